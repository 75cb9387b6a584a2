package gateway

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// tcpPair returns the two ends of a real loopback TCP connection.
func tcpPair(t *testing.T) (client, server *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() { c, err := ln.Accept(); ch <- res{c, err} }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { c.Close(); r.c.Close() })
	return c.(*net.TCPConn), r.c.(*net.TCPConn)
}

// relayed builds app ⇄ [relay] ⇄ target over real sockets and runs the
// relay in the background; the result arrives on the returned channel.
func relayed(t *testing.T) (app, target *net.TCPConn, done <-chan relayResult) {
	app, a := tcpPair(t)
	b, target := tcpPair(t)
	ch := make(chan relayResult, 1)
	go func() { ch <- relay(a, b) }()
	return app, target, ch
}

func TestRelayHalfClose(t *testing.T) {
	for _, size := range []int{0, 1, 1 << 20, 8 << 20} {
		app, target, done := relayed(t)
		req := make([]byte, size)
		rand.Read(req)
		reply := make([]byte, size/2+3)
		rand.Read(reply)

		// The app sends its request and half-closes; the target reads to
		// EOF, then answers and closes; the app still reads the whole
		// answer.
		go func() { app.Write(req); app.CloseWrite() }()
		got, err := io.ReadAll(target)
		if err != nil {
			t.Fatalf("size %d: target read: %v", size, err)
		}
		if !bytes.Equal(got, req) {
			t.Fatalf("size %d: request corrupted: got %d bytes", size, len(got))
		}
		go func() { target.Write(reply); target.CloseWrite() }()
		back, err := io.ReadAll(app)
		if err != nil {
			t.Fatalf("size %d: app read: %v", size, err)
		}
		if sha256.Sum256(back) != sha256.Sum256(reply) {
			t.Fatalf("size %d: reply corrupted", size)
		}
		r := <-done
		if r.Err != nil || r.AToB != int64(size) || r.BToA != int64(len(reply)) {
			t.Fatalf("size %d: relay result %+v", size, r)
		}
	}
}

func TestRelayHalfCloseMirror(t *testing.T) {
	app, target, done := relayed(t)
	// The target speaks first and closes its write side; the app reads to
	// EOF and only then sends, and the target still receives it.
	if _, err := target.Write([]byte("banner")); err != nil {
		t.Fatal(err)
	}
	target.CloseWrite()
	got, err := io.ReadAll(app)
	if err != nil || string(got) != "banner" {
		t.Fatalf("app read %q, %v", got, err)
	}
	app.Write([]byte("late request"))
	app.CloseWrite()
	got, err = io.ReadAll(target)
	if err != nil || string(got) != "late request" {
		t.Fatalf("target read %q, %v", got, err)
	}
	if r := <-done; r.Err != nil {
		t.Fatalf("relay error: %v", r.Err)
	}
}

func TestRelayResetPropagates(t *testing.T) {
	app, target, done := relayed(t)
	if _, err := app.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1)
	if _, err := io.ReadFull(target, buf); err != nil {
		t.Fatal(err)
	}
	target.SetLinger(0)
	target.Close() // RST towards the relay

	r := <-done
	if r.Err == nil {
		t.Fatalf("relay ended cleanly after a reset")
	}
	app.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := app.Read(buf)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("app read after target reset: %v, want ECONNRESET", err)
	}
}
