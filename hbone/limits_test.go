package hbone

import (
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// waitStats polls the server's stats until cond holds (bounded).
func waitStats(t *testing.T, s *Server, what string, cond func(ServerStats) bool) ServerStats {
	t.Helper()
	deadline := time.Now().Add(srvTestWait)
	for st := s.Stats(); ; st = s.Stats() {
		if cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: stats %+v after %v", what, st, srvTestWait)
		}
		time.Sleep(5 * time.Millisecond) // polling the counters, bounded
	}
}

// awaitClosed reads c until the server closes it, and fails if it does
// not within srvTestWait.
func awaitClosed(t *testing.T, c net.Conn, what string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(srvTestWait))
	_, err := io.Copy(io.Discard, c)
	if isTimeout(err) {
		t.Fatalf("%s: still open after %v", what, srvTestWait)
	}
}

// Past MaxConns, connections are closed as soon as they are accepted,
// and counted; one closing makes room again.
func TestServerMaxConns(t *testing.T) {
	const max, over = 5, 50
	e := newSrvTest(t, srvEcho, func(o *ServerOptions) { o.MaxConns = max })
	var held []*http2.ClientConn
	for range max {
		cc := e.client()
		if _, err := srvConnect(t, cc, srvTestTarget); err != nil {
			t.Fatal(err)
		}
		held = append(held, cc)
	}
	waitStats(t, e.srv, "the first connections", func(st ServerStats) bool { return st.ConnsOpen == max })
	for i := range over {
		c, err := net.DialTimeout("tcp", e.addr, srvTestWait)
		if err != nil {
			t.Fatal(err)
		}
		// Closed before any TLS: the server never answers a ClientHello.
		c.Write([]byte{0x16, 0x03, 0x01})
		awaitClosed(t, c, "a connection over the limit")
		c.Close()
		if i == 0 {
			if _, err := srvConnect(t, held[0], srvTestTarget); err != nil {
				t.Fatalf("a held connection stopped serving at the limit: %v", err)
			}
		}
	}
	st := e.srv.Stats()
	if st.ConnsRefused != over || st.ConnsAccepted != max {
		t.Fatalf("stats %+v: want %d refused, %d accepted", st, over, max)
	}
	held[0].Close()
	waitStats(t, e.srv, "a held connection's close", func(st ServerStats) bool { return st.ConnsOpen < max })
	cn, err := srvConnect(t, e.client(), srvTestTarget)
	if err != nil || cn.resp.StatusCode != http.StatusOK {
		t.Fatalf("a new connection once below the limit: %v", err)
	}
}

// A ClientHello sent a byte at a time is cut off at HandshakeTimeout, and
// counted as a failed handshake.
func TestServerSlowClientHello(t *testing.T) {
	e := newSrvTest(t, srvEcho, func(o *ServerOptions) { o.HandshakeTimeout = 300 * time.Millisecond })
	c, err := net.DialTimeout("tcp", e.addr, srvTestWait)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// A TLS handshake record announcing 512 bytes, then its body a byte at
	// a time: the server never has a whole ClientHello.
	hello := append([]byte{0x16, 0x03, 0x01, 0x02, 0x00}, make([]byte, 512)...)
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		awaitClosed(t, c, "a slow ClientHello")
	}()
	sent := 0
trickle:
	for ; sent < len(hello); sent++ {
		if _, err := c.Write(hello[sent : sent+1]); err != nil {
			break
		}
		select {
		case <-closed:
			break trickle
		case <-time.After(20 * time.Millisecond): // the attacker's pace
		}
	}
	<-closed
	if sent == len(hello) {
		t.Fatalf("the server waited for all %d bytes", len(hello))
	}
	waitStats(t, e.srv, "the failed handshake", func(st ServerStats) bool { return st.HandshakeFailures == 1 })
	t.Logf("closed after %d of %d bytes", sent, len(hello))
}

// A client that completes TLS and the HTTP/2 preface but never sends
// HEADERS is closed at HandshakeTimeout; one that sent its CONNECT in
// time is served past it.
func TestServerNoRequestClosed(t *testing.T) {
	e := newSrvTest(t, srvEcho, func(o *ServerOptions) { o.HandshakeTimeout = 300 * time.Millisecond })
	cc := e.client()
	cn, err := srvConnect(t, cc, srvTestTarget)
	if err != nil || cn.resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT: %v", err)
	}
	idle := e.dialRaw() // preface and SETTINGS, then nothing
	idle.tc.SetReadDeadline(time.Now().Add(srvTestWait))
	for {
		if _, err := idle.fr.ReadFrame(); err != nil {
			if isTimeout(err) {
				t.Fatal("a connection without a request outlived the handshake timeout")
			}
			break
		}
	}
	waitStats(t, e.srv, "the idle connection", func(st ServerStats) bool { return st.HandshakeFailures == 1 })
	// The connection with a stream was opened before the idle one, so
	// its deadline has passed too: it must still echo.
	go func() { cn.body.Write([]byte("past the deadline")); cn.body.Close() }()
	got, err := io.ReadAll(cn.resp.Body)
	if err != nil || string(got) != "past the deadline" {
		t.Fatalf("echo on the connection that sent its request in time: %q, %v", got, err)
	}
	if cn2, err := srvConnect(t, cc, srvTestTarget); err != nil || cn2.resp.StatusCode != http.StatusOK {
		t.Fatalf("a second CONNECT on it: %v", err)
	}
}
