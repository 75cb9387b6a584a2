package gateway

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"

	"github.com/meshtun/meshtun/hbone"
)

// handleInbound serves one CONNECT stream that hbone.Server accepted and
// parsed: check the target, authorize the connection, dial the target,
// answer 200 only once the dial succeeded, then relay. A stream refused on
// the way is answered with its outcome's status.
func (g *Gateway) handleInbound(r *hbone.Request) {
	// Once the drain has begun (and said so), a new stream is refused
	// before it becomes a flow, as a captured connection is, also in the
	// moment before the HBONE server's shutdown refuses it by itself.
	if g.draining.Load() {
		r.Reject(http.StatusServiceUnavailable)
		return
	}
	f := g.flows.begin(inbound)
	stream, target, o := g.inbound(r, f)
	if stream == nil && o.status != 0 {
		r.Reject(o.status)
	}
	g.carry(f, stream, target, o)
}

// inbound sets flow f up for stream r: it returns the accepted stream and
// the connection to its target, or, when it gets no further, why.
func (g *Gateway) inbound(r *hbone.Request, f *flow) (stream, target conn, o outcome) {
	snap := g.snapshot() // this stream's config and policies; a reload re-checks it once relayed
	dst := r.Target()
	var nameErr error
	if name := r.TargetName(); name != "" {
		dst, nameErr = nameTarget(snap, name, r.LocalAddr())
	}
	fl := &f.log
	fl.src, fl.srcIdentity, fl.dst, fl.dstIdentity = inboundSource(r), r.PeerIdentity(), dst, g.identity
	fl.traceID = r.TraceID()
	fl.openMetrics(g.metrics, g.inboundLabels(snap, r, fl.src, dst))
	if max := snap.cfg.Gateway.MaxFlowsPerSource; !g.flows.admit(f, fl.src.Addr(), max) {
		return nil, nil, outcome{flag: flagOverflow, status: http.StatusServiceUnavailable,
			err: fmt.Errorf("%d inbound flows from %s are open (gateway.max_flows_per_source)", max, fl.src.Addr())}
	}
	if nameErr != nil {
		return nil, nil, outcome{flag: flagConnect, status: http.StatusServiceUnavailable, err: nameErr}
	}
	if status, err := g.checkInbound(snap, dst); err != nil {
		return nil, nil, outcome{flag: flagConnect, status: status, err: err}
	}
	// Authorization before the dial: a denied client must not even make
	// the target see a connection attempt.
	ac := AuthzConn{Identity: r.PeerIdentity(), Src: fl.src.Addr(), Dst: dst}
	if d := snap.authz.Authorize(ac); !d.Allow {
		return nil, nil, outcome{flag: flagDeny, status: http.StatusUnauthorized, err: fmt.Errorf("authorization: %s", d.Reason)}
	}
	d := net.Dialer{Timeout: g.cfg.HBONE.ConnectTimeout.Duration}
	tc, err := d.DialContext(r.Context(), "tcp", dst.String())
	if err != nil {
		return nil, nil, outcome{flag: flagConnect, status: http.StatusServiceUnavailable, err: fmt.Errorf("dial target: %w", err)}
	}
	s, err := r.Accept()
	if err != nil {
		tc.Close()
		return nil, nil, outcome{err: err}
	}
	g.watchInbound(f, snap, ac, s, tc.(*net.TCPConn))
	return s, tc.(*net.TCPConn), outcome{}
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

// nameTarget is the target of a CONNECT to "hostname:port", as a flow
// through a network gateway arrives (docs/hbone.md, "Double HBONE"):
// Router.nameTarget, with hbone.serve as what this node serves.
func nameTarget(snap *snapshot, name string, local net.Addr) (netip.AddrPort, error) {
	host, port, err := hbone.ParseNameAuthority(name)
	if err != nil {
		return netip.AddrPort{}, err
	}
	ta, ok := local.(*net.TCPAddr)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("target %s: the connection has no local address", name)
	}
	at := ta.AddrPort().Addr().Unmap()
	vips, _ := snap.zone.Resolve(host)
	served := func(a netip.Addr) bool {
		for _, p := range snap.cfg.HBONE.Serve {
			if p.Contains(a.Unmap()) {
				return true
			}
		}
		return false
	}
	t, err := snap.router.nameTarget(host, port, vips, at, served, snap.pickEndpoint)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("target %s: %w", name, err)
	}
	return t, nil
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
