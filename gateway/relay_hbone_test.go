package gateway

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"io"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshtun/meshtun/internal/tcptest"
)

// halfCloseTarget accepts one connection at a time: it reads the request
// to EOF, reports its hash, then answers with reply and closes.
func halfCloseTarget(t *testing.T, reply []byte) (net.Listener, <-chan [32]byte) {
	got := make(chan [32]byte, 1)
	ln := oneConnTarget(t, func(c *net.TCPConn) {
		h := sha256.New()
		if _, err := io.Copy(h, c); err != nil {
			return
		}
		var sum [32]byte
		copy(sum[:], h.Sum(nil))
		got <- sum
		c.Write(reply)
		c.CloseWrite()
	})
	return ln, got
}

// oneConnTarget listens on loopback and hands the first connection to
// serve, then closes it; the listener closes when the test ends.
func oneConnTarget(t *testing.T, serve func(c *net.TCPConn)) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		serve(c.(*net.TCPConn))
	}()
	return ln
}

// The relay over real HBONE streams, both ways: app ⇄ [relay] ⇄ client
// stream ⇒ gateway's inbound ⇒ server stream ⇄ [relay] ⇄ target. Both
// streams hand their received data to the relay with WriteBufferedTo.
// Sizes beyond the 4 MiB stream window need the credit to come back as the
// relay consumes; the request's EOF must become the target's FIN while the
// reply still flows; the live counters must count every byte.
func TestRelayOverHBONE(t *testing.T) {
	for _, size := range []int{0, 1, relaySmallSize, relayBufSize + 5, 9 << 20} {
		e := newReloadEnv(t, "")
		req := make([]byte, size)
		rand.Read(req)
		reply := make([]byte, size/2+7)
		rand.Read(reply)
		ln, gotReq := halfCloseTarget(t, reply)
		stream, err := e.connect(ln.Addr().(*net.TCPAddr).AddrPort())
		if err != nil {
			t.Fatal(err)
		}
		app, a := tcptest.Pair(t)
		var up, down liveCount
		done := make(chan relayResult, 1)
		startRelay(a, stream, relayCounters{aToB: &up, bToA: &down}, func(r relayResult) { done <- r })

		go func() { app.Write(req); app.CloseWrite() }()
		app.SetReadDeadline(time.Now().Add(30 * time.Second))
		back, err := io.ReadAll(app)
		if err != nil {
			t.Fatalf("size %d: app read: %v", size, err)
		}
		select {
		case sum := <-gotReq:
			if sum != sha256.Sum256(req) {
				t.Fatalf("size %d: request corrupted", size)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("size %d: target never saw the request's end", size)
		}
		if !bytes.Equal(back, reply) {
			t.Fatalf("size %d: reply corrupted: got %d bytes, want %d", size, len(back), len(reply))
		}
		select {
		case r := <-done:
			if r.Err != nil || r.AToB != int64(size) || r.BToA != int64(len(reply)) {
				t.Fatalf("size %d: relay result %+v", size, r)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("size %d: relay did not end", size)
		}
		if up.Load() != uint64(size) || down.Load() != uint64(len(reply)) {
			t.Fatalf("size %d: live counts %d/%d, want %d/%d", size, up.Load(), down.Load(), size, len(reply))
		}
		if n := relayBufsOut.Load(); n != 0 {
			t.Fatalf("size %d: %d pooled relay buffers out after the relay", size, n)
		}
	}
}

// A reset on the target's side reaches the app as a reset through both
// HBONE hops: the server stream's relay resets the stream, the client
// stream's WriteBufferedTo returns the reset, and our relay resets the app.
func TestRelayOverHBONEReset(t *testing.T) {
	e := newReloadEnv(t, "")
	ln := oneConnTarget(t, func(c *net.TCPConn) {
		buf := make([]byte, 5)
		io.ReadFull(c, buf)
		c.SetLinger(0) // the deferred Close sends a RST
	})
	stream, err := e.connect(ln.Addr().(*net.TCPAddr).AddrPort())
	if err != nil {
		t.Fatal(err)
	}
	app, a := tcptest.Pair(t)
	done := make(chan relayResult, 1)
	startRelay(a, stream, relayCounters{}, func(r relayResult) { done <- r })
	if _, err := app.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.Err == nil {
			t.Fatalf("relay ended cleanly after the target's reset: %+v", r)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("relay did not end after the target's reset")
	}
	app.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := app.Read(make([]byte, 1)); err == nil || err == io.EOF {
		t.Fatalf("app read after the target's reset: %v, want a reset", err)
	}
}

// A ping-pong of small messages through both relays: each echo goes from
// the HBONE reader straight into the app's and the target's sockets (run
// to completion, see copyBuffered), and the live counters and the relay's
// result still count every byte exactly once.
func TestRelayOverHBONEPingPong(t *testing.T) {
	e := newReloadEnv(t, "")
	ln := oneConnTarget(t, func(c *net.TCPConn) {
		io.Copy(c, c)
		c.CloseWrite()
	})
	stream, err := e.connect(ln.Addr().(*net.TCPAddr).AddrPort())
	if err != nil {
		t.Fatal(err)
	}
	app, a := tcptest.Pair(t)
	var up, down liveCount
	done := make(chan relayResult, 1)
	startRelay(a, stream, relayCounters{aToB: &up, bToA: &down}, func(r relayResult) { done <- r })

	const rounds, size = 300, 100
	app.SetDeadline(time.Now().Add(30 * time.Second))
	msg, back := make([]byte, size), make([]byte, size)
	for i := range rounds {
		rand.Read(msg)
		if _, err := app.Write(msg); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if _, err := io.ReadFull(app, back); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if !bytes.Equal(msg, back) {
			t.Fatalf("round %d: echo corrupted", i)
		}
	}
	checkNoDelay(t)
	app.CloseWrite()
	if n, err := app.Read(back); err != io.EOF {
		t.Fatalf("after the last round: read %d bytes, %v; want io.EOF", n, err)
	}
	select {
	case r := <-done:
		if r.Err != nil || r.AToB != rounds*size || r.BToA != rounds*size {
			t.Fatalf("relay result %+v, want %d bytes each way", r, rounds*size)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("relay did not end")
	}
	if up.Load() != rounds*size || down.Load() != rounds*size {
		t.Fatalf("live counts %d/%d, want %d each way", up.Load(), down.Load(), rounds*size)
	}
}

// checkNoDelay fails the test unless every connected TCP socket of this
// process has Nagle off (TCP_NODELAY): the HBONE connection's both ends,
// the dial to the target, the target's and the app's sockets. Go sets it
// on every TCP connection it makes; this pins it, since Nagle with a
// delayed ACK costs ≈ 40 ms per exchange (ztunnel lost that once).
func checkNoDelay(t *testing.T) {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, e := range fds {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE); err != nil || typ != unix.SOCK_STREAM {
			continue // not a socket (or gone), or not a stream socket
		}
		if _, err := unix.Getpeername(fd); err != nil {
			continue // a listener
		}
		sa, err := unix.Getsockname(fd)
		if err != nil {
			continue
		}
		switch sa.(type) {
		case *unix.SockaddrInet4, *unix.SockaddrInet6:
		default:
			continue // a Unix socket
		}
		v, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY)
		if err != nil {
			continue
		}
		if v == 0 {
			t.Errorf("TCP socket fd %d has Nagle on (TCP_NODELAY 0)", fd)
		}
		checked++
	}
	// app ⇄ relay (2), gateway → HBONE server (2), inbound → target (2).
	if checked < 6 {
		t.Fatalf("checked %d connected TCP sockets, want at least the 6 of the flow", checked)
	}
}
