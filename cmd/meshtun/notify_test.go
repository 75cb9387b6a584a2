package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// notifySocket is a stand-in for systemd's notification socket: a unix
// datagram socket that receives the sender's credentials with every
// message (SO_PASSCRED), as systemd's does, so a test can tell whose
// message it got.
type notifySocket struct {
	conn *net.UnixConn
	name string // as NOTIFY_SOCKET spells it
}

func listenNotify(t *testing.T, name string) *notifySocket {
	t.Helper()
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 1) }); err != nil || serr != nil {
		t.Fatalf("SO_PASSCRED: %v %v", err, serr)
	}
	return &notifySocket{conn: c, name: name}
}

// notifyMsg is one datagram: its lines and the sender's pid.
type notifyMsg struct {
	pid   int
	lines []string
}

func (m notifyMsg) has(line string) bool {
	for _, l := range m.lines {
		if l == line {
			return true
		}
	}
	return false
}

func (m notifyMsg) value(key string) (string, bool) {
	for _, l := range m.lines {
		if v, ok := strings.CutPrefix(l, key+"="); ok {
			return v, true
		}
	}
	return "", false
}

// next reads the next message from pid (0: anyone), skipping others, until
// ctx ends.
func (s *notifySocket) next(ctx context.Context, pid int) (notifyMsg, error) {
	buf, oob := make([]byte, 4096), make([]byte, unix.CmsgSpace(unix.SizeofUcred))
	for {
		dl, ok := ctx.Deadline()
		if !ok {
			dl = time.Now().Add(30 * time.Second)
		}
		s.conn.SetReadDeadline(dl)
		n, oobn, _, _, err := s.conn.ReadMsgUnix(buf, oob)
		if err != nil {
			return notifyMsg{}, err
		}
		m := notifyMsg{lines: strings.Split(strings.TrimRight(string(buf[:n]), "\n"), "\n")}
		if cms, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil && len(cms) > 0 {
			if cred, err := unix.ParseUnixCredentials(&cms[0]); err == nil {
				m.pid = int(cred.Pid)
			}
		}
		if pid == 0 || m.pid == pid {
			return m, nil
		}
	}
}

// nextWith reads messages from pid until one has line.
func (s *notifySocket) nextWith(ctx context.Context, pid int, line string) (notifyMsg, error) {
	for {
		m, err := s.next(ctx, pid)
		if err != nil {
			return m, fmt.Errorf("waiting for %q: %w", line, err)
		}
		if m.has(line) {
			return m, nil
		}
	}
}

func TestNotifier(t *testing.T) {
	for _, tc := range []struct{ name, socket string }{
		{"path", filepath.Join(t.TempDir(), "notify")},
		{"abstract", fmt.Sprintf("@meshtun-test-%d", os.Getpid())},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := listenNotify(t, tc.socket)
			t.Setenv("NOTIFY_SOCKET", tc.socket)
			n, err := newNotifier()
			if err != nil || n == nil {
				t.Fatalf("newNotifier: %v, %v", n, err)
			}
			defer n.Close()
			// The sequence cmdRun sends: ready, one reload, the drain.
			seq := [][]string{
				{"READY=1", "STATUS=serving"},
				{"RELOADING=1", monotonicUsec()},
				{"READY=1"},
				{"STOPPING=1"},
			}
			for _, lines := range seq {
				if err := n.send(lines...); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var prevUsec string
			for i, want := range seq {
				m, err := sock.next(ctx, 0)
				if err != nil {
					t.Fatalf("message %d: %v", i, err)
				}
				if m.pid != os.Getpid() {
					t.Errorf("message %d from pid %d, want ours %d", i, m.pid, os.Getpid())
				}
				if m.has("RELOADING=1") {
					v, ok := m.value("MONOTONIC_USEC")
					if !ok || v == "0" || v == prevUsec {
						t.Errorf("RELOADING=1 without a fresh MONOTONIC_USEC: %q", m.lines)
					}
					prevUsec = v
				}
				if !m.has(want[0]) || len(m.lines) != len(want) {
					t.Errorf("message %d: %q, want %q", i, m.lines, want)
				}
			}
		})
	}
}

func TestNotifierOff(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	n, err := newNotifier()
	if n != nil || err != nil {
		t.Fatalf("without NOTIFY_SOCKET: %v, %v; want nil, nil", n, err)
	}
	if err := n.send("READY=1"); err != nil || n.Close() != nil {
		t.Fatal("a nil notifier must do nothing")
	}
	t.Setenv("NOTIFY_SOCKET", "vsock:2:1234")
	if _, err := newNotifier(); err == nil {
		t.Fatal("an unsupported NOTIFY_SOCKET was accepted")
	}
	t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "nobody-listens"))
	if _, err := newNotifier(); !errors.Is(err, unix.ENOENT) {
		t.Fatalf("a socket nobody listens on: %v, want ENOENT", err)
	}
}
