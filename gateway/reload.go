package gateway

import (
	"errors"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/dnsproxy"
	"github.com/meshtun/meshtun/internal/pmap"
	"github.com/meshtun/meshtun/mesh"
)

// Reload: the parts of the config a running gateway can change.
//
// Every flow works from one snapshot, taken when it starts: the config,
// the Router built from it and the Authorizer of its policies. Reload
// builds a whole new snapshot beside the running one and swaps the pointer,
// so a flow never sees the router of one config and the policies of
// another; flows that started earlier keep the snapshot they took.
//
// What a reload applies: [[peers]], [[workloads]], [[services]] (and with
// them the names the DNS server answers: the snapshot's zone),
// [[policies]], hbone.serve, gateway.drain_timeout,
// gateway.max_flows_per_source, log.level, dns.ttl and the [gateway] keys
// describing this node's workload (the labels and baggage of new flows),
// the keys the config schema tags reload:"apply" (config.ReloadApplied). Every
// other key is bound to something built once at start (the device and its
// routes, the stack, the listeners, the pool, the certificates, the
// loggers): a reload that changes one logs it as needing a restart and
// keeps running with the old value, so the snapshot's config always says
// what is really in force.
//
// After a change of policies, every open inbound connection is authorized
// again with the new policies, exactly as a new stream would be; the ones
// now denied are ended (a reset on both sides) and logged with
// response_flags DENY, as ztunnel does. Outbound flows whose route is gone
// are left to finish: the peer's gateway decides about them, and cutting
// a client's connection because a routing entry moved would be worse than
// letting it end on its own.
//
// With [mesh] on, the config in force is the file's merged with the
// mesh's latest state (merge): each xDS update (ApplyMesh) and each
// reload builds a snapshot of that merge through the same swap. On a
// clash (a workload's address or namespace/name, a service's VIP:port or
// namespace/name, a policy's name) the file's entry wins; the mesh's is
// dropped, logged as an error and counted (MeshStats). The node's own
// workload's addresses join hbone.serve.

// snapshot is what one flow uses of the config. Read-only once stored.
type snapshot struct {
	// cfg is in force: restart-only keys keep their values from the
	// start. Its workloads and services are the file's; the mesh's are in
	// meshEntries and routed by router.mesh (meshstate.go). Its network,
	// own workload, hbone.serve and policies are the merged ones.
	cfg    *config.Config
	router *Router
	authz  *Authorizer
	zone   *dnsproxy.Zone // the names the DNS server answers (dns.go)
	// endpointTurn holds one round-robin counter per service and
	// waypoint, by "namespace/name"; a reload carries the counters of
	// services it keeps.
	endpointTurn pmap.Map[string, *atomic.Uint64]
	// meshEntries is the mesh's state the snapshot was built from, and
	// routed the routes of its entries in force, by resource name.
	meshEntries meshState
	routed      routedByRes
}

// newSnapshot is the snapshot of cfg's own entries; prev's counters of
// the services it keeps carry on.
func newSnapshot(cfg *config.Config, prev *snapshot) *snapshot {
	s := &snapshot{
		cfg:    cfg,
		router: NewRouter(cfg),
		authz:  NewAuthorizer(cfg.Policies),
		zone:   zoneOf(cfg),
	}
	keep := func(key string) {
		if _, ok := s.endpointTurn.Get(key); ok {
			return
		}
		var turn *atomic.Uint64
		ok := false
		if prev != nil {
			turn, ok = prev.endpointTurn.Get(key)
		}
		if !ok {
			turn = new(atomic.Uint64)
		}
		s.endpointTurn = s.endpointTurn.Set(key, turn)
	}
	for _, svc := range cfg.Services {
		keep(svc.Namespace + "/" + svc.Name)
		if svc.Waypoint != nil {
			keep(svc.Waypoint.Name)
		}
	}
	for _, w := range cfg.Workloads {
		if w.Waypoint != nil {
			keep(w.Waypoint.Name) // a waypoint's instances take turns too
		}
	}
	return s
}

// pickEndpoint is the endpoint choice Router.Route asks for: round robin
// per service, so each endpoint gets an even share of the flows whatever
// other services are used in between.
func (s *snapshot) pickEndpoint(service string, n int) int {
	turn, ok := s.endpointTurn.Get(service)
	if !ok {
		return 0
	}
	return int((turn.Add(1) - 1) % uint64(n))
}

// snapshot is the config in force for a flow starting now.
func (g *Gateway) snapshot() *snapshot { return g.cur.Load() }

// ErrReloadNil is Reload's answer to a nil config.
var ErrReloadNil = errors.New("gateway: reload: no config")

// Reload puts cfg in force for new flows and re-authorizes the open
// inbound connections if the policies changed. cfg must come from
// config.Load without error and have passed New's checks (the CLI loads
// it through the same path as at start). It returns the keys that changed
// and were applied, and the keys that changed but need a restart (they
// keep their running values). Reloads are serialized; flows keep running
// throughout.
func (g *Gateway) Reload(cfg *config.Config) (changed, restartNeeded []string, err error) {
	if cfg == nil {
		return nil, nil, ErrReloadNil
	}
	g.reloadMu.Lock()
	defer g.reloadMu.Unlock()

	eff := *cfg
	changed, restartNeeded = diffConfig(g.file, &eff)
	for _, k := range restartNeeded {
		g.log.Warn("reload: key changed but needs a restart; keeping its running value", "key", k)
	}
	if len(changed) == 0 {
		g.log.Info("reload: nothing to apply")
		return nil, restartNeeded, nil
	}
	if eff.Log.Level != g.file.Log.Level {
		g.log.SetLevel(hclog.LevelFromString(eff.Log.Level)) // the level is shared by every sub-logger
	}
	g.file = &eff
	g.keys = fileKeysOf(g.file)
	checked, closed := g.swapLocked()
	g.log.Info("reloaded", "changed", strings.Join(changed, ","),
		"peers", len(eff.Peers), "workloads", len(eff.Workloads), "services", len(eff.Services), "policies", len(eff.Policies),
		"inbound_checked", checked, "inbound_closed", closed)
	return changed, restartNeeded, nil
}

// swapLocked puts in force the merge of g.file and g.mesh, every route
// built anew; when the policies changed, the open inbound connections are
// authorized again and those now denied closed. The caller holds
// reloadMu.
func (g *Gateway) swapLocked() (checked, closed int) {
	old := g.snapshot()
	return g.swapToLocked(old, g.fullSnapshotLocked(g.mergeLocked(), old))
}

// swapChangedLocked is swapLocked for a change of the mesh's entries: the
// routes ch names are changed, the rest shared with the snapshot in
// force.
func (g *Gateway) swapChangedLocked(ch *mesh.Changes) (checked, closed int) {
	old := g.snapshot()
	return g.swapToLocked(old, g.changedSnapshotLocked(g.mergeLocked(), old, ch))
}

func (g *Gateway) swapToLocked(old, next *snapshot) (checked, closed int) {
	// Swap under the flow table's lock: an inbound flow watched after this
	// sees the new snapshot (watchInbound), one watched before is in the
	// list checked below. None is missed.
	open := g.flows.swap(func() { g.cur.Store(next) })
	if next.authz == old.authz || policiesEqual(old.cfg.Policies, next.cfg.Policies) {
		return 0, 0
	}
	for _, f := range open {
		if d := next.authz.Authorize(f.ac); !d.Allow {
			f.deny(d.Reason)
			closed++
		}
	}
	return len(open), closed
}

func policiesEqual(a, b []config.Policy) bool {
	return reflect.DeepEqual(a, b)
}

// MeshStats is what the gateway did with the mesh's state.
type MeshStats struct {
	// Updates counts ApplyMesh calls.
	Updates uint64
	// Rejected is the number of resources of the latest state that could
	// not be used (mesh.State.Rejections); Clashes the number of its
	// entries dropped because the file has one of the same address, VIP
	// and port, or name.
	Rejected, Clashes int64
	// OtherNetwork counts flows denied because their destination is in
	// another network.
	OtherNetwork uint64
	// Ready is true once a complete state was applied.
	Ready bool
}

// MeshStats returns the counts of the mesh's state in force.
func (g *Gateway) MeshStats() MeshStats {
	ready := false
	select {
	case <-g.meshReady:
		ready = true
	default:
	}
	return MeshStats{
		Updates:      g.meshStats.updates.Load(),
		Rejected:     g.meshStats.rejected.Load(),
		Clashes:      g.meshStats.clashes.Load(),
		OtherNetwork: g.meshStats.otherNetwork.Load(),
		Ready:        ready,
	}
}

type meshCounters struct {
	updates, otherNetwork atomic.Uint64
	rejected, clashes     atomic.Int64
}

// meshLog remembers what was last logged of each kind, so a problem is
// logged once when it appears, not at every update. Guarded by reloadMu.
type meshLog map[string]map[string]bool

func (l *meshLog) fresh(kind string, now []string) []string {
	if *l == nil {
		*l = meshLog{}
	}
	prev := (*l)[kind]
	cur := make(map[string]bool, len(now))
	var out []string
	for _, s := range now {
		cur[s] = true
		if !prev[s] {
			out = append(out, s)
		}
	}
	(*l)[kind] = cur
	return out
}

// mergeLocked is the config in force: the file's, with the mesh's
// network and own workload, its policies that do not clash with the
// file's, and hbone.serve widened by the node's own workload's
// addresses. The mesh's workloads and services are not in it: they are
// routed from persistent maps (meshstate.go), so a merge costs the file,
// not the mesh.
func (g *Gateway) mergeLocked() *config.Config {
	if g.mesh == nil {
		return g.file
	}
	c := *g.file
	st := g.mesh
	c.Network, c.Self = st.network, st.self

	c.Policies = slices.Clone(g.file.Policies)
	var clashes []string
	for _, p := range st.policies {
		if g.keys.policies[p.Name] {
			clashes = append(clashes, "policy "+p.Name+": the file has a policy of that name")
			continue
		}
		c.Policies = append(c.Policies, p)
	}
	g.policyClashes = len(clashes)
	for _, cl := range g.meshLog.fresh("clash", clashes) {
		g.log.Error("mesh: entry from istiod dropped: the file's wins", "clash", cl)
	}

	if st.self != nil {
		c.HBONE.Serve = slices.Clone(g.file.HBONE.Serve)
		for _, a := range st.self.Addresses {
			p := netip.PrefixFrom(a, a.BitLen())
			if !slices.ContainsFunc(c.HBONE.Serve, func(q netip.Prefix) bool { return q.Contains(a) }) {
				c.HBONE.Serve = append(c.HBONE.Serve, p)
			}
		}
	}
	return &c
}

// diffConfig compares the config in force with a new one, key by key:
// changed lists the keys Reload applies, restartNeeded the others (the
// schema's reload tags decide, config.ReloadApplied). The restart-only
// keys of next are set back to their values in cur, so next becomes the
// config in force after the reload.
func diffConfig(cur, next *config.Config) (changed, restartNeeded []string) {
	for _, k := range config.Diff(cur, next) {
		if config.ReloadApplied(k) {
			changed = append(changed, k)
		} else {
			restartNeeded = append(restartNeeded, k)
		}
	}
	*next = *config.InForce(cur, next)
	return changed, restartNeeded
}

// watchInbound makes f, an inbound flow that authorized allowed as ac and
// that is about to be relayed between stream and target, one that a
// reload authorizes again. If a reload swapped the snapshot in the
// meantime, f is authorized again with the one now in force and ended at
// once if that denies it.
func (g *Gateway) watchInbound(f *flow, authorized *snapshot, ac AuthzConn, stream, target conn) {
	if now := g.flows.watch(f, ac, stream, target, g.snapshot); now != authorized {
		if d := now.authz.Authorize(ac); !d.Allow {
			f.deny(d.Reason)
		}
	}
}
