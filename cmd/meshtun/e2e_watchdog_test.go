package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshtun/meshtun/internal/topo"
)

// watchdogUsec is this test's WatchdogSec: 2 s, so pings every second and
// checks bounded by 500 ms (far more than a check takes even under -race
// on a busy machine: a probe through the stack and a loopback connect).
const watchdogUsec = "2000000"

// TestEndToEndWatchdog runs the real binaries with a NOTIFY_SOCKET and
// WATCHDOG_USEC of our own, node B's HBONE listener on its veth address:
// WATCHDOG=1 arrives while the self-check passes; then the listener's
// address is taken off the node (a real fault: no peer can reach the
// listener, and the gateway's own connect to it fails), the self-check
// fails, STATUS= says why, the log says it once, and no ping comes; with
// the address back, the pings resume.
func TestEndToEndWatchdog(t *testing.T) {
	if err := topo.Available(); err != nil {
		t.Skipf("end-to-end test needs namespaces: %v", err)
	}
	sock := listenNotify(t, filepath.Join(t.TempDir(), "notify"))
	t.Setenv("NOTIFY_SOCKET", sock.name) // inherited through `ip netns exec`
	t.Setenv("WATCHDOG_USEC", watchdogUsec)
	listen := "192.0.2.2:15008"
	bin, dir, tp := twoNodes(t, "mtwdg", func(n, s string) string {
		if n == "node-b" {
			return strings.Replace(s, `listen = "0.0.0.0:15008"`, `listen = "`+listen+`"`, 1)
		}
		return s
	})
	_, gwB := startGateways(t, tp, bin, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pid := gwB.PID()

	if _, err := sock.nextWith(ctx, pid, "READY=1"); err != nil {
		t.Fatalf("node B's READY=1: %v", err)
	}
	for i := range 2 {
		if _, err := sock.nextWith(ctx, pid, "WATCHDOG=1"); err != nil {
			t.Fatalf("node B's ping %d: %v", i, err)
		}
	}

	// The fault. Removed at cleanup too, should the test fail meanwhile.
	addr := tp.B.VethIP4.String() + "/24"
	if err := tp.B.IP("addr", "del", addr, "dev", "veth-b"); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			if err := tp.B.IP("addr", "add", addr, "dev", "veth-b"); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(restore)

	// The first UNHEALTHY status that names the listener (a busy machine
	// may have let an earlier check run out of time: that one passes again
	// and says so).
	var m notifyMsg
	for {
		var err error
		if m, err = nextStatus(ctx, sock, pid, "UNHEALTHY"); err != nil {
			t.Fatal(err)
		}
		if st, _ := m.value("STATUS"); strings.Contains(st, "hbone listener "+listen+": does not accept") {
			if !strings.Contains(st, "; serving, config") {
				t.Errorf("STATUS while the listener is gone does not end with the gateway's own: %q", st)
			}
			break
		}
	}
	if m.has("WATCHDOG=1") {
		t.Errorf("the failing check's message pings: %q", m.lines)
	}
	// From that message on, no ping until a healthy STATUS: the messages
	// of one sender arrive in order. Three intervals of silence show the
	// pings have stopped rather than slowed.
	quiet, cancelQuiet := context.WithTimeout(ctx, 3*2*time.Second)
	for {
		m, err := sock.next(quiet, pid)
		if err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatal(err)
			}
			break
		}
		if m.has("WATCHDOG=1") {
			t.Fatalf("a ping while the self-check fails: %q", m.lines)
		}
	}
	cancelQuiet()
	if n := len(gwB.LogsContaining("does not accept")); n != 1 {
		t.Errorf("%d log lines of the failure, want one per change:\n%s", n, strings.Join(gwB.LogsContaining("self-check"), "\n"))
	}

	restore()
	m, err := nextStatus(ctx, sock, pid, "serving")
	if err != nil {
		t.Fatal(err)
	}
	if !m.has("WATCHDOG=1") {
		t.Errorf("the message that says healthy again does not ping: %q", m.lines)
	}
	if _, err := sock.nextWith(ctx, pid, "WATCHDOG=1"); err != nil {
		t.Fatalf("pings after the address came back: %v", err)
	}
	waitLog(t, gwB, "self-check passes again")
}

// nextStatus reads pid's messages until one has a STATUS= that begins
// with prefix.
func nextStatus(ctx context.Context, s *notifySocket, pid int, prefix string) (notifyMsg, error) {
	for {
		m, err := s.next(ctx, pid)
		if err != nil {
			return m, errors.New("waiting for STATUS=" + prefix + "...: " + err.Error())
		}
		if st, ok := m.value("STATUS"); ok && strings.HasPrefix(st, prefix) {
			return m, nil
		}
	}
}
