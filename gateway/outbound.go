package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/meshtun/meshtun/hbone"
	"github.com/meshtun/meshtun/netstack"
	"github.com/meshtun/meshtun/tun"
)

// flowRequest is a captured connection waiting for the outbound handler
// to accept or refuse it: a SYN from the TUN (netstack.Request, through
// tunRequest), or a test's fake, so a flow can be driven without a device.
type flowRequest interface {
	// Src is the client's address and port.
	Src() netip.AddrPort
	// Dst is the destination the client dialled.
	Dst() netip.AddrPort
	// Accept completes the client's handshake and returns its side of the
	// connection. The relay also uses its WaitRead and Reset where it has
	// them (netstack.Conn does; see readWaiter and resetter).
	Accept() (conn, error)
	// Reject refuses the client with a RST. It does nothing once the
	// request was accepted or rejected.
	Reject()
}

// tunRequest is a netstack.Request as a flowRequest.
type tunRequest struct{ *netstack.Request }

var (
	_ flowRequest = tunRequest{}
	// What the relay uses of an accepted connection besides conn.
	_ interface {
		conn
		readWaiter
		resetter
	} = (*netstack.Conn)(nil)
)

func (r tunRequest) Accept() (conn, error) {
	c, err := r.Request.Accept()
	if err != nil {
		return nil, err // not a nil *netstack.Conn in a non-nil conn
	}
	return c, nil
}

// handleOutbound carries one flow captured by the TUN (netstack's
// Handler).
func (g *Gateway) handleOutbound(r *netstack.Request) { g.serveOutbound(tunRequest{r}) }

// serveOutbound carries one captured flow. It dials first: the client's
// handshake is completed only once the peer has answered the CONNECT with
// 200 (or, for a protocol TCP workload, the target accepted the direct
// dial), so a refused or unreachable destination reaches the application
// as a RST (connection refused), never as an accepted connection that then
// dies.
func (g *Gateway) serveOutbound(r flowRequest) {
	if g.draining.Load() {
		r.Reject()
		return
	}
	f := g.flows.begin(outbound)
	client, server, o := g.outbound(r, f)
	if client == nil {
		r.Reject()
	}
	g.carry(f, client, server, o)
}

// outbound sets flow f up for r: it returns the accepted client side and
// the connection to the destination, or, when it gets no further, why.
func (g *Gateway) outbound(r flowRequest, f *flow) (client, server conn, o outcome) {
	snap := g.snapshot() // this flow's config, router and policies, whatever a reload does meanwhile
	plan := snap.router.Route(r.Dst(), snap.pickEndpoint)
	fl := &f.log
	fl.src, fl.srcIdentity, fl.dst = r.Src(), g.identity, r.Dst()
	if plan.Kind != Deny {
		fl.dst, fl.service = plan.Target, plan.Service
	}
	labels, baggage := g.outboundLabels(snap, r.Src(), plan)
	fl.openMetrics(g.metrics, labels)
	if max := snap.cfg.Gateway.MaxFlowsPerSource; !g.flows.admit(f, r.Src().Addr(), max) {
		return nil, nil, outcome{flag: flagOverflow,
			err: fmt.Errorf("%d outbound flows from %s are open (gateway.max_flows_per_source)", max, r.Src().Addr())}
	}
	switch plan.Kind {
	case HBONE:
		fl.hboneAddr, fl.dstIdentity = plan.HBONEAddress, plan.Identities[0]
		if plan.Gateway != nil {
			fl.hboneAddr = plan.Gateway.Address // the next hop's, as ztunnel logs it
		}
	case Direct:
		return g.outboundDirect(r, plan)
	default:
		if plan.OtherNetwork != "" {
			g.meshStats.otherNetwork.Add(1)
		}
		return nil, nil, outcome{flag: flagNoRoute, err: errors.New("no route: " + plan.Reason)}
	}

	req := hbone.ConnectRequest{
		Address:       plan.HBONEAddress,
		Authority:     plan.Target,
		AuthorityName: plan.Authority,
		Identities:    plan.Identities,
		Source:        r.Src(),
		Host:          plan.Host,
		Baggage:       baggage,
	}
	if gw := plan.Gateway; gw != nil {
		req.Gateway = &hbone.GatewayHop{Address: gw.Address, Identities: gw.Identities}
		req.Network = snap.router.network
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.HBONE.ConnectTimeout.Duration)
	stream, err := g.pool.Connect(ctx, req)
	cancel()
	if err != nil {
		o := outcome{flag: flagConnect, err: err}
		if se := (*hbone.StatusError)(nil); errors.As(err, &se) {
			o.status = se.Code
		}
		return nil, nil, o
	}
	fl.dstIdentity = stream.PeerIdentity()
	c, err := r.Accept()
	if err != nil {
		stream.Close()
		return nil, nil, outcome{err: err}
	}
	return c, stream, outcome{}
}

// outboundDirect connects a flow to a protocol TCP workload: a plain TCP
// dial from this host, no tunnel. The socket carries tun.BypassMark, so the
// kernel routes it by the main table (e.g. over the node's uplink) even
// when the target lies inside a range the TUN captures; without the mark
// the SYN would come straight back into our own TUN.
func (g *Gateway) outboundDirect(r flowRequest, plan Plan) (client, server conn, o outcome) {
	d := net.Dialer{Timeout: g.cfg.HBONE.ConnectTimeout.Duration, Control: tun.BypassControl}
	tc, err := d.Dial("tcp", plan.Target.String())
	if err != nil {
		return nil, nil, outcome{flag: flagConnect, err: fmt.Errorf("direct dial %s (%s): %w", plan.Target, plan.Via, err)}
	}
	c, err := r.Accept()
	if err != nil {
		tc.Close()
		return nil, nil, outcome{err: err}
	}
	return c, tc.(*net.TCPConn), outcome{}
}
