package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/internal/topo"
)

// reloadDeny is node B's policy after the reload: the long-lived flow's
// port is denied.
const reloadDeny = `
[[policies]]
name = "no-7070-after-reload"
action = "deny"
  [[policies.rules]]
  destination_ports = [7070]
`

// TestEndToEndReload runs the real binaries in the two-node topology with
// a NOTIFY_SOCKET of our own, holds a flow open through the pair, rewrites
// node B's config so a policy denies that flow, sends node B's gateway
// SIGHUP and checks: the open flow is ended, a new identical one is
// refused, the log and systemd hear of it; then a broken config changes
// nothing.
func TestEndToEndReload(t *testing.T) {
	if err := topo.Available(); err != nil {
		t.Skipf("end-to-end test needs namespaces: %v", err)
	}
	sock := listenNotify(t, filepath.Join(t.TempDir(), "notify"))
	t.Setenv("NOTIFY_SOCKET", sock.name) // inherited by both gateways through `ip netns exec`
	bin, dir, tp := twoNodes(t, "mtrld", func(n, s string) string { return s })
	_, gwB := startGateways(t, tp, bin, dir)
	pathB := filepath.Join(dir, "node-b.toml")
	origB, err := os.ReadFile(pathB)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// systemd hears READY=1 from node B's gateway, once it is serving.
	if m, err := sock.nextWith(ctx, gwB.PID(), "READY=1"); err != nil {
		t.Fatalf("node B's READY=1: %v", err)
	} else if st, _ := m.value("STATUS"); !strings.Contains(st, "serving") {
		t.Errorf("READY=1 message: %q", m.lines)
	}

	srvB := echoServer(t, tp.B, tp.B.Workload4.String()+":7070")
	echoServer(t, tp.B, tp.B.Workload4.String()+":7071")
	long := dialEcho(t, tp.A, tp.B.Workload4.String()+":7070")
	defer long.Close()
	if err := echoOnce(long, "before the reload"); err != nil {
		t.Fatalf("the long-lived flow before the reload: %v", err)
	}

	t.Run("policy reload ends the open flow and refuses new ones", func(t *testing.T) {
		if err := os.WriteFile(pathB, append(append([]byte{}, origB...), reloadDeny...), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(gwB.PID(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		// The open flow ends: EOF or a reset, within a bounded time.
		ended := make(chan error, 1)
		go func() {
			long.SetReadDeadline(time.Now().Add(20 * time.Second))
			_, err := io.Copy(io.Discard, long)
			ended <- err
		}()
		if err := <-ended; err != nil && (errors.Is(err, os.ErrDeadlineExceeded) || !errors.Is(err, syscall.ECONNRESET)) {
			t.Fatalf("the denied flow: %v; want EOF or a reset", err)
		}
		line := waitLog(t, gwB, "reloaded:")
		if !strings.Contains(line, "changed=policies") || !strings.Contains(line, "inbound_closed=1") {
			t.Errorf("node B's reload line: %s", line)
		}
		line = waitLog(t, gwB, "denied by policy after reload")
		for _, want := range []string{"response_flags=DENY", "no-7070-after-reload", "direction=inbound", "dst.addr=" + tp.B.Workload4.String() + ":7070"} {
			if !strings.Contains(line, want) {
				t.Errorf("node B's access log line has no %q: %s", want, line)
			}
		}
		// A new identical flow is refused, and the target sees nothing.
		before := srvB.count()
		c, err := dialFrom(tp.A, tp.B.Workload4.String()+":7070")
		if c != nil {
			c.Close()
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("new flow after the reload: %v, want connection refused", err)
		}
		if n := srvB.count(); n != before {
			t.Errorf("the target accepted %d connections after the reload, want none", n-before)
		}
		// systemd heard the reload: RELOADING=1 with a timestamp, then READY=1.
		m, err := sock.nextWith(ctx, gwB.PID(), "RELOADING=1")
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := m.value("MONOTONIC_USEC"); !ok {
			t.Errorf("RELOADING=1 without MONOTONIC_USEC: %q", m.lines)
		}
		m, err = sock.next(ctx, gwB.PID())
		if err != nil || !m.has("READY=1") {
			t.Fatalf("after RELOADING=1: %q, %v; want READY=1", m.lines, err)
		}
	})

	t.Run("broken config keeps the running one", func(t *testing.T) {
		broken := strings.Replace(string(origB)+reloadDeny, `action = "deny"`, `action = "maybe"`, 1)
		if err := os.WriteFile(pathB, []byte(broken), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(gwB.PID(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		line := waitLog(t, gwB, "reload: config error")
		if !strings.Contains(line, "key=policies[0].action") {
			t.Errorf("the error does not name the key: %s", line)
		}
		waitLog(t, gwB, "reload failed; still running the previous config")
		m, err := sock.nextWith(ctx, gwB.PID(), "RELOADING=1")
		if err != nil {
			t.Fatal(err)
		}
		if m, err = sock.next(ctx, gwB.PID()); err != nil || !m.has("READY=1") {
			t.Fatalf("after RELOADING=1: %q, %v; want READY=1", m.lines, err)
		}
		if st, _ := m.value("STATUS"); !strings.Contains(st, "previous config") {
			t.Errorf("STATUS after the failed reload: %q", st)
		}
		// Still serving, with the previous (reloaded) policies: 7071 is
		// carried, 7070 still refused.
		c := dialEcho(t, tp.A, tp.B.Workload4.String()+":7071")
		defer c.Close()
		if err := echoOnce(c, "after the failed reload"); err != nil {
			t.Fatal(err)
		}
		c2, err := dialFrom(tp.A, tp.B.Workload4.String()+":7070")
		if c2 != nil {
			c2.Close()
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("7070 after the failed reload: %v, want still refused", err)
		}
		readyCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := gwB.WaitReady(readyCtx, "127.0.0.1:15021"); err != nil {
			t.Fatal(err)
		}
	})

	// SIGTERM: systemd hears STOPPING=1 and the gateway exits cleanly.
	if err := gwB.Stop(15 * time.Second); err != nil {
		t.Fatalf("node B's gateway: %v", err)
	}
	if _, err := sock.nextWith(ctx, gwB.PID(), "STOPPING=1"); err != nil {
		t.Fatalf("node B's STOPPING=1: %v", err)
	}
}

// countingEcho is an echo server that counts its connections.
type countingEcho struct {
	mu sync.Mutex
	n  int
}

func (e *countingEcho) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n
}

func echoServer(t *testing.T, n *topo.Node, addr string) *countingEcho {
	t.Helper()
	l, err := n.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	e := &countingEcho{}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			e.mu.Lock()
			e.n++
			e.mu.Unlock()
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() { defer wg.Done(); io.Copy(c, c); c.Close() }()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return e
}

func dialFrom(n *topo.Node, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return n.Dial(ctx, "tcp", addr)
}

func dialEcho(t *testing.T, n *topo.Node, addr string) net.Conn {
	t.Helper()
	c, err := dialFrom(n, addr)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// echoOnce sends msg and reads it back, within a bounded time.
func echoOnce(c net.Conn, msg string) error {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write([]byte(msg)); err != nil {
		return err
	}
	b := make([]byte, len(msg))
	if _, err := io.ReadFull(c, b); err != nil {
		return err
	}
	if string(b) != msg {
		return errors.New("echo mismatch: " + string(b))
	}
	return nil
}

// TestReloadCLI drives reload, the function SIGHUP runs, in process
// (no root needed): a broken file changes nothing and logs each error
// with its key path; a good one is applied.
func TestReloadCLI(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "gateway.toml")
	good := validConfig(t, dir)
	if err := os.WriteFile(path, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	log := hclog.New(&hclog.LoggerOptions{Output: &logs})
	g, _, err := check(path, func(*config.Config) hclog.Logger { return log })
	if err != nil {
		t.Fatal(err)
	}
	router := g.Router()

	broken := strings.Replace(good, `cidrs = ["10.244.2.0/24"]`, `cidrs = ["10.244.2.0/33"]`, 1) + "\n[tun]\n"
	if err := os.WriteFile(path, []byte(broken), 0o644); err != nil {
		t.Fatal(err)
	}
	status := reload(path, g, log)
	if !strings.Contains(status, "previous config") || g.Router() != router {
		t.Fatalf("broken config: status %q, router replaced %v", status, g.Router() != router)
	}
	// A duplicate table is a syntax error: reported with its line.
	if !strings.Contains(logs.String(), "reload failed; still running the previous config") || !strings.Contains(logs.String(), "line=") {
		t.Errorf("log after a broken config:\n%s", logs.String())
	}

	logs.Reset()
	broken = strings.Replace(good, `cidrs = ["10.244.2.0/24"]`, `cidrs = ["10.244.2.0/33"]`, 1)
	if err := os.WriteFile(path, []byte(broken), 0o644); err != nil {
		t.Fatal(err)
	}
	reload(path, g, log)
	if !strings.Contains(logs.String(), "key=peers[0].cidrs[0]") || g.Router() != router {
		t.Errorf("bad CIDR: router replaced %v, log:\n%s", g.Router() != router, logs.String())
	}

	logs.Reset()
	next := good + `
[[peers]]
name = "node-c"
cidrs = ["10.244.3.0/24"]
address = "192.0.2.3:15008"
identity = "spiffe://cluster.local/ns/meshtun/sa/node-c"
`
	next = strings.Replace(next, `routes = ["10.244.2.0/24"]`, `routes = ["10.244.2.0/24", "10.244.3.0/24"]`, 1)
	if err := os.WriteFile(path, []byte(next), 0o644); err != nil {
		t.Fatal(err)
	}
	status = reload(path, g, log)
	if !strings.Contains(status, "applied peers") || !strings.Contains(status, "needs a restart for tun.routes") || g.Router() == router {
		t.Fatalf("good config: status %q, router replaced %v\n%s", status, g.Router() != router, logs.String())
	}
	if !strings.Contains(logs.String(), "key=tun.routes") {
		t.Errorf("no warning naming tun.routes:\n%s", logs.String())
	}
}
