package gateway

import (
	"errors"
	"fmt"
	"net"
	"os"
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
