package gateway

import (
	"io"
	"net/netip"
	"testing"
	"time"
)

// withFlowsPerSource reloads g with gateway.max_flows_per_source = max
// (a key a reload applies).
func withFlowsPerSource(t *testing.T, g *Gateway, max int) {
	t.Helper()
	c := *g.snapshot().cfg
	c.Gateway.MaxFlowsPerSource = max
	if _, _, err := g.Reload(&c); err != nil {
		t.Fatal(err)
	}
}

// endFlow half-closes the application's side of r and reads the echo to
// EOF: the flow is over on both gateways.
func endFlow(t *testing.T, r *fakeRequest) {
	t.Helper()
	r.app.SetDeadline(time.Now().Add(10 * time.Second))
	if err := r.app.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(r.app); err != nil {
		t.Fatal(err)
	}
}

// Outbound, past gateway.max_flows_per_source from one application
// address: a RST, logged OVERFLOW and counted, before any dial; another
// source is not affected, and the place comes back when a flow ends.
func TestOutboundFlowsPerSource(t *testing.T) {
	e := newOutboundEnv(t, "")
	withFlowsPerSource(t, e.a, 1)
	first, _, overTarget := oneFlowThenOver(t, e)
	wantIn(t, accessLine(t, e.aLogs, overTarget), "[WARN]", "direction=outbound", "response_flags=OVERFLOW",
		"dst.hbone_addr=-", "gateway.max_flows_per_source")
	if n := e.a.flows.refusedOverLimit(outbound); n != 1 {
		t.Errorf("%d flows counted over the limit, want 1", n)
	}

	other := newFakeRequest(t, echo(t))
	other.src = netip.MustParseAddrPort("10.0.0.8:41000")
	e.a.serveOutbound(other)
	if acc, _ := other.decisions(); acc != 1 {
		t.Fatal("a flow from another source was refused")
	}

	endFlow(t, first)
	accessLine(t, e.aLogs, first.dst) // the first flow is over on A
	waitFlowsAtMost(t, &e.a.flows, outbound, 1)
	again := newFakeRequest(t, echo(t))
	e.a.serveOutbound(again)
	if acc, _ := again.decisions(); acc != 1 {
		t.Fatal("a flow from the first source was refused after its other flow ended")
	}
	endFlow(t, other)
	endFlow(t, again)
}

// Inbound, the source is the client the peer forwarded: past the limit,
// 503 before any dial, logged OVERFLOW on the receiving gateway.
func TestInboundFlowsPerSource(t *testing.T) {
	e := newOutboundEnv(t, "")
	withFlowsPerSource(t, e.g, 1)
	first, over, overTarget := oneFlowThenOver(t, e)
	wantIn(t, accessLine(t, e.aLogs, overTarget), "direction=outbound", "response_flags=CONNECT", "503")
	wantIn(t, accessLine(t, e.logs, overTarget), "direction=inbound", "response_flags=OVERFLOW",
		"src.addr="+over.src.String(), "gateway.max_flows_per_source")
	if n := e.g.flows.refusedOverLimit(inbound); n != 1 {
		t.Errorf("%d inbound flows counted over the limit, want 1", n)
	}
	endFlow(t, first)
}

// oneFlowThenOver opens one flow through gateway A, accepted and left
// open, then a second from the same source, which must be refused (a RST
// to the application): the two flows, and the second one's target.
func oneFlowThenOver(t *testing.T, e *outboundEnv) (first, over *fakeRequest, overTarget netip.AddrPort) {
	t.Helper()
	first = newFakeRequest(t, echo(t))
	e.a.serveOutbound(first)
	if acc, _ := first.decisions(); acc != 1 {
		t.Fatal("the first flow was not accepted")
	}
	overTarget = echo(t)
	over = newFakeRequest(t, overTarget)
	e.a.serveOutbound(over)
	if acc, rej := over.decisions(); acc != 0 || rej != 1 {
		t.Fatalf("a second flow from %s: %d accepts, %d rejects; want a RST", over.src, acc, rej)
	}
	return first, over, overTarget
}

// waitFlowsAtMost waits until at most n flows of direction are open (a
// flow's line is logged just before it leaves the table).
func waitFlowsAtMost(t *testing.T, ft *flowTable, direction string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for ft.open(direction) > n {
		if time.Now().After(deadline) {
			t.Fatalf("%d %s flows open after 10s, want at most %d", ft.open(direction), direction, n)
		}
		time.Sleep(5 * time.Millisecond) // polling the table, bounded
	}
}
