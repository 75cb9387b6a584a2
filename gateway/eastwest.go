package gateway

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"

	"github.com/meshtun/meshtun/hbone"
	"github.com/meshtun/meshtun/tun"
)

// This node as its network's east-west gateway (gateway.east_west):
// the outer hop of double HBONE from another network, as Istio's
// east-west gateway is for a cluster's network. An outer CONNECT names a
// destination of this node's routes (a service's "hostname:port", as
// ztunnel sends it, or a workload's ip:port); the gateway picks one of
// its endpoints of this network, dials the endpoint's HBONE address and,
// once connected, answers 200 and relays the stream as bytes: they are
// the inner TLS connection, which ends at the destination, so the
// gateway never holds the flow's plaintext nor the destination's key.
//
// Authorization is Istio's east-west gateway's: the outer TLS proves a
// client of our trust domain (hbone.Server), and only a destination of
// this network is served, never one behind another gateway (no chaining)
// nor one of the gateway's own ports. [[policies]] are the
// destination's, enforced there against the real client, whose identity
// the inner TLS proves: a gateway sees only the client's claim.

// eastWest is the direction of a flow the east-west gateway forwards.
const eastWest = "east-west"

// EastWestHandler is the handler of the east-west listener, for serving
// it elsewhere (tests: interop/istiod's NewDoubleDialer runs through it).
func (g *Gateway) EastWestHandler() func(*hbone.Request) { return g.handleEastWest }

// handleEastWest forwards one outer CONNECT, or refuses it with its
// outcome's status.
func (g *Gateway) handleEastWest(r *hbone.Request) {
	f := g.flows.begin(eastWest)
	stream, next, o := g.eastWest(r, f)
	if stream == nil && o.status != 0 {
		r.Reject(o.status)
	}
	g.carry(f, stream, next, o)
}

// eastWest sets flow f up for r: the accepted outer stream and the
// connection to the destination's HBONE listener, or why not.
func (g *Gateway) eastWest(r *hbone.Request, f *flow) (stream, next conn, o outcome) {
	snap := g.snapshot()
	fl := &f.log
	fl.src, fl.srcIdentity, fl.traceID = inboundSource(r), r.PeerIdentity(), r.TraceID()
	fl.dst = r.Target()
	refuse := func(err error) (conn, conn, outcome) {
		return nil, nil, outcome{flag: flagNoRoute, status: http.StatusServiceUnavailable, err: err}
	}
	if g.draining.Load() {
		return refuse(fmt.Errorf("draining"))
	}
	plan, err := snap.router.eastWestPlan(snap, r.Target(), r.TargetName(), snap.pickEndpoint)
	if err != nil {
		return refuse(err)
	}
	fl.dst, fl.service, fl.hboneAddr, fl.dstIdentity = plan.Target, plan.Service, plan.HBONEAddress, plan.Identities[0]
	// This node's own HBONE listener is a destination like any other;
	// its other listeners, this one included, are not.
	if hb, err := netip.ParseAddrPort(g.cfg.HBONE.Listen); g.isOwnListener(plan.HBONEAddress) && (err != nil || hb.Port() != plan.HBONEAddress.Port()) {
		return refuse(fmt.Errorf("%s: its HBONE address %s is one of this gateway's own listeners", plan.Dst, plan.HBONEAddress))
	}
	// Marked as the pool's sockets are: an HBONE address in a captured
	// range must not come back into our own TUN.
	d := net.Dialer{Timeout: g.cfg.HBONE.ConnectTimeout.Duration, Control: tun.BypassControl}
	tc, err := d.DialContext(r.Context(), "tcp", plan.HBONEAddress.String())
	if err != nil {
		return nil, nil, outcome{flag: flagConnect, status: http.StatusServiceUnavailable,
			err: fmt.Errorf("dial %s's HBONE address %s: %w", plan.Via, plan.HBONEAddress, err)}
	}
	s, err := r.Accept()
	if err != nil {
		tc.Close()
		return nil, nil, outcome{err: err}
	}
	return s, tc.(*net.TCPConn), outcome{}
}

// eastWestPlan is where an outer CONNECT to dst (ip:port) or name
// ("hostname:port") goes: a plan of this network (no second gateway) to
// a destination that speaks HBONE.
func (r *Router) eastWestPlan(snap *snapshot, dst netip.AddrPort, name string, pick Pick) (Plan, error) {
	if name != "" {
		host, port, err := hbone.ParseNameAuthority(name)
		if err != nil {
			return Plan{}, err
		}
		vips, _ := snap.zone.Resolve(host)
		s := r.serviceByName(host, port, vips)
		if s == nil {
			return Plan{}, fmt.Errorf("no service %s with port %d", host, port)
		}
		dst = netip.AddrPortFrom(s.vip, port)
	}
	plan := r.Route(dst, pick)
	switch {
	case plan.Kind == Deny:
		return plan, fmt.Errorf("%s", plan.Reason)
	case plan.Kind == Direct:
		return plan, fmt.Errorf("%s via %s speaks plain TCP: nothing there would end the inner HBONE", dst, plan.Via)
	case plan.Gateway != nil:
		return plan, fmt.Errorf("%s via %s is behind network %q's gateway: one gateway does not forward to another", dst, plan.Via, plan.Gateway.Network)
	}
	return plan, nil
}
