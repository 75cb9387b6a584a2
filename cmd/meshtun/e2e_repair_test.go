package main

import (
	"context"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/meshtun/meshtun/internal/xfer"
)

// Self-repair with the real binary: on node A, the capture route, the
// bypass rule, the TUN's addresses and its up state are taken away with
// the ip command, one after another, while a transfer runs through the
// gateways; each comes back (logged, counted on /metrics), and the
// transfer ends with both hashes right. A reload that drops a route from
// tun.routes leaves it in force (restart-only), and so restored.
func TestEndToEndSelfRepair(t *testing.T) {
	bin, dir, tp := twoNodes(t, "mtrep", func(_, s string) string { return s })
	// Registered before the gateways start, so it runs after they stop:
	// shutting down, the gateway's own removal is not undone.
	t.Cleanup(func() {
		if err := tp.A.IP("link", "show", "meshtun0"); err == nil {
			t.Errorf("meshtun0 still in node A after the gateway stopped")
		}
		out, err := tp.A.Command(context.Background(), "ip", "rule", "show", "priority", "10109").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "" {
			t.Errorf("bypass rule left in node A after the gateway stopped: %q, %v", out, err)
		}
	})
	gwA, _ := startGateways(t, tp, bin, dir)

	target := tp.B.Workload4.String() + ":7001"
	l, err := tp.B.Listen("tcp", target)
	if err != nil {
		t.Fatal(err)
	}
	var received atomic.Int64 // payload and header bytes the server has read
	served := make(chan struct{})
	go func() { xfer.Serve(byteCounter{l, &received}); close(served) }()
	t.Cleanup(func() { l.Close(); <-served })

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := tp.A.Dial(ctx, "tcp", target)
	if err != nil {
		t.Fatalf("dial %s: %v", target, err)
	}
	const phase = 4 << 20 // bytes the client may send per step
	gc := &gatedConn{TCPConn: c.(*net.TCPConn), limit: phase}
	gc.cond = sync.NewCond(&gc.mu)
	defer gc.open(math.MaxInt64) // never leave the writer parked
	steps := []struct {
		cmd []string
		log string // the restoration the gateway must log
	}{
		{[]string{"route", "del", "10.244.2.0/24", "table", "109"}, "restored route 10.244.2.0/24 dev meshtun0 table 109"},
		{[]string{"rule", "del", "priority", "10109"}, "restored rule 10109: not from all fwmark 0x6d74 lookup 109 (IPv4)"},
		{[]string{"addr", "flush", "dev", "meshtun0"}, "restored address 100.64.0.1/32 dev meshtun0"},
		{[]string{"link", "set", "meshtun0", "down"}, "restored link meshtun0 up"},
	}
	size := int64(len(steps)+1) * phase
	result := make(chan error, 1)
	go func() {
		_, err := xfer.Run(gc, size, 1<<20)
		result <- err
	}()

	for i, st := range steps {
		// While the client is sending (it may send this phase's bytes),
		// take the part away; it must come back, and the bytes sent
		// meanwhile must reach the server through the restored path.
		gc.open(int64(i+1) * phase)
		if err := tp.A.IP(st.cmd...); err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithTimeout(context.Background(), 15*time.Second)
		line, err := gwA.WaitLog(wctx, st.log)
		wcancel()
		if err != nil {
			t.Fatalf("step %d (ip %s): %v", i+1, strings.Join(st.cmd, " "), err)
		}
		t.Logf("step %d: ip %s → %s", i+1, strings.Join(st.cmd, " "), line)
		want := int64(i+1) * phase // the reply-size header included
		deadline := time.Now().Add(15 * time.Second)
		for received.Load() < want {
			if time.Now().After(deadline) {
				t.Fatalf("step %d: the server has %d of %d bytes 15 s after the restoration", i+1, received.Load(), want)
			}
			time.Sleep(10 * time.Millisecond) // polling the server's count; bounded by deadline
		}
	}
	gc.open(math.MaxInt64)
	select {
	case err := <-result:
		if err != nil {
			t.Fatalf("transfer across the repairs: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("transfer did not finish within 30 s of the last step")
	}

	// A reload that drops a route from tun.routes does not take it away
	// (the key needs a restart): the route stays in force, so the
	// Repairer still restores it.
	const v6route = "fd00:10:244:2::/64"
	pathA := filepath.Join(dir, "node-a.toml")
	cfgA, err := os.ReadFile(pathA)
	if err != nil {
		t.Fatal(err)
	}
	dropped := strings.Replace(string(cfgA), `, "`+v6route+`"]`, `]`, 1)
	if dropped == string(cfgA) {
		t.Fatalf("node A's config has no route %s to drop", v6route)
	}
	if err := os.WriteFile(pathA, []byte(dropped), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(gwA.PID(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer rcancel()
	if _, err := gwA.WaitLog(rctx, "key=tun.routes"); err != nil {
		t.Fatalf("the reload: %v", err)
	}
	restoredV6 := "restored route " + v6route + " dev meshtun0 table 109"
	before := len(gwA.LogsContaining(restoredV6))
	if err := tp.A.IP("-6", "route", "del", v6route, "table", "109"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for len(gwA.LogsContaining(restoredV6)) == before {
		if time.Now().After(deadline) {
			t.Fatalf("route %s, in force after the reload, not restored within 15 s", v6route)
		}
		time.Sleep(10 * time.Millisecond) // polling the log; bounded by deadline
	}

	samples := scrapeNode(t, tp.A, "/metrics")
	for _, what := range []string{"link", "address", "route", "rule"} {
		if v := promSum(samples, "meshtun_repairs_total", map[string]string{"what": what}); v < 1 {
			t.Errorf("meshtun_repairs_total{what=%q} = %v, want >= 1", what, v)
		}
	}
	var series []string
	for _, s := range samples {
		if s.name == "meshtun_repairs_total" {
			series = append(series, fmt.Sprintf("%s{what=%q} %v", s.name, s.labels["what"], s.value))
		}
	}
	if len(series) != 4 {
		t.Errorf("meshtun_repairs_total series: %v, want one per kind (link, address, route, rule)", series)
	}
	t.Logf("node A /metrics:\n%s", strings.Join(series, "\n"))
	t.Logf("node A's repair log:\n%s", strings.Join(gwA.LogsContaining("restored "), "\n"))
}

// gatedConn lets its writer send only up to limit bytes; open raises it.
type gatedConn struct {
	*net.TCPConn // CloseWrite; xfer writes through Write only
	mu           sync.Mutex
	cond         *sync.Cond
	limit        int64 // guarded by mu
	written      int64 // guarded by mu
}

func (c *gatedConn) open(limit int64) {
	c.mu.Lock()
	c.limit = max(c.limit, limit)
	c.mu.Unlock()
	c.cond.Broadcast()
}

func (c *gatedConn) Write(p []byte) (int, error) {
	done := 0
	for done < len(p) {
		c.mu.Lock()
		for c.written >= c.limit {
			c.cond.Wait()
		}
		n := int(min(int64(len(p)-done), c.limit-c.written))
		c.mu.Unlock()
		k, err := c.TCPConn.Write(p[done : done+n])
		c.mu.Lock()
		c.written += int64(k)
		c.mu.Unlock()
		done += k
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// byteCounter is a listener that counts the bytes read from its connections.
type byteCounter struct {
	net.Listener
	n *atomic.Int64
}

func (l byteCounter) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countingReader{c, l.n}, nil
}

// countingReader is a TCP connection that counts what is read from it.
// It embeds the net.Conn interface, not the *net.TCPConn, so io.Copy
// cannot go around Read through TCPConn.WriteTo.
type countingReader struct {
	net.Conn
	n *atomic.Int64
}

func (c countingReader) Read(p []byte) (int, error) {
	k, err := c.Conn.Read(p)
	c.n.Add(int64(k))
	return k, err
}

// CloseWrite half-closes, as xfer's server does after its reply.
func (c countingReader) CloseWrite() error { return c.Conn.(*net.TCPConn).CloseWrite() }
