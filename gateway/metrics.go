package gateway

import (
	"cmp"
	"fmt"
	"net/http"
	"net/netip"
	"regexp"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/dnsproxy"
	"github.com/meshtun/meshtun/hbone"
	"github.com/meshtun/meshtun/identity"
	"github.com/meshtun/meshtun/mesh"
	"github.com/meshtun/meshtun/netstack"
	"github.com/meshtun/meshtun/tun"
)

// The gateway's metrics, served on admin.metrics at /metrics and
// /stats/prometheus by promhttp from a registry of the gateway's own (not
// client_golang's global one), in Prometheus' text exposition format.
// The four TCP families carry Istio's names and labels, so that Istio's
// dashboards read them as they read ztunnel's:
//
//   - istio_tcp_connections_opened_total: counted when a flow opens (an
//     outbound flow once it is routed, an inbound stream once its CONNECT
//     is parsed), with response_flags "-";
//   - istio_tcp_connections_closed_total: counted when it ends, with the
//     response flag of its access-log line;
//   - istio_tcp_received_bytes_total: the bytes of the request direction,
//     client → server ("received during request", as Istio defines it;
//     the access log's bytes_sent);
//   - istio_tcp_sent_bytes_total: the bytes of the response direction,
//     server → client (the access log's bytes_recv).
//
// Bytes are added as the relay writes them (flowMetrics.relayCounters),
// so a long-lived flow's bytes show while it runs. They go to the series
// of the flow's opening labels (response_flags "-"), as ztunnel's do; a
// flow that did not get through moved no bytes. Each label set's four
// counters are resolved once, when a flow first needs them (tcpSeries),
// and the flow keeps them: the relay's per-write Add is an atomic add,
// with no lookup and no label hashing.
//
// Label values come from the configuration (workload names, service
// hostnames, the [gateway] keys describing this node), the mesh's state,
// certificate identities and peers' baggage, never from addresses or
// ports, so the number of series stays bounded by the mesh's size. Each
// end of a flow is described as Istio's standard metrics do
// (<end>_workload, _workload_namespace, _canonical_service,
// _canonical_revision, _cluster): the source outbound and the
// destination inbound by this node's description (nodeDescription) or a
// configured workload at the address; the destination outbound by the
// configured workload at the target; the source inbound by the peer's
// baggage, whose values are names only (hbone.ParseBaggage) and whose
// distinct descriptions are bounded per principal and in all
// (admitClaim), with a configured workload at the source address winning
// field by field. A value the gateway does not know is "unknown".
//
// Next to them: meshtun_flows_open{direction},
// meshtun_flows_over_limit_total{direction}; the counters of netstack,
// of the HBONE pool and of the HBONE server, read from their Stats at
// scrape time (statsCollector; the tables netstackFamilies,
// poolFamilies, serverFamilies); the state of the mesh clients, xDS and
// CA, read from their Stats at scrape time too (meshCollector);
// meshtun_repairs_total{what}, the TUN's self-repair (repairCollector);
// the DNS server's queries by result (dnsCollector, dns.go);
// meshtun_relay_buffers_in_use;
// meshtun_build_info; and client_golang's Go (go_*) and process
// (process_*) collectors: goroutines, heap, RSS, open file descriptors.

// unknown is the label value for what the gateway does not know.
const unknown = "unknown"

// Label values of reporter and connection_security_policy.
const (
	reporterSource      = "source"      // the outbound (TUN) side
	reporterDestination = "destination" // the inbound (HBONE) side
	mutualTLS           = "mutual_tls"
)

// tcpLabels is one series of the istio_tcp_* families. Values are never
// empty: "unknown" stands for what is not known.
type tcpLabels struct {
	reporter             string
	source               workloadLabels
	sourcePrincipal      string
	destination          workloadLabels
	destinationPrincipal string
	destinationService   string
	responseFlags        string
	securityPolicy       string
}

// workloadLabels describe one end of a flow as Istio's standard metrics
// do: <end>_workload, _workload_namespace, _canonical_service,
// _canonical_revision and _cluster.
type workloadLabels struct {
	workload, namespace, canonicalService, canonicalRevision, cluster string
}

// labelsOf are the labels of a workload description, "unknown" where a
// field is not known.
func labelsOf(b hbone.Baggage) workloadLabels {
	return workloadLabels{
		workload:          orUnknown(b.WorkloadName),
		namespace:         orUnknown(b.Namespace),
		canonicalService:  orUnknown(b.Service),
		canonicalRevision: orUnknown(b.Revision),
		cluster:           orUnknown(b.Cluster),
	}
}

// unknownWorkload is the description of an end the gateway knows nothing
// of.
var unknownWorkload = labelsOf(hbone.Baggage{})

// tcpSeries are the four counters of one label set, resolved children
// of the istio_tcp_* vectors.
type tcpSeries struct {
	opened, closed, received, sent prometheus.Counter
}

// metrics holds the gateway's counters and the registry that serves them.
// It is safe for concurrent use.
type metrics struct {
	reg *prometheus.Registry
	tcp struct{ opened, closed, received, sent *prometheus.CounterVec }

	mu     sync.Mutex
	series map[tcpLabels]*tcpSeries // guarded by mu
	// claims are the source descriptions peers' baggage has put on
	// series, by peer principal (admitClaim); guarded by mu.
	claims     map[string]map[hbone.Baggage]bool
	claimCount int // the descriptions in claims; guarded by mu

	// openFlows counts the flows open in a direction: the gateway's flow
	// table, the one record of open flows. Set once, before serving.
	openFlows func(direction string) int
	// overLimit counts the flows of a direction refused at
	// gateway.max_flows_per_source (the flow table). Set once, before
	// serving.
	overLimit func(direction string) uint64

	// identity is this gateway's SPIFFE ID (Gateway.identity), which
	// with gateway.name describes this node when nothing else does
	// (nodeDescription). Set once, in New.
	identity string

	// index names the configured workloads and services of the config in
	// force: the only workload and service label values besides
	// "unknown". Rebuilt when a reload brings a new config.
	index atomic.Pointer[labelIndex]

	// The packages whose counters are exported, stored by Run as it
	// starts them; a family of a package not running has no sample.
	pool   atomic.Pointer[hbone.Pool]
	server atomic.Pointer[hbone.Server]
	stack  atomic.Pointer[netstack.Stack]
	repair atomic.Pointer[tun.Repairer] // the TUN's self-repair (metrics_repair.go)
	dns    atomic.Pointer[dnsproxy.Server]
	// meshStats reads the gateway's merge of the mesh's state (false: the
	// mesh is off). Set once, before serving.
	meshStats func() (MeshStats, bool)
	// The mesh clients, stored when [mesh] is on and they are made.
	xds atomic.Pointer[mesh.XDSClient]
	ca  atomic.Pointer[mesh.CertManager]
}

// labelIndex is what labels are looked up in, for one snapshot: the
// file's entries here, the mesh's in the snapshot's router (their
// descriptions made once per entry, as istiod sends it).
type labelIndex struct {
	snap      *snapshot
	workloads map[netip.Addr]hbone.Baggage // the file's workloads' descriptions by address, and this node's own
	hosts     map[string]bool              // the file's service hostnames
	// self describes this node's workload (nodeDescription), and
	// selfBaggage is it as a baggage header: what outbound CONNECTs from
	// this node itself send.
	self        hbone.Baggage
	selfBaggage string
}

// Bounds of the source descriptions peers' baggage may put on series
// (admitClaim). A principal is a service account, and the workloads of
// one service account are few: 16 leaves room for each to roll out a new
// revision while the old one runs. 4096 in all bounds what any set of
// peers can add to the series of this gateway's /metrics. A description
// beyond them is labelled "unknown".
const (
	maxClaimsPerPrincipal = 16
	maxClaims             = 4096
)

func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry(), series: make(map[tcpLabels]*tcpSeries), claims: make(map[string]map[hbone.Baggage]bool)}
	vec := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, tcpLabelNames[:])
	}
	m.tcp.opened = vec("istio_tcp_connections_opened_total", "The total number of TCP connections opened.")
	m.tcp.closed = vec("istio_tcp_connections_closed_total", "The total number of TCP connections closed.")
	m.tcp.received = vec("istio_tcp_received_bytes_total", "The bytes received during request (client to server), counted as they flow.")
	m.tcp.sent = vec("istio_tcp_sent_bytes_total", "The bytes sent during response (server to client), counted as they flow.")

	flowsOpen := func(direction string) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "meshtun_flows_open",
			Help:        "Connections the gateway is carrying now, by direction.",
			ConstLabels: prometheus.Labels{"direction": direction},
		}, func() float64 {
			if m.openFlows == nil {
				return 0
			}
			return float64(m.openFlows(direction))
		})
	}
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "meshtun_build_info",
		Help:        "Always 1; version is the main module's version as the Go toolchain stamped it, goversion the Go release it was built with.",
		ConstLabels: prometheus.Labels{"version": buildVersion(), "goversion": runtime.Version()},
	})
	buildInfo.Set(1)

	overLimit := func(direction string) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "meshtun_flows_over_limit_total",
			Help:        "Flows refused because gateway.max_flows_per_source flows from their source were open, by direction.",
			ConstLabels: prometheus.Labels{"direction": direction},
		}, func() float64 {
			if m.overLimit == nil {
				return 0
			}
			return float64(m.overLimit(direction))
		})
	}
	m.reg.MustRegister(
		m.tcp.opened, m.tcp.closed, m.tcp.received, m.tcp.sent,
		flowsOpen(outbound), flowsOpen(inbound), overLimit(outbound), overLimit(inbound),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "meshtun_relay_buffers_in_use",
			Help: fmt.Sprintf("Pooled relay buffers (%d KiB each) held by flows now: only directions that are moving data hold one.", relayBufSize>>10),
		}, func() float64 { return float64(relayBufsOut.Load()) }),
		&statsCollector[netstack.Stats]{stats: statsOf(&m.stack, (*netstack.Stack).Stats), families: netstackFamilies},
		&statsCollector[hbone.PoolStats]{stats: statsOf(&m.pool, (*hbone.Pool).Stats), families: poolFamilies},
		&statsCollector[hbone.ServerStats]{stats: statsOf(&m.server, (*hbone.Server).Stats), families: serverFamilies},
		&statsCollector[MeshStats]{stats: func() (MeshStats, bool) {
			if m.meshStats == nil {
				return MeshStats{}, false
			}
			return m.meshStats()
		}, families: meshStateFamilies},
		&meshCollector{xds: statsOf(&m.xds, (*mesh.XDSClient).Stats), ca: statsOf(&m.ca, (*mesh.CertManager).Stats)},
		&repairCollector{stats: statsOf(&m.repair, (*tun.Repairer).Stats)},
		&dnsCollector{stats: statsOf(&m.dns, (*dnsproxy.Server).Stats)},
		buildInfo,
		// With the collector's CPU (go_cpu_classes_gc_total_cpu_seconds_total):
		// a mesh's heap is large and long-lived, and what collecting it
		// costs is worth a figure of its own.
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
			collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/cpu/classes/gc/total:cpu-seconds$`)})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// buildVersion is the main module's version in the binary's build info:
// a tag, or a pseudo-version naming the commit; "unknown" without one.
func buildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return unknown
}

// indexFor returns the label index of snap, building it on first use: it
// costs the file's entries, not the mesh's.
func (m *metrics) indexFor(snap *snapshot) *labelIndex {
	if x := m.index.Load(); x != nil && x.snap == snap {
		return x
	}
	cfg := snap.cfg
	x := &labelIndex{snap: snap, workloads: make(map[netip.Addr]hbone.Baggage), hosts: make(map[string]bool)}
	for i := range cfg.Workloads {
		w := &cfg.Workloads[i]
		d := describeWorkload(w)
		for _, a := range w.Addresses {
			x.workloads[a.Unmap()] = d
		}
	}
	x.self = nodeDescription(cfg, m.identity)
	x.selfBaggage = x.self.String()
	if cfg.Self != nil {
		for _, a := range cfg.Self.Addresses {
			x.workloads[a.Unmap()] = x.self // with the [gateway] keys that win over istiod's
		}
	}
	for _, s := range cfg.Services {
		if s.Hostname != "" {
			x.hosts[s.Hostname] = true
		}
	}
	m.index.Store(x)
	return x
}

// describeWorkload is what the metrics' labels say of a configured
// workload: the mesh's carries istiod's names, a file's its name and
// namespace.
func describeWorkload(w *config.Workload) hbone.Baggage {
	var l config.WorkloadLabels
	if w.Labels != nil {
		l = *w.Labels
	}
	return describe(hbone.Baggage{
		Cluster: l.Cluster, Namespace: w.Namespace, WorkloadKind: l.WorkloadKind,
		WorkloadName: cmp.Or(l.WorkloadName, w.Name), Service: l.CanonicalService, Revision: l.CanonicalRevision,
	})
}

// host reports whether h is the hostname of a service in force.
func (x *labelIndex) host(h string) bool {
	if x.hosts[h] {
		return true
	}
	n, _ := x.snap.router.mesh.hosts.Get(h)
	return n > 0
}

// counts returns the counters of l, resolving them on first use. All four
// are resolved together, so a label set has a sample in each family.
func (m *metrics) counts(l tcpLabels) *tcpSeries {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.series[l]
	if c == nil {
		v := l.values()
		c = &tcpSeries{
			opened:   m.tcp.opened.WithLabelValues(v[:]...),
			closed:   m.tcp.closed.WithLabelValues(v[:]...),
			received: m.tcp.received.WithLabelValues(v[:]...),
			sent:     m.tcp.sent.WithLabelValues(v[:]...),
		}
		m.series[l] = c
	}
	return c
}

// tcpLabelNames are the labels of the istio_tcp_* families, in the order
// of tcpLabels.values.
var tcpLabelNames = [...]string{
	"reporter",
	"source_workload", "source_workload_namespace", "source_canonical_service", "source_canonical_revision", "source_cluster",
	"source_principal",
	"destination_workload", "destination_workload_namespace", "destination_canonical_service", "destination_canonical_revision", "destination_cluster",
	"destination_principal", "destination_service", "response_flags", "connection_security_policy",
}

// values are l's label values, in the order of tcpLabelNames.
func (l tcpLabels) values() [len(tcpLabelNames)]string {
	s, d := l.source, l.destination
	return [...]string{
		l.reporter,
		s.workload, s.namespace, s.canonicalService, s.canonicalRevision, s.cluster,
		l.sourcePrincipal,
		d.workload, d.namespace, d.canonicalService, d.canonicalRevision, d.cluster,
		l.destinationPrincipal, l.destinationService, l.responseFlags, l.securityPolicy,
	}
}

// workload is the description of the configured workload at addr.
func (x *labelIndex) workload(addr netip.Addr) (hbone.Baggage, bool) {
	addr = addr.Unmap()
	if d, ok := x.workloads[addr]; ok {
		return d, true
	}
	if w, ok := x.snap.router.mesh.workloads.Get(addr); ok {
		// Described when a flow asks, not held: a pod's name is its own,
		// so a description per pod would cost memory per workload of the
		// mesh for a few hundred nanoseconds a flow.
		return describeWorkload(w.w), true
	}
	return hbone.Baggage{}, false
}

// local describes the workload of this node at addr: a configured
// workload's, else this node's own.
func (x *labelIndex) local(addr netip.Addr) hbone.Baggage {
	if d, ok := x.workload(addr); ok {
		return d
	}
	return x.self
}

// describe completes a workload's description with Istio's defaults for
// a workload no label names a canonical service or revision of: the
// workload's name, and "latest". A value that is not a name is dropped:
// the values become label values and a header.
func describe(b hbone.Baggage) hbone.Baggage {
	for _, v := range []*string{&b.Cluster, &b.Namespace, &b.WorkloadName, &b.Service, &b.Revision} {
		if identity.CheckName(*v) != nil {
			*v = ""
		}
	}
	if b.WorkloadName != "" {
		b.Service = cmp.Or(b.Service, b.WorkloadName)
	}
	if b.Service != "" {
		b.Revision = cmp.Or(b.Revision, "latest")
	}
	if b.WorkloadName == "" || !slices.Contains(hbone.BaggageKinds, b.WorkloadKind) {
		b.WorkloadKind = ""
	}
	return b
}

// admitClaim returns b, a source description from a peer's baggage, if
// the series of principal may carry it, else the zero description: a
// principal's first maxClaimsPerPrincipal distinct descriptions, up to
// maxClaims in all, are remembered and admitted for the life of the
// process, the rest read as unknown.
func (m *metrics) admitClaim(principal string, b hbone.Baggage) hbone.Baggage {
	if b.IsZero() {
		return b
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := m.claims[principal]
	if seen[b] {
		return b
	}
	if len(seen) >= maxClaimsPerPrincipal || m.claimCount >= maxClaims {
		return hbone.Baggage{}
	}
	if seen == nil {
		seen = make(map[hbone.Baggage]bool)
		m.claims[principal] = seen
	}
	seen[b] = true
	m.claimCount++
	return b
}

// flowMetrics is what a flow keeps between opening and closing.
type flowMetrics struct {
	m      *metrics
	labels tcpLabels  // as opened (response_flags "-")
	open   *tcpSeries // the counters of labels
	live   bool       // the relay adds the bytes as they flow (relayCounters)
}

// relayCounters hands the relay the byte counters of the flow's series, so
// a long flow's bytes show while it runs; close then adds none. The client
// side is the relay's a: a → b is the request (received), b → a the
// response (sent), on both reporters.
func (fm *flowMetrics) relayCounters() relayCounters {
	if fm == nil {
		return relayCounters{}
	}
	fm.live = true
	return relayCounters{aToB: fm.open.received, bToA: fm.open.sent}
}

// openFlow counts a flow as opened and returns what closeFlow needs.
func (m *metrics) openFlow(l tcpLabels) *flowMetrics {
	l.responseFlags = "-"
	fm := &flowMetrics{m: m, labels: l, open: m.counts(l)}
	fm.open.opened.Inc()
	return fm
}

// close counts the flow as closed with its response flag ("" for none)
// and adds its bytes, unless the relay counted them live: request is
// client → server, response back.
func (fm *flowMetrics) close(flag string, request, response int64) {
	if request > 0 && !fm.live {
		fm.open.received.Add(float64(request))
	}
	if response > 0 && !fm.live {
		fm.open.sent.Add(float64(response))
	}
	closed := fm.open
	if flag != "" {
		l := fm.labels
		l.responseFlags = flag
		closed = fm.m.counts(l)
	}
	closed.closed.Inc()
}

// outboundLabels are the labels of a flow captured by the TUN from src
// and routed by plan under snap, and the baggage header its CONNECT
// carries: the description of its source, a configured workload at src
// or else this node. This gateway's identity is the one its HBONE peers
// see as the source.
func (g *Gateway) outboundLabels(snap *snapshot, src netip.AddrPort, plan Plan) (l tcpLabels, baggage string) {
	x := g.metrics.indexFor(snap)
	source := x.local(src.Addr())
	baggage = x.selfBaggage
	if source != x.self {
		baggage = source.String()
	}
	l = tcpLabels{
		reporter:             reporterSource,
		source:               labelsOf(source),
		sourcePrincipal:      orUnknown(g.identity),
		destination:          unknownWorkload,
		destinationPrincipal: unknown,
		destinationService:   unknown,
		securityPolicy:       unknown,
	}
	if plan.Kind == Deny {
		return l, baggage
	}
	if d, ok := x.workload(plan.Target.Addr()); ok {
		l.destination = labelsOf(d)
	}
	switch {
	case plan.Host != "":
		l.destinationService = plan.Host
	case plan.Service != "":
		l.destinationService = plan.Service
	}
	if plan.Kind == HBONE {
		// The identity the flow is sent to, as ztunnel labels it (the
		// workload's or peer's, not a subject_alt_name the peer may
		// present instead), so that opened and closed share one series.
		l.destinationPrincipal = plan.Identities[0]
		l.securityPolicy = mutualTLS
	}
	return l, baggage
}

// inboundLabels are the labels of a CONNECT stream from the client src
// under snap. The source is described by the peer's baggage (what
// admitClaim lets through), each field a configured workload at src
// knows replaced by the config's, as ztunnel prefers its own state to a
// peer's claim; the destination is the configured workload at the
// target, else this node. The destination service is the forwarded
// host= only when it names a configured service: a peer's header must
// not create series.
func (g *Gateway) inboundLabels(snap *snapshot, r *hbone.Request, src, dst netip.AddrPort) tcpLabels {
	x := g.metrics.indexFor(snap)
	source := g.metrics.admitClaim(r.PeerIdentity(), r.Baggage())
	// Through a network gateway (ztunnel's from_gateway), the source's
	// address is of its own network: a workload of ours there is not it.
	if d, ok := x.workload(src.Addr()); ok && !fromOtherNetwork(snap, r) {
		source = hbone.Baggage{
			Cluster: cmp.Or(d.Cluster, source.Cluster), Namespace: cmp.Or(d.Namespace, source.Namespace),
			WorkloadKind: d.WorkloadKind, WorkloadName: d.WorkloadName,
			Service: cmp.Or(d.Service, source.Service), Revision: cmp.Or(d.Revision, source.Revision),
		}
	}
	l := tcpLabels{
		reporter:             reporterDestination,
		source:               labelsOf(source),
		sourcePrincipal:      orUnknown(r.PeerIdentity()),
		destination:          labelsOf(x.local(dst.Addr())),
		destinationPrincipal: orUnknown(g.identity),
		destinationService:   unknown,
		securityPolicy:       mutualTLS,
	}
	if h := forwardedHost(r.Header().Get("Forwarded")); h != "" && x.host(h) {
		l.destinationService = h
	}
	return l
}

// fromOtherNetwork reports whether r came through a network gateway
// from another network: its x-forwarded-network names one other than
// ours (ztunnel's inbound reads it so).
func fromOtherNetwork(snap *snapshot, r *hbone.Request) bool {
	n := r.Header().Get("X-Forwarded-Network")
	return n != "" && !strings.EqualFold(n, snap.router.network)
}

// forwardedHost is the host= parameter of a forwarded header, or "".
func forwardedHost(v string) string {
	for _, elem := range strings.Split(v, ",") {
		for _, pair := range strings.Split(elem, ";") {
			k, val, ok := strings.Cut(strings.TrimSpace(pair), "=")
			if ok && strings.EqualFold(k, "host") {
				return strings.Trim(val, `"`)
			}
		}
	}
	return ""
}

func orUnknown(s string) string {
	if s == "" {
		return unknown
	}
	return s
}

// metricsHandler serves the registry on /metrics and /stats/prometheus
// (the path Istio's sidecars and ztunnel are scraped at). A collector
// that fails is logged and the rest is served.
func (g *Gateway) metricsHandler() http.Handler {
	log := g.log
	if log == nil {
		log = hclog.NewNullLogger()
	}
	h := promhttp.HandlerFor(g.metrics.reg, promhttp.HandlerOpts{
		ErrorLog:      log.StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Warn}),
		ErrorHandling: promhttp.ContinueOnError,
		Registry:      g.metrics.reg, // promhttp_metric_handler_errors_total
	})
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h)
	mux.Handle("GET /stats/prometheus", h)
	return mux
}

// statFamily is one family read from a package's Stats value S.
type statFamily[S any] struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(S) float64
}

// counterOf and gaugeOf declare a family of a Stats table: a counter's
// name ends in _total, a gauge's does not.
func counterOf[S any, N uint64 | int | int64](name, help string, field func(S) N) statFamily[S] {
	return statFamily[S]{prometheus.NewDesc(name, help, nil, nil), prometheus.CounterValue, func(s S) float64 { return float64(field(s)) }}
}

func gaugeOf[S any, N uint64 | int | int64](name, help string, field func(S) N) statFamily[S] {
	return statFamily[S]{prometheus.NewDesc(name, help, nil, nil), prometheus.GaugeValue, func(s S) float64 { return float64(field(s)) }}
}

// The families of the packages' Stats. A field the package adds to its
// Stats is exported by one line here.
var (
	netstackFamilies = []statFamily[netstack.Stats]{
		counterOf("meshtun_netstack_requests_total", "SYNs captured from the TUN and handed to the outbound handler.",
			func(s netstack.Stats) uint64 { return s.Requests }),
		counterOf("meshtun_netstack_forwarded_total", "Captured connections accepted with a completed handshake.",
			func(s netstack.Stats) uint64 { return s.Forwarded }),
		counterOf("meshtun_netstack_rejected_total", "Captured SYNs answered with a RST (rejected, undecided, or the stack closing).",
			func(s netstack.Stats) uint64 { return s.Rejected }),
		counterOf("meshtun_netstack_accept_failures_total", "Captured connections whose handshake failed after the handler accepted them.",
			func(s netstack.Stats) uint64 { return s.AcceptFailures }),
		counterOf("meshtun_netstack_in_flight_drops_total", "SYNs dropped because netstack.max_in_flight connections were undecided.",
			func(s netstack.Stats) uint64 { return s.InFlightDrops }),
		counterOf("meshtun_netstack_bad_checksums_total", "Packets from an offload TUN dropped for a wrong checksum before the stack saw them.",
			func(s netstack.Stats) uint64 { return s.BadChecksums }),
	}
	poolFamilies = []statFamily[hbone.PoolStats]{
		counterOf("meshtun_hbone_pool_connections_opened_total", "Outbound HBONE connections set up (TLS and HTTP/2 settled).",
			func(s hbone.PoolStats) uint64 { return s.ConnsOpened }),
		gaugeOf("meshtun_hbone_pool_connections_open", "Outbound HBONE connections held by the pool, draining ones included.",
			func(s hbone.PoolStats) int { return s.ConnsOpen }),
		gaugeOf("meshtun_hbone_pool_streams_open", "CONNECT streams open, or being opened, on the pool's connections.",
			func(s hbone.PoolStats) int { return s.StreamsOpen }),
		counterOf("meshtun_hbone_pool_dials_failed_total", "Outbound HBONE connection attempts that failed (TCP, TLS, or the peer's first SETTINGS).",
			func(s hbone.PoolStats) uint64 { return s.DialsFailed }),
		counterOf("meshtun_hbone_pool_streams_opened_total", "CONNECT streams that got 200.",
			func(s hbone.PoolStats) uint64 { return s.StreamsOpened }),
		counterOf("meshtun_hbone_pool_streams_failed_total", "CONNECTs sent that got another status, a reset, or no answer.",
			func(s hbone.PoolStats) uint64 { return s.StreamsFailed }),
	}
	meshStateFamilies = []statFamily[MeshStats]{
		counterOf("meshtun_mesh_updates_total", "States from istiod merged into the gateway's snapshot.",
			func(s MeshStats) uint64 { return s.Updates }),
		gaugeOf("meshtun_mesh_rejected_resources", "Resources of istiod's state in force that could not be used (NACKed, with the reason in the log).",
			func(s MeshStats) int64 { return s.Rejected }),
		gaugeOf("meshtun_mesh_clashes", "Entries of istiod's state in force dropped because the file has one of the same address, VIP and port, or name (the file wins).",
			func(s MeshStats) int64 { return s.Clashes }),
		counterOf("meshtun_mesh_other_network_denied_total", "Flows denied because their destination is in another network that has no known network gateway.",
			func(s MeshStats) uint64 { return s.OtherNetwork }),
		gaugeOf("meshtun_mesh_ready", "1 once a complete state from istiod was applied.",
			func(s MeshStats) int {
				if s.Ready {
					return 1
				}
				return 0
			}),
	}
	serverFamilies = []statFamily[hbone.ServerStats]{
		counterOf("meshtun_hbone_server_connections_accepted_total", "Inbound HBONE connections that completed the TLS handshake.",
			func(s hbone.ServerStats) uint64 { return s.ConnsAccepted }),
		counterOf("meshtun_hbone_server_streams_accepted_total", "Inbound CONNECT streams answered 200.",
			func(s hbone.ServerStats) uint64 { return s.StreamsAccepted }),
		counterOf("meshtun_hbone_server_streams_rejected_total", "Inbound CONNECT streams answered with another status.",
			func(s hbone.ServerStats) uint64 { return s.StreamsRejected }),
		gaugeOf("meshtun_hbone_server_connections_open", "Inbound HBONE connections, including those still in the TLS handshake.",
			func(s hbone.ServerStats) int64 { return s.ConnsOpen }),
		gaugeOf("meshtun_hbone_server_streams_open", "Inbound CONNECT streams not yet closed both ways.",
			func(s hbone.ServerStats) int64 { return s.StreamsOpen }),
		counterOf("meshtun_hbone_server_handshake_failures_total", "Inbound connections whose TLS handshake or HTTP/2 preface and SETTINGS failed, or that sent no CONNECT within hbone.handshake_timeout.",
			func(s hbone.ServerStats) uint64 { return s.HandshakeFailures }),
		counterOf("meshtun_hbone_server_connections_refused_total", "Inbound connections closed at accept, over hbone.max_inbound_conns.",
			func(s hbone.ServerStats) uint64 { return s.ConnsRefused }),
		counterOf("meshtun_hbone_server_streams_refused_total", "Inbound streams refused with REFUSED_STREAM (over the concurrency limit, or while draining).",
			func(s hbone.ServerStats) uint64 { return s.StreamsRefused }),
	}
)

// statsCollector exports a package's Stats, read once per scrape, as
// the families of its table. While stats reports the package is not
// running, the families have no sample.
type statsCollector[S any] struct {
	stats    func() (S, bool)
	families []statFamily[S]
}

var _ prometheus.Collector = (*statsCollector[netstack.Stats])(nil)

func (c *statsCollector[S]) Describe(ch chan<- *prometheus.Desc) {
	for _, f := range c.families {
		ch <- f.desc
	}
}

func (c *statsCollector[S]) Collect(ch chan<- prometheus.Metric) {
	s, ok := c.stats()
	if !ok {
		return
	}
	for _, f := range c.families {
		ch <- prometheus.MustNewConstMetric(f.desc, f.kind, f.value(s))
	}
}

// statsOf reads the Stats of the package p points to, if any.
func statsOf[T, S any](p *atomic.Pointer[T], stats func(*T) S) func() (S, bool) {
	return func() (S, bool) {
		x := p.Load()
		if x == nil {
			var zero S
			return zero, false
		}
		return stats(x), true
	}
}

// The families of the mesh clients. Their type label is the short name
// of the xDS type (xdsTypeLabel), as an operator writes it in a query.
var (
	xdsConnectedDesc = prometheus.NewDesc("meshtun_xds_connected",
		"1 while the xDS stream to istiod is open and has delivered a response, else 0.", nil, nil)
	xdsReconnectsDesc = prometheus.NewDesc("meshtun_xds_reconnects_total",
		"xDS streams opened after the first (istiod closes streams at their maximum age, so a slow rise is normal).", nil, nil)
	xdsResourcesDesc = prometheus.NewDesc("meshtun_xds_resources",
		"Resources held from istiod, by type: address (workloads and services) or authorization (policies).", []string{"type"}, nil)
	xdsUpdatesDesc = prometheus.NewDesc("meshtun_xds_updates_total",
		"xDS responses applied, wholly or in part, by type.", []string{"type"}, nil)
	xdsNACKsDesc = prometheus.NewDesc("meshtun_xds_nacks_total",
		"xDS responses NACKed because at least one resource was rejected, by type; unknown: responses of a type not subscribed to.", []string{"type"}, nil)
	xdsCoalescedDesc = prometheus.NewDesc("meshtun_xds_coalesced_total",
		"xDS responses applied together with an earlier one, because they arrived while it was being applied: istiod pushing faster than the state is applied.", nil, nil)
	xdsApplyDesc = prometheus.NewDesc("meshtun_xds_apply_seconds",
		"Time from receiving an xDS response to sending its ACK: waiting behind the one applied before it, decoding, and putting what it changed in force.", nil, nil)
	caRenewalsDesc = prometheus.NewDesc("meshtun_ca_renewals_total",
		"Certificate requests to Istio's CA, the first issuance included, by result: success or failure.", []string{"result"}, nil)
	caExpiryDesc = prometheus.NewDesc("meshtun_ca_cert_expiry_seconds",
		"The NotAfter of the mesh certificate held, as Unix time in seconds; alert on it minus time(). No sample before the first certificate.", nil, nil)
)

// applyHistogram is h as a Prometheus histogram, in seconds.
func applyHistogram(h mesh.ApplyHistogram) prometheus.Metric {
	buckets := make(map[float64]uint64, len(mesh.ApplyBounds))
	var below uint64
	for i, b := range mesh.ApplyBounds {
		below += h.Buckets[i]
		buckets[b.Seconds()] = below
	}
	return prometheus.MustNewConstHistogram(xdsApplyDesc, h.Count, h.Sum.Seconds(), buckets)
}

// xdsTypeLabel is the type label of an xDS type URL: "address" and
// "authorization" for the two meshtun subscribes to, the URL itself for
// any other (there is none today; the label stays bounded by the types
// the client holds).
func xdsTypeLabel(typeURL string) string {
	switch typeURL {
	case mesh.AddressType:
		return "address"
	case mesh.AuthorizationType:
		return "authorization"
	}
	return typeURL
}

// meshCollector exports the state of the xDS client and the certificate
// manager, read once per scrape. A client not stored (the mesh off, or
// not started yet) has no sample.
type meshCollector struct {
	xds func() (mesh.XDSStats, bool)
	ca  func() (mesh.CAStats, bool)
}

var _ prometheus.Collector = (*meshCollector)(nil)

func (c *meshCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{xdsConnectedDesc, xdsReconnectsDesc, xdsResourcesDesc,
		xdsUpdatesDesc, xdsNACKsDesc, xdsCoalescedDesc, xdsApplyDesc, caRenewalsDesc, caExpiryDesc} {
		ch <- d
	}
}

func (c *meshCollector) Collect(ch chan<- prometheus.Metric) {
	if s, ok := c.xds(); ok {
		connected := 0.0
		if s.Connected {
			connected = 1
		}
		ch <- prometheus.MustNewConstMetric(xdsConnectedDesc, prometheus.GaugeValue, connected)
		ch <- prometheus.MustNewConstMetric(xdsReconnectsDesc, prometheus.CounterValue, float64(s.Reconnects))
		ch <- prometheus.MustNewConstMetric(xdsCoalescedDesc, prometheus.CounterValue, float64(s.Coalesced))
		ch <- applyHistogram(s.Apply)
		for url, t := range s.Types {
			typ := xdsTypeLabel(url)
			ch <- prometheus.MustNewConstMetric(xdsResourcesDesc, prometheus.GaugeValue, float64(t.Resources), typ)
			ch <- prometheus.MustNewConstMetric(xdsUpdatesDesc, prometheus.CounterValue, float64(t.Updates), typ)
			ch <- prometheus.MustNewConstMetric(xdsNACKsDesc, prometheus.CounterValue, float64(t.NACKs), typ)
		}
		ch <- prometheus.MustNewConstMetric(xdsNACKsDesc, prometheus.CounterValue, float64(s.UnknownTypeNACKs), unknown)
	}
	if s, ok := c.ca(); ok {
		ch <- prometheus.MustNewConstMetric(caRenewalsDesc, prometheus.CounterValue, float64(s.Renewals), "success")
		ch <- prometheus.MustNewConstMetric(caRenewalsDesc, prometheus.CounterValue, float64(s.RenewalFailures), "failure")
		if !s.Expiry.IsZero() {
			// Unix time, not seconds left: a gauge of time left is stale
			// between scrapes and needs this process to keep it true,
			// while a timestamp is right as long as it is held, and
			// Prometheus' own convention (process_start_time_seconds,
			// the blackbox exporter's certificate expiry) is the
			// timestamp, with time() in the query.
			ch <- prometheus.MustNewConstMetric(caExpiryDesc, prometheus.GaugeValue, float64(s.Expiry.UnixMilli())/1e3)
		}
	}
}
