package main

import (
	"errors"
	"os"
	"strconv"
	"testing"
	"time"
)

func TestWatchdogInterval(t *testing.T) {
	self := strconv.Itoa(os.Getpid())
	for _, tc := range []struct {
		usec, pid string
		want      time.Duration
		wantErr   bool
	}{
		{"", "", 0, false},
		{"30000000", "", 30 * time.Second, false},
		{"30000000", self, 30 * time.Second, false},
		{"30000000", strconv.Itoa(os.Getpid() + 1), 0, false}, // another process's
		{"0", "", 0, true},
		{"-5", "", 0, true},
		{"30s", "", 0, true},
		{"30000000", "me", 0, true},
	} {
		t.Setenv("WATCHDOG_USEC", tc.usec)
		t.Setenv("WATCHDOG_PID", tc.pid)
		got, err := watchdogInterval()
		if got != tc.want || (err != nil) != tc.wantErr {
			t.Errorf("WATCHDOG_USEC=%q WATCHDOG_PID=%q: %v, %v; want %v, error %v", tc.usec, tc.pid, got, err, tc.want, tc.wantErr)
		}
	}
}

// TestWatchdogResult: a ping only after a passing check; STATUS= and the
// log line only when the state changes (another failure is a change).
func TestWatchdogResult(t *testing.T) {
	w := &watchdog{interval: 30 * time.Second}
	if w.period() != 15*time.Second || w.timeout() != maxCheckTimeout {
		t.Errorf("period %v, timeout %v", w.period(), w.timeout())
	}
	if (&watchdog{interval: 2 * time.Second}).timeout() != 500*time.Millisecond {
		t.Error("a short interval's check must end within a quarter of it")
	}
	wedged := errors.New("netstack: probe: no answer from the stack")
	gone := errors.New("tun meshtun0: link is down")
	steps := []struct {
		err     error
		ping    bool
		changed bool
		status  string
	}{
		{nil, true, false, "serving"},
		{nil, true, false, "serving"},
		{wedged, false, true, "UNHEALTHY, not pinging the watchdog: netstack: probe: no answer from the stack; serving"},
		{wedged, false, false, "UNHEALTHY, not pinging the watchdog: netstack: probe: no answer from the stack; serving"},
		{gone, false, true, "UNHEALTHY, not pinging the watchdog: tun meshtun0: link is down; serving"},
		{nil, true, true, "serving"},
	}
	for i, s := range steps {
		lines, changed := w.result(s.err)
		ping := len(lines) == 1 && lines[0] == "WATCHDOG=1"
		if ping != s.ping || (!s.ping && len(lines) != 0) || changed != s.changed || w.status("serving") != s.status {
			t.Errorf("step %d: lines %q changed %v status %q; want ping %v changed %v status %q", i, lines, changed, w.status("serving"), s.ping, s.changed, s.status)
		}
	}
	var off *watchdog
	if off.status("serving") != "serving" {
		t.Error("without a watchdog the status is the gateway's")
	}
}
