package gateway

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/meshtun/meshtun/config"
)

// Kind says what the gateway does with a captured flow.
type Kind int

const (
	// Deny: the client gets a RST.
	Deny Kind = iota
	// HBONE: the flow rides a CONNECT stream to a peer gateway or ztunnel.
	HBONE
	// Direct: the destination speaks plain TCP and is dialled as it is.
	Direct
)

func (k Kind) String() string {
	switch k {
	case HBONE:
		return "hbone"
	case Direct:
		return "direct"
	default:
		return "deny"
	}
}

// Plan is what to do with one flow: the outcome of Router.Route.
type Plan struct {
	Kind Kind
	// Dst is the destination the client asked for.
	Dst netip.AddrPort
	// Target is where the bytes must end up: the CONNECT :authority for
	// HBONE, the address dialled for Direct.
	Target netip.AddrPort
	// HBONEAddress is the peer's HBONE listener (HBONE only).
	HBONEAddress netip.AddrPort
	// Identities are the SPIFFE IDs the peer may present (HBONE only).
	Identities []string
	// Via names the config entry that decided: "workload default/web",
	// "peer node-b".
	Via string
	// Reason says why a flow is denied.
	Reason string
}

func (p Plan) String() string {
	switch p.Kind {
	case HBONE:
		return fmt.Sprintf("%s via %s: CONNECT %s at %s, expecting %s",
			p.Dst, p.Via, p.Target, p.HBONEAddress, strings.Join(p.Identities, " or "))
	case Direct:
		return fmt.Sprintf("%s via %s: direct TCP to %s", p.Dst, p.Via, p.Target)
	default:
		return fmt.Sprintf("%s: denied: %s", p.Dst, p.Reason)
	}
}

// Router maps a captured destination to a Plan. It is built once from a
// config and is read-only afterwards, so Route is safe for concurrent use
// and has no side effects: the gateway and `meshtun route` share it.
//
// Precedence, most specific first: a workload address, then the longest
// matching peer CIDR. Nothing matched → Deny.
type Router struct {
	workloads map[netip.Addr]*workloadRoute
	peers     []peerRoute // longest prefix first
}

type workloadRoute struct {
	name     string
	protocol string
	hbone    netip.AddrPort
	identity string
}

type peerRoute struct {
	name     string
	prefix   netip.Prefix
	address  netip.AddrPort
	identity string
}

// NewRouter compiles the routing tables of cfg. cfg must have passed
// Validate.
func NewRouter(cfg *config.Config) *Router {
	r := &Router{workloads: make(map[netip.Addr]*workloadRoute)}
	for i := range cfg.Workloads {
		w := &cfg.Workloads[i]
		wr := &workloadRoute{
			name:     w.Namespace + "/" + w.Name,
			protocol: w.Protocol,
			hbone:    w.HBONEAddress,
			identity: w.ExpectedIdentity(cfg.Gateway.TrustDomain),
		}
		for _, a := range w.Addresses {
			r.workloads[a.Unmap()] = wr
		}
	}
	for _, p := range cfg.Peers {
		for _, c := range p.CIDRs {
			r.peers = append(r.peers, peerRoute{name: p.Name, prefix: c.Masked(), address: p.Address, identity: p.Identity})
		}
	}
	// Longest prefix first; among equal lengths, config order.
	slices.SortStableFunc(r.peers, func(a, b peerRoute) int { return b.prefix.Bits() - a.prefix.Bits() })
	return r
}

// Route returns the plan for a flow to dst.
func (r *Router) Route(dst netip.AddrPort) Plan {
	dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	plan := Plan{Dst: dst, Target: dst}
	if w, ok := r.workloads[dst.Addr()]; ok {
		plan.Via = "workload " + w.name
		if strings.EqualFold(w.protocol, "TCP") {
			plan.Kind = Direct
			return plan
		}
		plan.Kind = HBONE
		plan.HBONEAddress = w.hbone
		plan.Identities = []string{w.identity}
		return plan
	}
	for _, p := range r.peers {
		if p.prefix.Contains(dst.Addr()) {
			plan.Kind = HBONE
			plan.Via = "peer " + p.name
			plan.HBONEAddress = p.address
			plan.Identities = []string{p.identity}
			return plan
		}
	}
	plan.Reason = "no workload or peer route matches the destination"
	return plan
}
