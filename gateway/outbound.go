package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/meshtun/meshtun/hbone"
	"github.com/meshtun/meshtun/netstack"
	"github.com/meshtun/meshtun/tun"
)

// handleOutbound carries one flow captured by the TUN. It dials first: the
// client's handshake is completed only once the peer has answered the
// CONNECT with 200 (or, for a protocol TCP workload, the target accepted
// the direct dial), so a refused or unreachable destination reaches the
// application as a RST (connection refused), never as an accepted
// connection that then dies.
func (g *Gateway) handleOutbound(r *netstack.Request) {
	if g.draining.Load() {
		r.Reject()
		return
	}
	g.flows.begin()
	snap := g.snapshot() // this flow's config, router and policies, whatever a reload does meanwhile
	plan := snap.router.Route(r.Dst(), snap.pickEndpoint)
	fl := &flowLog{direction: outbound, src: r.Src(), srcIdentity: g.identity, dst: r.Dst(), start: time.Now()}
	// The flow ends here unless a relay took it over (g.relay), which then
	// ends it when both directions are done.
	defer g.endUnlessRelayed(fl)

	if plan.Kind != Deny {
		fl.dst, fl.service = plan.Target, plan.Service
	}
	fl.openMetrics(g.metrics, g.outboundLabels(r.Src(), plan))
	switch plan.Kind {
	case HBONE:
		fl.hboneAddr, fl.dstIdentity = plan.HBONEAddress, plan.Identities[0]
	case Direct:
		g.outboundDirect(r, plan, fl)
		return
	default:
		r.Reject()
		fl.flag = flagNoRoute
		fl.err = errors.New("no route: " + plan.Reason)
		return
	}

	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.HBONE.ConnectTimeout.Duration)
	stream, err := g.pool.Connect(ctx, hbone.ConnectRequest{
		Address:    plan.HBONEAddress,
		Authority:  plan.Target,
		Identities: plan.Identities,
		Source:     r.Src(),
		Host:       plan.Host,
	})
	cancel()
	if err != nil {
		r.Reject()
		fl.flag = flagConnect
		fl.err = err
		return
	}
	fl.dstIdentity = stream.PeerIdentity()
	c, err := r.Accept()
	if err != nil {
		stream.Close()
		fl.err = err
		return
	}
	g.relay(fl, c, stream, nil)
}

// outboundDirect carries a flow to a protocol TCP workload: a plain TCP
// dial from this host, no tunnel. The socket carries tun.BypassMark, so the
// kernel routes it by the main table (e.g. over the node's uplink) even
// when the target lies inside a range the TUN captures; without the mark
// the SYN would come straight back into our own TUN.
func (g *Gateway) outboundDirect(r *netstack.Request, plan Plan, fl *flowLog) {
	d := net.Dialer{Timeout: g.cfg.HBONE.ConnectTimeout.Duration, Control: tun.BypassControl}
	tc, err := d.Dial("tcp", plan.Target.String())
	if err != nil {
		r.Reject()
		fl.flag = flagConnect
		fl.err = fmt.Errorf("direct dial %s (%s): %w", plan.Target, plan.Via, err)
		return
	}
	c, err := r.Accept()
	if err != nil {
		tc.Close()
		fl.err = err
		return
	}
	g.relay(fl, c, tc.(*net.TCPConn), nil)
}

// relay hands flow fl over to a relay between its client side a and b:
// from here the relay's goroutines carry it, and when both directions are
// done, after, if not nil, runs with the result, then the flow is logged,
// counted and ended (flows.end). The handler's goroutine returns.
func (g *Gateway) relay(fl *flowLog, a, b conn, after func(relayResult)) {
	fl.relayed = true
	startRelay(a, b, fl.metrics.relayCounters(), func(res relayResult) {
		fl.sent, fl.recv, fl.err = res.AToB, res.BToA, res.Err
		if after != nil {
			after(res)
		}
		g.endFlow(fl)
	})
}

// endUnlessRelayed ends a flow whose handler returns without a relay (it
// was refused or failed before any data).
func (g *Gateway) endUnlessRelayed(fl *flowLog) {
	if !fl.relayed {
		g.endFlow(fl)
	}
}

// endFlow writes the flow's access-log line and metrics, and ends it for
// the drain.
func (g *Gateway) endFlow(fl *flowLog) {
	fl.emit(g.accessLog)
	g.flows.end()
}
