package gateway

import (
	"bufio"
	"cmp"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/hbone"
)

// The gateway's metrics, served on admin.metrics at /metrics and
// /stats/prometheus in Prometheus' text exposition format (version 0.0.4).
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
// flow that did not get through moved no bytes.
//
// Label values come from the configuration (workload names, service
// hostnames) and from certificate identities, never from addresses or
// ports, so the number of series stays bounded by the mesh's size. A
// value the gateway does not know is "unknown".

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
	sourcePrincipal      string
	destinationPrincipal string
	sourceWorkload       string
	destinationWorkload  string
	destinationService   string
	responseFlags        string
	securityPolicy       string
}

// tcpCounts are the counters of one series.
type tcpCounts struct {
	opened, closed, sent, received atomic.Uint64
}

// metrics holds the gateway's counters. It is safe for concurrent use.
type metrics struct {
	mu     sync.Mutex
	series map[tcpLabels]*tcpCounts

	flowsOpen [2]atomic.Int64 // by direction: 0 outbound, 1 inbound

	// index names the configured workloads and services of the config in
	// force: the only workload and service label values besides
	// "unknown". Rebuilt when a reload brings a new config.
	index atomic.Pointer[labelIndex]
}

// labelIndex is what labels are looked up in, for one config.
type labelIndex struct {
	cfg       *config.Config
	workloads map[netip.Addr]string // workload name by address
	hosts     map[string]bool       // service hostnames
}

func newMetrics() *metrics {
	return &metrics{series: make(map[tcpLabels]*tcpCounts)}
}

// indexFor returns the label index of cfg, building it on first use.
func (m *metrics) indexFor(cfg *config.Config) *labelIndex {
	if x := m.index.Load(); x != nil && x.cfg == cfg {
		return x
	}
	x := &labelIndex{cfg: cfg, workloads: make(map[netip.Addr]string), hosts: make(map[string]bool)}
	for _, w := range cfg.Workloads {
		for _, a := range w.Addresses {
			x.workloads[a.Unmap()] = w.Name
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

// countsLocked returns the counters of l, creating them.
func (m *metrics) countsLocked(l tcpLabels) *tcpCounts {
	c := m.series[l]
	if c == nil {
		c = new(tcpCounts)
		m.series[l] = c
	}
	return c
}

func (m *metrics) counts(l tcpLabels) *tcpCounts {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.countsLocked(l)
}

// workload is the workload label of addr.
func (x *labelIndex) workload(addr netip.Addr) string {
	if n, ok := x.workloads[addr.Unmap()]; ok {
		return n
	}
	return unknown
}

// flowMetrics is what a flow keeps between opening and closing.
type flowMetrics struct {
	m      *metrics
	labels tcpLabels  // as opened (response_flags "-")
	open   *tcpCounts // the series of labels
	dir    int
	live   bool // the relay adds the bytes as they flow (relayCounters)
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
	return relayCounters{aToB: &fm.open.received, bToA: &fm.open.sent}
}

// openFlow counts a flow as opened and returns what closeFlow needs.
func (m *metrics) openFlow(direction string, l tcpLabels) *flowMetrics {
	l.responseFlags = "-"
	fm := &flowMetrics{m: m, labels: l, open: m.counts(l)}
	if direction == inbound {
		fm.dir = 1
	}
	fm.open.opened.Add(1)
	m.flowsOpen[fm.dir].Add(1)
	return fm
}

// close counts the flow as closed with its response flag ("" for none)
// and adds its bytes, unless the relay counted them live: request is
// client → server, response back.
func (fm *flowMetrics) close(flag string, request, response int64) {
	if request > 0 && !fm.live {
		fm.open.received.Add(uint64(request))
	}
	if response > 0 && !fm.live {
		fm.open.sent.Add(uint64(response))
	}
	closed := fm.open
	if flag != "" {
		l := fm.labels
		l.responseFlags = flag
		closed = fm.m.counts(l)
	}
	closed.closed.Add(1)
	fm.m.flowsOpen[fm.dir].Add(-1)
}

// outboundLabels are the labels of a flow captured by the TUN from src
// and routed by plan. This gateway's identity is the one its HBONE peers
// see as the source.
func (g *Gateway) outboundLabels(src netip.AddrPort, plan Plan) tcpLabels {
	x := g.metrics.indexFor(g.snapshot().cfg)
	l := tcpLabels{
		reporter:             reporterSource,
		sourcePrincipal:      orUnknown(g.identity),
		sourceWorkload:       x.workload(src.Addr()),
		destinationPrincipal: unknown,
		destinationWorkload:  unknown,
		destinationService:   unknown,
		securityPolicy:       unknown,
	}
	if plan.Kind == Deny {
		return l
	}
	l.destinationWorkload = x.workload(plan.Target.Addr())
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
	return l
}

// inboundLabels are the labels of a CONNECT stream from the client src.
// The destination service is the forwarded host= only when it names a
// configured service: a peer's header must not create series.
func (g *Gateway) inboundLabels(r *hbone.Request, src netip.AddrPort) tcpLabels {
	x := g.metrics.indexFor(g.snapshot().cfg)
	l := tcpLabels{
		reporter:             reporterDestination,
		sourcePrincipal:      orUnknown(r.PeerIdentity()),
		destinationPrincipal: orUnknown(g.identity),
		sourceWorkload:       x.workload(src.Addr()),
		destinationWorkload:  x.workload(r.Target().Addr()),
		destinationService:   unknown,
		securityPolicy:       mutualTLS,
	}
	if h := forwardedHost(r.Header().Get("Forwarded")); h != "" && x.hosts[h] {
		l.destinationService = h
	}
	return l
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

// The TCP families, in exposition order.
var tcpFamilies = []struct {
	name, help string
	value      func(*tcpCounts) uint64
}{
	{"istio_tcp_connections_opened_total", "The total number of TCP connections opened.",
		func(c *tcpCounts) uint64 { return c.opened.Load() }},
	{"istio_tcp_connections_closed_total", "The total number of TCP connections closed.",
		func(c *tcpCounts) uint64 { return c.closed.Load() }},
	{"istio_tcp_received_bytes_total", "The bytes received during request (client to server), counted as they flow.",
		func(c *tcpCounts) uint64 { return c.received.Load() }},
	{"istio_tcp_sent_bytes_total", "The bytes sent during response (server to client), counted as they flow.",
		func(c *tcpCounts) uint64 { return c.sent.Load() }},
}

// metricsHandler serves the exposition on /metrics and /stats/prometheus
// (the path Istio's sidecars and ztunnel are scraped at).
func (g *Gateway) metricsHandler() http.Handler {
	mux := http.NewServeMux()
	h := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		bw := bufio.NewWriter(w)
		g.writeMetrics(bw)
		bw.Flush()
	}
	mux.HandleFunc("GET /metrics", h)
	mux.HandleFunc("GET /stats/prometheus", h)
	return mux
}

// writeMetrics writes every family in the text exposition format, series
// sorted by their labels so that scrapes are stable.
func (g *Gateway) writeMetrics(w *bufio.Writer) {
	m := g.metrics
	m.mu.Lock()
	type entry struct {
		l tcpLabels
		c *tcpCounts
	}
	series := make([]entry, 0, len(m.series))
	for l, c := range m.series {
		series = append(series, entry{l, c})
	}
	m.mu.Unlock()
	slices.SortFunc(series, func(a, b entry) int { return cmp.Compare(a.l.String(), b.l.String()) })

	for _, f := range tcpFamilies {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s counter\n", f.name, f.help, f.name)
		for _, e := range series {
			fmt.Fprintf(w, "%s{%s} %d\n", f.name, e.l.String(), f.value(e.c))
		}
	}

	gauge := func(name, help string, values ...string) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name)
		for i := 0; i+1 < len(values); i += 2 {
			fmt.Fprintf(w, "%s%s %s\n", name, values[i], values[i+1])
		}
	}
	// TODO(lead): gauge from flow table (g.flows.open(dir) counts the same flows; then drop flowsOpen)
	gauge("meshtun_flows_open", "Connections the gateway is carrying now, by direction.",
		`{direction="outbound"}`, fmt.Sprint(m.flowsOpen[0].Load()),
		`{direction="inbound"}`, fmt.Sprint(m.flowsOpen[1].Load()))
	if g.pool != nil {
		s := g.pool.Stats()
		gauge("meshtun_hbone_pool_connections_open", "Outbound HBONE connections held by the pool, draining ones included.",
			"", fmt.Sprint(s.ConnsOpen))
	}
	if g.server != nil {
		s := g.server.Stats()
		gauge("meshtun_hbone_server_connections_open", "Inbound HBONE connections, including those still in the TLS handshake.",
			"", fmt.Sprint(s.ConnsOpen))
	}
}

// String is the label set in the exposition format, without braces.
func (l tcpLabels) String() string {
	var b strings.Builder
	for i, kv := range [...][2]string{
		{"reporter", l.reporter},
		{"source_principal", l.sourcePrincipal},
		{"destination_principal", l.destinationPrincipal},
		{"source_workload", l.sourceWorkload},
		{"destination_workload", l.destinationWorkload},
		{"destination_service", l.destinationService},
		{"response_flags", l.responseFlags},
		{"connection_security_policy", l.securityPolicy},
	} {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(kv[0])
		b.WriteString(`="`)
		labelEscaper.WriteString(&b, kv[1])
		b.WriteByte('"')
	}
	return b.String()
}

// labelEscaper escapes a label value as the text format requires.
var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
