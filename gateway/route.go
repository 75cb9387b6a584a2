package gateway

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/internal/pmap"
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
	// HBONE, the address dialled for Direct. For a service it is the
	// chosen endpoint's address and the mapped target port.
	Target netip.AddrPort
	// HBONEAddress is the peer's HBONE listener (HBONE only).
	HBONEAddress netip.AddrPort
	// Identities are the SPIFFE IDs the peer may present (HBONE only):
	// the workload's or peer's identity, then a service's
	// subject_alt_names.
	Identities []string
	// Via names the config entry that decided: "service default/web",
	// "workload default/web", "peer node-b".
	Via string
	// Service is the service ("namespace/name") when Dst is a service
	// VIP, and Host its hostname (sent as forwarded ;host=), if it has one.
	Service, Host string
	// Endpoint is the workload ("namespace/name") chosen among the
	// service's Endpoints, at index EndpointIndex of its endpoint list.
	Endpoint                 string
	EndpointIndex, Endpoints int
	// Waypoint names the waypoint the flow is sent to instead of its
	// destination (a workload's or service's, from the mesh); Target is
	// then the original destination, as ztunnel sends it.
	Waypoint string
	// Reason says why a flow is denied.
	Reason string
	// OtherNetwork is set when the flow is denied because its destination
	// is in another network that has no usable network gateway: that
	// network.
	OtherNetwork string
	// Gateway, for a destination in another network, is that network's
	// gateway, the outer hop of double HBONE (docs/hbone.md, "Double
	// HBONE"); HBONEAddress and Identities are then the destination's,
	// the inner hop's.
	Gateway *GatewayHop
	// Authority, if set, is the CONNECT's :authority instead of Target:
	// the service's "hostname:port" that ztunnel sends through a
	// network gateway.
	Authority string
}

// GatewayHop is the network gateway a Plan goes through.
type GatewayHop struct {
	// Name is the gateway's service ("namespace/hostname") or address;
	// Network is the network it fronts.
	Name, Network string
	// Address and Identities are the chosen instance's HBONE address and
	// the identities it may present: the instance's own, then the
	// gateway service's subject_alt_names.
	Address    netip.AddrPort
	Identities []string
	// Instance is the chosen one's index among Instances.
	Instance, Instances int
}

func (p Plan) String() string {
	via := p.Via
	if p.Endpoint != "" {
		via += fmt.Sprintf(", endpoint %s (%d of %d)", p.Endpoint, p.EndpointIndex+1, p.Endpoints)
	}
	if p.Waypoint != "" {
		via += ", waypoint " + p.Waypoint
	}
	switch p.Kind {
	case HBONE:
		if g := p.Gateway; g != nil {
			return fmt.Sprintf("%s via %s: double HBONE: outer CONNECT %s at network gateway %s of network %q (%d of %d) at %s, expecting %s; inner CONNECT %s to %s (%s), expecting %s",
				p.Dst, via, p.authority(), g.Name, g.Network, g.Instance+1, g.Instances, g.Address, strings.Join(g.Identities, " or "),
				p.authority(), p.Target, p.HBONEAddress, strings.Join(p.Identities, " or "))
		}
		return fmt.Sprintf("%s via %s: CONNECT %s at %s, expecting %s",
			p.Dst, via, p.authority(), p.HBONEAddress, strings.Join(p.Identities, " or "))
	case Direct:
		return fmt.Sprintf("%s via %s: direct TCP to %s", p.Dst, via, p.Target)
	default:
		return fmt.Sprintf("%s: denied: %s", p.Dst, p.Reason)
	}
}

// authority is the CONNECT's :authority.
func (p Plan) authority() string {
	if p.Authority != "" {
		return p.Authority
	}
	return p.Target.String()
}

// Router maps a captured destination to a Plan. It is built once from a
// config and is read-only afterwards, so Route is safe for concurrent use
// and has no side effects: the gateway and `meshtun route` share it.
//
// Precedence, most specific first: a service VIP and port, then a workload
// address, then the longest matching peer CIDR. Nothing matched → Deny. A
// service VIP with a port the service does not declare is denied too: the
// VIP is the service's, and no workload listens there.
//
// Entries from the mesh add ztunnel's rules (its proxy/outbound.rs and
// state.rs): a workload or service with a waypoint is sent to the
// waypoint (a CONNECT to one of its instances whose :authority is the
// original destination, VIP:port for a service, expecting the instance's
// identity and the waypoint service's subject_alt_names); a service's
// endpoint serves a port at its own target port, else the service's,
// else not at all; and a workload of another network than this node's is
// reached through its network's gateway as double HBONE (Plan.Gateway;
// a service's hostname and port as the :authority), or refused
// (Plan.OtherNetwork) when that network has no known gateway.
type Router struct {
	// The file's entries: built once per config (NewRouter).
	services  map[netip.Addr]*serviceRoute // by VIP
	workloads map[netip.Addr]*workloadRoute
	peers     []peerRoute // longest prefix first
	network   string      // this node's (config.Config.Network)
	// The mesh's entries, in persistent maps that each istiod update
	// changes by what it changed (meshstate.go); looked up after the
	// file's service, and after the file's workload.
	mesh meshRoutes
}

// meshRoutes are the routes of the mesh's entries.
type meshRoutes struct {
	workloads pmap.Map[netip.Addr, *workloadRoute]
	byName    pmap.Map[string, *workloadRoute]      // namespace/name: services' endpoints
	services  pmap.Map[netip.Addr, []*serviceRoute] // by VIP; several when their ports differ, by name
	hosts     pmap.Map[string, int]                 // service hostnames, with how many services have each
}

// A workloadRoute is held for every workload of the mesh: what w holds
// is read from it rather than copied.
type workloadRoute struct {
	name     string // namespace/name
	identity string
	unmapped *[]netip.Addr    // w's addresses unmapped, where some are not (a file's)
	named    *config.Waypoint // network's gateway as named (other only); see gateway
	w        *config.Workload
	direct   bool // protocol TCP: dialled as it is, no HBONE
	other    bool // w is in another network than ours (w.Network)
}

// routedOf is the route of the mesh's entry w, if w is routed: the route
// of its name, when it is w's.
func (m meshRoutes) routedOf(w *config.Workload) (*workloadRoute, bool) {
	wr, ok := m.byName.Get(w.Namespace + "/" + w.Name)
	if !ok || wr.w != w {
		return nil, false
	}
	return wr, true
}

// addresses are w's addresses, unmapped.
func (wr *workloadRoute) addresses() []netip.Addr {
	if wr.unmapped != nil {
		return *wr.unmapped
	}
	return wr.w.Addresses // the mesh's are unmapped
}

// gateway is the network gateway w is reached through: named, when it
// has instances and w speaks HBONE (a protocol TCP workload has nothing
// to end the inner HBONE). Worked out, not held: a field more would take
// the route, held for every workload, to the next size class.
func (wr *workloadRoute) gateway() *config.Waypoint {
	if gw := wr.named; gw != nil && len(gw.Endpoints) > 0 && !wr.direct {
		return gw
	}
	return nil
}

// network is w's network when it is another than ours, else "".
func (wr *workloadRoute) network() string {
	if wr.other {
		return wr.w.Network
	}
	return ""
}

type serviceRoute struct {
	name     string       // namespace/name
	vips     []netip.Addr // a mesh service's, where the router holds it
	hostname string
	ports    map[uint16]uint16 // service port → target port (0: the endpoint's)
	// byPort are the endpoints that serve each service port, in config
	// order, at their target port; remote names the network of an
	// endpoint left out of them for being in another network.
	byPort   map[uint16][]endpointRoute
	remote   map[uint16]string
	sans     []string // subject_alt_names
	waypoint *config.Waypoint
}

type endpointRoute struct {
	w    *workloadRoute
	port uint16 // the target port
}

type peerRoute struct {
	name     string
	prefix   netip.Prefix
	address  netip.AddrPort
	identity string
}

// NewRouter compiles the routing tables of cfg. cfg must have passed
// Validate (every endpoint names a declared workload; one that does not is
// left out).
func NewRouter(cfg *config.Config) *Router {
	r := &Router{
		services:  make(map[netip.Addr]*serviceRoute),
		workloads: make(map[netip.Addr]*workloadRoute),
		network:   cfg.Network,
	}
	byName := make(map[string]*workloadRoute, len(cfg.Workloads))
	for i := range cfg.Workloads {
		w := &cfg.Workloads[i]
		wr := newWorkloadRoute(w, w.Namespace+"/"+w.Name, cfg)
		for _, a := range wr.addresses() {
			r.workloads[a] = wr
		}
		byName[wr.name] = wr
	}
	for i := range cfg.Services {
		sr := newServiceRoute(&cfg.Services[i], func(name string) (*workloadRoute, bool) { w, ok := byName[name]; return w, ok })
		for _, vip := range cfg.Services[i].VIPs {
			r.services[vip.Unmap()] = sr
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

// newWorkloadRoute compiles the route of w, an entry of cfg's or the
// mesh's in cfg's network, whose namespace/name is name.
func newWorkloadRoute(w *config.Workload, name string, cfg *config.Config) *workloadRoute {
	wr := &workloadRoute{
		name:     name,
		direct:   strings.EqualFold(w.Protocol, "TCP"),
		identity: w.ExpectedIdentity(cfg.Gateway.TrustDomain),
		w:        w, // never changed once in force: shared, not copied
	}
	// A file's workload without a network is ours; the mesh's are in
	// the network istiod says.
	switch {
	case w.Source == config.SourceXDS && w.Network != cfg.Network:
		wr.other, wr.named = w.Network != "", w.NetworkGateway
	case w.Source != config.SourceXDS && w.Network != "" && w.Network != cfg.Network:
		wr.other, wr.named = true, fileGateway(cfg, w.Network)
	}
	if slices.ContainsFunc(w.Addresses, netip.Addr.Is4In6) {
		var unmapped []netip.Addr
		for _, a := range w.Addresses {
			unmapped = append(unmapped, a.Unmap())
		}
		wr.unmapped = &unmapped
	}
	return wr
}

// newServiceRoute compiles the route of s, whose endpoints byName finds.
func newServiceRoute(s *config.Service, byName func(string) (*workloadRoute, bool)) *serviceRoute {
	sr := &serviceRoute{
		name:     s.Namespace + "/" + s.Name,
		hostname: s.Hostname,
		ports:    s.Ports,
		byPort:   make(map[uint16][]endpointRoute, len(s.Ports)),
		remote:   make(map[uint16]string),
		sans:     s.SubjectAltNames,
		waypoint: s.Waypoint,
	}
	for port, target := range s.Ports {
		for _, ep := range s.Endpoints {
			w, ok := byName(ep)
			if !ok {
				continue
			}
			t := target
			if own, ok := s.EndpointPorts[ep][port]; ok && own != 0 {
				t = own
			}
			switch {
			case t == 0: // neither the endpoint nor the service says where
			case w.other && w.gateway() == nil:
				sr.remote[port] = w.network()
			default:
				sr.byPort[port] = append(sr.byPort[port], endpointRoute{w, t})
			}
		}
	}
	return sr
}

// Pick chooses one of the n endpoints of service ("namespace/name"): an
// index in [0, n); other values are reduced modulo n.
type Pick func(service string, n int) int

// Route returns the plan for a flow to dst. When dst is a service with
// more than one endpoint, pick chooses one; a nil pick chooses the first.
// Route itself keeps no state: the gateway passes round-robin counters,
// tests a fixed choice.
func (r *Router) Route(dst netip.AddrPort, pick Pick) Plan {
	dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	plan := Plan{Dst: dst, Target: dst}
	if s, ok := r.services[dst.Addr()]; ok {
		return s.route(plan, pick, r)
	}
	if ss, ok := r.mesh.services.Get(dst.Addr()); ok {
		s := ss[0]
		for _, x := range ss {
			if _, ok := x.ports[dst.Port()]; ok {
				s = x
				break
			}
		}
		return s.route(plan, pick, r)
	}
	w, ok := r.workloads[dst.Addr()]
	if !ok {
		w, ok = r.mesh.workloads.Get(dst.Addr())
	}
	if ok {
		plan.Via = "workload " + w.name
		if w.other && w.gateway() == nil {
			return r.otherNetwork(plan, "workload "+w.name, w.network(), w.named, w.direct)
		}
		if w.w.Waypoint != nil && w.gateway() == nil {
			return waypointRoute(plan, w.w.Waypoint, pick)
		}
		return w.route(plan, dst, pick)
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
	plan.Reason = "no service, workload or peer route matches the destination"
	return plan
}

// otherNetwork denies plan: its destination what is in network, whose
// gateway gw (nil: none) has no instance, or cannot carry a direct
// (protocol TCP) destination.
func (r *Router) otherNetwork(plan Plan, what, network string, gw *config.Waypoint, direct bool) Plan {
	plan.OtherNetwork = network
	ours := r.network
	if ours == "" {
		ours = `""`
	}
	why := "which has no network gateway"
	switch {
	case gw != nil && len(gw.Endpoints) > 0 && direct:
		why = fmt.Sprintf("and speaks plain TCP: nothing behind network gateway %s would end the inner HBONE", gw.Name)
	case gw != nil:
		why = fmt.Sprintf("whose network gateway %s is not known (or has no instance)", gw.Name)
	}
	plan.Reason = fmt.Sprintf("%s is in network %q, not this node's (%s), %s: crossing networks (double HBONE) needs one", what, network, ours, why)
	return plan
}

// fileGateway is the gateway of network as cfg's [[networks]] declares
// it, or nil.
func fileGateway(cfg *config.Config, network string) *config.Waypoint {
	for _, n := range cfg.Networks {
		if n.Name == network {
			return &config.Waypoint{Name: n.Gateway.String(),
				Endpoints: []config.WaypointEndpoint{{Address: n.Gateway, Identity: n.Identity}}}
		}
	}
	return nil
}

// viaGateway completes plan, routed to w of another network, with w's
// network gateway as the outer hop. The :authority is the service's
// hostname and the port the client dialled, as ztunnel sends it, when
// the flow is for a service with a hostname.
func viaGateway(plan Plan, w *workloadRoute, pick Pick) Plan {
	gw := w.gateway()
	n := len(gw.Endpoints)
	i := choose(pick, "gateway "+gw.Name, n)
	ep := gw.Endpoints[i]
	hop := &GatewayHop{Name: gw.Name, Network: w.network(), Address: ep.Address,
		Identities: []string{ep.Identity}, Instance: i, Instances: n}
	for _, san := range gw.SubjectAltNames {
		if !slices.Contains(hop.Identities, san) {
			hop.Identities = append(hop.Identities, san)
		}
	}
	plan.Gateway = hop
	if plan.Host != "" {
		plan.Authority = plan.Host + ":" + strconv.Itoa(int(plan.Dst.Port()))
	}
	return plan
}

// choose applies pick to n choices of key.
func choose(pick Pick, key string, n int) int {
	if pick == nil || n <= 1 {
		return 0
	}
	i := pick(key, n) % n
	if i < 0 {
		i += n
	}
	return i
}

// waypointRoute sends plan to one of wp's instances, the original
// destination as the CONNECT's :authority.
func waypointRoute(plan Plan, wp *config.Waypoint, pick Pick) Plan {
	plan.Waypoint = wp.Name
	n := len(wp.Endpoints)
	if n == 0 {
		plan.Reason = fmt.Sprintf("%s: its waypoint %s is not known (or has no instance)", plan.Via, wp.Name)
		return plan
	}
	ep := wp.Endpoints[choose(pick, wp.Name, n)]
	plan.Kind = HBONE
	plan.HBONEAddress = ep.Address
	plan.Identities = []string{ep.Identity}
	for _, san := range wp.SubjectAltNames {
		if !slices.Contains(plan.Identities, san) {
			plan.Identities = append(plan.Identities, san)
		}
	}
	return plan
}

// route completes plan for a flow to one of the service's endpoints.
func (s *serviceRoute) route(plan Plan, pick Pick, r *Router) Plan {
	plan.Via = "service " + s.name
	plan.Service, plan.Host = s.name, s.hostname
	if _, ok := s.ports[plan.Dst.Port()]; !ok {
		plan.Reason = fmt.Sprintf("service %s has no port %d (its ports: %s)", s.name, plan.Dst.Port(), s.portList())
		return plan
	}
	if s.waypoint != nil {
		return waypointRoute(plan, s.waypoint, pick)
	}
	eps := s.byPort[plan.Dst.Port()]
	n := len(eps)
	plan.Endpoints = n
	if n == 0 {
		if net, ok := s.remote[plan.Dst.Port()]; ok {
			return r.otherNetwork(plan, "every endpoint of service "+s.name, net, nil, false)
		}
		plan.Reason = fmt.Sprintf("service %s has no endpoints for port %d", s.name, plan.Dst.Port())
		return plan
	}
	i := choose(pick, s.name, n)
	w := eps[i].w
	plan.Endpoint, plan.EndpointIndex = w.name, i
	addr, ok := w.addressLike(plan.Dst.Addr())
	if !ok {
		plan.Reason = fmt.Sprintf("service %s: endpoint %s has no address", s.name, w.name)
		return plan
	}
	plan = w.route(plan, netip.AddrPortFrom(addr, eps[i].port), pick)
	for _, san := range s.sans {
		if plan.Kind == HBONE && !slices.Contains(plan.Identities, san) {
			plan.Identities = append(plan.Identities, san)
		}
	}
	return plan
}

func (s *serviceRoute) portList() string {
	ports := make([]int, 0, len(s.ports))
	for p := range s.ports {
		ports = append(ports, int(p))
	}
	slices.Sort(ports)
	var b strings.Builder
	for i, p := range ports {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Itoa(p))
	}
	return b.String()
}

// route completes plan for a flow to target, an address of w; through
// w's network gateway when w is of another network.
func (w *workloadRoute) route(plan Plan, target netip.AddrPort, pick Pick) Plan {
	plan.Target = target
	if w.direct {
		plan.Kind = Direct
		return plan
	}
	plan.Kind = HBONE
	plan.HBONEAddress = w.w.HBONEAddress
	plan.Identities = []string{w.identity}
	if w.gateway() != nil {
		return viaGateway(plan, w, pick)
	}
	return plan
}

// addressLike returns w's first address of the same family as like, or
// else its first address.
func (w *workloadRoute) addressLike(like netip.Addr) (netip.Addr, bool) {
	for _, a := range w.addresses() {
		if a.Is4() == like.Is4() {
			return a, true
		}
	}
	if len(w.addresses()) > 0 {
		return w.addresses()[0], true
	}
	return netip.Addr{}, false
}

// nameTarget is the target of a flow to service host's port arriving
// at local (inbound through a network gateway), as ztunnel's
// find_inbound_upstream reads it, for a node that serves more than its
// own address: the service's endpoint at local, else one of its
// endpoints this node serves (an address in served; pick chooses among
// several), each at the port the service maps port to on that endpoint;
// with no such endpoint, local itself at the service's target port.
func (r *Router) nameTarget(host string, port uint16, vips []netip.Addr, local netip.Addr,
	served func(netip.Addr) bool, pick Pick) (netip.AddrPort, error) {
	found := r.serviceByName(host, port, vips)
	if found == nil {
		return netip.AddrPort{}, fmt.Errorf("no service %s with port %d", host, port)
	}
	s := found.serviceRoute
	var ours []netip.AddrPort
	for _, ep := range s.byPort[port] {
		if ep.w.other {
			continue
		}
		if slices.Contains(ep.w.addresses(), local) {
			return netip.AddrPortFrom(local, ep.port), nil
		}
		for _, a := range ep.w.addresses() {
			if served(a) {
				ours = append(ours, netip.AddrPortFrom(a, ep.port))
				break
			}
		}
	}
	if len(ours) > 0 {
		return ours[choose(pick, s.name, len(ours))], nil
	}
	if t := s.ports[port]; t != 0 {
		return netip.AddrPortFrom(local, t), nil
	}
	return netip.AddrPort{}, fmt.Errorf("service %s: no target port for port %d at %s", s.name, port, local)
}

// namedService is a service found by its hostname, at one of its VIPs.
type namedService struct {
	*serviceRoute
	vip netip.Addr
}

// serviceByName is the service of hostname host that has port, among
// those at vips (host's addresses in the DNS zone): the file's first, as
// Route looks them up; nil if none.
func (r *Router) serviceByName(host string, port uint16, vips []netip.Addr) *namedService {
	for _, vip := range vips {
		vip = vip.Unmap()
		cands := r.mesh.servicesAt(vip)
		if fs, ok := r.services[vip]; ok {
			cands = append([]*serviceRoute{fs}, cands...)
		}
		for _, c := range cands {
			if _, ok := c.ports[port]; ok && strings.EqualFold(c.hostname, host) {
				return &namedService{c, vip}
			}
		}
	}
	return nil
}

// servicesAt is the mesh's services at vip.
func (m *meshRoutes) servicesAt(vip netip.Addr) []*serviceRoute {
	ss, _ := m.services.Get(vip.Unmap())
	return slices.Clone(ss)
}
