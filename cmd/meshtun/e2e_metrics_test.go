package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshtun/meshtun/hbone"
	"github.com/meshtun/meshtun/internal/topo"
	"github.com/meshtun/meshtun/internal/xfer"
)

// The metrics and admin endpoints of two real gateways: flows from node
// A's client workload to node B's server workload, one of them denied by
// node B's policy, then each node's /metrics scraped from inside its
// namespace. Both nodes know both workloads by name, so every label has a
// value to check.
const (
	metricsClient    = "10.244.1.5" // topo's node A workload address
	metricsServer    = "10.244.2.5" // topo's node B workload address
	metricsDenyPort  = 9090
	metricsWorkloads = `
[[workloads]]
name = "client"
namespace = "default"
service_account = "client"
addresses = ["10.244.1.5"]
hbone_address = "192.0.2.1:15008"
identity = "spiffe://cluster.local/ns/meshtun/sa/node-a"

[[workloads]]
name = "server"
namespace = "default"
service_account = "server"
addresses = ["10.244.2.5"]
hbone_address = "192.0.2.2:15008"
identity = "spiffe://cluster.local/ns/meshtun/sa/node-b"
`
	// Each node describes its own workload with the [gateway] keys of
	// examples/two-nodes; node A's description reaches node B in the
	// CONNECT's baggage.
	metricsNodeTarget  = "10.244.2.6" // in node B, served, no configured workload: node B's own
	metricsNodeBPolicy = `
[[policies]]
name = "no-9090"
action = "deny"
  [[policies.rules]]
  destination_ports = [9090]
`
)

// nodeHTTP is an HTTP client whose connections start inside node n.
func nodeHTTP(n *topo.Node) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return n.Dial(ctx, network, addr)
		},
	}}
}

func httpDo(t *testing.T, c *http.Client, method, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// promSample is one sample of a text exposition.
type promSample struct {
	name   string
	labels map[string]string
	value  float64
}

// parseProm reads the samples of a text exposition. Our label values
// carry no quotes or backslashes, so a plain split is enough here (the
// gateway's unit tests parse escapes).
func parseProm(text string) ([]promSample, error) {
	var out []promSample
	for _, line := range strings.Split(text, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		s := promSample{labels: map[string]string{}}
		rest := line
		if i := strings.IndexByte(line, '{'); i >= 0 {
			j := strings.LastIndexByte(line, '}')
			if j < i {
				return nil, fmt.Errorf("bad sample %q", line)
			}
			s.name, rest = line[:i], line[j+1:]
			for _, kv := range strings.Split(line[i+1:j], `",`) {
				k, v, ok := strings.Cut(kv, `="`)
				if !ok {
					return nil, fmt.Errorf("bad label %q in %q", kv, line)
				}
				s.labels[k] = strings.TrimSuffix(v, `"`)
			}
		} else {
			f := strings.Fields(line)
			if len(f) != 2 {
				return nil, fmt.Errorf("bad sample %q", line)
			}
			s.name, rest = f[0], f[1]
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		if err != nil {
			return nil, fmt.Errorf("bad value in %q: %w", line, err)
		}
		s.value = v
		out = append(out, s)
	}
	return out, nil
}

// promSum adds up the samples of name whose labels include want.
func promSum(samples []promSample, name string, want map[string]string) float64 {
	var sum float64
	for _, s := range samples {
		if s.name != name {
			continue
		}
		ok := true
		for k, v := range want {
			if s.labels[k] != v {
				ok = false
				break
			}
		}
		if ok {
			sum += s.value
		}
	}
	return sum
}

func scrapeNode(t *testing.T, n *topo.Node, path string) []promSample {
	t.Helper()
	code, body := httpDo(t, nodeHTTP(n), http.MethodGet, "http://127.0.0.1:15020"+path)
	if code != http.StatusOK {
		t.Fatalf("%s GET %s: %d %.200s", n.Name, path, code, body)
	}
	s, err := parseProm(body)
	if err != nil {
		t.Fatalf("%s %s: %v", n.Name, path, err)
	}
	return s
}

// labelsWith copies m with the given key/value pairs set.
func labelsWith(m map[string]string, kv ...string) map[string]string {
	out := make(map[string]string, len(m)+len(kv)/2)
	for k, v := range m {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

func TestEndToEndMetrics(t *testing.T) {
	bin, dir, tp := twoNodes(t, "mtmet", func(n, s string) string {
		s += metricsWorkloads
		if n == "node-b" {
			s += metricsNodeBPolicy
		}
		return s
	})
	if err := tp.B.IP("addr", "add", metricsNodeTarget+"/32", "dev", "lo"); err != nil {
		t.Fatal(err)
	}
	_, idA, err := hbone.LoadKeyPair(filepath.Join(dir, "node-a.pem"), filepath.Join(dir, "node-a-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	_, idB, err := hbone.LoadKeyPair(filepath.Join(dir, "node-b.pem"), filepath.Join(dir, "node-b-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	_, gwB := startGateways(t, tp, bin, dir)

	l, err := tp.B.Listen("tcp", metricsServer+":8080")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { xfer.Serve(l); close(served) }()
	t.Cleanup(func() { l.Close(); <-served })

	dial := func(addr string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var c net.Conn
		err := tp.A.Do(func() error {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: netip.MustParseAddr(metricsClient).AsSlice()}}
			var err error
			c, err = d.DialContext(ctx, "tcp", addr)
			return err
		})
		return c, err
	}

	// The transfers, and the bytes each moves on the wire: xfer sends an
	// 8-byte header before the payload and answers with a 32-byte hash
	// and an 8-byte length, the reply, and the reply's 32-byte hash.
	transfers := []struct{ up, down int64 }{{0, 0}, {1, 70000}, {1<<20 + 3, 12345}}
	var wantRequest, wantResponse int64
	for i, x := range transfers {
		c, err := dial(metricsServer + ":8080")
		if err != nil {
			t.Fatalf("transfer %d: dial: %v", i, err)
		}
		if _, err := xfer.Run(c, x.up, x.down); err != nil {
			t.Fatalf("transfer %d: %v", i, err)
		}
		wantRequest += 8 + x.up
		wantResponse += 32 + 8 + x.down + 32
	}
	// Denied by node B's policy: the client sees a RST.
	c, err := dial(fmt.Sprintf("%s:%d", metricsServer, metricsDenyPort))
	if c != nil {
		c.Close()
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial the denied port: %v, want connection refused", err)
	}
	flows := float64(len(transfers))

	common := map[string]string{
		"source_principal": idA, "destination_principal": idB,
		"source_workload": "client", "destination_workload": "server",
		"destination_service": "unknown", "connection_security_policy": "mutual_tls",
	}
	// The package counters that move with these flows: node A's netstack
	// captured every flow (the denied one answered with a RST) over the
	// pool's connection; node B's server accepted the clean flows' CONNECTs
	// and rejected the denied one's. Retransmitted SYNs of one flow are
	// one request, but a retried dial would be another: at least, there.
	type moved struct {
		metric string
		want   float64
		exact  bool
	}
	for _, side := range []struct {
		node     *topo.Node
		reporter string
		denyFlag string // the denied flow's response_flags on this side
		moved    []moved
	}{
		{tp.A, "source", "CONNECT", []moved{ // node A: the peer refused the CONNECT
			{"meshtun_netstack_requests_total", flows + 1, false},
			{"meshtun_netstack_forwarded_total", flows, false},
			{"meshtun_netstack_rejected_total", 1, false},
			{"meshtun_hbone_pool_connections_opened_total", 1, false},
			{"meshtun_hbone_pool_streams_opened_total", flows, true},
			{"meshtun_hbone_pool_streams_failed_total", 1, false},
			{"meshtun_hbone_server_streams_accepted_total", 0, true},
		}},
		{tp.B, "destination", "DENY", []moved{ // node B: its policy denied it
			{"meshtun_hbone_server_connections_accepted_total", 1, false},
			{"meshtun_hbone_server_streams_accepted_total", flows, true},
			{"meshtun_hbone_server_streams_rejected_total", 1, true},
			{"meshtun_netstack_requests_total", 0, true},
		}},
	} {
		t.Run(side.node.Name, func(t *testing.T) {
			ok := labelsWith(common, "reporter", side.reporter, "response_flags", "-")
			// A flow is counted closed once its relay has ended, a moment
			// after the client saw the end: poll, bounded.
			var samples []promSample
			deadline := time.Now().Add(10 * time.Second)
			for {
				samples = scrapeNode(t, side.node, "/metrics")
				closed := promSum(samples, "istio_tcp_connections_closed_total", map[string]string{"reporter": side.reporter})
				if closed >= flows+1 || time.Now().After(deadline) {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			for _, c := range []struct {
				what, metric string
				labels       map[string]string
				want         float64
			}{
				{"opened (the denied flow too, under -)", "istio_tcp_connections_opened_total", ok, flows + 1},
				{"closed cleanly", "istio_tcp_connections_closed_total", ok, flows},
				{"closed denied", "istio_tcp_connections_closed_total", labelsWith(ok, "response_flags", side.denyFlag), 1},
				{"request bytes", "istio_tcp_received_bytes_total", ok, float64(wantRequest)},
				{"response bytes", "istio_tcp_sent_bytes_total", ok, float64(wantResponse)},
				{"opened, all series", "istio_tcp_connections_opened_total", nil, flows + 1},
				{"closed, all series", "istio_tcp_connections_closed_total", nil, flows + 1},
				{"open now", "meshtun_flows_open", nil, 0},
			} {
				if got := promSum(samples, c.metric, c.labels); got != c.want {
					t.Errorf("%s: %s%v = %v, want %v", c.what, c.metric, c.labels, got, c.want)
				}
			}
			// Next to Istio's families: the packages' counters, moved by
			// the flows, and the process's own gauges.
			for _, m := range side.moved {
				got := promSum(samples, m.metric, nil)
				if m.exact && got != m.want || !m.exact && got < m.want {
					t.Errorf("%s = %v, want %s%v", m.metric, got, map[bool]string{true: "", false: "≥ "}[m.exact], m.want)
				}
			}
			names := map[string]bool{}
			for _, s := range samples {
				names[s.name] = true
			}
			for _, name := range []string{
				"meshtun_netstack_requests_total", "meshtun_netstack_forwarded_total", "meshtun_netstack_rejected_total",
				"meshtun_netstack_accept_failures_total", "meshtun_netstack_in_flight_drops_total", "meshtun_netstack_bad_checksums_total",
				"meshtun_hbone_pool_connections_opened_total", "meshtun_hbone_pool_connections_open", "meshtun_hbone_pool_streams_open",
				"meshtun_hbone_pool_dials_failed_total", "meshtun_hbone_pool_streams_opened_total", "meshtun_hbone_pool_streams_failed_total",
				"meshtun_hbone_server_handshake_failures_total", "meshtun_hbone_server_streams_refused_total",
				"meshtun_hbone_server_connections_accepted_total", "meshtun_hbone_server_streams_accepted_total",
				"meshtun_hbone_server_streams_rejected_total", "meshtun_hbone_server_connections_open", "meshtun_hbone_server_streams_open",
				"meshtun_relay_buffers_in_use", "meshtun_build_info",
				"go_goroutines", "go_memstats_heap_alloc_bytes", "process_resident_memory_bytes", "process_open_fds",
			} {
				if !names[name] {
					t.Errorf("no %s in the scrape", name)
				}
			}
			for name, least := range map[string]float64{
				"go_goroutines":                 1,
				"process_resident_memory_bytes": 1 << 20,
				"process_open_fds":              3,
				"meshtun_build_info":            1,
			} {
				if got := promSum(samples, name, nil); got < least {
					t.Errorf("%s = %v: not a running gateway's (want ≥ %v)", name, got, least)
				}
			}
			// The same exposition at Istio's sidecar path.
			again := scrapeNode(t, side.node, "/stats/prometheus")
			if got := promSum(again, "istio_tcp_connections_opened_total", ok); got != flows+1 {
				t.Errorf("/stats/prometheus: opened %v, want %v", got, flows+1)
			}
			if t.Failed() {
				for _, s := range samples {
					t.Logf("%s %v %v", s.name, s.labels, s.value)
				}
			}
		})
	}

	// A flow from node A itself (not from its client workload's address)
	// to an address of node B no workload is configured at: node A
	// describes itself as the source, in its labels and in the CONNECT's
	// baggage, which node B's labels read; node B is the destination.
	t.Run("baggage", func(t *testing.T) {
		l, err := tp.B.Listen("tcp", metricsNodeTarget+":8080")
		if err != nil {
			t.Fatal(err)
		}
		served := make(chan struct{})
		go func() { xfer.Serve(l); close(served) }()
		defer func() { l.Close(); <-served }()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var c net.Conn
		if err := tp.A.Do(func() error {
			var err error
			c, err = (&net.Dialer{}).DialContext(ctx, "tcp", metricsNodeTarget+":8080")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := xfer.Run(c, 100, 100); err != nil {
			t.Fatal(err)
		}
		source := map[string]string{
			"source_workload": "node-a", "source_workload_namespace": "demo", "source_canonical_service": "client",
			"source_canonical_revision": "v1", "source_cluster": "demo", "source_principal": idA,
		}
		unknownDst := map[string]string{
			"destination_workload": "unknown", "destination_workload_namespace": "unknown", "destination_canonical_service": "unknown",
			"destination_canonical_revision": "unknown", "destination_cluster": "unknown",
		}
		nodeB := map[string]string{
			"destination_workload": "node-b", "destination_workload_namespace": "demo", "destination_canonical_service": "node-b",
			"destination_canonical_revision": "latest", "destination_cluster": "demo", "destination_principal": idB,
		}
		for _, side := range []struct {
			node   *topo.Node
			labels map[string]string
		}{
			{tp.A, labelsWith(merged(source, unknownDst), "reporter", "source", "response_flags", "-")},
			{tp.B, labelsWith(merged(source, nodeB), "reporter", "destination", "response_flags", "-")},
		} {
			// Opened is counted before the CONNECT's answer: the transfer
			// that ended proves it.
			samples := scrapeNode(t, side.node, "/metrics")
			if got := promSum(samples, "istio_tcp_connections_opened_total", side.labels); got != 1 {
				t.Errorf("%s: istio_tcp_connections_opened_total%v = %v, want 1", side.node.Name, side.labels, got)
			}
			for _, s := range samples {
				if s.name == "istio_tcp_connections_opened_total" && s.labels["source_workload"] == "node-a" || t.Failed() && strings.HasPrefix(s.name, "istio_tcp_") {
					t.Logf("%s: %s%v %v", side.node.Name, s.name, s.labels, s.value)
				}
			}
		}
	})

	t.Run("config dump", func(t *testing.T) {
		code, body := httpDo(t, nodeHTTP(tp.A), http.MethodGet, "http://127.0.0.1:15000/config_dump")
		if code != http.StatusOK {
			t.Fatalf("GET /config_dump: %d %.200s", code, body)
		}
		var dump struct {
			Admin     map[string]any   `json:"admin"`
			TLS       map[string]any   `json:"tls"`
			Workloads []map[string]any `json:"workloads"`
		}
		if err := json.Unmarshal([]byte(body), &dump); err != nil {
			t.Fatalf("not JSON: %v\n%.300s", err, body)
		}
		if dump.Admin["metrics"] != "127.0.0.1:15020" || len(dump.Workloads) != 2 {
			t.Errorf("dump: admin %v, %d workloads", dump.Admin, len(dump.Workloads))
		}
		if key, _ := dump.TLS["key"].(string); filepath.Base(key) != "node-a-key.pem" {
			t.Errorf("tls.key in the dump: %v", dump.TLS["key"])
		}
		if strings.Contains(body, "PRIVATE KEY") {
			t.Error("the dump contains key material")
		}
	})

	t.Run("log level", func(t *testing.T) {
		admin := nodeHTTP(tp.B)
		const url = "http://127.0.0.1:15000/logging"
		if code, body := httpDo(t, admin, http.MethodGet, url); code != http.StatusOK || body != "level: info\n" {
			t.Fatalf("GET /logging: %d %q", code, body)
		}
		if code, body := httpDo(t, admin, http.MethodPost, url+"?level=nonsense"); code != http.StatusBadRequest {
			t.Errorf("POST ?level=nonsense: %d %q, want 400", code, body)
		}
		if code, body := httpDo(t, admin, http.MethodPost, url+"?level=warn"); code != http.StatusOK || body != "level: warn\n" {
			t.Fatalf("POST ?level=warn: %d %q", code, body)
		}
		// At warn, node B's clean flows write no INFO access-log line.
		// If the level did not change, the line of the flow below would
		// appear before the denied flow's WARN line, which is waited for.
		cleanLines := func() int {
			n := 0
			for _, l := range gwB.LogsContaining("connection complete") {
				if strings.Contains(l, "[INFO]") && strings.Contains(l, "dst.addr="+metricsServer+":8080") {
					n++
				}
			}
			return n
		}
		denied := func() int {
			return len(gwB.LogsContaining(fmt.Sprintf("dst.addr=%s:%d", metricsServer, metricsDenyPort)))
		}
		cleanBefore, deniedBefore := cleanLines(), denied()
		transfer := func() {
			c, err := dial(metricsServer + ":8080")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := xfer.Run(c, 10, 10); err != nil {
				t.Fatal(err)
			}
		}
		transfer()
		if c, err := dial(fmt.Sprintf("%s:%d", metricsServer, metricsDenyPort)); err == nil {
			c.Close()
			t.Fatal("the denied port accepted a connection")
		}
		waitCount(t, "node B's WARN line of the denied flow", denied, deniedBefore+1)
		if n := cleanLines(); n != cleanBefore {
			t.Errorf("at level warn node B wrote %d INFO access-log lines", n-cleanBefore)
		}

		if code, body := httpDo(t, admin, http.MethodPut, url+"?level=info"); code != http.StatusOK || body != "level: info\n" {
			t.Fatalf("PUT ?level=info: %d %q", code, body)
		}
		transfer()
		waitCount(t, "node B's INFO line at level info again", cleanLines, cleanBefore+1)
	})
}

// merged is the union of label sets (the later wins).
func merged(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// waitCount polls count until it reaches want, for at most 10 s.
func waitCount(t *testing.T, what string, count func() int, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for count() < want {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d, want %d", what, count(), want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
