package gateway

import (
	"errors"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"

	"github.com/meshtun/meshtun/config"
)

// Reload: the parts of the config a running gateway can change.
//
// Every flow works from one snapshot, taken when it starts: the config,
// the Router built from it and the Authorizer of its policies. Reload
// builds a whole new snapshot beside the running one and swaps the pointer,
// so a flow never sees the router of one config and the policies of
// another; flows that started earlier keep the snapshot they took.
//
// What a reload applies: [[peers]], [[workloads]], [[services]],
// [[policies]], hbone.serve, gateway.drain_timeout and log.level, the keys
// the config schema tags reload:"apply" (config.ReloadApplied). Every
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

// snapshot is what one flow uses of the config. Read-only once stored.
type snapshot struct {
	cfg    *config.Config // in force: restart-only keys keep their values from the start
	router *Router
	authz  *Authorizer
	// endpointTurn holds one round-robin counter per service, by
	// "namespace/name"; a reload carries the counters of services it keeps.
	endpointTurn map[string]*atomic.Uint64
}

func newSnapshot(cfg *config.Config, prev *snapshot) *snapshot {
	s := &snapshot{
		cfg:          cfg,
		router:       NewRouter(cfg),
		authz:        NewAuthorizer(cfg.Policies),
		endpointTurn: make(map[string]*atomic.Uint64),
	}
	for _, svc := range cfg.Services {
		key := svc.Namespace + "/" + svc.Name
		if prev != nil && prev.endpointTurn[key] != nil {
			s.endpointTurn[key] = prev.endpointTurn[key]
		} else {
			s.endpointTurn[key] = new(atomic.Uint64)
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

	old := g.snapshot()
	eff := *cfg
	changed, restartNeeded = diffConfig(old.cfg, &eff)
	for _, k := range restartNeeded {
		g.log.Warn("reload: key changed but needs a restart; keeping its running value", "key", k)
	}
	if len(changed) == 0 {
		g.log.Info("reload: nothing to apply")
		return nil, restartNeeded, nil
	}
	next := newSnapshot(&eff, old)
	if eff.Log.Level != old.cfg.Log.Level {
		g.log.SetLevel(hclog.LevelFromString(eff.Log.Level)) // the level is shared by every sub-logger
	}

	// Swap under the flow table's lock: an inbound flow watched after this
	// sees the new snapshot (watchInbound), one watched before is in the
	// list checked below. None is missed.
	open := g.flows.swap(func() { g.cur.Store(next) })
	if !slices.Contains(changed, "policies") {
		open = nil
	}

	closed := 0
	for _, f := range open {
		if d := next.authz.Authorize(f.ac); !d.Allow {
			f.deny(d.Reason)
			closed++
		}
	}
	g.log.Info("reloaded", "changed", strings.Join(changed, ","),
		"peers", len(eff.Peers), "workloads", len(eff.Workloads), "services", len(eff.Services), "policies", len(eff.Policies),
		"inbound_checked", len(open), "inbound_closed", closed)
	return changed, restartNeeded, nil
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
