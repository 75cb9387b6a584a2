package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/hbone/devca"
)

// sample is one line of a text exposition.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// parseExposition parses Prometheus' text format strictly enough to catch
// our mistakes: every sample's family must have been announced by HELP
// and TYPE lines before it, label values must be quoted and escaped, and
// no series may appear twice.
func parseExposition(t *testing.T, text string) []sample {
	t.Helper()
	typed := map[string]string{}
	seen := map[string]bool{}
	var out []sample
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if line == "" {
			continue
		}
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			f := strings.Fields(rest)
			if len(f) != 2 || (f[1] != "counter" && f[1] != "gauge") {
				t.Fatalf("line %d: bad TYPE: %q", n, line)
			}
			typed[f[0]] = f[1]
			continue
		}
		if strings.HasPrefix(line, "# HELP ") {
			continue
		}
		if strings.HasPrefix(line, "#") {
			t.Fatalf("line %d: unexpected comment %q", n, line)
		}
		s, err := parseSample(line)
		if err != nil {
			t.Fatalf("line %d: %v: %q", n, err, line)
		}
		if typed[s.name] == "" {
			t.Fatalf("line %d: sample of %s before its TYPE line", n, s.name)
		}
		key := s.name + fmt.Sprint(s.labels)
		if seen[key] {
			t.Fatalf("line %d: series twice: %q", n, line)
		}
		seen[key] = true
		out = append(out, s)
	}
	return out
}

func parseSample(line string) (sample, error) {
	s := sample{labels: map[string]string{}}
	i := strings.IndexAny(line, "{ ")
	if i <= 0 {
		return s, fmt.Errorf("no metric name")
	}
	s.name, line = line[:i], line[i:]
	if line[0] == '{' {
		line = line[1:]
		for line != "" && line[0] != '}' {
			eq := strings.Index(line, `="`)
			if eq <= 0 {
				return s, fmt.Errorf("bad label at %q", line)
			}
			name := line[:eq]
			line = line[eq+2:]
			var v strings.Builder
			closed := false
			for j := 0; j < len(line); j++ {
				c := line[j]
				if c == '\\' && j+1 < len(line) {
					j++
					switch line[j] {
					case 'n':
						v.WriteByte('\n')
					case '\\', '"':
						v.WriteByte(line[j])
					default:
						return s, fmt.Errorf("bad escape \\%c", line[j])
					}
					continue
				}
				if c == '"' {
					line = line[j+1:]
					closed = true
					break
				}
				v.WriteByte(c)
			}
			if !closed {
				return s, fmt.Errorf("unterminated label value")
			}
			if _, dup := s.labels[name]; dup {
				return s, fmt.Errorf("label %s twice", name)
			}
			s.labels[name] = v.String()
			line = strings.TrimPrefix(line, ",")
		}
		if line == "" {
			return s, fmt.Errorf("no closing brace")
		}
		line = line[1:]
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(line), 64)
	if err != nil {
		return s, err
	}
	s.value = v
	return s, nil
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
	g := &Gateway{cfg: cfg, identity: testIDA, metrics: newMetrics()}
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
		fl.openMetrics(g.metrics, g.outboundLabels(src, plan))
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

	// One still open: counted as opened, not closed, and in flows_open.
	open := &flowLog{direction: outbound}
	open.openMetrics(g.metrics, g.outboundLabels(stranger, toPeer))

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
	peer := with(service, "source_workload", "unknown", "destination_workload", "unknown", "destination_service", "unknown")
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

	open.emit(nil)
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
	var buf strings.Builder
	w := bufio.NewWriter(&buf)
	g.writeMetrics(w)
	w.Flush()
	samples := parseExposition(t, buf.String())
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

func TestMetricsLabelEscaping(t *testing.T) {
	l := tcpLabels{reporter: "source", sourceWorkload: "a\"b\\c\nd", responseFlags: "-"}
	s, err := parseSample("m{" + l.String() + "} 1")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.labels["source_workload"]; got != "a\"b\\c\nd" {
		t.Errorf("round trip of an escaped value: %q", got)
	}
	if len(s.labels) != 8 {
		t.Errorf("labels: %v, want the 8 of Istio's TCP metrics", s.labels)
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
