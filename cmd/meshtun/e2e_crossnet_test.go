package main

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Double HBONE end to end, with two meshtun processes in network
// namespaces, TUN and netstack on node A, and the file form of networks:
// node A holds node B's workload and service as "cluster-net", whose
// gateway is node B itself (gateway.east_west on :15009). A's
// application dials the workload and the service's VIP; the flows go A →
// B's east-west listener (outer CONNECT) → B's own HBONE listener (the
// inner connection, mTLS with node B's identity end to end) → the server.
// First A names a gateway port nothing listens on: flows are refused
// with the reason; a reload to the right one brings them back.
func TestEndToEndCrossNetwork(t *testing.T) {
	const (
		server = "10.244.2.5"
		vip    = "10.244.2.200"
		host   = "server.demo.svc.cluster.local"
		nodeB  = "spiffe://cluster.local/ns/meshtun/sa/node-b"
	)
	entries := func(network string) string {
		return `
[[workloads]]
name = "server"
namespace = "demo"
addresses = ["` + server + `"]
hbone_address = "192.0.2.2:15008"
identity = "` + nodeB + `"
` + network + `
[[services]]
name = "server"
namespace = "demo"
hostname = "` + host + `"
vips = ["` + vip + `"]
ports = { 80 = 8080 }
endpoints = ["demo/server"]
`
	}
	bin, dir, tp := twoNodes(t, "mtxnet", func(n, s string) string {
		if n == "node-a" {
			return s + `
[[networks]]
name = "cluster-net"
gateway = "192.0.2.2:15019"
identity = "` + nodeB + `"
` + entries(`network = "cluster-net"`)
		}
		return strings.Replace(s, `name = "node-b"`, `name = "node-b"`+"\neast_west = \"0.0.0.0:15009\"", 1) + entries("")
	})
	e := &e2e{topo: tp, dir: dir, bin: bin, served: map[string]*countingListener{}}
	e.gwA, e.gwB = startGateways(t, tp, bin, dir)

	l, err := tp.B.Listen("tcp", server+":8080")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
				c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()

	// The gateway is down: a RST for the application, and why.
	if c, err := e.dialA(t, server+":8080"); err == nil {
		c.Close()
		t.Fatal("a flow got through a gateway that is down")
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial through a gateway that is down: %v, want connection refused", err)
	}
	line := waitLog(t, e.gwA, "network gateway 192.0.2.2:15019")
	for _, want := range []string{"response_flags=CONNECT", "dst.hbone_addr=192.0.2.2:15019", "connection refused"} {
		if !strings.Contains(line, want) {
			t.Errorf("node A's line lacks %q: %s", want, line)
		}
	}
	// And back: the right port, applied by a reload.
	pathA := filepath.Join(dir, "node-a.toml")
	text, err := os.ReadFile(pathA)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pathA, []byte(strings.Replace(string(text), "192.0.2.2:15019", "192.0.2.2:15009", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := e.gwA.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if line := waitLog(t, e.gwA, "reloaded:"); !strings.Contains(line, "networks") {
		t.Errorf("node A's reload line does not name networks: %s", line)
	}

	for _, dst := range []string{server + ":8080", vip + ":80"} {
		c, err := e.dialA(t, dst)
		if err != nil {
			t.Fatalf("dial %s from node A: %v", dst, err)
		}
		c.SetDeadline(time.Now().Add(20 * time.Second))
		msg := "across networks to " + dst
		if _, err := io.WriteString(c, msg); err != nil {
			t.Fatal(err)
		}
		c.(*net.TCPConn).CloseWrite() // half-close through both layers
		back, err := io.ReadAll(c)
		c.Close()
		if err != nil || string(back) != msg {
			t.Fatalf("%s: echo %q, %v", dst, back, err)
		}
	}

	// The plan as the running gateway has it: both hops.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := tp.A.Command(ctx, bin, "route", "--admin", "127.0.0.1:15000", vip+":80").CombinedOutput()
	if err != nil {
		t.Fatalf("meshtun route: %v\n%s", err, out)
	}
	for _, want := range []string{`double HBONE, through network "cluster-net"'s gateway`, "outer hbone: 192.0.2.2:15009",
		"authority:   " + host + ":80 (outer and inner)"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("meshtun route lacks %q:\n%s", want, out)
		}
	}
}
