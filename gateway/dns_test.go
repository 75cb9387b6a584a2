package gateway

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/miekg/dns"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/hbone/devca"
	"github.com/meshtun/meshtun/mesh"
)

// testUpstream is a resolver on loopback that answers example.org. A
// 192.0.2.80, TTL 1234.
func testUpstream(t *testing.T) netip.AddrPort {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg).SetReply(r)
		if r.Question[0].Name == "example.org." {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: "example.org.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 1234}, A: net.IPv4(192, 0, 2, 80)})
		} else {
			m.Rcode = dns.RcodeNameError
		}
		w.WriteMsg(m)
	})}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	done := make(chan struct{})
	go func() { defer close(done); srv.ActivateAndServe() }()
	<-started
	t.Cleanup(func() { srv.Shutdown(); <-done })
	return pc.LocalAddr().(*net.UDPAddr).AddrPort()
}

func lookupA(t *testing.T, server netip.AddrPort, name string) (int, []string) {
	t.Helper()
	r, _, err := (&dns.Client{Timeout: 20 * time.Second}).Exchange(new(dns.Msg).SetQuestion(dns.Fqdn(name), dns.TypeA), server.String())
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var out []string
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			out = append(out, fmt.Sprintf("%s %d", a.A, a.Hdr.Ttl))
		}
	}
	return r.Rcode, out
}

const dnsServices = `
[[services]]
name = "web"
namespace = "default"
hostname = "web.default.svc.cluster.local"
vips = ["10.96.0.10", "fd00:96::10"]
ports = { 80 = 8080 }
`

// The gateway's DNS server answers from the snapshot in force: a reload
// that adds a service, or changes dns.ttl, changes the next answer;
// other names go to dns.upstream; the counts are on /metrics.
func TestGatewayDNS(t *testing.T) {
	dir := t.TempDir()
	ca, _, err := devca.LoadOrCreate(dir, "cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := ca.WriteLeaf(dir, "node-a", "spiffe://cluster.local/ns/meshtun/sa/node-a"); err != nil {
		t.Fatal(err)
	}
	up := testUpstream(t)
	write := func(ttl, tail string) *config.Config {
		t.Helper()
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
metrics = ""
[dns]
enabled = true
listen = "127.0.0.1:53"
upstream = [%q]
ttl = %q
`, up, ttl) + tail
		path := filepath.Join(dir, "gateway.toml")
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg, err := config.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		cfg.TUN.Name = ""                                       // no device
		cfg.DNS.Listen = netip.MustParseAddrPort("127.0.0.1:0") // any free port
		return cfg
	}
	// admin listeners on port 0: found through a listener of our own.
	metricsLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := metricsLn.Addr().String()
	metricsLn.Close()
	cfg := write("30s", dnsServices)
	cfg.Admin.Metrics = metricsAddr
	g, err := New(cfg, hclog.New(&hclog.LoggerOptions{Output: testWriter{t}, Level: hclog.Debug}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
	select {
	case <-g.Ready():
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("not ready")
	}
	srv := g.metrics.dns.Load()
	if srv == nil {
		t.Fatal("no DNS server with dns.enabled")
	}
	addr := srv.Addr()

	if rc, a := lookupA(t, addr, "web.default.svc.cluster.local"); rc != dns.RcodeSuccess || !slices.Equal(a, []string{"10.96.0.10 30"}) {
		t.Errorf("web: %s %v, want 10.96.0.10 with TTL 30", dns.RcodeToString[rc], a)
	}
	if rc, _ := lookupA(t, addr, "api.default.svc.cluster.local"); rc != dns.RcodeNameError {
		t.Errorf("api before the reload: %s, want NXDOMAIN", dns.RcodeToString[rc])
	}
	if rc, a := lookupA(t, addr, "example.org"); rc != dns.RcodeSuccess || !slices.Equal(a, []string{"192.0.2.80 1234"}) {
		t.Errorf("example.org: %s %v, want the upstream's answer and TTL", dns.RcodeToString[rc], a)
	}

	next := write("7s", dnsServices+`
[[services]]
name = "api"
namespace = "default"
hostname = "api.default.svc.cluster.local"
vips = ["10.96.0.11"]
ports = { 80 = 8080 }
`)
	next.Admin.Metrics = metricsAddr
	changed, _, err := g.Reload(next)
	if err == nil && !strings.Contains(strings.Join(changed, ","), "dns.ttl") {
		err = fmt.Errorf("changed %v: no dns.ttl", changed)
	}
	if err != nil {
		t.Fatal(err)
	}
	if rc, a := lookupA(t, addr, "api.default.svc.cluster.local"); rc != dns.RcodeSuccess || !slices.Equal(a, []string{"10.96.0.11 7"}) {
		t.Errorf("api after the reload: %s %v, want 10.96.0.11 with TTL 7", dns.RcodeToString[rc], a)
	}

	// meshtun route by name: the plan of the VIP the name resolves to.
	ans, err := g.ExplainName("web.default", 80, 0)
	if err != nil || ans.Dst != netip.MustParseAddrPort("10.96.0.10:80") || ans.Name != "web.default" || ans.Service != "default/web" {
		t.Errorf("ExplainName(web.default:80) = %+v, %v; want the plan of 10.96.0.10:80, service default/web", ans, err)
	}
	if _, err := g.ExplainName("nope.default.svc.cluster.local", 80, 0); err == nil {
		t.Error("ExplainName of a name no service has: no error")
	}

	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`meshtun_dns_queries_total{result="answered"} 2`,
		`meshtun_dns_queries_total{result="nxdomain"} 1`,
		`meshtun_dns_queries_total{result="forwarded"} 1`,
		`meshtun_dns_queries_total{result="upstream_error"} 0`,
		`meshtun_dns_queries_total{result="ratelimited"} 0`,
		`meshtun_dns_queries_total{result="malformed"} 0`,
	} {
		if !strings.Contains(string(body), want+"\n") {
			t.Errorf("/metrics has no line %q", want)
		}
	}
}

func TestSplitNamePort(t *testing.T) {
	for _, tc := range []struct {
		in   string
		name string
		port uint16
		ok   bool
	}{
		{"web.default.svc.cluster.local:80", "web.default.svc.cluster.local", 80, true},
		{"web:8080", "web", 8080, true},
		{"10.96.0.10:80", "", 0, false},
		{"[fd00::1]:80", "", 0, false},
		{"web", "", 0, false},
		{"web:0", "", 0, false},
		{":80", "", 0, false},
	} {
		name, port, err := SplitNamePort(tc.in)
		if (err == nil) != tc.ok || name != tc.name || port != tc.port {
			t.Errorf("SplitNamePort(%q) = %q %d %v", tc.in, name, port, err)
		}
	}
}

// istiod's services are names too, at once after ApplyMesh; a
// mesh-namespace short name expands in this node's namespace only with
// the mesh on.
func TestZoneFollowsMesh(t *testing.T) {
	e := newReloadEnv(t, dnsServices+"\n[mesh]\nnamespace = \"default\"\n")
	if _, ok := e.g.snapshot().zone.Resolve("web"); ok {
		t.Error("with the mesh off, a one-label name was expanded in mesh.namespace")
	}
	if addrs, ok := e.g.snapshot().zone.Resolve("web.default.svc.cluster.local"); !ok || len(addrs) != 2 {
		t.Errorf("the file's service: %v %v", addrs, ok)
	}
	if _, ok := e.g.snapshot().zone.Resolve("db.data.svc.cluster.local"); ok {
		t.Fatal("a name of istiod's before its state")
	}
	e.g.ApplyMesh(mesh.State{Ready: true, Services: []config.Service{{
		Name: "db", Namespace: "data", Hostname: "db.data.svc.cluster.local", VIPs: []netip.Addr{netip.MustParseAddr("10.96.0.2")},
		Ports: map[uint16]uint16{5432: 5432}, Source: config.SourceXDS,
	}}})
	if addrs, ok := e.g.snapshot().zone.Resolve("db.data"); !ok || !slices.Equal(addrs, []netip.Addr{netip.MustParseAddr("10.96.0.2")}) {
		t.Errorf("istiod's service after ApplyMesh: %v %v, want 10.96.0.2", addrs, ok)
	}
	e.g.ApplyMesh(mesh.State{Ready: true})
	if _, ok := e.g.snapshot().zone.Resolve("db.data.svc.cluster.local"); ok {
		t.Error("istiod's service is still a name after it left the state")
	}
}
