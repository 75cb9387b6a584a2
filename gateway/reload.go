package gateway

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/dnsproxy"
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
	cfg    *config.Config // in force: restart-only keys keep their values from the start
	router *Router
	authz  *Authorizer
	zone   *dnsproxy.Zone // the names the DNS server answers (dns.go)
	// endpointTurn holds one round-robin counter per service, by
	// "namespace/name"; a reload carries the counters of services it keeps.
	endpointTurn map[string]*atomic.Uint64
}

func newSnapshot(cfg *config.Config, prev *snapshot) *snapshot {
	s := &snapshot{
		cfg:          cfg,
		router:       NewRouter(cfg),
		authz:        NewAuthorizer(cfg.Policies),
		zone:         zoneOf(cfg),
		endpointTurn: make(map[string]*atomic.Uint64),
	}
	keep := func(key string) {
		if prev != nil && prev.endpointTurn[key] != nil {
			s.endpointTurn[key] = prev.endpointTurn[key]
		} else if s.endpointTurn[key] == nil {
			s.endpointTurn[key] = new(atomic.Uint64)
		}
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
	turn := s.endpointTurn[service]
	if turn == nil {
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
	checked, closed := g.swapLocked()
	g.log.Info("reloaded", "changed", strings.Join(changed, ","),
		"peers", len(eff.Peers), "workloads", len(eff.Workloads), "services", len(eff.Services), "policies", len(eff.Policies),
		"inbound_checked", checked, "inbound_closed", closed)
	return changed, restartNeeded, nil
}

// swapLocked puts in force the merge of g.file and g.mesh; when the
// policies changed, the open inbound connections are authorized again and
// those now denied closed. The caller holds reloadMu.
func (g *Gateway) swapLocked() (checked, closed int) {
	old := g.snapshot()
	merged := g.mergeLocked()
	next := newSnapshot(merged, old)

	// Swap under the flow table's lock: an inbound flow watched after this
	// sees the new snapshot (watchInbound), one watched before is in the
	// list checked below. None is missed.
	open := g.flows.swap(func() { g.cur.Store(next) })
	if policiesEqual(old.cfg.Policies, merged.Policies) {
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

// ApplyMesh puts st, the mesh's latest state, in force beside the file's
// entries: the XDSClient's OnUpdate (through mesh.Convert). It takes as
// long as one swap, never waits on the network, and does not call back
// into the xDS client.
func (g *Gateway) ApplyMesh(st mesh.State) {
	g.reloadMu.Lock()
	defer g.reloadMu.Unlock()
	g.mesh = &st
	g.meshStats.updates.Add(1)
	g.meshStats.rejected.Store(int64(len(st.Rejections)))
	var now []string
	for _, r := range st.Rejections {
		now = append(now, r.String())
	}
	for _, r := range g.meshLog.fresh("rejected", now) {
		g.log.Error("mesh: resource not used", "resource", r)
	}
	checked, closed := g.swapLocked()
	var noSelf []string
	if st.Self == nil && st.Ready {
		noSelf = []string{"no workload of this node"}
	}
	if len(g.meshLog.fresh("self", noSelf)) > 0 {
		g.log.Warn("mesh: istiod sends no workload of this node (namespace and service account ours, an address among INSTANCE_IPS): inbound serves hbone.serve only, the network is the default one, and no workload-selector policy applies")
	}
	g.log.Debug("mesh: applied", "generation", st.Generation, "workloads", len(st.Workloads), "services", len(st.Services),
		"policies", len(st.Policies), "rejected", len(st.Rejections), "inbound_checked", checked, "inbound_closed", closed)
	if st.Ready {
		g.meshReadyOnce.Do(func() {
			g.log.Info("mesh: first complete state from istiod", "workloads", len(st.Workloads), "services", len(st.Services), "policies", len(st.Policies))
			close(g.meshReady)
		})
	}
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
// entries that do not clash with it, the mesh's network, and hbone.serve
// widened by the node's own workload's addresses.
func (g *Gateway) mergeLocked() *config.Config {
	if g.mesh == nil {
		return g.file
	}
	c := *g.file
	st := g.mesh
	var clashes []string
	c.Network, c.Self = st.Network, st.Self

	c.Workloads = slices.Clone(g.file.Workloads)
	addrs := map[netip.Addr]string{}
	names := map[string]bool{}
	for _, w := range c.Workloads {
		names[w.Namespace+"/"+w.Name] = true
		for _, a := range w.Addresses {
			addrs[a.Unmap()] = w.Namespace + "/" + w.Name
		}
	}
	for _, w := range st.Workloads {
		key := w.Namespace + "/" + w.Name
		clash := ""
		if names[key] {
			clash = "the file has a workload of that namespace and name"
		}
		for _, a := range w.Addresses {
			if o, ok := addrs[a]; ok {
				clash = fmt.Sprintf("address %s is the file's workload %s", a, o)
			}
		}
		if clash != "" {
			clashes = append(clashes, "workload "+key+": "+clash)
			continue
		}
		c.Workloads = append(c.Workloads, w)
	}

	c.Services = slices.Clone(g.file.Services)
	vips := map[netip.AddrPort]string{}
	names = map[string]bool{}
	for _, s := range c.Services {
		names[s.Namespace+"/"+s.Name] = true
		for _, v := range s.VIPs {
			for p := range s.Ports {
				vips[netip.AddrPortFrom(v.Unmap(), p)] = s.Namespace + "/" + s.Name
			}
		}
	}
	for _, s := range st.Services {
		key := s.Namespace + "/" + s.Name
		clash := ""
		if names[key] {
			clash = "the file has a service of that namespace and name"
		}
		for _, v := range s.VIPs {
			for p := range s.Ports {
				if o, ok := vips[netip.AddrPortFrom(v, p)]; ok {
					clash = fmt.Sprintf("%s is the file's service %s", netip.AddrPortFrom(v, p), o)
				}
			}
		}
		if clash != "" {
			clashes = append(clashes, "service "+key+": "+clash)
			continue
		}
		c.Services = append(c.Services, s)
	}

	c.Policies = slices.Clone(g.file.Policies)
	names = map[string]bool{}
	for _, p := range c.Policies {
		names[p.Name] = true
	}
	for _, p := range st.Policies {
		if names[p.Name] {
			clashes = append(clashes, "policy "+p.Name+": the file has a policy of that name")
			continue
		}
		c.Policies = append(c.Policies, p)
	}

	if st.Self != nil {
		c.HBONE.Serve = slices.Clone(g.file.HBONE.Serve)
		for _, a := range st.Self.Addresses {
			p := netip.PrefixFrom(a, a.BitLen())
			if !slices.ContainsFunc(c.HBONE.Serve, func(q netip.Prefix) bool { return q.Contains(a) }) {
				c.HBONE.Serve = append(c.HBONE.Serve, p)
			}
		}
	}

	g.meshStats.clashes.Store(int64(len(clashes)))
	for _, cl := range g.meshLog.fresh("clash", clashes) {
		g.log.Error("mesh: entry from istiod dropped: the file's wins", "clash", cl)
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
