package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshtun/meshtun/gateway"
	"github.com/meshtun/meshtun/internal/topo"
)

// testStatusAndFlows runs `meshtun status` and `meshtun flows` in node A
// and node B, as an operator would on each, while a flow from A to
// target:7004 is open: both find the admin listener from the config
// file, and name the flow, its peer and its bytes.
func testStatusAndFlows(t *testing.T, e *e2e, target string) {
	l, err := e.topo.B.Listen("tcp", target+":7004")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	held := make(chan net.Conn, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			c.Write([]byte("hi")) // 2 bytes back
			held <- c
		}
	}()
	c, err := e.dialA(t, target+":7004")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.ReadFull(c, make([]byte, 2)); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-held:
		defer s.Close()
	case <-time.After(20 * time.Second):
		t.Fatal("the server never took the connection")
	}

	meshtun := func(n *topo.Node, args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		args = append(args, "--config", filepath.Join(e.dir, n.Name+".toml"))
		out, err := n.Command(ctx, e.bin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: meshtun %s: %v\n%s", n.Name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	dst := netip.MustParseAddrPort(target + ":7004")
	ours := func(fa gateway.FlowsAnswer) *gateway.FlowInfo {
		for i := range fa.Flows {
			if fa.Flows[i].Dst == dst {
				return &fa.Flows[i]
			}
		}
		return nil
	}
	// The relay counts a write once it returned: poll, bounded.
	var f *gateway.FlowInfo
	for deadline := time.Now().Add(20 * time.Second); ; {
		var fa gateway.FlowsAnswer
		if err := json.Unmarshal([]byte(meshtun(e.topo.A, "flows", "--json")), &fa); err != nil {
			t.Fatalf("meshtun flows --json: %v", err)
		}
		if f = ours(fa); f != nil && f.BytesSent == 5 && f.BytesRecv == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond) // polling the counters for a bounded time
	}
	if f == nil || f.Direction != "outbound" || f.BytesSent != 5 || f.BytesRecv != 2 ||
		f.HBONEAddr.String() != "192.0.2.2:15008" || !strings.HasSuffix(f.PeerIdentity, "/sa/node-b") {
		t.Fatalf("node A's flow to %s: %+v", dst, f)
	}

	text := meshtun(e.topo.A, "flows")
	for _, want := range []string{"DIRECTION", "outbound", dst.String(), "/sa/node-b @ 192.0.2.2:15008", "5B", "2B", "relayed"} {
		if !strings.Contains(text, want) {
			t.Errorf("node A's `meshtun flows` lacks %q:\n%s", want, text)
		}
	}
	text = meshtun(e.topo.B, "flows")
	for _, want := range []string{"inbound", dst.String(), "/sa/node-a"} {
		if !strings.Contains(text, want) {
			t.Errorf("node B's `meshtun flows` lacks %q:\n%s", want, text)
		}
	}

	st := meshtun(e.topo.A, "status")
	for _, want := range []string{"gateway:     node-a", "identity:    spiffe://cluster.local/ns/meshtun/sa/node-a",
		"certificate: from file, expires in", "istiod:      off", "outbound", "peers:", "192.0.2.2:15008", "/sa/node-b"} {
		if !strings.Contains(st, want) {
			t.Errorf("node A's `meshtun status` lacks %q:\n%s", want, st)
		}
	}
	var sa gateway.StatusAnswer
	if err := json.Unmarshal([]byte(meshtun(e.topo.A, "status", "--json")), &sa); err != nil {
		t.Fatalf("meshtun status --json: %v", err)
	}
	if sa.Flows.Outbound < 1 || len(sa.Peers) == 0 || sa.Pool.Conns < 1 {
		t.Errorf("node A's status with a flow open: %+v", sa)
	}
}
