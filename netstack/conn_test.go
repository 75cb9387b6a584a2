package netstack_test

import (
	"errors"
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/meshtun/meshtun/netstack"
)

// waitReadTests are the events that end a WaitRead, for TestWaitRead and
// TestChanWaitRead.
var waitReadTests = []struct {
	name string
	// wake makes the waiting WaitRead return: from the client, or by
	// closing the server's Conn.
	wake func(client io.WriteCloser, server *netstack.Conn)
	// want is what the server's Read returns afterwards.
	want string
	eof  bool
}{
	{"data", func(c io.WriteCloser, _ *netstack.Conn) { c.Write([]byte("ping")) }, "ping", false},
	{"FIN", func(c io.WriteCloser, _ *netstack.Conn) { c.Close() }, "", true},
	{"Close", func(_ io.WriteCloser, s *netstack.Conn) { s.Close() }, "", false},
}

// TestWaitRead: WaitRead blocks while the client is silent and returns on
// data, on the client's FIN, and when the Conn is closed under it; it
// consumes nothing.
func TestWaitRead(t *testing.T) {
	for _, fam := range families {
		for _, tt := range waitReadTests {
			t.Run(fam.name+"/"+tt.name, func(t *testing.T) {
				conns := make(chan *netstack.Conn, 1)
				done := make(chan struct{})
				e := setup(t, netstack.Options{Handler: func(r *netstack.Request) {
					c, err := r.Accept()
					if err != nil {
						t.Errorf("Accept: %v", err)
						close(conns)
						return
					}
					defer c.Close()
					conns <- c
					<-done
				}})
				defer close(done)
				c, err := e.dial(fam.dst)
				if err != nil {
					t.Fatalf("dial: %v", err)
				}
				defer c.Close()
				s := <-conns
				if s == nil {
					t.Fatal("no connection")
				}
				checkWaitRead(t, c, s, tt.wake, tt.want, tt.eof)
			})
		}
	}
}

// checkWaitRead starts a WaitRead on s, checks it blocks until wake, and
// that the Read after it returns want, or EOF, or else an error.
func checkWaitRead(t *testing.T, c io.WriteCloser, s *netstack.Conn, wake func(io.WriteCloser, *netstack.Conn), want string, eof bool) {
	t.Helper()
	waited := make(chan error, 1)
	go func() { waited <- s.WaitRead() }()
	// WaitRead must still be blocked: nothing happened yet. (This can
	// only catch a WaitRead that returns early, not prove it never does;
	// the wake below is the real check.)
	select {
	case err := <-waited:
		t.Fatalf("WaitRead returned %v before any event", err)
	case <-time.After(50 * time.Millisecond):
	}
	wake(c, s)
	select {
	case err := <-waited:
		if err != nil {
			t.Fatalf("WaitRead: %v", err)
		}
	case <-time.After(ioTimeout):
		t.Fatalf("WaitRead still blocked %v after the event", ioTimeout)
	}
	s.SetReadDeadline(time.Now().Add(ioTimeout))
	buf := make([]byte, 16)
	n, err := s.Read(buf)
	switch {
	case want != "":
		if err != nil || string(buf[:n]) != want {
			t.Fatalf("Read after WaitRead = %q, %v; want %q", buf[:n], err, want)
		}
	case eof:
		if err != io.EOF {
			t.Fatalf("Read after FIN = %d, %v; want EOF", n, err)
		}
	default:
		if err == nil {
			t.Fatalf("Read after Close returned %d bytes and no error", n)
		}
	}
}

// TestConnReset: Reset sends a RST: the client's Read fails with
// ECONNRESET instead of seeing a FIN.
func TestConnReset(t *testing.T) {
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			e := setup(t, netstack.Options{Handler: func(r *netstack.Request) {
				c, err := r.Accept()
				if err != nil {
					t.Errorf("Accept: %v", err)
					return
				}
				// Reset only once the client is connected and has spoken:
				// a RST racing the end of its connect() would fail the
				// dial instead of the Read.
				c.SetDeadline(time.Now().Add(ioTimeout))
				if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
					t.Errorf("server read: %v", err)
				}
				if err := c.Reset(); err != nil {
					t.Errorf("Reset: %v", err)
				}
				if err := c.Close(); err != nil {
					t.Errorf("Close after Reset: %v", err)
				}
			}})
			c, err := e.dial(fam.dst)
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			defer c.Close()
			if _, err := c.Write([]byte("x")); err != nil {
				t.Fatalf("client write: %v", err)
			}
			_, err = c.Read(make([]byte, 1))
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("client Read after Reset: %v; want ECONNRESET", err)
			}
		})
	}
}
