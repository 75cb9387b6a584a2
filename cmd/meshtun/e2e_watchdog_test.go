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

// watchdogUsec is this test's WatchdogSec: 4 s, so pings every 2 s and
// checks bounded by 1 s (far more than a check takes even under -race
// on a busy machine: a probe through the stack and a local connect).
const watchdogUsec = "4000000"

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
	naming := func(m notifyMsg) bool {
		st, _ := m.value("STATUS")
		return strings.HasPrefix(st, "UNHEALTHY") && strings.Contains(st, "hbone listener "+listen+": does not accept")
	}
	var m notifyMsg
	for !naming(m) {
		var err error
		if m, err = nextStatus(ctx, sock, pid, "UNHEALTHY"); err != nil {
			t.Fatal(err)
		}
	}
	if st, _ := m.value("STATUS"); !strings.HasSuffix(st, "; serving, config "+filepath.Join(dir, "node-b.toml")) {
		t.Errorf("STATUS while the listener is gone does not end with the gateway's own: %q", st)
	}
	if m.has("WATCHDOG=1") {
		t.Errorf("the failing check's message pings: %q", m.lines)
	}
	statuses := 1 // STATUS= lines naming the listener: one per change of the failure
	// From that message on, no ping until a healthy STATUS: the messages
	// of one sender arrive in order. Three watchdog intervals of silence
	// (six pings missed) show the pings have stopped rather than slowed.
	quiet, cancelQuiet := context.WithTimeout(ctx, 3*4*time.Second)
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
		if naming(m) {
			statuses++
		}
	}
	cancelQuiet()

	restore()
	for {
		m, err := sock.next(ctx, pid)
		if err != nil {
			t.Fatalf("waiting for a healthy STATUS after the address came back: %v", err)
		}
		if naming(m) {
			statuses++
		}
		if st, _ := m.value("STATUS"); strings.HasPrefix(st, "serving") {
			if !m.has("WATCHDOG=1") {
				t.Errorf("the message that says healthy again does not ping: %q", m.lines)
			}
			break
		}
		if m.has("WATCHDOG=1") {
			t.Fatalf("a ping before the healthy STATUS: %q", m.lines)
		}
	}
	if _, err := sock.nextWith(ctx, pid, "WATCHDOG=1"); err != nil {
		t.Fatalf("pings after the address came back: %v", err)
	}
	// The log: one line per change, as STATUS=. The line that says the
	// check passes again is logged after every failure line, so once the
	// last self-check line is that one, all of them are in.
	deadline := time.Now().Add(20 * time.Second)
	for {
		lines := gwB.LogsContaining("self-check")
		if n := len(lines); n > 0 && strings.Contains(lines[n-1], "self-check passes again") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no \"self-check passes again\" after the failures:\n%s", strings.Join(lines, "\n"))
		}
		select {
		case <-gwB.Exited():
			t.Fatal("node B's gateway exited")
		case <-time.After(50 * time.Millisecond):
		}
	}
	if n := len(gwB.LogsContaining("does not accept")); n != statuses {
		t.Errorf("%d log lines of the listener's failure, %d STATUS= lines: want one of each per change:\n%s",
			n, statuses, strings.Join(gwB.LogsContaining("self-check"), "\n"))
	}
	t.Logf("the listener's failure: %d change(s), logged and reported once each", statuses)
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
