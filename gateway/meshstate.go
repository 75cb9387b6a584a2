package gateway

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/dnsproxy"
	"github.com/meshtun/meshtun/internal/pmap"
	"github.com/meshtun/meshtun/mesh"
)

// The mesh's entries, as istiod's updates change them.
//
// The gateway holds what the mesh.Tracker emitted (meshState), by
// resource name, in persistent maps. An update (ApplyMeshChanges) changes
// those maps, the router's mesh routes, the DNS zone and the round-robin
// counters by what it changed, each a path copy, and swaps the snapshot:
// its cost is the entries it names (and the endpoints of the services it
// names), not the mesh. A reload of the file, a full state (ApplyMesh, or
// a Tracker's Full change when the network moved) rebuild every route
// from meshState; that is the only place the whole mesh is walked,
// besides /config_dump.
//
// The file wins a clash (fileKeys): a mesh entry with an address,
// VIP:port or name of the file's is held but not routed, logged once and
// counted.

// meshState is the mesh's latest state as the gateway holds it.
type meshState struct {
	workloads  pmap.Map[string, *config.Workload] // by resource name
	services   pmap.Map[string, *config.Service]
	policies   []config.Policy
	self       *config.Workload
	network    string
	rejections []mesh.Rejection
	ready      bool
	generation uint64
}

// meshStateOf is a whole State as a meshState, keyed by namespace/name
// (and position, should a name repeat).
func meshStateOf(st mesh.State) *meshState {
	ms := &meshState{policies: st.Policies, self: st.Self, network: st.Network, rejections: st.Rejections,
		ready: st.Ready, generation: st.Generation}
	for i := range st.Workloads {
		w := &st.Workloads[i]
		ms.workloads = ms.workloads.Set(fmt.Sprintf("%s/%s#%d", w.Namespace, w.Name, i), w)
	}
	for i := range st.Services {
		s := &st.Services[i]
		ms.services = ms.services.Set(fmt.Sprintf("%s/%s#%d", s.Namespace, s.Name, i), s)
	}
	return ms
}

// fileKeys are what the file's entries hold: a mesh entry that claims any
// of it is dropped (the file wins).
type fileKeys struct {
	workloads map[string]bool       // namespace/name
	addrs     map[netip.Addr]string // → the file's workload
	services  map[string]bool
	vips      map[netip.AddrPort]string // → the file's service
	policies  map[string]bool
}

func fileKeysOf(cfg *config.Config) *fileKeys {
	k := &fileKeys{workloads: map[string]bool{}, addrs: map[netip.Addr]string{}, services: map[string]bool{},
		vips: map[netip.AddrPort]string{}, policies: map[string]bool{}}
	for _, w := range cfg.Workloads {
		k.workloads[w.Namespace+"/"+w.Name] = true
		for _, a := range w.Addresses {
			k.addrs[a.Unmap()] = w.Namespace + "/" + w.Name
		}
	}
	for _, s := range cfg.Services {
		k.services[s.Namespace+"/"+s.Name] = true
		for _, v := range s.VIPs {
			for p := range s.Ports {
				k.vips[netip.AddrPortFrom(v.Unmap(), p)] = s.Namespace + "/" + s.Name
			}
		}
	}
	for _, p := range cfg.Policies {
		k.policies[p.Name] = true
	}
	return k
}

// workloadClash says why the file's entries keep w out ("" if nothing).
func (k *fileKeys) workloadClash(w *config.Workload) string {
	key := w.Namespace + "/" + w.Name
	clash := ""
	if k.workloads[key] {
		clash = "the file has a workload of that namespace and name"
	}
	for _, a := range w.Addresses {
		if o, ok := k.addrs[a]; ok {
			clash = fmt.Sprintf("address %s is the file's workload %s", a, o)
		}
	}
	if clash == "" {
		return ""
	}
	return "workload " + key + ": " + clash
}

func (k *fileKeys) serviceClash(s *config.Service) string {
	key := s.Namespace + "/" + s.Name
	clash := ""
	if k.services[key] {
		clash = "the file has a service of that namespace and name"
	}
	for _, v := range s.VIPs {
		for p := range s.Ports {
			if o, ok := k.vips[netip.AddrPortFrom(v, p)]; ok {
				clash = fmt.Sprintf("%s is the file's service %s", netip.AddrPortFrom(v, p), o)
			}
		}
	}
	if clash == "" {
		return ""
	}
	return "service " + key + ": " + clash
}

// meshBuild is one change of the mesh's part of a snapshot: the router's
// mesh routes, the zone and the counters, changed in place (they are
// values copied from the snapshot in force: persistent maps).
type meshBuild struct {
	g      *Gateway
	cfg    *config.Config // the merged config of the new snapshot
	routes meshRoutes
	// prevW is the workloads of the snapshot built on, by resource name
	// (none for a full rebuild): what a change replaces. A workload's
	// route is found from its entry, by its name (routedOf), rather than
	// through a map of its own: one map entry less for every pod.
	prevW  pmap.Map[string, *config.Workload]
	wlN    int // the mesh's workloads routed
	svcRes pmap.Map[string, *serviceRoute]
	turns  pmap.Map[string, *atomic.Uint64]
	prev   pmap.Map[string, *atomic.Uint64] // a full rebuild's predecessor's counters, carried on
	zone   map[string]dnsproxy.Host         // the zone's changes, by resource name
}

// setWorkload replaces the routes of resource res with w's (nil: none).
// A key the new route keeps (its resource, an address, its name) is set
// once, over the old value, rather than deleted and set again: each write
// of a persistent map copies a path.
func (b *meshBuild) setWorkload(res string, w *config.Workload) {
	oldW, hadOld := b.prevW.Get(res)
	// An entry is routed unless the file's clashed with it (routedOf
	// cannot say, once another entry of this change took its name).
	_, oldClashed := b.g.clashes["w"+res]
	b.g.setClashLocked("w"+res, "")
	var wr *workloadRoute
	if w != nil {
		if c := b.g.keys.workloadClash(w); c != "" {
			b.g.setClashLocked("w"+res, c)
		} else {
			wr = newWorkloadRoute(w, meshName(res, w), b.cfg)
		}
	}
	if hadOld {
		// The old entry's routes are those that still point at it: a key
		// another entry of this change took is left to it.
		oldName := oldW.Namespace + "/" + oldW.Name
		if !oldClashed {
			b.wlN--
		}
		for _, a := range oldW.Addresses {
			a = a.Unmap()
			if wr != nil && slices.Contains(wr.addresses(), a) {
				continue // set to wr below
			}
			if cur, _ := b.routes.workloads.Get(a); cur != nil && cur.w == oldW {
				b.routes.workloads = b.routes.workloads.Delete(a)
			}
		}
		if wr == nil || wr.name != oldName {
			if cur, _ := b.routes.byName.Get(oldName); cur != nil && cur.w == oldW {
				b.routes.byName = b.routes.byName.Delete(oldName)
			}
		}
	}
	if wr == nil {
		return
	}
	b.wlN++
	for _, a := range wr.addresses() {
		b.routes.workloads = b.routes.workloads.Set(a, wr)
	}
	b.routes.byName = b.routes.byName.Set(wr.name, wr)
	if w.Waypoint != nil {
		b.turn(w.Waypoint.Name) // a waypoint's instances take turns too
	}
}

// meshName is the namespace/name of w, the mesh's entry of resource res:
// the end of res when res ends with it, as a pod's does
// ("Kubernetes//Pod/<namespace>/<name>"), so that its route holds no
// copy of its own (one allocation less for every pod), else a string of
// its own.
func meshName(res string, w *config.Workload) string {
	head, ok := strings.CutSuffix(res, w.Name)
	head, slash := strings.CutSuffix(head, "/")
	if ok && slash && strings.HasSuffix(head, w.Namespace) {
		return res[len(res)-len(w.Namespace)-1-len(w.Name):]
	}
	return w.Namespace + "/" + w.Name
}

// setService replaces the routes of resource res with s's (nil: none).
// The workloads of the same change come first: s's endpoints are looked
// up among them. As in setWorkload, a key kept is written once; the
// hostname's count and the DNS zone change only when the hostname or the
// VIPs do (a pod's change changes its service's endpoints, not its name).
func (b *meshBuild) setService(res string, s *config.Service) {
	old, hadOld := b.svcRes.Get(res)
	b.g.setClashLocked("s"+res, "")
	var sr *serviceRoute
	if s != nil {
		if c := b.g.keys.serviceClash(s); c != "" {
			b.g.setClashLocked("s"+res, c)
		} else {
			sr = newServiceRoute(s, b.routes.byName.Get)
			for _, v := range s.VIPs {
				sr.vips = append(sr.vips, v.Unmap())
			}
		}
	}
	byName := func(a, b *serviceRoute) int { return strings.Compare(a.name, b.name) }
	if hadOld {
		for _, v := range old.vips {
			list, _ := b.routes.services.Get(v)
			list = slices.DeleteFunc(slices.Clone(list), func(x *serviceRoute) bool { return x == old })
			if sr != nil && slices.Contains(sr.vips, v) {
				list = append(list, sr)
				slices.SortFunc(list, byName)
			}
			if len(list) == 0 {
				b.routes.services = b.routes.services.Delete(v)
			} else {
				b.routes.services = b.routes.services.Set(v, list)
			}
		}
	}
	if sr != nil {
		for _, v := range sr.vips {
			if hadOld && slices.Contains(old.vips, v) {
				continue // replaced above
			}
			list, _ := b.routes.services.Get(v)
			list = append(slices.Clone(list), sr)
			slices.SortFunc(list, byName)
			b.routes.services = b.routes.services.Set(v, list)
		}
	}

	oldHost, newHost := "", ""
	if hadOld {
		oldHost = old.hostname
	}
	if sr != nil {
		newHost = s.Hostname
	}
	if oldHost != newHost || !hadOld || sr == nil || !slices.Equal(old.vips, sr.vips) {
		if oldHost != "" {
			b.countHost(oldHost, -1)
		}
		b.zone[res] = dnsproxy.Host{}
		if newHost != "" {
			b.countHost(newHost, 1)
			b.zone[res] = dnsproxy.Host{Name: newHost, Addrs: s.VIPs}
		}
	}

	if sr == nil {
		if hadOld {
			b.svcRes = b.svcRes.Delete(res)
		}
		return
	}
	b.svcRes = b.svcRes.Set(res, sr)
	b.turn(sr.name)
	if s.Waypoint != nil {
		b.turn(s.Waypoint.Name)
	}
}

func (b *meshBuild) countHost(h string, d int) {
	n, _ := b.routes.hosts.Get(h)
	if n+d == 0 {
		b.routes.hosts = b.routes.hosts.Delete(h)
	} else {
		b.routes.hosts = b.routes.hosts.Set(h, n+d)
	}
}

// turn makes sure a round-robin counter exists for name; a counter is
// kept as long as the snapshot is built on (a full rebuild keeps only
// those of the names in force).
func (b *meshBuild) turn(name string) {
	if _, ok := b.turns.Get(name); !ok {
		t, ok := b.prev.Get(name)
		if !ok {
			t = new(atomic.Uint64)
		}
		b.turns = b.turns.Set(name, t)
	}
}

// setClashLocked records why the mesh's entry id is dropped ("" if it is
// not), logging a new clash once.
func (g *Gateway) setClashLocked(id, clash string) {
	old, had := g.clashes[id]
	switch {
	case clash == "" && had:
		delete(g.clashes, id)
	case clash != "" && (!had || old != clash):
		g.clashes[id] = clash
		if g.clashesBefore[id] != clash {
			g.log.Error("mesh: entry from istiod dropped: the file's wins", "clash", clash)
		}
	}
}

// ApplyMeshChanges puts in force what a mesh.Tracker's Apply changed of
// the mesh's state: the XDSClient's OnDelta, through the Tracker. It
// costs the entries ch names; a Full change rebuilds.
func (g *Gateway) ApplyMeshChanges(ch mesh.Changes, ready bool, generation uint64) {
	g.reloadMu.Lock()
	defer g.reloadMu.Unlock()
	prev := g.mesh
	ms := &meshState{}
	if prev != nil && !ch.Full {
		*ms = *prev
	}
	for res, w := range ch.Workloads {
		if w == nil {
			ms.workloads = ms.workloads.Delete(res)
		} else {
			ms.workloads = ms.workloads.Set(res, w)
		}
	}
	for res, s := range ch.Services {
		if s == nil {
			ms.services = ms.services.Delete(res)
		} else {
			ms.services = ms.services.Set(res, s)
		}
	}
	if ch.PoliciesChanged || prev == nil || ch.Full {
		ms.policies = ch.Policies
	}
	ms.self, ms.network, ms.rejections = ch.Self, ch.Network, ch.Rejections
	ms.ready, ms.generation = ready, generation
	g.mesh = ms
	if ch.Full || prev == nil || prev.network != ms.network {
		g.applyMeshLocked(true, nil)
		return
	}
	g.applyMeshLocked(false, &ch)
}

// ApplyMesh puts st, a whole state of the mesh, in force beside the file's
// entries, rebuilding every route: for a caller with the whole state
// (tests; the XDSClient's path is ApplyMeshChanges). It takes as long as
// one swap, never waits on the network, and does not call back into the
// xDS client.
func (g *Gateway) ApplyMesh(st mesh.State) {
	g.reloadMu.Lock()
	defer g.reloadMu.Unlock()
	g.mesh = meshStateOf(st)
	g.applyMeshLocked(true, nil)
}

// applyMeshLocked swaps in the snapshot of g.mesh, rebuilt (full) or
// changed by ch, and logs what is new of its problems.
func (g *Gateway) applyMeshLocked(full bool, ch *mesh.Changes) {
	st := g.mesh
	g.meshStats.updates.Add(1)
	g.meshStats.rejected.Store(int64(len(st.rejections)))
	var now []string
	for _, r := range st.rejections {
		now = append(now, r.String())
	}
	for _, r := range g.meshLog.fresh("rejected", now) {
		g.log.Error("mesh: resource not used", "resource", r)
	}
	var checked, closed int
	if full {
		checked, closed = g.swapLocked()
	} else {
		checked, closed = g.swapChangedLocked(ch)
	}
	var noSelf []string
	if st.self == nil && st.ready {
		noSelf = []string{"no workload of this node"}
	}
	if len(g.meshLog.fresh("self", noSelf)) > 0 {
		g.log.Warn("mesh: istiod sends no workload of this node (namespace and service account ours, an address among INSTANCE_IPS): inbound serves hbone.serve only, the network is the default one, and no workload-selector policy applies")
	}
	g.log.Debug("mesh: applied", "generation", st.generation, "workloads", st.workloads.Len(), "services", st.services.Len(),
		"policies", len(st.policies), "rejected", len(st.rejections), "inbound_checked", checked, "inbound_closed", closed)
	if st.ready {
		g.meshReadyOnce.Do(func() {
			g.log.Info("mesh: first complete state from istiod", "workloads", st.workloads.Len(), "services", st.services.Len(), "policies", len(st.policies))
			close(g.meshReady)
		})
	}
}

// meshWorkloads and meshServices are the mesh's entries in force (not
// dropped for a clash), in the order of their resource names: for
// /config_dump.
func (s *snapshot) meshWorkloads() []config.Workload {
	type held struct {
		res string
		w   *config.Workload
	}
	var in []held
	for res, w := range s.meshEntries.workloads.All() {
		if _, routed := s.router.mesh.routedOf(w); routed {
			in = append(in, held{res, w})
		}
	}
	slices.SortFunc(in, func(a, b held) int { return strings.Compare(a.res, b.res) })
	out := make([]config.Workload, len(in))
	for i, h := range in {
		out[i] = *h.w
	}
	return out
}

func (s *snapshot) meshServices() []config.Service {
	return entriesInForce(s.meshEntries.services, s.routed.svc)
}

func entriesInForce[T any, R any](all pmap.Map[string, *T], routed pmap.Map[string, R]) []T {
	keys := make([]string, 0, routed.Len())
	for k := range routed.All() {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]T, 0, len(keys))
	for _, k := range keys {
		if e, ok := all.Get(k); ok {
			out = append(out, *e)
		}
	}
	return out
}

// routedByRes are the routes of the mesh's services by resource name,
// and how many of its workloads are routed.
type routedByRes struct {
	workloads int
	svc       pmap.Map[string, *serviceRoute]
}

// fullSnapshotLocked is the snapshot of cfg, the merged config, with
// every route of g.mesh built anew; prev's counters carry on.
func (g *Gateway) fullSnapshotLocked(cfg *config.Config, prev *snapshot) *snapshot {
	next := newSnapshot(cfg, prev)
	if g.mesh == nil {
		return next
	}
	b := &meshBuild{g: g, cfg: cfg, turns: next.endpointTurn, zone: map[string]dnsproxy.Host{}}
	if prev != nil {
		b.prev = prev.endpointTurn
	}
	g.clashesBefore, g.clashes = g.clashes, map[string]string{}
	for res, w := range g.mesh.workloads.All() {
		b.setWorkload(res, w)
	}
	for res, s := range g.mesh.services.All() {
		b.setService(res, s)
	}
	g.clashesBefore = nil
	return b.finish(next, next.zone)
}

// changedSnapshotLocked is prev with the mesh's entries ch names changed,
// for cfg, the merged config (the same file and network as prev's).
func (g *Gateway) changedSnapshotLocked(cfg *config.Config, prev *snapshot, ch *mesh.Changes) *snapshot {
	next := *prev
	next.cfg = cfg
	router := *prev.router
	next.router = &router
	if ch.PoliciesChanged {
		next.authz = NewAuthorizer(cfg.Policies)
	}
	b := &meshBuild{g: g, cfg: cfg, routes: prev.router.mesh, prevW: prev.meshEntries.workloads, wlN: prev.routed.workloads, svcRes: prev.routed.svc,
		turns: prev.endpointTurn, zone: map[string]dnsproxy.Host{}}
	for res, w := range ch.Workloads {
		b.setWorkload(res, w)
	}
	for res, s := range ch.Services {
		b.setService(res, s)
	}
	return b.finish(&next, prev.zone)
}

// finish puts what b built into next.
func (b *meshBuild) finish(next *snapshot, zone *dnsproxy.Zone) *snapshot {
	next.router.mesh = b.routes
	next.routed = routedByRes{workloads: b.wlN, svc: b.svcRes}
	next.endpointTurn = b.turns
	next.meshEntries = *b.g.mesh
	next.zone = zone.With(b.zone)
	b.g.meshStats.clashes.Store(int64(len(b.g.clashes) + b.g.policyClashes))
	return next
}
