package gateway

import (
	"bytes"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/hashicorp/go-hclog"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/hbone/devca"
	"github.com/meshtun/meshtun/mesh"
)

func adminServer(t *testing.T, cfg *config.Config, log hclog.Logger) *httptest.Server {
	t.Helper()
	g := &Gateway{cfg: cfg, log: log, metrics: newMetrics()}
	g.cur.Store(newSnapshot(cfg, nil))
	srv := httptest.NewServer(g.adminHandler())
	t.Cleanup(srv.Close)
	return srv
}

func do(t *testing.T, method, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// The dump uses gateway.toml's keys: written back as TOML without what it
// adds (sources, certificate, xds), it parses (strictly: an unknown key is
// an error) to the very config it came from.
func TestConfigDumpRoundTrip(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "config", "testdata", "gateway-example.toml"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	keyPath := filepath.Join(dir, "key.pem")
	const keyPEM = "-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n"
	if err := os.WriteFile(keyPath, []byte(keyPEM), 0o600); err != nil {
		t.Fatal(err)
	}
	data = bytes.Replace(data, []byte(`"/etc/meshtun/tls/key.pem"`), []byte(`"`+keyPath+`"`), 1)
	cfg, err := config.Parse(data, "gateway-example.toml")
	if err != nil {
		t.Fatal(err)
	}
	srv := adminServer(t, cfg, hclog.NewNullLogger())

	code, body := do(t, http.MethodGet, srv.URL+"/config_dump")
	if code != http.StatusOK {
		t.Fatalf("GET /config_dump: %d %s", code, body)
	}
	if strings.Contains(body, "PRIVATE KEY") || strings.Contains(body, "c2VjcmV0") {
		t.Fatalf("the dump contains key material:\n%s", body)
	}
	if !strings.Contains(body, keyPath) {
		t.Errorf("the dump lacks the key's path %s", keyPath)
	}

	dec := json.NewDecoder(strings.NewReader(body))
	dec.UseNumber()
	var tree map[string]any
	if err := dec.Decode(&tree); err != nil {
		t.Fatalf("the dump is not JSON: %v\n%s", err, body)
	}
	// What the dump adds to the file's keys, checked by TestConfigDumpState.
	delete(tree, "certificate")
	delete(tree, "xds")
	for _, list := range []string{"workloads", "services", "policies"} {
		entries, _ := tree[list].([]any)
		for _, e := range entries {
			delete(e.(map[string]any), "source")
		}
	}
	var out bytes.Buffer
	if err := toml.NewEncoder(&out).Encode(tomlTree(tree)); err != nil {
		t.Fatal(err)
	}
	back, err := config.Parse(out.Bytes(), "dump")
	if err != nil {
		t.Fatalf("the dump, written as TOML, does not parse: %v\n%s", err, out.String())
	}
	// Compared through the dump: the decoder gives an absent list as
	// nil, an empty one as [].
	if !reflect.DeepEqual(config.Dump(back), config.Dump(cfg)) {
		t.Errorf("the dump parses to another config:\n got %+v\nwant %+v", back, cfg)
	}
}

// tomlTree makes a decoded dump encodable as TOML: JSON numbers become
// integers, and empty strings (unset addresses) and nulls are left out,
// as an operator's file would leave them out.
func tomlTree(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range v {
			if s, ok := e.(string); (ok && s == "") || e == nil {
				continue
			}
			out[k] = tomlTree(e)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = tomlTree(e)
		}
		// A list of tables is an array of tables for the encoder.
		if len(out) > 0 {
			if _, ok := out[0].(map[string]any); ok {
				ts := make([]map[string]any, len(out))
				for i, e := range out {
					ts[i] = e.(map[string]any)
				}
				return ts
			}
		}
		return out
	case json.Number:
		n, err := v.Int64()
		if err != nil {
			return v.String()
		}
		return n
	}
	return v
}

func TestLogging(t *testing.T) {
	var out bytes.Buffer
	root := hclog.New(&hclog.LoggerOptions{Name: "meshtun", Level: hclog.Info, Output: &out})
	access := root.Named("access")
	srv := adminServer(t, config.Default(), root.Named("gateway"))

	if code, body := do(t, http.MethodGet, srv.URL+"/logging"); code != http.StatusOK || body != "level: info\n" {
		t.Fatalf("GET /logging: %d %q, want 200 \"level: info\"", code, body)
	}
	if access.IsDebug() {
		t.Fatal("debug enabled before the change")
	}
	for _, method := range []string{http.MethodPost, http.MethodPut} {
		if code, body := do(t, method, srv.URL+"/logging?level=debug"); code != http.StatusOK || body != "level: debug\n" {
			t.Fatalf("%s /logging?level=debug: %d %q", method, code, body)
		}
	}
	// Every logger of the process follows, not only the gateway's.
	if !root.IsDebug() || !access.IsDebug() {
		t.Error("after level=debug the root and the access logger are not at debug")
	}
	if !strings.Contains(out.String(), "log level changed") {
		t.Errorf("the change was not logged: %q", out.String())
	}
	if code, body := do(t, http.MethodGet, srv.URL+"/logging"); body != "level: debug\n" {
		t.Errorf("GET /logging after the change: %d %q", code, body)
	}

	for _, bad := range []string{"", "?level=", "?level=loud", "?level=off"} {
		code, body := do(t, http.MethodPost, srv.URL+"/logging"+bad)
		if code != http.StatusBadRequest || !strings.Contains(body, "trace, debug, info, warn, error") {
			t.Errorf("POST /logging%s: %d %q, want 400 naming the levels", bad, code, body)
		}
	}
	if code, _ := do(t, http.MethodDelete, srv.URL+"/logging"); code != http.StatusMethodNotAllowed {
		t.Errorf("DELETE /logging: %d, want 405", code)
	}
	if root.GetLevel() != hclog.Debug {
		t.Errorf("a refused change moved the level to %s", root.GetLevel())
	}
}

func TestAdminKeepsPprof(t *testing.T) {
	srv := adminServer(t, config.Default(), hclog.NewNullLogger())
	if code, body := do(t, http.MethodGet, srv.URL+"/debug/pprof/"); code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Errorf("GET /debug/pprof/: %d", code)
	}
}

// routeTOML has a workload, a service of two endpoints, a peer and
// capture routes that leave the peer's range out.
const routeTOML = `version = 1
[tls]
cert = "/etc/meshtun/tls/cert.pem"
key = "/etc/meshtun/tls/key.pem"
trust_bundle = "/etc/meshtun/tls/ca.pem"
[tun]
routes = ["10.244.2.0/24", "10.96.0.0/16"]

[[peers]]
name = "node-c"
cidrs = ["10.244.3.0/24"]
address = "192.0.2.3:15008"
identity = "spiffe://cluster.local/ns/meshtun/sa/node-c"

[[workloads]]
name = "web"
namespace = "default"
service_account = "web"
addresses = ["10.244.2.5"]

[[workloads]]
name = "web2"
namespace = "default"
service_account = "web"
addresses = ["10.244.2.6"]

[[services]]
name = "web"
namespace = "default"
hostname = "web.default.svc.cluster.local"
vips = ["10.96.0.10"]
ports = { 80 = 8080 }
endpoints = ["default/web", "default/web2"]
`

// GET /route answers the plan of the router in force as JSON, for every
// kind of destination, without moving the round robin of real flows.
func TestRouteEndpoint(t *testing.T) {
	cfg, err := config.Parse([]byte(routeTOML), "route.toml")
	if err != nil {
		t.Fatal(err)
	}
	g := &Gateway{cfg: cfg, log: hclog.NewNullLogger(), metrics: newMetrics()}
	g.cur.Store(newSnapshot(cfg, nil))
	srv := httptest.NewServer(g.adminHandler())
	t.Cleanup(srv.Close)

	tests := []struct {
		name, query string
		want        map[string]any // the answer's keys, all of them
	}{
		{"workload", "dst=10.244.2.5:9000", map[string]any{
			"destination": "10.244.2.5:9000", "kind": "hbone", "via": "workload default/web",
			"target": "10.244.2.5:9000", "hbone_address": "10.244.2.5:15008",
			"identities": []any{"spiffe://cluster.local/ns/default/sa/web"}, "captured": true}},
		{"service, second endpoint", "dst=10.96.0.10:80&endpoint=1", map[string]any{
			"destination": "10.96.0.10:80", "kind": "hbone", "via": "service default/web",
			"service": "default/web", "host": "web.default.svc.cluster.local",
			"endpoint": "default/web2", "endpoint_index": 1.0, "endpoints": 2.0,
			"target": "10.244.2.6:8080", "hbone_address": "10.244.2.6:15008",
			"identities": []any{"spiffe://cluster.local/ns/default/sa/web"}, "captured": true}},
		{"service, first endpoint by default", "dst=10.96.0.10:80", map[string]any{
			"destination": "10.96.0.10:80", "kind": "hbone", "via": "service default/web",
			"service": "default/web", "host": "web.default.svc.cluster.local",
			"endpoint": "default/web", "endpoint_index": 0.0, "endpoints": 2.0,
			"target": "10.244.2.5:8080", "hbone_address": "10.244.2.5:15008",
			"identities": []any{"spiffe://cluster.local/ns/default/sa/web"}, "captured": true}},
		{"peer, not captured", "dst=10.244.3.9:443", map[string]any{
			"destination": "10.244.3.9:443", "kind": "hbone", "via": "peer node-c",
			"target": "10.244.3.9:443", "hbone_address": "192.0.2.3:15008",
			"identities": []any{"spiffe://cluster.local/ns/meshtun/sa/node-c"}, "captured": false}},
		{"deny", "dst=10.244.2.99:80", map[string]any{
			"destination": "10.244.2.99:80", "kind": "deny",
			"reason": "no service, workload or peer route matches the destination", "captured": true}},
		{"deny, service port", "dst=10.96.0.10:81", map[string]any{
			"destination": "10.96.0.10:81", "kind": "deny", "via": "service default/web",
			"service": "default/web", "host": "web.default.svc.cluster.local",
			"reason": "service default/web has no port 81 (its ports: 80)", "captured": true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := http.Get(srv.URL + "/route?" + tt.query)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("GET /route?%s: %s %q\n%s", tt.query, resp.Status, resp.Header.Get("Content-Type"), body)
			}
			var got map[string]any
			if err := json.Unmarshal(body, &got); err != nil {
				t.Fatalf("not JSON: %v\n%s", err, body)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("GET /route?%s:\n got %v\nwant %v", tt.query, got, tt.want)
			}
			// The JSON is the plan: decoded, it is what the router says.
			var back RouteAnswer
			if err := json.Unmarshal(body, &back); err != nil {
				t.Fatal(err)
			}
			q, _ := url.ParseQuery(tt.query)
			n, _ := strconv.Atoi(q.Get("endpoint"))
			if direct := g.ExplainRoute(netip.MustParseAddrPort(q.Get("dst")), n); !reflect.DeepEqual(back, direct) {
				t.Errorf("decoded %+v\nthe router's %+v", back, direct)
			}
		})
	}
	if turn := turnOf(g.snapshot(), "default/web").Load(); turn != 0 {
		t.Errorf("asking moved the round robin to %d", turn)
	}

	for _, bad := range []struct{ query, want string }{
		{"", `dst "" is not IP:PORT`},
		{"dst=10.96.0.10", `dst "10.96.0.10" is not IP:PORT`},
		{"dst=web.default", "is not IP:PORT or NAME:PORT"},
		{"dst=10.96.0.10:0", "is not IP:PORT"},
		{"dst=10.96.0.10:80&endpoint=-1", `endpoint "-1"`},
		{"dst=10.96.0.10:80&endpoint=x", `endpoint "x"`},
	} {
		if code, body := do(t, http.MethodGet, srv.URL+"/route?"+bad.query); code != http.StatusBadRequest || !strings.Contains(body, bad.want) {
			t.Errorf("GET /route?%s: %d %q, want 400 with %q", bad.query, code, body, bad.want)
		}
	}
	// A service's name is resolved as the DNS server would; one no
	// service has is 404, saying so.
	code, body := do(t, http.MethodGet, srv.URL+"/route?dst=web.default:80")
	var byName RouteAnswer
	if err := json.Unmarshal([]byte(body), &byName); code != http.StatusOK || err != nil || byName.Name != "web.default" ||
		!reflect.DeepEqual(byName.Plan, g.ExplainRoute(netip.MustParseAddrPort("10.96.0.10:80"), 0).Plan) {
		t.Errorf("GET /route?dst=web.default:80: %d %q, want the plan of 10.96.0.10:80 named web.default", code, body)
	}
	if code, body := do(t, http.MethodGet, srv.URL+"/route?dst=nope.default.svc.cluster.local:80"); code != http.StatusNotFound || !strings.Contains(body, `no service in force has the hostname "nope.default.svc.cluster.local"`) {
		t.Errorf("GET /route for an unknown name: %d %q, want 404 naming it", code, body)
	}
	if code, _ := do(t, http.MethodPost, srv.URL+"/route?dst=10.96.0.10:80"); code != http.StatusMethodNotAllowed {
		t.Errorf("POST /route: %d, want 405", code)
	}
}

// A JSON answer of an unknown kind is refused, not read as a deny.
func TestRouteAnswerUnknownKind(t *testing.T) {
	var a RouteAnswer
	err := json.Unmarshal([]byte(`{"destination":"10.0.0.1:80","kind":"teleport"}`), &a)
	if err == nil || !strings.Contains(err.Error(), `kind "teleport"`) {
		t.Errorf("unmarshal of kind teleport: %v", err)
	}
}

// dumpOf GETs /config_dump and decodes it; the raw body comes too.
func dumpOf(t *testing.T, srv *httptest.Server) (map[string]any, string) {
	t.Helper()
	code, body := do(t, http.MethodGet, srv.URL+"/config_dump")
	if code != http.StatusOK {
		t.Fatalf("GET /config_dump: %d %s", code, body)
	}
	var tree map[string]any
	if err := json.Unmarshal([]byte(body), &tree); err != nil {
		t.Fatalf("the dump is not JSON: %v\n%s", err, body)
	}
	return tree, body
}

// The dump shows the state in force: each entry's source, the
// certificate (from the file, then from the mesh's CA) and the xDS
// stream, and never key material.
func TestConfigDumpState(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "config", "testdata", "gateway-example.toml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse(data, "gateway-example.toml")
	if err != nil {
		t.Fatal(err)
	}
	ca, err := devca.New("cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.Issue(testIDA)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	g := &Gateway{cfg: cfg, log: hclog.NewNullLogger(), metrics: newMetrics()}
	if err := g.installCertificate(&cert, nil); err != nil {
		t.Fatal(err)
	}
	g.cur.Store(newSnapshot(cfg, nil))
	srv := httptest.NewServer(g.adminHandler())
	t.Cleanup(srv.Close)
	block, _ := pem.Decode(keyPEM)
	keyBody := base64.StdEncoding.EncodeToString(block.Bytes)[:40]
	noKey := func(body string) {
		t.Helper()
		if strings.Contains(body, "PRIVATE KEY") || strings.Contains(body, keyBody) {
			t.Errorf("the dump holds key material:\n%s", body)
		}
	}

	tree, body := dumpOf(t, srv)
	noKey(body)
	for list, n := range map[string]int{"workloads": len(cfg.Workloads), "services": len(cfg.Services), "policies": len(cfg.Policies)} {
		entries, _ := tree[list].([]any)
		if n == 0 || len(entries) != n {
			t.Fatalf("%s: %d in the dump, %d in the config (the example must have some)", list, len(entries), n)
		}
		for i, e := range entries {
			if src := e.(map[string]any)["source"]; src != "file" {
				t.Errorf("%s[%d].source = %v, want file", list, i, src)
			}
		}
	}
	want := map[string]any{"source": "file", "identity": testIDA, "not_after": cert.Leaf.NotAfter.UTC().Format(time.RFC3339)}
	if got := tree["certificate"]; !reflect.DeepEqual(got, want) {
		t.Errorf("certificate from the file: %v, want %v", got, want)
	}
	if x, ok := tree["xds"]; ok {
		t.Errorf("xds section with the mesh off: %v", x)
	}

	// The mesh's clients, the CA's first request failed: its state, and
	// no expiry before a first certificate.
	cm, xc := failedMeshClients(t)
	g.metrics.ca.Store(cm)
	g.metrics.xds.Store(xc)
	tree, body = dumpOf(t, srv)
	noKey(body)
	c, _ := tree["certificate"].(map[string]any)
	caState, _ := c["ca"].(map[string]any)
	if c["source"] != "ca" || c["identity"] != "spiffe://cluster.local/ns/vm/sa/vm-sa" || caState == nil {
		t.Fatalf("certificate from the mesh: %v", c)
	}
	if _, ok := c["not_after"]; ok {
		t.Errorf("not_after before any certificate: %v", c)
	}
	stats := cm.Stats()
	if caState["renewals"] != 0.0 || caState["renewal_failures"] != 1.0 || caState["last_error"] != stats.LastError ||
		caState["last_error"] == "" || caState["next_attempt"] != stats.NextAttempt.UTC().Format(time.RFC3339Nano) ||
		caState["last_error_at"] != stats.LastErrorAt.UTC().Format(time.RFC3339Nano) {
		t.Errorf("ca state in the dump %v, the manager's %+v", caState, stats)
	}
	x, _ := tree["xds"].(map[string]any)
	types, _ := x["types"].(map[string]any)
	addr, _ := types["address"].(map[string]any)
	authz, _ := types["authorization"].(map[string]any)
	if x["node_id"] != xc.NodeID() || x["connected"] != false || addr["ready"] != false || authz["resources"] != 0.0 || len(types) != 2 {
		t.Errorf("xds section: %v (node id %s)", x, xc.NodeID())
	}
}

// A certificate from the mesh shows its expiry, and an entry's Source is
// the source shown (file when it has none).
func TestConfigDumpSourceAndExpiry(t *testing.T) {
	expiry := time.Date(2026, 12, 2, 3, 4, 5, 0, time.FixedZone("CET", 3600))
	b, err := json.Marshal(meshCertificate(mesh.CAStats{Identity: "spiffe://td/ns/vm/sa/a", Expiry: expiry}))
	if err != nil {
		t.Fatal(err)
	}
	if want := `"not_after":"2026-12-02T02:04:05Z"`; !strings.Contains(string(b), want) {
		t.Errorf("mesh certificate %s: want %s", b, want)
	}

	dumped := []any{map[string]any{"name": "a"}, map[string]any{"name": "b"}}
	tagSources(dumped, []config.Workload{{Name: "a", Source: config.SourceXDS}, {Name: "b"}},
		func(w *config.Workload) string { return w.Source })
	if dumped[0].(map[string]any)["source"] != "xds" || dumped[1].(map[string]any)["source"] != "file" {
		t.Errorf("tagged: %v", dumped)
	}
}

// A plan through a network gateway keeps both hops through /route's
// JSON, the form `meshtun route --admin` reads.
func TestRouteAnswerGatewayRoundTrip(t *testing.T) {
	r := NewRouter(meshCrossNetworkConfig())
	p := r.Route(netip.MustParseAddrPort("10.96.0.40:80"), func(string, int) int { return 0 })
	if p.Gateway == nil {
		t.Fatalf("plan %s has no gateway", p)
	}
	b, err := json.Marshal(RouteAnswer{Plan: p, Captured: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"authority":"cross.default.svc.cluster.local:80"`, `"gateway":{"name":"istio-system/istio-eastwestgateway.istio-system.svc.cluster.local","network":"net-2","address":"203.0.113.10:15008"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("JSON lacks %s: %s", want, b)
		}
	}
	var back RouteAnswer
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Plan.String() != p.String() || !reflect.DeepEqual(back.Plan.Gateway, p.Gateway) {
		t.Errorf("round trip:\n got %s\nwant %s", back.Plan, p)
	}
}
