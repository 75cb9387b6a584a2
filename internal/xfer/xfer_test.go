package xfer

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

func TestRoundTrip(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { Serve(l); close(done) }()
	t.Cleanup(func() { l.Close(); <-done })
	for _, sz := range []int64{0, 1, 7, 9, 1 << 20, 3<<20 + 5} {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		r, err := Run(c, sz, sz/3+1)
		if err != nil {
			t.Fatalf("size %d: %v", sz, err)
		}
		if r.Sent != sz || r.Received != sz/3+1 {
			t.Fatalf("size %d: result %+v", sz, r)
		}
	}
}

// A server that corrupts the data must be caught.
func TestDetectsCorruption(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 8+100)
		n := 0
		for n < len(buf) {
			k, err := c.Read(buf[n:])
			if err != nil {
				break
			}
			n += k
		}
		// A receipt claiming the right length but a wrong hash.
		out := make([]byte, 32+8)
		out[39] = 100
		c.Write(out)
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Run(c, 100, 0); err == nil {
		t.Fatal("corruption not detected")
	}
}

// A reply that never ends (no FIN) fails at the client's deadline, and
// says so in its cause: a caller tells a timeout from a reset by it.
func TestReplyWithoutEOFKeepsItsCause(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	served := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		// Without CloseWrite, ServeConn sends no FIN after the reply.
		ServeConn(struct{ net.Conn }{c})
		served <- c
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(2 * time.Second))
	_, err = Run(c, 100, 100)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a reply without EOF: %v, want a deadline in its cause", err)
	}
	select {
	case s := <-served:
		s.Close()
	case <-time.After(10 * time.Second):
		t.Error("the server never finished its reply")
	}
}
