package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/mesh"
)

// adminHandler serves the admin listener, which binds to localhost by
// default:
//
//   - GET /config_dump: the state in force (after any reload, with what
//     istiod sent), as JSON (configDump): the config with gateway.toml's
//     key names, each workload, service and policy with its source, the
//     certificate in force and, with the mesh on, the xDS stream's state.
//     The config holds only the paths of the certificate and key files,
//     and the certificate section only public facts of the leaf, so no
//     key material can appear here.
//   - GET /route?dst=IP:PORT[&endpoint=N]: the plan of the router in force
//     for a flow to IP:PORT, as JSON (RouteAnswer), what `meshtun route
//     --admin` prints. Asking routes nothing and moves no round robin: a
//     service's endpoint is the N-th (default 0), as `meshtun route
//     --endpoint N` shows it.
//   - GET /status: what `meshtun status` prints, as JSON (StatusAnswer):
//     identity and certificate, the stream to istiod, the entries in force
//     by source, the HBONE pool and its peers, open flows, the latest
//     errors. Its size does not grow with the mesh.
//   - GET /flows?limit=N&offset=M: the flows being relayed, oldest first,
//     a page of at most 1,000 (default 100), as JSON (FlowsAnswer): what
//     `meshtun flows` prints.
//   - GET /logging shows the log level; POST or PUT /logging?level=debug
//     changes it at once for every logger of the process (the access log
//     too, which writes at INFO and WARN).
//   - POST /quitquitquit drains the gateway as SIGTERM does (Quit) and
//     answers 200 at once; the process exits once the drain is over.
//   - /debug/pprof/: Go's profiler, to see where a gateway's CPU and memory
//     go (the bench's missed targets were diagnosed with it).
func (g *Gateway) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /config_dump", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, "config dump", g.configDump())
	})
	mux.HandleFunc("GET /route", g.serveRoute)
	mux.HandleFunc("GET /status", g.serveStatus)
	mux.HandleFunc("GET /flows", g.serveFlows)
	mux.HandleFunc("/logging", g.serveLogging)
	mux.HandleFunc("POST /quitquitquit", g.serveQuit)
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// AdminHandler is the handler Run serves on admin.listen, for serving it
// elsewhere (`meshtun route --admin`'s tests serve it on a test server).
func (g *Gateway) AdminHandler() http.Handler { return g.adminHandler() }

// configDump is what /config_dump shows: config.Dump of the config in
// force (gateway.toml's keys; the workloads, services and policies are
// those in force, the file's and istiod's), and beside the file's keys:
//
//   - "source" in each entry of workloads, services and policies: "file"
//     or "xds" (from istiod);
//   - "certificate": the certificate in force (certificateDump);
//   - "xds", with the mesh on: the stream to istiod (xdsDump).
//
// Without the three, it is a gateway.toml that parses to the config in
// force.
func (g *Gateway) configDump() map[string]any {
	snap := g.snapshot()
	c := *snap.cfg
	c.Workloads = append(slices.Clone(c.Workloads), snap.meshWorkloads()...)
	c.Services = append(slices.Clone(c.Services), snap.meshServices()...)
	cfg := &c
	d := config.Dump(cfg)
	tagSources(d["workloads"], cfg.Workloads, func(w *config.Workload) string { return w.Source })
	tagSources(d["services"], cfg.Services, func(s *config.Service) string { return s.Source })
	tagSources(d["policies"], cfg.Policies, func(p *config.Policy) string { return p.Source })
	if ca := g.metrics.ca.Load(); ca != nil {
		st := ca.Stats()
		c := meshCertificate(st)
		// not_after is the certificate HBONE presents: the manager's
		// latest once the gateway took it.
		if cert, _, notAfter := g.certs().Current(); cert != nil && !st.Expiry.IsZero() {
			c.NotAfter = notAfter.UTC()
		}
		d["certificate"] = c
	} else {
		d["certificate"] = g.fileCertificate()
	}
	if x := g.metrics.xds.Load(); x != nil {
		d["xds"] = newXDSDump(x.NodeID(), x.Stats())
	}
	return d
}

// tagSources sets "source" in each dumped entry of list from the entry of
// entries it was dumped from: config.SourceXDS, or config.SourceFile for
// an entry without a source.
func tagSources[T any](list any, entries []T, source func(*T) string) {
	dumped, _ := list.([]any)
	for i := range min(len(dumped), len(entries)) {
		if m, ok := dumped[i].(map[string]any); ok {
			m["source"] = config.SourceOf(source(&entries[i]))
		}
	}
}

// certificateDump is the certificate section of /config_dump: public
// facts of the certificate in force, never its key.
type certificateDump struct {
	// Source is "file" (tls.cert) or "ca" (Istio's CA, with [mesh]).
	Source   string `json:"source"`
	Identity string `json:"identity"`
	// NotAfter is the leaf's expiry; absent before a first certificate.
	NotAfter time.Time `json:"not_after,omitzero"`
	// CA is the certificate manager's state (source "ca" only).
	CA *caDump `json:"ca,omitempty"`
}

// caDump is the state of the renewals from Istio's CA.
type caDump struct {
	NextAttempt     time.Time `json:"next_attempt,omitzero"`
	Renewals        uint64    `json:"renewals"`
	RenewalFailures uint64    `json:"renewal_failures"`
	LastError       string    `json:"last_error,omitempty"`
	LastErrorAt     time.Time `json:"last_error_at,omitzero"`
}

// fileCertificate describes the certificate in force from tls.cert (the
// latest set its watch put in force).
func (g *Gateway) fileCertificate() certificateDump {
	c := certificateDump{Source: config.SourceFile, Identity: g.identity}
	if cert, _, notAfter := g.certs().Current(); cert != nil {
		c.NotAfter = notAfter.UTC()
	}
	return c
}

// meshCertificate describes the certificate the manager holds (kept while
// renewals fail, until it expires).
func meshCertificate(s mesh.CAStats) certificateDump {
	return certificateDump{Source: "ca", Identity: s.Identity, NotAfter: s.Expiry.UTC(), CA: &caDump{
		NextAttempt: s.NextAttempt.UTC(), Renewals: s.Renewals, RenewalFailures: s.RenewalFailures,
		LastError: s.LastError, LastErrorAt: s.LastErrorAt.UTC(),
	}}
}

// xdsDump is the xds section of /config_dump.
type xdsDump struct {
	NodeID           string `json:"node_id"`
	Connected        bool   `json:"connected"`
	Reconnects       uint64 `json:"reconnects"`
	LastError        string `json:"last_error,omitempty"`
	UnknownTypeNACKs uint64 `json:"unknown_type_nacks"`
	// Types is keyed like the metrics' type label: address, authorization.
	Types map[string]xdsTypeDump `json:"types"`
}

type xdsTypeDump struct {
	Resources int    `json:"resources"`
	Updates   uint64 `json:"updates"`
	NACKs     uint64 `json:"nacks"`
	Ready     bool   `json:"ready"`
}

func newXDSDump(nodeID string, s mesh.XDSStats) xdsDump {
	d := xdsDump{NodeID: nodeID, Connected: s.Connected, Reconnects: s.Reconnects, LastError: s.LastError,
		UnknownTypeNACKs: s.UnknownTypeNACKs, Types: make(map[string]xdsTypeDump, len(s.Types))}
	for url, t := range s.Types {
		d.Types[xdsTypeLabel(url)] = xdsTypeDump{Resources: t.Resources, Updates: t.Updates, NACKs: t.NACKs, Ready: t.Ready}
	}
	return d
}

// logLevels are the levels /logging accepts: log.level's values.
var logLevels = []string{"trace", "debug", "info", "warn", "error"}

// serveLogging shows or sets the level of the process's loggers. The
// gateway's logger is a Named child of the root logger and shares its
// level (hclog's default), so setting it here sets it everywhere.
func (g *Gateway) serveLogging(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
	case http.MethodPost, http.MethodPut:
		v := r.URL.Query().Get("level")
		lvl := hclog.LevelFromString(v)
		if v == "" || lvl == hclog.NoLevel || lvl == hclog.Off {
			http.Error(w, fmt.Sprintf("logging: level %q: want one of %s, as in /logging?level=debug",
				v, strings.Join(logLevels, ", ")), http.StatusBadRequest)
			return
		}
		old := g.log.GetLevel()
		g.log.SetLevel(lvl)
		g.log.Info("log level changed", "from", levelName(old), "to", levelName(lvl))
	default:
		w.Header().Set("Allow", "GET, HEAD, POST, PUT")
		http.Error(w, "logging: use GET to read the level, POST or PUT ?level=LEVEL to set it", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "level: %s\n", levelName(g.log.GetLevel()))
}

func levelName(l hclog.Level) string {
	return strings.ToLower(l.String())
}

// RouteAnswer is the plan for one destination of the snapshot in force,
// and whether the device captures it. GET /route answers it as JSON:
//
//	{"destination": "10.96.0.10:80", "kind": "hbone", "via": "service default/web",
//	 "service": "default/web", "host": "web.default.svc.cluster.local",
//	 "endpoint": "default/web", "endpoint_index": 0, "endpoints": 2,
//	 "target": "10.244.2.5:8080", "hbone_address": "10.244.2.5:15008",
//	 "identities": ["spiffe://cluster.local/ns/default/sa/web"], "captured": true}
//
// A destination in another network reached through its network's
// gateway adds "gateway" (the outer hop: "name", "network", "address",
// "identities", "instance", "instances") and, for a service, "authority"
// (its "hostname:port", both CONNECTs'); hbone_address and identities
// are then the inner hop's, the destination's.
//
// kind is "hbone", "direct" or "deny"; a denied plan has "reason" and no
// target; keys without a value are left out.
type RouteAnswer struct {
	Plan
	// Name is the hostname asked (ExplainName), whose address is Dst;
	// "" when asked by address.
	Name string
	// Captured is whether one of tun.routes holds the destination: if
	// none does, the kernel never sends the flow to the gateway.
	Captured bool
}

// routeJSON is RouteAnswer's JSON form.
type routeJSON struct {
	Destination   netip.AddrPort `json:"destination"`
	Name          string         `json:"name,omitempty"`
	Kind          string         `json:"kind"`
	Via           string         `json:"via,omitempty"`
	Service       string         `json:"service,omitempty"`
	Host          string         `json:"host,omitempty"`
	Endpoint      string         `json:"endpoint,omitempty"`
	EndpointIndex *int           `json:"endpoint_index,omitempty"` // with endpoint
	Endpoints     int            `json:"endpoints,omitempty"`
	Target        netip.AddrPort `json:"target,omitzero"`
	HBONEAddress  netip.AddrPort `json:"hbone_address,omitzero"`
	Identities    []string       `json:"identities,omitempty"`
	Authority     string         `json:"authority,omitempty"`
	Gateway       *gatewayJSON   `json:"gateway,omitempty"`
	Reason        string         `json:"reason,omitempty"`
	Captured      bool           `json:"captured"`
}

// gatewayJSON is a Plan's GatewayHop, the outer hop of double HBONE;
// the plan's hbone_address and identities are then the inner hop's.
type gatewayJSON struct {
	Name       string         `json:"name"`
	Network    string         `json:"network"`
	Address    netip.AddrPort `json:"address"`
	Identities []string       `json:"identities"`
	Instance   int            `json:"instance"`
	Instances  int            `json:"instances"`
}

// MarshalJSON implements json.Marshaler.
func (a RouteAnswer) MarshalJSON() ([]byte, error) {
	p := a.Plan
	j := routeJSON{
		Destination: p.Dst, Name: a.Name, Kind: p.Kind.String(), Via: p.Via, Service: p.Service, Host: p.Host,
		Endpoint: p.Endpoint, Endpoints: p.Endpoints,
		HBONEAddress: p.HBONEAddress, Identities: p.Identities, Reason: p.Reason, Captured: a.Captured,
		Authority: p.Authority,
	}
	if g := p.Gateway; g != nil {
		j.Gateway = &gatewayJSON{Name: g.Name, Network: g.Network, Address: g.Address, Identities: g.Identities,
			Instance: g.Instance, Instances: g.Instances}
	}
	if p.Endpoint != "" {
		j.EndpointIndex = &p.EndpointIndex
	}
	if p.Kind != Deny {
		j.Target = p.Target
	}
	return json.Marshal(j)
}

// UnmarshalJSON implements json.Unmarshaler.
func (a *RouteAnswer) UnmarshalJSON(b []byte) error {
	var j routeJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	var kind Kind
	switch j.Kind {
	case "hbone":
		kind = HBONE
	case "direct":
		kind = Direct
	case "deny":
		kind = Deny
	default:
		return fmt.Errorf("route answer: kind %q: want hbone, direct or deny", j.Kind)
	}
	target := j.Target
	if kind == Deny {
		target = j.Destination // as Router.Route leaves it
	}
	index := 0
	if j.EndpointIndex != nil {
		index = *j.EndpointIndex
	}
	*a = RouteAnswer{Plan: Plan{
		Kind: kind, Dst: j.Destination, Target: target, HBONEAddress: j.HBONEAddress, Identities: j.Identities,
		Via: j.Via, Service: j.Service, Host: j.Host, Endpoint: j.Endpoint, EndpointIndex: index,
		Endpoints: j.Endpoints, Reason: j.Reason, Authority: j.Authority,
	}, Name: j.Name, Captured: j.Captured}
	if g := j.Gateway; g != nil {
		a.Plan.Gateway = &GatewayHop{Name: g.Name, Network: g.Network, Address: g.Address, Identities: g.Identities,
			Instance: g.Instance, Instances: g.Instances}
	}
	return nil
}

// ExplainRoute is the plan of the snapshot in force for a flow to dst,
// with a service's endpoint number endpoint (reduced modulo their count).
// It changes nothing: the round robin real flows take turns with is not
// moved.
func (g *Gateway) ExplainRoute(dst netip.AddrPort, endpoint int) RouteAnswer {
	s := g.snapshot()
	return explain(s.router, s.cfg, dst, endpoint)
}

// ExplainConfig is ExplainRoute for a gateway that would run cfg, from
// the config alone: no certificate is read, nothing opened. `meshtun
// route --config` prints it.
func ExplainConfig(cfg *config.Config, dst netip.AddrPort, endpoint int) RouteAnswer {
	return explain(NewRouter(cfg), cfg, dst, endpoint)
}

// explain is the plan of router for dst, with the given endpoint choice,
// and whether cfg's tun.routes capture dst.
func explain(router *Router, cfg *config.Config, dst netip.AddrPort, endpoint int) RouteAnswer {
	plan := router.Route(dst, func(string, int) int { return endpoint })
	a := RouteAnswer{Plan: plan}
	for _, r := range cfg.TUN.Routes {
		if r.Contains(plan.Dst.Addr()) {
			a.Captured = true
		}
	}
	return a
}

// serveRoute answers GET /route?dst=IP:PORT[&endpoint=N]; dst may be a
// service's NAME:PORT too (ExplainName).
func (g *Gateway) serveRoute(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	dst, err := netip.ParseAddrPort(q.Get("dst"))
	name, port, nameErr := SplitNamePort(q.Get("dst"))
	if (err != nil || dst.Port() == 0 || dst.Addr().Zone() != "") && nameErr != nil {
		http.Error(w, fmt.Sprintf("route: dst %q is not IP:PORT or NAME:PORT (like /route?dst=10.96.0.10:80, dst=[fd00::5]:80 or dst=web.default.svc.cluster.local:80)", q.Get("dst")),
			http.StatusBadRequest)
		return
	}
	endpoint := 0
	if v := q.Get("endpoint"); v != "" {
		if endpoint, err = strconv.Atoi(v); err != nil || endpoint < 0 {
			http.Error(w, fmt.Sprintf("route: endpoint %q: want a number, 0 or more", v), http.StatusBadRequest)
			return
		}
	}
	var answer RouteAnswer
	if nameErr == nil {
		if answer, err = g.ExplainName(name, port, endpoint); err != nil {
			http.Error(w, "route: "+err.Error(), http.StatusNotFound)
			return
		}
	} else {
		answer = g.ExplainRoute(dst, endpoint)
	}
	writeJSON(w, "route", answer)
}

// writeJSON answers with v as indented JSON, what naming the answer in an
// error (one a value of ours never makes).
func writeJSON(w http.ResponseWriter, what string, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		http.Error(w, what+": "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(append(b, '\n'))
}
