package gateway

import (
	"context"
	"errors"
	"time"

	"github.com/meshtun/meshtun/hbone"
	"github.com/meshtun/meshtun/netstack"
)

// handleOutbound carries one flow captured by the TUN. It dials first: the
// client's handshake is completed only once the peer has answered the
// CONNECT with 200, so a refused or unreachable destination reaches the
// application as a RST (connection refused), never as an accepted
// connection that then dies.
func (g *Gateway) handleOutbound(r *netstack.Request) {
	if g.draining.Load() {
		r.Reject()
		return
	}
	g.flows.Add(1)
	defer g.flows.Done()

	plan := g.router.Route(r.Dst())
	fl := &flowLog{direction: outbound, src: r.Src(), srcIdentity: g.identity, dst: r.Dst(), start: time.Now()}
	defer fl.emit(g.accessLog)

	switch plan.Kind {
	case HBONE:
		fl.hboneAddr, fl.dstIdentity = plan.HBONEAddress, plan.Identities[0]
	case Direct:
		// A direct dial from this host would be routed back into our own
		// TUN; it needs a socket mark and a routing rule, which this build
		// does not set up yet.
		r.Reject()
		fl.err = errors.New("protocol TCP workloads are not supported by this build: " + plan.Via)
		return
	default:
		r.Reject()
		fl.err = errors.New("no route: " + plan.Reason)
		return
	}

	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.HBONE.ConnectTimeout.Duration)
	stream, err := g.pool.Connect(ctx, hbone.ConnectRequest{
		Address:    plan.HBONEAddress,
		Authority:  plan.Target,
		Identities: plan.Identities,
		Source:     r.Src(),
	})
	cancel()
	if err != nil {
		r.Reject()
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
