package gateway

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/hbone"
	"github.com/meshtun/meshtun/hbone/devca"
	"github.com/meshtun/meshtun/netstack"
)

// sample is one line of a text exposition.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// parseExposition parses a text exposition with the Prometheus text
// parser, which rejects what Prometheus would (a sample before its
// family's TYPE line, a bad escape, a TYPE twice), and checks what it
// lets through: every family has a HELP line and no series appears
// twice. Summaries and histograms become their _sum, _count, quantile and
// bucket samples.
func parseExposition(t *testing.T, text string) []sample {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("parse the exposition: %v\n%s", err, text)
	}
	seen := map[string]bool{}
	var out []sample
	add := func(name string, labels map[string]string, v float64) {
		key := name + fmt.Sprint(labels)
		if seen[key] {
			t.Fatalf("series twice: %s", key)
		}
		seen[key] = true
		out = append(out, sample{name, labels, v})
	}
	for name, f := range families {
		if f.GetHelp() == "" {
			t.Errorf("%s has no HELP line", name)
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			with := func(k, v string) map[string]string {
				out := maps.Clone(labels)
				out[k] = v
				return out
			}
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				add(name, labels, m.GetCounter().GetValue())
			case dto.MetricType_GAUGE:
				add(name, labels, m.GetGauge().GetValue())
			case dto.MetricType_UNTYPED:
				add(name, labels, m.GetUntyped().GetValue())
			case dto.MetricType_SUMMARY:
				for _, q := range m.GetSummary().GetQuantile() {
					add(name, with("quantile", fmt.Sprint(q.GetQuantile())), q.GetValue())
				}
				add(name+"_sum", labels, m.GetSummary().GetSampleSum())
				add(name+"_count", labels, float64(m.GetSummary().GetSampleCount()))
			case dto.MetricType_HISTOGRAM:
				for _, b := range m.GetHistogram().GetBucket() {
					add(name+"_bucket", with("le", fmt.Sprint(b.GetUpperBound())), float64(b.GetCumulativeCount()))
				}
				add(name+"_sum", labels, m.GetHistogram().GetSampleSum())
				add(name+"_count", labels, float64(m.GetHistogram().GetSampleCount()))
			default:
				t.Fatalf("%s: unexpected type %v", name, f.GetType())
			}
		}
	}
	return out
}

// find returns the value of the one sample of name whose labels include
// want; ok is false when there is none.
func find(t *testing.T, samples []sample, name string, want map[string]string) (float64, bool) {
	t.Helper()
	var (
		v     float64
		found int
	)
	for _, s := range samples {
		if s.name != name {
			continue
		}
		match := true
		for k, w := range want {
			if s.labels[k] != w {
				match = false
				break
			}
		}
		if match {
			v += s.value
			found++
		}
	}
	return v, found > 0
}

// scrape GETs path from the metrics handler over a real HTTP connection.
func scrape(t *testing.T, base, path string) []sample {
	t.Helper()
	resp, err := http.Get(base + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s: %s", path, resp.Status, b)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Errorf("GET %s: Content-Type %q, want the text format's", path, ct)
	}
	return parseExposition(t, string(b))
}

const (
	testIDA = "spiffe://cluster.local/ns/meshtun/sa/node-a"
	testIDB = "spiffe://cluster.local/ns/meshtun/sa/node-b"
)

// metricsGateway is a Gateway with just what the metrics need: its
// identity, a config with a client and a server workload and a service.
func metricsGateway(t *testing.T) *Gateway {
	t.Helper()
	cfg := config.Default()
	cfg.Workloads = []config.Workload{
		{Name: "client", Namespace: "default", Addresses: []netip.Addr{netip.MustParseAddr("10.244.1.5")}},
		{Name: "server", Namespace: "default", Addresses: []netip.Addr{netip.MustParseAddr("10.244.2.5")}},
	}
	cfg.Services = []config.Service{{Name: "web", Namespace: "default", Hostname: "web.default.svc.cluster.local"}}
	cfg.Gateway.Name = "node-a"
	g := &Gateway{cfg: cfg, identity: testIDA, metrics: newMetrics()}
	g.metrics.identity = testIDA
	g.metrics.openFlows = g.flows.open
	g.cur.Store(newSnapshot(cfg, nil))
	return g
}

func TestMetricsOutboundFlows(t *testing.T) {
	g := metricsGateway(t)
	srv := httptest.NewServer(g.metricsHandler())
	defer srv.Close()

	client := netip.MustParseAddrPort("10.244.1.5:40000")
	stranger := netip.MustParseAddrPort("10.244.1.77:40000")
	toService := Plan{
		Kind: HBONE, Target: netip.MustParseAddrPort("10.244.2.5:8080"), Identities: []string{testIDB, "spiffe://cluster.local/ns/default/sa/web"},
		Service: "default/web", Host: "web.default.svc.cluster.local",
	}
	toPeer := Plan{Kind: HBONE, Target: netip.MustParseAddrPort("10.244.2.9:80"), Identities: []string{testIDB}}
	noRoute := Plan{Kind: Deny, Reason: "no peer"}

	// flow runs one flow through the hooks the handlers use: openMetrics
	// once routed, emit when it ends.
	flow := func(src netip.AddrPort, plan Plan, flag string, up, down int64) {
		fl := &flowLog{direction: outbound, src: src}
		l, _ := g.outboundLabels(g.snapshot(), src, plan)
		fl.openMetrics(g.metrics, l)
		fl.flag, fl.sent, fl.recv = flag, up, down
		fl.emit(nil)
	}
	ups := []int64{1, 1000, 65536}
	var upSum, downSum int64
	for i, up := range ups {
		down := int64(i*7919 + 3)
		upSum, downSum = upSum+up, downSum+down
		flow(client, toService, "", up, down)
	}
	flow(stranger, toPeer, flagConnect, 0, 0)
	flow(stranger, noRoute, flagNoRoute, 0, 0)

	// One still open: counted as opened, not closed, and in flows_open
	// (which counts the flow table's open flows).
	open := g.flows.begin(outbound)
	l, _ := g.outboundLabels(g.snapshot(), stranger, toPeer)
	open.log.openMetrics(g.metrics, l)

	service := map[string]string{
		"reporter": "source", "source_principal": testIDA, "destination_principal": testIDB,
		"source_workload": "client", "destination_workload": "server",
		"destination_service": "web.default.svc.cluster.local", "connection_security_policy": "mutual_tls",
	}
	with := func(m map[string]string, kv ...string) map[string]string {
		out := map[string]string{}
		for k, v := range m {
			out[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	// A source no workload is configured at is this node, described by
	// gateway.name and its identity's namespace (nodeDescription).
	peer := with(service, "source_workload", "node-a", "source_workload_namespace", "meshtun", "source_canonical_service", "node-a",
		"source_canonical_revision", "latest", "destination_workload", "unknown", "destination_service", "unknown")
	unrouted := with(peer, "destination_principal", "unknown", "connection_security_policy", "unknown")

	for _, path := range []string{"/metrics", "/stats/prometheus"} {
		samples := scrape(t, srv.URL, path)
		for _, c := range []struct {
			name   string
			metric string
			labels map[string]string
			want   float64
		}{
			{"service flows opened", "istio_tcp_connections_opened_total", with(service, "response_flags", "-"), float64(len(ups))},
			{"service flows closed", "istio_tcp_connections_closed_total", with(service, "response_flags", "-"), float64(len(ups))},
			{"request bytes", "istio_tcp_received_bytes_total", with(service, "response_flags", "-"), float64(upSum)},
			{"response bytes", "istio_tcp_sent_bytes_total", with(service, "response_flags", "-"), float64(downSum)},
			{"failed and open flows opened under -", "istio_tcp_connections_opened_total", with(peer, "response_flags", "-"), 2},
			{"failed flow closed under CONNECT", "istio_tcp_connections_closed_total", with(peer, "response_flags", "CONNECT"), 1},
			{"open flow not closed", "istio_tcp_connections_closed_total", with(peer, "response_flags", "-"), 0},
			{"unrouted opened", "istio_tcp_connections_opened_total", with(unrouted, "response_flags", "-"), 1},
			{"unrouted closed", "istio_tcp_connections_closed_total", with(unrouted, "response_flags", "NO_ROUTE"), 1},
			{"every outbound opened", "istio_tcp_connections_opened_total", map[string]string{"reporter": "source"}, float64(len(ups) + 3)},
			{"no destination reporter", "istio_tcp_connections_opened_total", map[string]string{"reporter": "destination"}, 0},
			{"open outbound", "meshtun_flows_open", map[string]string{"direction": "outbound"}, 1},
			{"open inbound", "meshtun_flows_open", map[string]string{"direction": "inbound"}, 0},
		} {
			got, _ := find(t, samples, c.metric, c.labels)
			if got != c.want {
				t.Errorf("%s %s: %s%v = %v, want %v", path, c.name, c.metric, c.labels, got, c.want)
			}
		}
		for _, s := range samples {
			for k, v := range s.labels {
				if v == "" {
					t.Errorf("%s: %s has an empty %s; unknown values must read \"unknown\"", path, s.name, k)
				}
			}
		}
	}

	g.flows.end(open, outcome{})
	samples := scrape(t, srv.URL, "/metrics")
	if v, _ := find(t, samples, "meshtun_flows_open", map[string]string{"direction": "outbound"}); v != 0 {
		t.Errorf("meshtun_flows_open after every flow ended = %v, want 0", v)
	}
	if v, _ := find(t, samples, "istio_tcp_connections_closed_total", with(peer, "response_flags", "-")); v != 1 {
		t.Errorf("closed under - after the open flow ended = %v, want 1", v)
	}
}

// A flow whose emit runs twice (it must not) still counts one close.
func TestMetricsCloseOnce(t *testing.T) {
	g := metricsGateway(t)
	fl := &flowLog{direction: inbound}
	fl.openMetrics(g.metrics, tcpLabels{reporter: reporterDestination})
	fl.sent = 10
	fl.emit(nil)
	fl.emit(nil)
	srv := httptest.NewServer(g.metricsHandler())
	defer srv.Close()
	samples := scrape(t, srv.URL, "/metrics")
	for name, want := range map[string]float64{
		"istio_tcp_connections_opened_total": 1,
		"istio_tcp_connections_closed_total": 1,
		"istio_tcp_received_bytes_total":     10,
	} {
		if v, _ := find(t, samples, name, map[string]string{"reporter": "destination"}); v != want {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}
}

// Label values with quotes, backslashes and newlines (the exposition's
// escaping must hold whatever a value holds) come back from the exposition
// as they went in, with the 16 labels of Istio's TCP metrics.
func TestMetricsLabelEscaping(t *testing.T) {
	g := metricsGateway(t)
	const odd = "a\"b\\c\nd"
	fl := &flowLog{direction: outbound}
	fl.openMetrics(g.metrics, tcpLabels{reporter: "source", source: workloadLabels{workload: odd}})
	srv := httptest.NewServer(g.metricsHandler())
	defer srv.Close()
	var found int
	for _, s := range scrape(t, srv.URL, "/metrics") {
		if s.name != "istio_tcp_connections_opened_total" {
			continue
		}
		found++
		if got := s.labels["source_workload"]; got != odd {
			t.Errorf("round trip of an escaped value: %q, want %q", got, odd)
		}
		if len(s.labels) != len(tcpLabelNames) {
			t.Errorf("labels: %v, want the %d of Istio's TCP metrics", s.labels, len(tcpLabelNames))
		}
	}
	if found != 1 {
		t.Errorf("%d series of istio_tcp_connections_opened_total, want 1", found)
	}
}

func TestForwardedHost(t *testing.T) {
	for _, c := range []struct{ name, in, want string }{
		{"for and host", `for="10.0.0.1:5000";host=web.default.svc.cluster.local`, "web.default.svc.cluster.local"},
		{"quoted", `for="10.0.0.1:5000";host="web.default"`, "web.default"},
		{"case", `For="1.2.3.4:1"; Host=x`, "x"},
		{"none", `for="10.0.0.1:5000"`, ""},
		{"empty", ``, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := forwardedHost(c.in); got != c.want {
				t.Errorf("forwardedHost(%q) = %q, want %q", c.in, got, c.want)
			}
		})
	}
}

func TestMetricsMethodNotAllowed(t *testing.T) {
	g := metricsGateway(t)
	srv := httptest.NewServer(g.metricsHandler())
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/metrics", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /metrics: %s, want 405", resp.Status)
	}
}

// A metrics address that cannot be bound fails Run with the key's name,
// as the other listeners do.
func TestRunMetricsListenerInUse(t *testing.T) {
	dir := t.TempDir()
	ca, _, err := devca.LoadOrCreate(dir, "cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := ca.WriteLeaf(dir, "node-a", testIDA); err != nil {
		t.Fatal(err)
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	path := filepath.Join(dir, "gateway.toml")
	text := fmt.Sprintf(`version = 1
[gateway]
name = "node-a"
[tls]
cert = "node-a.pem"
key = "node-a-key.pem"
trust_bundle = "ca.pem"
[hbone]
listen = ""
[admin]
listen = ""
readiness = ""
metrics = %q
`, busy.Addr().String())
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg.TUN.Name = "" // no device: only the listeners start
	g, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = g.Run(ctx)
	if err == nil || !strings.Contains(err.Error(), "admin.metrics") {
		t.Fatalf("Run with admin.metrics in use: %v, want an error naming admin.metrics", err)
	}
}

// scrapeFamilies returns the families of a scrape with their TYPE, HELP and
// samples, parsed by the Prometheus text parser.
func scrapeFamilies(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	return families
}

// Every family the gateway exports is there with its type and a HELP
// line: Istio's, the gateway's, the packages' (while they run) and the Go
// and process collectors'. The process and Go gauges read this process.
func TestMetricsFamilies(t *testing.T) {
	g := metricsGateway(t)
	srv := httptest.NewServer(g.metricsHandler())
	defer srv.Close()
	fl := &flowLog{direction: outbound}
	l, _ := g.outboundLabels(g.snapshot(), netip.MustParseAddrPort("10.244.1.5:40000"), Plan{Kind: Deny})
	fl.openMetrics(g.metrics, l)
	defer fl.emit(nil)

	ca, err := devca.New("cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.KeyPair(testIDA)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := hbone.NewPool(hbone.PoolOptions{Certificate: cert, Roots: ca.Pool()})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	server, err := hbone.NewServer(hbone.ServerOptions{Certificate: cert, Roots: ca.Pool(), TrustDomain: "cluster.local",
		Handler: func(r *hbone.Request) { r.Reject(http.StatusForbidden) }})
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()

	counter, gauge := dto.MetricType_COUNTER, dto.MetricType_GAUGE
	packages := map[string]dto.MetricType{
		"meshtun_hbone_pool_connections_opened_total":     counter,
		"meshtun_hbone_pool_connections_open":             gauge,
		"meshtun_hbone_pool_streams_open":                 gauge,
		"meshtun_hbone_server_connections_accepted_total": counter,
		"meshtun_hbone_server_streams_accepted_total":     counter,
		"meshtun_hbone_server_streams_rejected_total":     counter,
		"meshtun_hbone_server_connections_open":           gauge,
		"meshtun_hbone_server_streams_open":               gauge,
	}
	always := map[string]dto.MetricType{
		"istio_tcp_connections_opened_total":        counter,
		"istio_tcp_connections_closed_total":        counter,
		"istio_tcp_received_bytes_total":            counter,
		"istio_tcp_sent_bytes_total":                counter,
		"meshtun_flows_open":                        gauge,
		"meshtun_relay_buffers_in_use":              gauge,
		"meshtun_build_info":                        gauge,
		"go_goroutines":                             gauge,
		"go_memstats_heap_alloc_bytes":              gauge,
		"go_info":                                   gauge,
		"go_cpu_classes_gc_total_cpu_seconds_total": counter,
		"process_resident_memory_bytes":             gauge,
		"process_open_fds":                          gauge,
		"process_cpu_seconds_total":                 counter,
	}
	check := func(families map[string]*dto.MetricFamily, want map[string]dto.MetricType) {
		t.Helper()
		for name, typ := range want {
			f := families[name]
			switch {
			case f == nil:
				t.Errorf("no family %s", name)
			case f.GetType() != typ:
				t.Errorf("%s is a %v, want a %v", name, f.GetType(), typ)
			case f.GetHelp() == "":
				t.Errorf("%s has no HELP", name)
			case len(f.GetMetric()) == 0:
				t.Errorf("%s has no sample", name)
			}
		}
	}

	// The pool and the server not running yet: their families have no
	// sample, and no netstack runs in this test.
	families := scrapeFamilies(t, srv.URL+"/metrics")
	check(families, always)
	for name := range families {
		if strings.HasPrefix(name, "meshtun_hbone_") || strings.HasPrefix(name, "meshtun_netstack_") {
			t.Errorf("%s exported while its package is not running", name)
		}
	}
	for name, f := range families {
		if f.GetType() == counter && !strings.HasSuffix(name, "_total") {
			t.Errorf("counter %s: name without _total", name)
		}
	}
	for _, c := range []struct {
		name string
		ok   func(float64) bool
	}{
		{"go_goroutines", func(v float64) bool { return v >= 1 }},
		{"process_resident_memory_bytes", func(v float64) bool { return v >= 1<<20 }},
		{"process_open_fds", func(v float64) bool { return v >= 3 }},
	} {
		if m := families[c.name].GetMetric(); len(m) != 1 || !c.ok(m[0].GetGauge().GetValue()) {
			t.Errorf("%s = %v: not a value of a running process", c.name, m)
		}
	}
	info := families["meshtun_build_info"].GetMetric()
	if len(info) != 1 || info[0].GetGauge().GetValue() != 1 {
		t.Fatalf("meshtun_build_info: %v, want one sample of 1", info)
	}
	labels := map[string]string{}
	for _, lp := range info[0].GetLabel() {
		labels[lp.GetName()] = lp.GetValue()
	}
	if labels["goversion"] != runtime.Version() || labels["version"] == "" || len(labels) != 2 {
		t.Errorf("meshtun_build_info labels %v, want version and goversion %s", labels, runtime.Version())
	}

	// Running, with one connection from the pool to the server and one
	// CONNECT, which the server rejects.
	g.metrics.pool.Store(pool)
	g.metrics.server.Store(server)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { server.Serve(ln); close(served) }()
	defer func() { server.Close(); <-served }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pool.Connect(ctx, hbone.ConnectRequest{
		Address:    ln.Addr().(*net.TCPAddr).AddrPort(),
		Authority:  netip.MustParseAddrPort("10.244.2.5:80"),
		Identities: []string{testIDA},
	})
	if err == nil {
		t.Fatal("Connect succeeded; the server rejects every CONNECT")
	}
	families = scrapeFamilies(t, srv.URL+"/metrics")
	check(families, packages)
	for name, want := range map[string]float64{
		"meshtun_hbone_pool_connections_opened_total":     1,
		"meshtun_hbone_pool_connections_open":             1,
		"meshtun_hbone_server_connections_accepted_total": 1,
		"meshtun_hbone_server_streams_accepted_total":     0,
		"meshtun_hbone_server_streams_rejected_total":     1,
	} {
		m := families[name].GetMetric()
		if len(m) != 1 {
			t.Errorf("%s: %d samples, want 1", name, len(m))
			continue
		}
		if got := m[0].GetCounter().GetValue() + m[0].GetGauge().GetValue(); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
}

// Each field of the packages' Stats lands in its own family: the tables
// are fed values that differ from field to field.
func TestMetricsStatsTables(t *testing.T) {
	running := func(s netstack.Stats) func() (netstack.Stats, bool) {
		return func() (netstack.Stats, bool) { return s, true }
	}
	for _, c := range []struct {
		name string
		c    prometheus.Collector
		want map[string]float64
	}{
		{"netstack", &statsCollector[netstack.Stats]{stats: running(netstack.Stats{
			Requests: 1, Forwarded: 2, Rejected: 3, AcceptFailures: 4, InFlightDrops: 5, BadChecksums: 6,
		}), families: netstackFamilies}, map[string]float64{
			"meshtun_netstack_requests_total":        1,
			"meshtun_netstack_forwarded_total":       2,
			"meshtun_netstack_rejected_total":        3,
			"meshtun_netstack_accept_failures_total": 4,
			"meshtun_netstack_in_flight_drops_total": 5,
			"meshtun_netstack_bad_checksums_total":   6,
		}},
		{"pool", &statsCollector[hbone.PoolStats]{stats: func() (hbone.PoolStats, bool) {
			return hbone.PoolStats{ConnsOpened: 1, ConnsOpen: 2, StreamsOpen: 3, DialsFailed: 4, StreamsOpened: 5, StreamsFailed: 6}, true
		}, families: poolFamilies}, map[string]float64{
			"meshtun_hbone_pool_connections_opened_total": 1,
			"meshtun_hbone_pool_connections_open":         2,
			"meshtun_hbone_pool_streams_open":             3,
			"meshtun_hbone_pool_dials_failed_total":       4,
			"meshtun_hbone_pool_streams_opened_total":     5,
			"meshtun_hbone_pool_streams_failed_total":     6,
		}},
		{"server", &statsCollector[hbone.ServerStats]{stats: func() (hbone.ServerStats, bool) {
			return hbone.ServerStats{ConnsAccepted: 1, StreamsAccepted: 2, StreamsRejected: 3, ConnsOpen: 4, StreamsOpen: 5, HandshakeFailures: 6, StreamsRefused: 7, ConnsRefused: 8}, true
		}, families: serverFamilies}, map[string]float64{
			"meshtun_hbone_server_connections_accepted_total": 1,
			"meshtun_hbone_server_streams_accepted_total":     2,
			"meshtun_hbone_server_streams_rejected_total":     3,
			"meshtun_hbone_server_connections_open":           4,
			"meshtun_hbone_server_streams_open":               5,
			"meshtun_hbone_server_handshake_failures_total":   6,
			"meshtun_hbone_server_streams_refused_total":      7,
			"meshtun_hbone_server_connections_refused_total":  8,
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := gatherSeries(t, c.c); !maps.Equal(got, c.want) {
				t.Errorf("gathered %v, want %v", got, c.want)
			}
		})
	}
}
