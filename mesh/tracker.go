package mesh

import (
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"sort"
	"strings"

	"istio.io/istio/pkg/workloadapi"
	"istio.io/istio/pkg/workloadapi/security"

	"github.com/meshtun/meshtun/config"
)

// Tracker is the conversion kept up to date resource by resource: a
// Delta of istiod's (the resources one response adds, replaces or
// removes) costs what it names and what depends on it, not what the mesh
// holds. Apply returns the entries whose conversion changed, which the
// gateway applies to its persistent routing state; State is the whole
// conversion, as Convert gives it for a Snapshot.
//
// The rules are Convert's (convert.go's comment), with every choice made
// independent of the order in which resources arrived, so that an entry's
// fate depends only on the resources that share its keys:
//
//   - Claims. Workloads claim their addresses and their namespace/name;
//     services claim each VIP:port of theirs (this node's network's,
//     else, with none there, the others': convertService). A claim is won
//     by the first claimant in the order (our network first, then
//     resource name). A workload is kept when it wins all of its claims; a
//     service when it wins all of its. A loser is rejected with the
//     winner's name, except a workload of another network that lost an
//     address to ours, which is left out silently (networks may reuse
//     addresses; only ours can be routed to).
//   - Dependencies. A service's endpoints are the kept, healthy workloads
//     whose services map names it; a waypoint is resolved from the kept
//     workload or service at its address, or the service of its hostname,
//     and that service's members. Each of these is indexed both ways, so a
//     change marks exactly the entries it affects.
//   - This node's own workload decides the network: when the network
//     changes (the node's workload first seen, or moved), every entry is
//     converted again (Changes.Full).
//
// A Tracker is not safe for concurrent use: the XDSClient's goroutine
// owns it.
type Tracker struct {
	node Node
	own  map[netip.Addr]bool

	wls      map[string]*trackedWorkload // converted, with an address
	svcs     map[string]*trackedService  // every service resource, converted for our network
	pols     map[string]trackedPolicy    // converted
	rejected map[string]trackedRejection // by addrKey or polKey

	addrClaims claimIndex[ipKey, trackedWorkload]  // each sorted by claimOrder
	nameClaims claimIndex[string, trackedWorkload] // by namespace/name
	vipClaims  claimIndex[netip.AddrPort, trackedService]
	vips       map[netip.Addr][]*trackedService   // the services with each VIP of ours, by resource name
	keyClaims  claimIndex[string, trackedService] // by namespace/hostname, sorted by resource name
	members    map[string][]*trackedWorkload      // service key → its kept workloads, in no order
	wpUsers    map[string]map[string]bool         // waypoint target (wpTarget) → users ("w"+res, "s"+res)
	candidates map[string]*trackedWorkload        // workloads that could be this node's own
	portMaps   map[string]map[uint16]uint16       // portsOf's, by their ports written out

	self     *trackedWorkload
	network  string
	strs     stringTable                       // what the workloads repeat, shared
	labels   shareTable[config.WorkloadLabels] // shareLabels's
	services shareTable[[]memberOf]            // shareServices's

	outS map[string]*config.Service // what Apply last emitted (a workload's: its out)

	// goneW is, during one Apply, what was last emitted for each workload
	// it removed: emit compares the new entry with it.
	goneW map[string]*config.Workload

	// Dirty during one Apply.
	dirtyW, dirtyS     map[string]bool
	dirtyKeys, dirtyWP map[string]bool
	polsDirty          bool
}

// trackedWorkload is one workload as the Tracker holds it: the entry it
// emits, and what its claims and dependencies need. There are as many as
// pods in the mesh, so what few workloads have is behind refs.
type trackedWorkload struct {
	res      string
	cfg      config.Workload
	services *[]memberOf      // the services it names, shared (shareServices); nil: none
	out      *config.Workload // what emit last gave for it; nil: nothing
	refs     *workloadRefs    // nil: none, as for most pods
	kept     bool
}

// workloadRefs is what a workload may name beyond its services, and its
// key when its resource name does not end with it.
type workloadRefs struct {
	waypoint *workloadapi.GatewayAddress
	netGW    *workloadapi.GatewayAddress // its network's gateway (network_gateway)
	authz    []string                    // the policies selecting it
	key      string                      // namespace/name, if not the end of res
}

// key is w's namespace/name. A pod's resource name ends with it
// ("Kubernetes//Pod/default/web-1"), and it is that end of it, not a
// string of its own: one allocation less for every pod. Another
// workload's is in refs (newTrackedWorkload).
func (w *trackedWorkload) key() string {
	if w.refs != nil && w.refs.key != "" {
		return w.refs.key
	}
	return w.res[len(w.res)-len(w.cfg.Namespace)-1-len(w.cfg.Name):]
}

// endsWithKey says whether res ends with namespace/name.
func endsWithKey(res, namespace, name string) bool {
	head, ok := strings.CutSuffix(res, name)
	head, slash := strings.CutSuffix(head, "/")
	return ok && slash && strings.HasSuffix(head, namespace)
}

// servicesNamed are the services w names, by key.
func (w *trackedWorkload) servicesNamed() []memberOf {
	if w.services == nil {
		return nil
	}
	return *w.services
}

func (w *trackedWorkload) waypoint() *workloadapi.GatewayAddress {
	if w.refs == nil {
		return nil
	}
	return w.refs.waypoint
}

func (w *trackedWorkload) netGW() *workloadapi.GatewayAddress {
	if w.refs == nil {
		return nil
	}
	return w.refs.netGW
}

func (w *trackedWorkload) authz() []string {
	if w.refs == nil {
		return nil
	}
	return w.refs.authz
}

// ipKey is an address as a claim's key: its 16 bytes, without the zone
// netip.Addr carries a pointer for (the mesh's addresses have none, and
// are unmapped, so an IPv4 address and its mapped form never meet), a
// third smaller in a map of every address of the mesh.
type ipKey [16]byte

func keyOf(a netip.Addr) ipKey { return a.As16() }

// claimIndex is the claimants of each key, in claim order. Nearly every
// key has one, which one holds without a slice of its own (a slice and
// its array cost as much as the rest of the index's entry); only a
// contested key's whole list is in more.
type claimIndex[K comparable, T any] struct {
	one  map[K]*T // the first claimant of every key
	more map[K][]*T
}

func newClaimIndex[K comparable, T any]() claimIndex[K, T] {
	return claimIndex[K, T]{one: map[K]*T{}, more: map[K][]*T{}}
}

// first is k's winning claimant, nil if none.
func (c claimIndex[K, T]) first(k K) *T { return c.one[k] }

// list is k's claimants, in order; the caller may not change it.
func (c claimIndex[K, T]) list(k K) []*T {
	if l, ok := c.more[k]; ok {
		return l
	}
	if x := c.one[k]; x != nil {
		return []*T{x}
	}
	return nil
}

// set makes l, in order, k's claimants; an empty l removes k.
func (c claimIndex[K, T]) set(k K, l []*T) {
	switch len(l) {
	case 0:
		delete(c.one, k)
		delete(c.more, k)
	case 1:
		c.one[k] = l[0]
		delete(c.more, k)
	default:
		c.one[k] = l[0]
		c.more[k] = l
	}
}

// memberOf is one service a workload names, with its ports there.
type memberOf struct {
	key   string            // namespace/hostname
	ports map[uint16]uint16 // service port → target port; shared, never changed (portsOf)
}

// portsOf is pl's valid ports as a map, the same map for the same ports:
// the pods of a service name the same ones, and a map per pod would cost
// more than the rest of its entry.
func (t *Tracker) portsOf(pl *workloadapi.PortList) map[uint16]uint16 {
	ports := map[uint16]uint16{}
	for _, p := range pl.GetPorts() {
		if p.GetServicePort() > 0 && p.GetServicePort() <= 65535 && p.GetTargetPort() > 0 && p.GetTargetPort() <= 65535 {
			ports[uint16(p.GetServicePort())] = uint16(p.GetTargetPort())
		}
	}
	keys := slices.Sorted(maps.Keys(ports))
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%d:%d,", k, ports[k])
	}
	if shared, ok := t.portMaps[b.String()]; ok {
		return shared
	}
	t.portMaps[b.String()] = ports
	return ports
}

type trackedService struct {
	res      string
	key      string // namespace/hostname
	msg      *workloadapi.Service
	cfg      config.Service // its VIPs (convertService); no endpoints or waypoint
	vipPorts []netip.AddrPort
	err      error // the conversion's: such a service claims nothing
	kept     bool
}

type trackedPolicy struct {
	msg *security.Authorization
	cfg config.Policy
}

type trackedRejection struct {
	rank   int // 0 workloads, 1 services, 2 policies: the order of State.Rejections
	name   string
	reason string
}

// addrKey and polKey key t.rejected: the two types' names are apart.
func addrKey(name string) string { return "a" + name }
func polKey(name string) string  { return "p" + name }

// Delta is what one response of istiod's changes: the resources added or
// replaced, by name, and the names removed.
type Delta struct {
	Addresses             map[string]*workloadapi.Address
	RemovedAddresses      []string
	Authorizations        map[string]*security.Authorization
	RemovedAuthorizations []string
}

// Changes is what Apply changed of the conversion.
type Changes struct {
	// Full is set when every entry was converted again (the network
	// changed): Workloads and Services then hold every entry, and
	// whatever they do not name is gone.
	Full bool
	// Workloads and Services are the entries whose conversion changed, by
	// resource name; nil means the entry is gone (removed, or no longer
	// kept).
	Workloads map[string]*config.Workload
	Services  map[string]*config.Service
	// Policies is set when the policies in force changed: all of them.
	PoliciesChanged bool
	Policies        []config.Policy
	// Self and Network are this node's own workload and network, whether
	// or not they changed; SelfChanged says whether they did.
	SelfChanged bool
	Self        *config.Workload
	Network     string
	// Rejections are every resource held that could not be used.
	Rejections []Rejection
}

// NewTracker returns an empty Tracker for node.
func NewTracker(node Node) *Tracker {
	t := &Tracker{
		node: node, own: map[netip.Addr]bool{},
		wls: map[string]*trackedWorkload{}, svcs: map[string]*trackedService{},
		pols: map[string]trackedPolicy{}, rejected: map[string]trackedRejection{},
		candidates: map[string]*trackedWorkload{}, portMaps: map[string]map[uint16]uint16{},
		outS: map[string]*config.Service{},
	}
	for _, ip := range node.InstanceIPs {
		t.own[ip.Unmap()] = true
	}
	t.network = node.Network
	t.resetIndexes()
	return t
}

func (t *Tracker) resetIndexes() {
	t.addrClaims = newClaimIndex[ipKey, trackedWorkload]()
	t.nameClaims = newClaimIndex[string, trackedWorkload]()
	t.vipClaims = newClaimIndex[netip.AddrPort, trackedService]()
	t.vips = map[netip.Addr][]*trackedService{}
	t.keyClaims = newClaimIndex[string, trackedService]()
	t.members = map[string][]*trackedWorkload{}
	t.wpUsers = map[string]map[string]bool{}
}

// Apply applies d and returns what changed.
func (t *Tracker) Apply(d Delta) Changes {
	t.dirtyW, t.dirtyS = map[string]bool{}, map[string]bool{}
	t.dirtyKeys, t.dirtyWP = map[string]bool{}, map[string]bool{}
	t.goneW = map[string]*config.Workload{}
	// A bulk change's sets are as large as the mesh: not kept until the
	// next push.
	defer func() { t.dirtyW, t.dirtyS, t.dirtyKeys, t.dirtyWP, t.goneW = nil, nil, nil, nil, nil }()
	t.polsDirty = false
	selfBefore := t.self

	for _, name := range d.RemovedAddresses {
		t.removeAddress(name)
	}
	for _, name := range sortedKeys(d.Addresses) {
		t.removeAddress(name)
		t.addAddress(name, d.Addresses[name])
	}
	for _, name := range d.RemovedAuthorizations {
		t.removePolicy(name)
	}
	for name, a := range d.Authorizations {
		t.removePolicy(name)
		t.addPolicy(name, a)
	}

	t.chooseSelf()
	ch := Changes{}
	if t.self != selfBefore {
		ch.SelfChanged = true
		t.polsDirty = true
		if t.networkOf(t.self) != t.network {
			t.network = t.networkOf(t.self)
			return t.rebuild()
		}
	}
	t.propagate()
	return t.emit(ch)
}

func (t *Tracker) networkOf(w *trackedWorkload) string {
	if t.node.Network != "" {
		return t.node.Network // configured, as ztunnel's NETWORK
	}
	if w == nil {
		return ""
	}
	return w.cfg.Network
}

// rebuild converts every entry again, for a new network.
func (t *Tracker) rebuild() Changes {
	t.resetIndexes()
	for k, r := range t.rejected {
		if r.rank == 1 {
			delete(t.rejected, k) // services are converted again
		}
	}
	wls, svcs := t.wls, t.svcs
	t.wls, t.svcs = map[string]*trackedWorkload{}, map[string]*trackedService{}
	for _, w := range wls {
		w.kept, w.out = false, nil
		t.claimWorkload(w)
	}
	for _, s := range svcs {
		t.addService(s.res, s.msg)
	}
	for res := range t.wls {
		t.dirtyW[res] = true
	}
	t.polsDirty = true
	t.propagate()
	t.outS, t.goneW = map[string]*config.Service{}, map[string]*config.Workload{}
	ch := t.emit(Changes{Full: true, SelfChanged: true})
	return ch
}

func (t *Tracker) removeAddress(name string) {
	delete(t.rejected, addrKey(name))
	if w := t.wls[name]; w != nil {
		delete(t.wls, name)
		delete(t.candidates, name)
		if _, ok := t.goneW[name]; !ok && w.out != nil {
			t.goneW[name] = w.out
		}
		t.dirtyW[name] = true
		for _, a := range w.cfg.Addresses {
			t.addrClaims.set(keyOf(a), t.unclaim(t.addrClaims.list(keyOf(a)), w))
			t.dirtyWP[wpAddr(a)] = true
		}
		t.nameClaims.set(w.key(), t.unclaim(t.nameClaims.list(w.key()), w))
		if w.kept {
			t.setMember(w, false)
		}
		t.unwatch(w.waypoint(), "w"+name)
		t.unwatch(w.netGW(), "g"+name)
		return
	}
	if s := t.svcs[name]; s != nil {
		delete(t.svcs, name)
		t.dirtyS[name] = true
		for _, vp := range s.vipPorts {
			t.vipClaims.set(vp, unclaimService(t.vipClaims.list(vp), s, t.dirtyS))
			t.dirtyWP[wpAddr(vp.Addr())] = true
		}
		t.keyClaims.set(s.key, unclaimService(t.keyClaims.list(s.key), s, t.dirtyS))
		for _, v := range s.cfg.VIPs {
			t.vips[v] = slices.DeleteFunc(slices.Clone(t.vips[v]), func(x *trackedService) bool { return x == s })
			if len(t.vips[v]) == 0 {
				delete(t.vips, v)
			}
		}
		t.dirtyWP[wpHost(s.key)] = true
		if s.err == nil {
			t.unwatch(s.msg.GetWaypoint(), "s"+name)
		}
	}
}

// unclaim removes w from a claim list and marks the others dirty: the
// winner may have changed.
func (t *Tracker) unclaim(list []*trackedWorkload, w *trackedWorkload) []*trackedWorkload {
	out := slices.DeleteFunc(slices.Clone(list), func(x *trackedWorkload) bool { return x == w })
	for _, x := range out {
		t.dirtyW[x.res] = true
	}
	return out
}

func unclaimService(list []*trackedService, s *trackedService, dirty map[string]bool) []*trackedService {
	out := slices.DeleteFunc(slices.Clone(list), func(x *trackedService) bool { return x == s })
	for _, x := range out {
		dirty[x.res] = true
	}
	return out
}

func (t *Tracker) addAddress(name string, a *workloadapi.Address) {
	switch m := a.GetType().(type) {
	case *workloadapi.Address_Workload:
		t.addWorkload(name, m.Workload)
	case *workloadapi.Address_Service:
		t.addService(name, m.Service)
	default:
		t.rejected[addrKey(name)] = trackedRejection{0, name, "address holds neither a workload nor a service"}
	}
}

func (t *Tracker) addWorkload(name string, msg *workloadapi.Workload) {
	c, err := convertWorkload(msg)
	if err != nil {
		t.rejected[addrKey(name)] = trackedRejection{0, name, err.Error()}
		return
	}
	if len(c.Addresses) == 0 {
		return // hostname only: nothing to route to
	}
	t.strs.workload(&c, len(t.wls))
	t.shareLabels(&c)
	w := &trackedWorkload{res: name, cfg: c}
	own := endsWithKey(name, c.Namespace, c.Name)
	if msg.GetWaypoint() != nil || msg.GetNetworkGateway() != nil || len(msg.GetAuthorizationPolicies()) > 0 || !own {
		w.refs = &workloadRefs{msg.GetWaypoint(), msg.GetNetworkGateway(), msg.GetAuthorizationPolicies(), ""}
		if !own {
			w.refs.key = c.Namespace + "/" + c.Name
		}
	}
	if len(msg.GetServices()) > 0 {
		var services []memberOf
		for svc, pl := range msg.GetServices() {
			// The pods of a service all name it: one string for them all.
			services = append(services, memberOf{t.strs.intern(svc), t.portsOf(pl)})
		}
		slices.SortFunc(services, func(a, b memberOf) int { return strings.Compare(a.key, b.key) })
		w.services = t.shareServices(services)
	}
	if c.Namespace == t.node.Namespace && c.ServiceAccount == t.node.ServiceAccount &&
		slices.ContainsFunc(c.Addresses, func(a netip.Addr) bool { return t.own[a] }) {
		t.candidates[name] = w
	}
	t.claimWorkload(w)
}

// claimWorkload enters w into the indexes of its claims.
func (t *Tracker) claimWorkload(w *trackedWorkload) {
	t.wls[w.res] = w
	t.dirtyW[w.res] = true
	for _, a := range w.cfg.Addresses {
		t.addrClaims.set(keyOf(a), t.claim(t.addrClaims.list(keyOf(a)), w))
		t.dirtyWP[wpAddr(a)] = true
	}
	t.nameClaims.set(w.key(), t.claim(t.nameClaims.list(w.key()), w))
	t.watch(w.waypoint(), "w"+w.res)
	t.watch(w.netGW(), "g"+w.res) // "g": a user of the target as its network gateway
}

func (t *Tracker) claim(list []*trackedWorkload, w *trackedWorkload) []*trackedWorkload {
	out := slices.Clone(list)
	if !slices.Contains(out, w) {
		out = append(out, w)
	}
	slices.SortFunc(out, t.claimOrder)
	for _, x := range out {
		t.dirtyW[x.res] = true
	}
	return out
}

// claimOrder orders claimants: our network's first, then by resource
// name (Convert's order).
func (t *Tracker) claimOrder(a, b *trackedWorkload) int {
	if oa, ob := a.cfg.Network != t.network, b.cfg.Network != t.network; oa != ob {
		return boolOrder(oa) - boolOrder(ob)
	}
	return strings.Compare(a.res, b.res)
}

func (t *Tracker) addService(name string, msg *workloadapi.Service) {
	c, err := convertService(msg, t.network)
	s := &trackedService{res: name, key: msg.GetNamespace() + "/" + msg.GetHostname(), msg: msg, cfg: c, err: err}
	t.svcs[name] = s
	t.dirtyS[name] = true
	if err != nil {
		t.rejected[addrKey(name)] = trackedRejection{1, name, err.Error()}
		return
	}
	for _, v := range c.VIPs {
		for p := range c.Ports {
			s.vipPorts = append(s.vipPorts, netip.AddrPortFrom(v, p))
		}
	}
	slices.SortFunc(s.vipPorts, netip.AddrPort.Compare)
	s.vipPorts = slices.Compact(s.vipPorts)
	byName := func(a, b *trackedService) int { return strings.Compare(a.res, b.res) }
	for _, v := range c.VIPs {
		l := append(slices.Clone(t.vips[v]), s)
		slices.SortFunc(l, byName)
		t.vips[v] = slices.Compact(l)
	}
	for _, vp := range s.vipPorts {
		l := append(slices.Clone(t.vipClaims.list(vp)), s)
		slices.SortFunc(l, byName)
		for _, x := range l {
			t.dirtyS[x.res] = true
		}
		t.vipClaims.set(vp, l)
		t.dirtyWP[wpAddr(vp.Addr())] = true
	}
	l := append(slices.Clone(t.keyClaims.list(s.key)), s)
	slices.SortFunc(l, byName)
	t.keyClaims.set(s.key, l)
	t.dirtyWP[wpHost(s.key)] = true
	t.watch(msg.GetWaypoint(), "s"+name)
}

func (t *Tracker) removePolicy(name string) {
	delete(t.rejected, polKey(name))
	if _, ok := t.pols[name]; ok {
		delete(t.pols, name)
		t.polsDirty = true
	}
}

func (t *Tracker) addPolicy(name string, a *security.Authorization) {
	p, err := convertPolicy(a)
	if err != nil {
		t.rejected[polKey(name)] = trackedRejection{2, name, err.Error()}
		return
	}
	t.pols[name] = trackedPolicy{a, p}
	t.polsDirty = true
}

// chooseSelf picks this node's own workload: the first candidate by
// resource name.
func (t *Tracker) chooseSelf() {
	var self *trackedWorkload
	for _, w := range t.candidates {
		if self == nil || w.res < self.res {
			self = w
		}
	}
	t.self = self
}

// Waypoint targets: what a waypoint's resolution reads.
func wpAddr(a netip.Addr) string { return "a" + a.String() }
func wpHost(key string) string   { return "h" + key }

func wpTargetOf(gw *workloadapi.GatewayAddress) string {
	switch d := gw.GetDestination().(type) {
	case *workloadapi.GatewayAddress_Hostname:
		return wpHost(d.Hostname.GetNamespace() + "/" + d.Hostname.GetHostname())
	case *workloadapi.GatewayAddress_Address:
		if ip, ok := netip.AddrFromSlice(d.Address.GetAddress()); ok {
			return wpAddr(ip.Unmap())
		}
	}
	return ""
}

func (t *Tracker) watch(gw *workloadapi.GatewayAddress, user string) {
	if target := wpTargetOf(gw); target != "" {
		if t.wpUsers[target] == nil {
			t.wpUsers[target] = map[string]bool{}
		}
		t.wpUsers[target][user] = true
	}
}

func (t *Tracker) unwatch(gw *workloadapi.GatewayAddress, user string) {
	if target := wpTargetOf(gw); target != "" {
		delete(t.wpUsers[target], user)
		if len(t.wpUsers[target]) == 0 {
			delete(t.wpUsers, target)
		}
	}
}

// setMember adds or removes w, kept or no longer, from the services it
// names.
func (t *Tracker) setMember(w *trackedWorkload, in bool) {
	for _, ms := range w.servicesNamed() {
		key := ms.key
		if in {
			// A slice, not a set: a map per service cost as much again
			// as its members, and a change of a member rebuilds the
			// service's entry from all of them anyway.
			t.members[key] = append(t.members[key], w)
		} else {
			l := t.members[key]
			if i := slices.Index(l, w); i >= 0 {
				l[i] = l[len(l)-1]
				l[len(l)-1] = nil
				l = l[:len(l)-1]
			}
			if len(l) == 0 {
				delete(t.members, key)
			} else {
				if cap(l) > 16 && len(l) < cap(l)/4 {
					l = slices.Clip(slices.Clone(l)) // a service that shrank
				}
				t.members[key] = l
			}
		}
		t.dirtyKeys[key] = true
	}
}

// propagate settles what the dirty entries affect: workloads' claims,
// then the services whose members changed, then the users of changed
// waypoints.
func (t *Tracker) propagate() {
	for res := range t.dirtyW {
		w := t.wls[res]
		if w == nil {
			continue
		}
		kept, reason, silent := t.workloadClaims(w)
		// A changed workload is a new one (removeAddress took the old one
		// out of its services), so a change of kept is the only one here.
		if kept != w.kept {
			w.kept = kept
			t.setMember(w, kept)
		}
		delete(t.rejected, addrKey(res))
		if !kept && !silent {
			t.rejected[addrKey(res)] = trackedRejection{0, res, reason}
		}
		for _, a := range w.cfg.Addresses {
			t.dirtyWP[wpAddr(a)] = true
		}
	}
	for key := range t.dirtyKeys {
		t.dirtyWP[wpHost(key)] = true
		for _, s := range t.keyClaims.list(key) {
			t.dirtyS[s.res] = true
		}
	}
	for res := range t.dirtyS {
		s := t.svcs[res]
		if s == nil || s.err != nil {
			continue
		}
		kept, reason := t.serviceClaims(s)
		s.kept = kept
		delete(t.rejected, addrKey(res))
		if !kept {
			t.rejected[addrKey(res)] = trackedRejection{1, res, reason}
		}
		t.dirtyWP[wpHost(s.key)] = true
		for _, v := range s.cfg.VIPs {
			t.dirtyWP[wpAddr(v)] = true
		}
	}
	for target := range t.dirtyWP {
		for user := range t.wpUsers[target] {
			if user[0] == 'w' || user[0] == 'g' {
				t.dirtyW[user[1:]] = true
			} else {
				t.dirtyS[user[1:]] = true
			}
		}
	}
}

// workloadClaims says whether w wins every claim it makes; if not, why,
// and whether it is left out silently (another network's workload at an
// address of ours).
func (t *Tracker) workloadClaims(w *trackedWorkload) (kept bool, reason string, silent bool) {
	addrLost := ""
	for _, a := range w.cfg.Addresses {
		if first := t.addrClaims.first(keyOf(a)); first != w {
			addrLost = fmt.Sprintf("workload %s: address %s is also workload %s's", w.key(), a, first.key())
		}
	}
	if addrLost != "" && w.cfg.Network != t.network {
		return false, "", true
	}
	if first := t.nameClaims.first(w.key()); first != w {
		return false, fmt.Sprintf("workload %s: another workload of that namespace and name is held", w.key()), false
	}
	return addrLost == "", addrLost, false
}

func (t *Tracker) serviceClaims(s *trackedService) (bool, string) {
	for _, vp := range s.vipPorts {
		if first := t.vipClaims.first(vp); first != s {
			return false, fmt.Sprintf("service %s: %s is also service %s's", s.key, vp, first.key)
		}
	}
	return true, ""
}

// emit turns the dirty entries into ch.
func (t *Tracker) emit(ch Changes) Changes {
	ch.Workloads = map[string]*config.Workload{}
	ch.Services = map[string]*config.Service{}
	for res := range t.dirtyW {
		var next *config.Workload
		if w := t.wls[res]; w != nil && w.kept {
			next = &w.cfg // never changed once converted: shared with the emitted entry
			if w.waypoint() != nil || w.netGW() != nil && w.cfg.Network != t.network {
				c := w.cfg
				c.Waypoint = t.resolveWaypoint(w.waypoint())
				if w.cfg.Network != t.network {
					c.NetworkGateway = t.resolveGateway(w.netGW(), w.cfg.Network)
				}
				next = &c
			}
		}
		w := t.wls[res]
		prev, replaced := t.goneW[res]
		if !replaced && w != nil {
			prev = w.out
		}
		if w != nil {
			w.out = next
		}
		// A workload replaced by an equal one is emitted all the same
		// when its entry is its own cfg: the gateway would otherwise hold
		// the old one, and with it the replaced trackedWorkload.
		fresh := replaced && w != nil && next == &w.cfg
		if next == nil && prev == nil || next != nil && prev != nil && !fresh && reflect.DeepEqual(prev, next) {
			if w != nil {
				w.out = prev // the same entry: the one the gateway holds
			}
			continue
		}
		ch.Workloads[res] = next
	}
	for res := range t.dirtyS {
		// Services are emitted whenever dirty: a member's change changes
		// the routes built from them even when the list is the same.
		var next *config.Service
		if s := t.svcs[res]; s != nil && s.err == nil && s.kept {
			next = t.serviceEntry(s)
		}
		if _, had := t.outS[res]; next == nil && !had {
			continue
		}
		if next == nil {
			delete(t.outS, res)
		} else {
			t.outS[res] = next
		}
		ch.Services[res] = next
	}
	if t.polsDirty {
		ch.PoliciesChanged = true
		ch.Policies = t.policies()
	}
	ch.Self, ch.Network = t.selfEntry(), t.network
	ch.Rejections = t.rejections()
	return ch
}

func (t *Tracker) selfEntry() *config.Workload {
	if t.self == nil {
		return nil
	}
	c := t.self.cfg
	return &c
}

// portsIn is w's ports in the service of key.
func (w *trackedWorkload) portsIn(key string) map[uint16]uint16 {
	for _, ms := range w.servicesNamed() {
		if ms.key == key {
			return ms.ports
		}
	}
	return nil
}

// routesAsService says whether an endpoint's own target ports, own, send
// every port of the service (svc: port → target port) where the
// service's would: the router takes an endpoint's non-zero target port
// over the service's.
func routesAsService(own, svc map[uint16]uint16) bool {
	for p, t := range svc {
		if o := own[p]; o != 0 && o != t {
			return false
		}
	}
	return true
}

// serviceEntry is s with its endpoints and waypoint.
func (t *Tracker) serviceEntry(s *trackedService) *config.Service {
	c := s.cfg
	c.SubjectAltNames = slices.Clone(s.cfg.SubjectAltNames)
	c.VIPs = slices.Clone(s.cfg.VIPs)
	c.Endpoints = make([]string, 0, len(t.members[s.key]))
	for _, m := range t.members[s.key] {
		if m.cfg.Unhealthy {
			continue
		}
		c.Endpoints = append(c.Endpoints, m.key())
		// An endpoint whose ports route as the service's own do is left
		// out of EndpointPorts: most are, and an entry each is most of
		// the service's memory.
		if ports := m.portsIn(s.key); len(ports) > 0 && !routesAsService(ports, s.cfg.Ports) {
			if c.EndpointPorts == nil {
				c.EndpointPorts = map[string]map[uint16]uint16{}
			}
			c.EndpointPorts[m.key()] = ports
		}
	}
	sort.Strings(c.Endpoints)
	c.Waypoint = t.resolveWaypoint(s.msg.GetWaypoint())
	return &c
}

// resolveWaypoint resolves a GatewayAddress to the waypoint's instances.
func (t *Tracker) resolveWaypoint(gw *workloadapi.GatewayAddress) *config.Waypoint {
	return t.resolveGateway(gw, t.network)
}

// resolveGateway resolves a GatewayAddress to its instances: a workload
// at its address, or the endpoints in network of a service by hostname
// or (our network's) VIP. It resolves a waypoint (our network) and a
// network gateway of another network (ztunnel's fetch_network_gateway),
// whose instances are in that network.
func (t *Tracker) resolveGateway(gw *workloadapi.GatewayAddress, network string) *config.Waypoint {
	if gw == nil {
		return nil
	}
	port := uint16(HBONEPort)
	if p := gw.GetHboneMtlsPort(); p > 0 && p <= 65535 {
		port = uint16(p)
	}
	wp := &config.Waypoint{}
	var svc *trackedService
	switch d := gw.GetDestination().(type) {
	case *workloadapi.GatewayAddress_Hostname:
		wp.Name = d.Hostname.GetNamespace() + "/" + d.Hostname.GetHostname()
		svc = t.serviceOfKey(wp.Name)
	case *workloadapi.GatewayAddress_Address:
		ip, ok := netip.AddrFromSlice(d.Address.GetAddress())
		if !ok {
			wp.Name = "an invalid address"
			return wp
		}
		ip = ip.Unmap()
		wp.Name = ip.String()
		if first := t.addrClaims.first(keyOf(ip)); first != nil && first.kept {
			wp.Endpoints = []config.WaypointEndpoint{{Address: netip.AddrPortFrom(ip, port), Identity: first.cfg.Identity}}
			return wp
		}
		svc = t.serviceAtVIP(ip)
	}
	if svc == nil {
		return wp
	}
	wp.Name = svc.key
	wp.SubjectAltNames = slices.Clone(svc.msg.GetSubjectAltNames())
	var eps []*trackedWorkload
	for _, m := range t.members[svc.key] {
		if !m.cfg.Unhealthy && m.cfg.Network == network {
			eps = append(eps, m)
		}
	}
	slices.SortFunc(eps, func(a, b *trackedWorkload) int { return strings.Compare(a.key(), b.key()) })
	for _, m := range eps {
		wp.Endpoints = append(wp.Endpoints, config.WaypointEndpoint{Address: netip.AddrPortFrom(m.cfg.Addresses[0], port), Identity: m.cfg.Identity})
	}
	return wp
}

// serviceOfKey is the first service by resource name of a namespace and
// hostname.
func (t *Tracker) serviceOfKey(key string) *trackedService {
	return t.keyClaims.first(key)
}

// serviceAtVIP is the first kept service, by resource name, with the VIP
// ip of ours.
func (t *Tracker) serviceAtVIP(ip netip.Addr) *trackedService {
	for _, s := range t.vips[ip] {
		if s.kept {
			return s
		}
	}
	return nil
}

// policies are the policies in force for this node, by resource name.
func (t *Tracker) policies() []config.Policy {
	selected := map[string]bool{}
	if t.self != nil {
		for _, k := range t.self.authz() {
			selected[k] = true
		}
	}
	var out []config.Policy
	for _, name := range sortedKeys(t.pols) {
		p := t.pols[name]
		if p.msg.GetDryRun() || !applies(p.msg, t.node.Namespace, selected) {
			continue
		}
		out = append(out, p.cfg)
	}
	return out
}

func (t *Tracker) rejections() []Rejection {
	if len(t.rejected) == 0 {
		return nil
	}
	rs := make([]trackedRejection, 0, len(t.rejected))
	for _, r := range t.rejected {
		rs = append(rs, r)
	}
	slices.SortFunc(rs, func(a, b trackedRejection) int {
		if a.rank != b.rank {
			return a.rank - b.rank
		}
		return strings.Compare(a.name, b.name)
	})
	out := make([]Rejection, len(rs))
	for i, r := range rs {
		out[i] = Rejection{Name: r.name, Reason: r.reason}
	}
	return out
}

// State is the whole conversion: every entry kept, in Convert's order
// (workloads of our network first, then by resource name; services and
// policies by resource name).
func (t *Tracker) State() State {
	st := State{Self: t.selfEntry(), Network: t.network, Rejections: t.rejections(), Policies: t.policies()}
	var ws []*trackedWorkload
	for _, w := range t.wls {
		if w.out != nil {
			ws = append(ws, w)
		}
	}
	slices.SortFunc(ws, t.claimOrder)
	for _, w := range ws {
		st.Workloads = append(st.Workloads, *w.out)
	}
	for _, res := range sortedKeys(t.outS) {
		st.Services = append(st.Services, *t.outS[res])
	}
	return st
}
