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
	defer g.flows.end()

	snap := g.snapshot() // this flow's config, router and policies, whatever a reload does meanwhile
	plan := snap.router.Route(r.Dst(), snap.pickEndpoint)
	fl := &flowLog{direction: outbound, src: r.Src(), srcIdentity: g.identity, dst: r.Dst(), start: time.Now()}
	defer fl.emit(g.accessLog)

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
	res := relay(c, stream)
	fl.sent, fl.recv, fl.err = res.AToB, res.BToA, res.Err
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
	res := relay(c, tc.(*net.TCPConn))
	fl.sent, fl.recv, fl.err = res.AToB, res.BToA, res.Err
}
