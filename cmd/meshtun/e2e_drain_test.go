package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshtun/meshtun/internal/topo"
)

// drainLong is the drain timeout of this test's gateways: longer than any
// wait of the test, so a drain that ends did so because its flows ended
// or because it was told to, never by the timeout.
const drainLong = `drain_timeout = "40s"`

// TestEndToEndDrain runs the real binaries in the two-node topology and
// drives both ways into a drain, each with a flow open through it:
//
//   - node A: SIGTERM drains (STOPPING=1, readiness 503 at once, the open
//     flow still carried); a second SIGTERM ends the drain early, the flow
//     is closed and the process exits cleanly;
//   - node B: GET /quitquitquit is 405 and changes nothing; POST drains
//     exactly as SIGTERM does, and the process exits cleanly once the open
//     flow ends.
func TestEndToEndDrain(t *testing.T) {
	if err := topo.Available(); err != nil {
		t.Skipf("end-to-end test needs namespaces: %v", err)
	}
	sock := listenNotify(t, filepath.Join(t.TempDir(), "notify"))
	t.Setenv("NOTIFY_SOCKET", sock.name)
	bin, dir, tp := twoNodes(t, "mtdrn", func(n, s string) string {
		return strings.Replace(s, `drain_timeout = "5s"`, drainLong, 1)
	})
	gwA, gwB := startGateways(t, tp, bin, dir)
	echoServer(t, tp.B, tp.B.Workload4.String()+":7070")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	t.Run("second SIGTERM ends the drain", func(t *testing.T) {
		flow := dialEcho(t, tp.A, tp.B.Workload4.String()+":7070")
		defer flow.Close()
		if err := echoOnce(flow, "before the drain"); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(gwA.PID(), syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		waitLog(t, gwA, `draining: timeout=40s`)
		if code := readiness(t, tp.A); code != http.StatusServiceUnavailable {
			t.Errorf("node A's readiness while draining: %d, want 503", code)
		}
		if _, err := sock.nextWith(ctx, gwA.PID(), "STOPPING=1"); err != nil {
			t.Fatalf("node A's STOPPING=1: %v", err)
		}
		if err := echoOnce(flow, "while draining"); err != nil {
			t.Fatalf("the open flow while node A drains: %v", err)
		}
		if err := syscall.Kill(gwA.PID(), syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		waitLog(t, gwA, "second signal: ending the drain now")
		waitLog(t, gwA, "drain ended early: closing the flows still open")
		waitExit(t, gwA)
		// The flow is closed: EOF or a reset, within a bounded time.
		flow.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.Copy(io.Discard, flow); err != nil && (errors.Is(err, os.ErrDeadlineExceeded) || !errors.Is(err, syscall.ECONNRESET)) {
			t.Fatalf("the open flow after the drain ended: %v; want EOF or a reset", err)
		}
	})

	// Node A again, for the flows into node B.
	gwA, err := tp.A.StartGateway(bin, filepath.Join(dir, "node-a.toml"), testLogWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := gwA.Stop(15 * time.Second); err != nil {
			t.Errorf("gateway node-a (restarted): %v", err)
		}
	})
	if err := gwA.WaitReady(ctx, "127.0.0.1:15021"); err != nil {
		t.Fatal(err)
	}

	t.Run("POST /quitquitquit drains like SIGTERM", func(t *testing.T) {
		flow := dialEcho(t, tp.A, tp.B.Workload4.String()+":7070")
		defer flow.Close()
		if err := echoOnce(flow, "before the drain"); err != nil {
			t.Fatal(err)
		}
		admin := nodeHTTP(tp.B)
		if code, body := httpDo(t, admin, http.MethodGet, "http://127.0.0.1:15000/quitquitquit"); code != http.StatusMethodNotAllowed {
			t.Fatalf("GET /quitquitquit: %d %q, want 405", code, body)
		}
		if code := readiness(t, tp.B); code != http.StatusOK {
			t.Fatalf("node B's readiness after a GET /quitquitquit: %d, want still 200", code)
		}
		if code, body := httpDo(t, admin, http.MethodPost, "http://127.0.0.1:15000/quitquitquit"); code != http.StatusOK || body != "draining\n" {
			t.Fatalf("POST /quitquitquit: %d %q, want 200 draining", code, body)
		}
		// At once: the answer comes after readiness has turned.
		if code := readiness(t, tp.B); code != http.StatusServiceUnavailable {
			t.Errorf("node B's readiness right after POST /quitquitquit: %d, want 503", code)
		}
		if _, err := sock.nextWith(ctx, gwB.PID(), "STOPPING=1"); err != nil {
			t.Fatalf("node B's STOPPING=1: %v", err)
		}
		waitLog(t, gwB, `draining: timeout=40s`)
		if err := echoOnce(flow, "while draining"); err != nil {
			t.Fatalf("the open flow while node B drains: %v", err)
		}
		flow.Close()
		waitLog(t, gwB, "drained")
		waitExit(t, gwB)
	})
}

// readiness is the status of GET /healthz/ready in node n.
func readiness(t *testing.T, n *topo.Node) int {
	t.Helper()
	code, _ := httpDo(t, nodeHTTP(n), http.MethodGet, "http://127.0.0.1:15021/healthz/ready")
	return code
}

// waitExit waits, bounded, for g's process to end and fails unless it
// exited with status 0.
func waitExit(t *testing.T, g *topo.Gateway) {
	t.Helper()
	select {
	case <-g.Exited():
	case <-time.After(30 * time.Second):
		t.Fatalf("gateway in %s still running", g.Node.Name)
	}
	if err := g.Stop(0); err != nil {
		t.Fatalf("gateway in %s: %v", g.Node.Name, err)
	}
}
