package gateway

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/meshtun/meshtun/hbone"
)

// handleInbound serves one CONNECT stream that hbone.Server accepted and
// parsed: check the target, authorize the connection, dial the target,
// answer 200 only once the dial succeeded, then relay.
func (g *Gateway) handleInbound(r *hbone.Request) {
	g.flows.begin()
	target := r.Target()
	fl := &flowLog{direction: inbound, srcIdentity: r.PeerIdentity(), dst: target, dstIdentity: g.identity, start: time.Now()}
	fl.src = inboundSource(r)
	fl.traceID = r.TraceID()
	defer g.endUnlessRelayed(fl)
	fl.openMetrics(g.metrics, g.inboundLabels(r, fl.src))

	snap := g.snapshot() // this stream's config and policies; a reload re-checks it once relayed
	if status, err := g.checkInbound(snap, target); err != nil {
		r.Reject(status)
		fl.flag = flagConnect
		fl.err = err
		return
	}
	// Authorization before the dial: a denied client must not even make
	// the target see a connection attempt.
	ac := AuthzConn{Identity: r.PeerIdentity(), Src: fl.src.Addr(), Dst: target}
	if d := snap.authz.Authorize(ac); !d.Allow {
		r.Reject(http.StatusUnauthorized)
		fl.flag = flagDeny
		fl.err = fmt.Errorf("authorization: %s", d.Reason)
		return
	}
	d := net.Dialer{Timeout: g.cfg.HBONE.ConnectTimeout.Duration}
	tc, err := d.DialContext(r.Context(), "tcp", target.String())
	if err != nil {
		r.Reject(http.StatusServiceUnavailable)
		fl.flag = flagConnect
		fl.err = fmt.Errorf("dial target: %w", err)
		return
	}
	s, err := r.Accept()
	if err != nil {
		tc.Close()
		fl.err = err
		return
	}
	open := g.trackInbound(snap, ac, s, tc.(*net.TCPConn))
	g.relay(fl, s, tc.(*net.TCPConn), func(relayResult) {
		g.untrackInbound(open)
		if err := open.deniedErr(); err != nil {
			fl.flag, fl.err = flagDeny, err
		}
	})
}

// checkInbound decides whether a CONNECT target may be served, and with
// which status it is refused if not.
func (g *Gateway) checkInbound(snap *snapshot, target netip.AddrPort) (int, error) {
	addr := target.Addr().Unmap()
	served := false
	for _, p := range snap.cfg.HBONE.Serve {
		if p.Contains(addr) {
			served = true
			break
		}
	}
	if !served {
		return http.StatusServiceUnavailable, fmt.Errorf("target %s is not in hbone.serve", target)
	}
	if g.isOwnListener(target) {
		return http.StatusServiceUnavailable, fmt.Errorf("target %s is one of this gateway's own ports", target)
	}
	return 0, nil
}

// inboundSource is the client of an inbound stream: the forwarded for=
// address when the peer sent one, else the HBONE peer's own address (see
// authz.go for why forwarded is trusted).
func inboundSource(r *hbone.Request) netip.AddrPort {
	if ap := r.ForwardedFor(); ap.IsValid() {
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	if ta, ok := r.RemoteAddr().(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}
