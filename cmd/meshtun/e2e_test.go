package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/meshtun/meshtun/internal/topo"
	"github.com/meshtun/meshtun/internal/xfer"
)

// buildMeshtun builds the binary under test into dir.
func buildMeshtun(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "meshtun")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	out, err := exec.Command("go", append(args, ".")...).CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// e2e is a running two-node setup: topology, certificates, two gateways.
type e2e struct {
	topo   *topo.Topology
	gwA    *topo.Gateway
	gwB    *topo.Gateway
	dir    string
	bin    string
	served map[string]*countingListener
}

// countingListener counts the connections a test server accepted.
type countingListener struct {
	net.Listener
	accepted atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

// The impostor range: node A routes it to node B's gateway but expects an
// identity node B does not have, so nothing may be forwarded.
const (
	impostorCIDR   = "10.244.3.0/24"
	impostorTarget = "10.244.3.5"
)

// twoNodes prepares what both namespace tests need: the binary, the
// certificates made by `meshtun certs`, the example configs as edited by
// edit (called with the node name and the file's text), each checked by
// `meshtun validate`, and a fresh topology removed at cleanup. It skips
// without root or namespaces.
func twoNodes(t *testing.T, prefix string, edit func(node, cfg string) string) (bin, dir string, tp *topo.Topology) {
	t.Helper()
	if err := topo.Available(); err != nil {
		t.Skipf("end-to-end test needs namespaces: %v", err)
	}
	dir = t.TempDir()
	bin = buildMeshtun(t, dir)
	if out, err := exec.Command(bin, "certs", "--out", dir, "node-a", "node-b").CombinedOutput(); err != nil {
		t.Fatalf("meshtun certs: %v\n%s", err, out)
	}
	for _, n := range []string{"node-a", "node-b"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "examples", "two-nodes", n+".toml"))
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, n+".toml")
		if err := os.WriteFile(path, []byte(edit(n, string(b))), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(bin, "validate", "--config", path).CombinedOutput(); err != nil {
			t.Fatalf("meshtun validate %s: %v\n%s", n, err, out)
		}
	}
	tp, err := topo.New(prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tp.Close(); err != nil {
			t.Errorf("remove topology: %v", err)
		}
	})
	return bin, dir, tp
}

func setupE2E(t *testing.T) *e2e {
	t.Helper()
	// The example configs, plus the impostor route on node A.
	bin, dir, tp := twoNodes(t, "mte2e", func(n, s string) string {
		if n == "node-a" {
			s = strings.Replace(s, `routes = [`, `routes = ["`+impostorCIDR+`", `, 1)
			return s + fmt.Sprintf("\n[[peers]]\nname = \"impostor\"\ncidrs = [%q]\naddress = \"192.0.2.2:15008\"\nidentity = \"spiffe://cluster.local/ns/meshtun/sa/not-node-b\"\n", impostorCIDR)
		}
		return strings.Replace(s, `serve = [`, `serve = ["`+impostorCIDR+`", `, 1)
	})
	if err := tp.B.IP("addr", "add", impostorTarget+"/32", "dev", "lo"); err != nil {
		t.Fatal(err)
	}
	e := &e2e{topo: tp, dir: dir, bin: bin, served: map[string]*countingListener{}}

	e.gwA, e.gwB = startGateways(t, tp, bin, dir)
	return e
}

// startGateways runs a gateway in each node from <dir>/<node>.toml (node B
// first, so A's first flows find it), waits until both are ready, and stops
// them at cleanup, failing the test if either does not exit cleanly.
func startGateways(t *testing.T, tp *topo.Topology, bin, dir string) (a, b *topo.Gateway) {
	t.Helper()
	for _, n := range []*topo.Node{tp.B, tp.A} {
		g, err := n.StartGateway(bin, filepath.Join(dir, n.Name+".toml"), testLogWriter{t})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := g.Stop(15 * time.Second); err != nil {
				t.Errorf("gateway %s: %v", n.Name, err)
			}
		})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = g.WaitReady(ctx, "127.0.0.1:15021")
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if n == tp.A {
			a = g
		} else {
			b = g
		}
	}
	return a, b
}

// serve starts an xfer server in node B on addr, closed at cleanup.
func (e *e2e) serve(t *testing.T, addr string) *countingListener {
	t.Helper()
	l, err := e.topo.B.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: l}
	done := make(chan struct{})
	go func() { xfer.Serve(cl); close(done) }()
	t.Cleanup(func() { l.Close(); <-done })
	return cl
}

// dialA connects from node A, as an application there would.
func (e *e2e) dialA(t *testing.T, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return e.topo.A.Dial(ctx, "tcp", addr)
}

// hboneConns counts the established TCP connections to node B's :15008.
func (e *e2e) hboneConns(t *testing.T) int {
	t.Helper()
	out, err := e.topo.B.Command(context.Background(), "ss", "-Htn", "state", "established", "( sport = :15008 )").Output()
	if err != nil {
		t.Fatalf("ss: %v", err)
	}
	n := 0
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if strings.TrimSpace(l) != "" {
			n++
		}
	}
	return n
}

type testLogWriter struct{ t *testing.T }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func TestEndToEnd(t *testing.T) {
	e := setupE2E(t)
	target := e.topo.B.Workload4.String()
	e.serve(t, target+":7001")

	t.Run("data intact", func(t *testing.T) {
		sizes := []int64{0, 1, 1 << 20, 256 << 20}
		if testing.Short() {
			sizes = sizes[:3]
		}
		for _, size := range sizes {
			// Upload size bytes with a 1-byte reply, then the mirror.
			for _, dir := range []struct {
				name     string
				up, down int64
			}{{"upload", size, 1}, {"download", 1, size}} {
				c, err := e.dialA(t, target+":7001")
				if err != nil {
					t.Fatalf("%s %d: dial: %v", dir.name, size, err)
				}
				r, err := xfer.Run(c, dir.up, dir.down)
				if err != nil {
					t.Fatalf("%s %d bytes: %v", dir.name, size, err)
				}
				t.Logf("%s %d bytes: ok in %v", dir.name, size, r.Duration)
			}
		}
	})

	t.Run("half-close, server first", func(t *testing.T) {
		l, err := e.topo.B.Listen("tcp", target+":7002")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		got := make(chan string, 1)
		go func() {
			c, err := l.Accept()
			if err != nil {
				got <- "accept: " + err.Error()
				return
			}
			defer c.Close()
			// The server speaks, closes its write side, and still reads
			// everything the client sends after seeing EOF.
			c.Write([]byte("banner"))
			c.(*net.TCPConn).CloseWrite()
			b := make([]byte, 0, 64)
			buf := make([]byte, 64)
			for {
				n, err := c.Read(buf)
				b = append(b, buf[:n]...)
				if err != nil {
					break
				}
			}
			got <- string(b)
		}()
		c, err := e.dialA(t, target+":7002")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		b := make([]byte, 64)
		n, err := readAll(c, b)
		if err != nil || string(b[:n]) != "banner" {
			t.Fatalf("client read %q, %v; want banner then EOF", b[:n], err)
		}
		if _, err := c.Write([]byte("after EOF")); err != nil {
			t.Fatalf("client write after EOF: %v", err)
		}
		c.(*net.TCPConn).CloseWrite()
		select {
		case s := <-got:
			if s != "after EOF" {
				t.Fatalf("server read %q, want %q", s, "after EOF")
			}
		case <-time.After(30 * time.Second):
			t.Fatal("server never saw the client's data and FIN")
		}
	})

	t.Run("50 flows share one HBONE connection", func(t *testing.T) {
		const flows = 50
		l, err := e.topo.B.Listen("tcp", target+":7003")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		// The server holds every connection open until all 50 are up.
		var mu sync.Mutex
		var held []net.Conn
		allUp := make(chan struct{})
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				held = append(held, c)
				if len(held) == flows {
					close(allUp)
				}
				mu.Unlock()
			}
		}()
		var clients []net.Conn
		defer func() {
			for _, c := range clients {
				c.Close()
			}
			mu.Lock()
			for _, c := range held {
				c.Close()
			}
			mu.Unlock()
		}()
		errs := make(chan error, flows)
		var cmu sync.Mutex
		for i := 0; i < flows; i++ {
			go func() {
				c, err := e.dialA(t, target+":7003")
				if err == nil {
					cmu.Lock()
					clients = append(clients, c)
					cmu.Unlock()
				}
				errs <- err
			}()
		}
		for i := 0; i < flows; i++ {
			if err := <-errs; err != nil {
				t.Fatalf("flow %d: %v", i, err)
			}
		}
		select {
		case <-allUp:
		case <-time.After(30 * time.Second):
			t.Fatal("the server did not see 50 connections")
		}
		if n := e.hboneConns(t); n != 1 {
			t.Fatalf("%d flows open over %d HBONE connections to node B, want 1", flows, n)
		}
	})

	t.Run("refused target is a RST", func(t *testing.T) {
		start := time.Now()
		_, err := e.dialA(t, target+":7999") // nothing listens there
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("dial to a closed port: %v, want connection refused", err)
		}
		t.Logf("refused after %v", time.Since(start))
	})

	t.Run("wrong peer identity forwards nothing", func(t *testing.T) {
		imp := e.serve(t, impostorTarget+":7001")
		_, err := e.dialA(t, impostorTarget+":7001")
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("dial through a peer with the wrong identity: %v, want connection refused", err)
		}
		if n := imp.accepted.Load(); n != 0 {
			t.Fatalf("the target behind the impostor route got %d connections, want 0", n)
		}
		// Node A says why in its access log (written as the flow ends, so
		// possibly just after the client saw the RST).
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		line, err := e.gwA.WaitLog(ctx, "dst.addr="+impostorTarget+":7001")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(line, "peer identity is not one of the expected identities") {
			t.Errorf("node A's access log does not say the identity was wrong: %s", line)
		}
	})

	t.Run("IPv6", func(t *testing.T) {
		e.serve(t, "["+e.topo.B.Workload6.String()+"]:7001")
		c, err := e.dialA(t, net.JoinHostPort(e.topo.B.Workload6.String(), "7001"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := xfer.Run(c, 1<<20, 1<<20); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("admin serves pprof on localhost", func(t *testing.T) {
		client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return e.topo.A.Dial(ctx, network, addr)
			},
		}}
		resp, err := client.Get("http://127.0.0.1:15000/debug/pprof/goroutine?debug=1")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "goroutine profile") {
			t.Fatalf("admin pprof: %s: %.200s", resp.Status, body)
		}
	})

	t.Run("status and flows", func(t *testing.T) { testStatusAndFlows(t, e, target) })

	t.Run("access log", func(t *testing.T) {
		// Every flow above produced one line on each side.
		a := e.gwA.LogsContaining("connection complete")
		b := e.gwB.LogsContaining("connection complete")
		if len(a) == 0 || len(b) == 0 {
			t.Fatalf("access log lines: node A %d, node B %d", len(a), len(b))
		}
		for _, want := range []string{"src.addr=", "dst.addr=", "dst.hbone_addr=192.0.2.2:15008", "direction=outbound", "bytes_sent=", "bytes_recv=", "duration="} {
			if !strings.Contains(strings.Join(a, "\n"), want) {
				t.Errorf("node A's access log has no %q", want)
			}
		}
		if !strings.Contains(strings.Join(b, "\n"), "src.identity=spiffe://cluster.local/ns/meshtun/sa/node-a") {
			t.Errorf("node B's access log does not name node A's identity")
		}
	})
}

// readAll reads into b until EOF; it returns the count and nil on EOF.
func readAll(c net.Conn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		k, err := c.Read(b[n:])
		n += k
		if err != nil {
			if errors.Is(err, io.EOF) {
				return n, nil
			}
			return n, err
		}
	}
	return n, errors.New("more data than expected: " + strconv.Itoa(n))
}
