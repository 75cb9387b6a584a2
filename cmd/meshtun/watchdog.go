package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"
)

// watchdogInterval is systemd's watchdog timeout for this process, as
// sd_watchdog_enabled(3) reads it: $WATCHDOG_USEC (set with WatchdogSec=
// in the unit), unless $WATCHDOG_PID names another process. 0: no
// watchdog.
func watchdogInterval() (time.Duration, error) {
	v := os.Getenv("WATCHDOG_USEC")
	if v == "" {
		return 0, nil
	}
	usec, err := strconv.ParseUint(v, 10, 63)
	if err != nil || usec == 0 {
		return 0, fmt.Errorf("WATCHDOG_USEC=%q: want a positive number of microseconds", v)
	}
	if p := os.Getenv("WATCHDOG_PID"); p != "" {
		pid, err := strconv.Atoi(p)
		if err != nil {
			return 0, fmt.Errorf("WATCHDOG_PID=%q: not a process id", p)
		}
		if pid != os.Getpid() {
			return 0, nil // meant for another process
		}
	}
	return time.Duration(usec) * time.Microsecond, nil
}

// maxCheckTimeout bounds one self-check. Every part answers within
// milliseconds on a live gateway (a probe through the stack, a loopback
// connect); one that takes seconds is as good as wedged.
const maxCheckTimeout = 5 * time.Second

// watchdog feeds systemd's watchdog from the gateway's self-check
// (Gateway.Check): every half interval (sd_watchdog_enabled(3)'s advice)
// a check runs, bounded by a quarter interval so that its answer comes
// before the next ping is due; WATCHDOG=1 goes out only after a check
// passed. It keeps the last result, so STATUS= can say it.
type watchdog struct {
	interval time.Duration
	check    func(context.Context) error

	failing error // the failure in force; nil while the checks pass
}

// period is how often the check runs and, while it passes, the pings go.
func (w *watchdog) period() time.Duration { return w.interval / 2 }

// timeout bounds one check.
func (w *watchdog) timeout() time.Duration { return min(w.interval/4, maxCheckTimeout) }

// run does one check within its timeout.
func (w *watchdog) run() error {
	ctx, cancel := context.WithTimeout(context.Background(), w.timeout())
	defer cancel()
	return w.check(ctx)
}

// result takes a check's result and returns the lines for systemd:
// WATCHDOG=1 if it passed. changed says that the state changed (from
// passing to failing or back, or to another failure: the problems'
// text), for the caller's one log line and new STATUS= per change.
func (w *watchdog) result(err error) (lines []string, changed bool) {
	was := w.failing
	w.failing = err
	if err == nil {
		return []string{"WATCHDOG=1"}, was != nil
	}
	return nil, was == nil || was.Error() != err.Error()
}

// status is base, the gateway's own STATUS= text, prefixed with the
// self-check's failure while one is in force.
func (w *watchdog) status(base string) string {
	if w == nil || w.failing == nil {
		return base
	}
	return "UNHEALTHY, not pinging the watchdog: " + w.failing.Error() + "; " + base
}
