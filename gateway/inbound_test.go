package gateway

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// A CONNECT to one of the peer gateway's own ports on one of its own
// addresses is answered 503 before any dial, because it would loop back
// into the gateway; the port really listens, so only the check stands
// between the stream and a connection.
func TestInboundOwnPortRefused(t *testing.T) {
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	own := ln.Addr().(*net.TCPAddr).AddrPort()
	e := newOutboundEnv(t, fmt.Sprintf("[admin]\nreadiness = %q\n", own.String()))

	r := newFakeRequest(t, own)
	e.a.serveOutbound(r)
	if acc, rej := r.decisions(); acc != 0 || rej != 1 {
		t.Fatalf("%d accepts, %d rejects; want 0, 1", acc, rej)
	}
	wantIn(t, accessLine(t, e.aLogs, own), "direction=outbound", "response_flags=CONNECT", "CONNECT refused: 503")
	wantIn(t, accessLine(t, e.logs, own), "direction=inbound", "response_flags=CONNECT", "own ports")

	// A dial would have finished before B logged the flow; a connection it
	// made waits in the listener's backlog, and Accept returns it at once.
	ln.SetDeadline(time.Now().Add(200 * time.Millisecond))
	if c, err := ln.Accept(); err == nil {
		c.Close()
		t.Error("the gateway's own port saw a connection")
	} else if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("accept: %v, want a deadline", err)
	}
}

// While draining, a new inbound stream is refused with 503 before it
// becomes a flow: no dial, no access-log line; the next one, the drain
// over, goes through.
func TestInboundDraining(t *testing.T) {
	e := newReloadEnv(t, "")
	target := echo(t)
	e.g.draining.Store(true)
	if s, err := e.connect(target); err == nil {
		s.Close()
		t.Fatal("a CONNECT while draining was accepted")
	} else if !strings.Contains(err.Error(), "503") {
		t.Errorf("a CONNECT while draining: %v, want a 503", err)
	}
	if n := len(e.logs.lines("connection complete")); n != 0 {
		t.Errorf("%d access-log lines for a stream refused while draining, want 0", n)
	}
	e.g.draining.Store(false)
	s, err := e.connect(target)
	if err != nil {
		t.Fatalf("a CONNECT once the drain is over: %v", err)
	}
	defer s.Close()
	if err := ping(s, "after"); err != nil {
		t.Fatal(err)
	}
}
