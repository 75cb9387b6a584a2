package main

import (
	"fmt"
	"net"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// notifier speaks systemd's notify protocol (sd_notify(3)): newline
// separated KEY=VALUE lines, one datagram per message, sent to the unix
// socket named by $NOTIFY_SOCKET. With Type=notify (the shipped unit,
// systemd 249+), systemd waits for READY=1 before it counts the service
// as started; a reload (SIGHUP, from ExecReload=, or from systemd itself
// with the Type=notify-reload drop-in of 253+) is answered with
// RELOADING=1 (stamped with MONOTONIC_USEC) and the READY=1 that ends it;
// STOPPING=1 starts the drain; WATCHDOG=1 feeds WatchdogSec= (watchdog.go);
// STATUS= lines say what the gateway is doing.
//
// It is written here rather than taken from go-systemd: it is about forty
// lines, and the module proxy available to this project does not serve
// go-systemd.
//
// A nil *notifier (no $NOTIFY_SOCKET: not started by systemd, or by a
// unit without Type=notify*) does nothing.
type notifier struct {
	conn *net.UnixConn
}

// newNotifier connects to $NOTIFY_SOCKET: a path, or an abstract socket
// name written with a leading '@' (Go's net package maps that to the
// leading NUL byte of Linux abstract names). It returns nil, nil when the
// variable is unset.
func newNotifier() (*notifier, error) {
	name := os.Getenv("NOTIFY_SOCKET")
	if name == "" {
		return nil, nil
	}
	if !strings.HasPrefix(name, "/") && !strings.HasPrefix(name, "@") {
		return nil, fmt.Errorf("NOTIFY_SOCKET=%q: only unix socket paths and @abstract names are supported", name)
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		return nil, fmt.Errorf("NOTIFY_SOCKET: %w", err)
	}
	return &notifier{conn: c}, nil
}

// send sends one message made of lines ("READY=1", "STATUS=…").
func (n *notifier) send(lines ...string) error {
	if n == nil {
		return nil
	}
	_, err := n.conn.Write([]byte(strings.Join(lines, "\n") + "\n"))
	return err
}

// Close closes the socket; safe on nil.
func (n *notifier) Close() error {
	if n == nil {
		return nil
	}
	return n.conn.Close()
}

// monotonicUsec is the MONOTONIC_USEC=… line that must accompany
// RELOADING=1: CLOCK_MONOTONIC in microseconds, so systemd can tell this
// reload from an earlier one.
func monotonicUsec() string {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return "MONOTONIC_USEC=0"
	}
	return fmt.Sprintf("MONOTONIC_USEC=%d", ts.Nano()/1000)
}
