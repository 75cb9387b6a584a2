package gateway

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"
	"istio.io/istio/pkg/workloadapi"
	"istio.io/istio/pkg/workloadapi/security"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/hbone"
	"github.com/meshtun/meshtun/hbone/devca"
	"github.com/meshtun/meshtun/mesh"
)

func meshDenyPort(name string, port uint16) config.Policy {
	return config.Policy{Name: name, Action: "deny", Source: config.SourceXDS, Rules: []config.Rule{{DestinationPorts: []uint16{port}}}}
}

// An xDS update goes through the reload's swap: an open inbound
// connection its new policy denies is closed, the others stay, new ones
// are refused; a later reload of the file keeps the mesh's entries.
func TestApplyMeshClosesDeniedOpenFlows(t *testing.T) {
	e := newReloadEnv(t, "")
	denied, kept := echo(t), echo(t)
	sd, sk := e.openEchoed(denied, kept)
	if st := e.g.MeshStats(); st.Ready || st.Updates != 0 {
		t.Fatalf("MeshStats before any update = %+v", st)
	}

	e.g.ApplyMesh(mesh.State{Ready: true, Policies: []config.Policy{meshDenyPort("ns/close-it", denied.Port())}})

	readErr := make(chan error, 1)
	go func() { _, err := io.ReadAll(sd); readErr <- err }()
	select {
	case err := <-readErr:
		t.Logf("denied flow ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the denied flow is still open 10s after the update")
	}
	if err := ping(sk, "after"); err != nil {
		t.Fatalf("the allowed flow after the update: %v", err)
	}
	refused := func(when string) {
		t.Helper()
		if s, err := e.connect(denied); err == nil {
			s.Close()
			t.Fatalf("%s: a new flow to the denied target was accepted", when)
		} else if !strings.Contains(err.Error(), "401") {
			t.Fatalf("%s: new flow to the denied target: %v, want a 401", when, err)
		}
	}
	refused("after the update")
	if st := e.g.MeshStats(); !st.Ready || st.Updates != 1 || st.Clashes != 0 || st.Rejected != 0 {
		t.Errorf("MeshStats = %+v", st)
	}
	select {
	case <-e.g.meshReady:
	default:
		t.Error("meshReady not closed by a complete state")
	}

	// A reload of the file merges again with the mesh's state.
	changed, _ := e.reload(denyPort("file-policy", 1))
	if !slices.Equal(changed, []string{"policies"}) {
		t.Fatalf("Reload changed %v", changed)
	}
	names := []string{}
	for _, p := range e.g.snapshot().cfg.Policies {
		names = append(names, p.Name+"/"+config.SourceOf(p.Source))
	}
	if !slices.Equal(names, []string{"file-policy/file", "ns/close-it/xds"}) {
		t.Errorf("policies in force after the reload: %v", names)
	}
	refused("after the reload")
	if err := ping(sk, "after the reload"); err != nil {
		t.Fatalf("the allowed flow after the reload: %v", err)
	}

	// The mesh drops its policy: the target is reachable again.
	e.g.ApplyMesh(mesh.State{Ready: true})
	s, err := e.connect(denied)
	if err != nil {
		t.Fatalf("after the mesh dropped its policy: %v", err)
	}
	defer s.Close()
	if err := ping(s, "again"); err != nil {
		t.Fatal(err)
	}
}

// On a clash the file's entry wins; the mesh's is dropped, logged once
// and counted. The node's own addresses join hbone.serve.
func TestApplyMeshFileWins(t *testing.T) {
	e := newReloadEnv(t, `
[[workloads]]
name = "web"
namespace = "default"
addresses = ["10.0.0.5"]

[[services]]
name = "web"
namespace = "default"
vips = ["10.96.0.1"]
ports = { 80 = 8080 }
endpoints = ["default/web"]
`+denyPort("ns/p", 9))
	ad := netip.MustParseAddr
	xw := func(name, addr string) config.Workload {
		return config.Workload{Name: name, Namespace: "mesh", ServiceAccount: name, Protocol: "HBONE", Source: config.SourceXDS, Network: "net-1",
			Addresses: []netip.Addr{ad(addr)}, HBONEAddress: netip.AddrPortFrom(ad(addr), 15008), Identity: "spiffe://cluster.local/ns/mesh/sa/" + name}
	}
	self := xw("node-b", "127.0.0.2")
	st := mesh.State{
		Ready:     true,
		Network:   "net-1",
		Self:      &self,
		Workloads: []config.Workload{xw("imposter", "10.0.0.5"), xw("db", "10.0.0.6"), self},
		Services: []config.Service{
			{Name: "shadow", Namespace: "mesh", VIPs: []netip.Addr{ad("10.96.0.1")}, Ports: map[uint16]uint16{80: 80}, Endpoints: []string{"mesh/db"}, Source: config.SourceXDS},
			{Name: "db", Namespace: "mesh", VIPs: []netip.Addr{ad("10.96.0.2")}, Ports: map[uint16]uint16{5432: 5432}, Endpoints: []string{"mesh/db"}, Source: config.SourceXDS},
		},
		Policies:   []config.Policy{meshDenyPort("ns/p", 1), meshDenyPort("ns/q", 2)},
		Rejections: []mesh.Rejection{{Name: "bad", Reason: "address of 3 bytes"}},
	}
	e.g.ApplyMesh(st)
	e.g.ApplyMesh(st) // the same problems are not logged twice

	if ms := e.g.MeshStats(); ms.Clashes != 3 || ms.Rejected != 1 || ms.Updates != 2 {
		t.Errorf("MeshStats = %+v, want 3 clashes and 1 rejection", ms)
	}
	r := e.g.Router()
	for dst, want := range map[string]string{
		"10.0.0.5:80":    "workload default/web",
		"10.0.0.6:80":    "workload mesh/db",
		"10.96.0.1:80":   "service default/web",
		"10.96.0.2:5432": "service mesh/db",
	} {
		if p := r.Route(netip.MustParseAddrPort(dst), nil); p.Via != want {
			t.Errorf("%s routed via %q, want %q (%s)", dst, p.Via, want, p)
		}
	}
	cfg := e.g.snapshot().cfg
	var pols []string
	for _, p := range cfg.Policies {
		pols = append(pols, p.Name+":"+config.SourceOf(p.Source))
	}
	if !slices.Equal(pols, []string{"ns/p:file", "ns/q:xds"}) {
		t.Errorf("policies in force: %v", pols)
	}
	if !slices.Contains(cfg.HBONE.Serve, netip.MustParsePrefix("127.0.0.2/32")) || cfg.Network != "net-1" {
		t.Errorf("serve %v, network %q: want the node's own address and network", cfg.HBONE.Serve, cfg.Network)
	}
	if !slices.Equal(e.g.file.HBONE.Serve, []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}) {
		t.Errorf("the file's config was changed: serve %v", e.g.file.HBONE.Serve)
	}
	for _, want := range []string{"workload mesh/imposter", "service mesh/shadow", "policy ns/p"} {
		if n := len(e.logs.lines(want)); n != 1 {
			t.Errorf("%d log lines about the clash of %s, want 1", n, want)
		}
	}
	if n := len(e.logs.lines("address of 3 bytes")); n != 1 {
		t.Errorf("%d log lines about the rejection, want 1", n)
	}
}

// From istiod's resources to a relayed flow: mesh.Convert's entries on
// both gateways. B's own workload (a WorkloadEntry at 127.0.0.2) widens
// what B serves; A reaches it through its waypoint (at B's HBONE port,
// the only way to name a loopback test port in the mesh's terms), with
// the original destination as :authority; a workload of another network
// is refused and counted.
func TestApplyMeshConvertedEndToEnd(t *testing.T) {
	e := newOutboundEnv(t, "")
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatalf("127.0.0.2 (all of 127.0.0.0/8 is loopback on Linux): %v", err)
	}
	ln.Close()
	target := echoOn(t, "127.0.0.2:0")

	ip := func(s string) []byte { return netip.MustParseAddr(s).AsSlice() }
	wl := func(w *workloadapi.Workload) *workloadapi.Address {
		return &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: w}}
	}
	snap := mesh.Snapshot{AddressesReady: true, AuthorizationsReady: true, Addresses: map[string]*workloadapi.Address{
		"vm-b": wl(&workloadapi.Workload{Name: "node-b", Namespace: "meshtun", ServiceAccount: "node-b", Addresses: [][]byte{ip("127.0.0.2")},
			TunnelProtocol: workloadapi.TunnelProtocol_HBONE,
			Waypoint: &workloadapi.GatewayAddress{HboneMtlsPort: uint32(e.addr.Port()),
				Destination: &workloadapi.GatewayAddress_Address{Address: &workloadapi.NetworkAddress{Address: ip("127.0.0.1")}}}}),
		"wp": wl(&workloadapi.Workload{Name: "waypoint", Namespace: "meshtun", ServiceAccount: "node-b", Addresses: [][]byte{ip("127.0.0.1")},
			TunnelProtocol: workloadapi.TunnelProtocol_HBONE}),
		"far": wl(&workloadapi.Workload{Name: "far", Namespace: "meshtun", Addresses: [][]byte{ip("127.0.0.3")},
			TunnelProtocol: workloadapi.TunnelProtocol_HBONE, Network: "net-2"}),
	}}
	nodeB := mesh.Node{Name: "node-b", Namespace: "meshtun", ServiceAccount: "node-b", InstanceIPs: []netip.Addr{netip.MustParseAddr("127.0.0.2")}}
	nodeA := mesh.Node{Name: "node-a", Namespace: "meshtun", ServiceAccount: "node-a", InstanceIPs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}}
	stB := mesh.Convert(snap, nodeB)
	if stB.Self == nil || len(stB.Rejections) != 0 {
		t.Fatalf("B's state: self %+v, rejections %v", stB.Self, stB.Rejections)
	}
	e.g.ApplyMesh(stB)
	e.a.ApplyMesh(mesh.Convert(snap, nodeA))

	p := e.a.Router().Route(target, nil)
	if p.Kind != HBONE || p.HBONEAddress != e.addr || p.Target != target || p.Waypoint != "127.0.0.1" || !slices.Equal(p.Identities, []string{reloadServerID}) {
		t.Fatalf("plan %s", p)
	}
	r := newFakeRequest(t, target)
	e.a.serveOutbound(r)
	if acc, rej := r.decisions(); acc != 1 || rej != 0 {
		t.Fatalf("%d accepts, %d rejects; want 1, 0", acc, rej)
	}
	r.app.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := r.app.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(r.app, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo %q, %v", buf, err)
	}
	r.app.Close()
	wantIn(t, accessLine(t, e.aLogs, target), "direction=outbound", "response_flags=-", "dst.hbone_addr="+e.addr.String())

	far := netip.MustParseAddrPort("127.0.0.3:80")
	rf := newFakeRequest(t, far)
	e.a.serveOutbound(rf)
	if acc, rej := rf.decisions(); acc != 0 || rej != 1 {
		t.Fatalf("to another network: %d accepts, %d rejects; want 0, 1", acc, rej)
	}
	wantIn(t, accessLine(t, e.aLogs, far), "response_flags=NO_ROUTE", `network \"net-2\"`)
	if n := e.a.MeshStats().OtherNetwork; n != 1 {
		t.Errorf("MeshStats.OtherNetwork = %d, want 1", n)
	}
}

// echoOn starts an echo server on addr and returns its address.
func echoOn(t *testing.T, addr string) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

func meshOnConfig() *config.Config {
	cfg := config.Default()
	cfg.Gateway.Name = "node-b"
	cfg.Mesh.XDSAddress = "istiod.istio-system.svc:15012"
	cfg.Mesh.Namespace, cfg.Mesh.ServiceAccount = "meshtun", "node-b"
	cfg.TLS = config.TLS{}
	cfg.TUN.Name = ""
	cfg.HBONE.Listen = "127.0.0.1:0"
	cfg.Admin = config.Admin{}
	return cfg
}

// With [mesh] on the gateway runs before the CA's first certificate:
// its listeners are up, HBONE handshakes fail cleanly (no certificate of
// ours), readiness says what it waits for; the certificate, once given,
// is used from the next handshake, and the gateway is ready once the
// xDS state is complete too.
func TestRunWaitsForMesh(t *testing.T) {
	ca, err := devca.New("cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.KeyPair(reloadServerID)
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.KeyPair("spiffe://cluster.local/ns/meshtun/sa/client")
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	log := hclog.New(&hclog.LoggerOptions{Output: io.MultiWriter(logs, testWriter{t}), Level: hclog.Info})
	cfg := meshOnConfig()
	// A port picked by the kernel and released: Run listens on it again.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hboneAddr := ln.Addr().String()
	ln.Close()
	cfg.HBONE.Listen = hboneAddr

	g, err := New(cfg, log)
	if err != nil {
		t.Fatalf("New with the mesh on and no certificate: %v", err)
	}
	if g.Identity() != reloadServerID {
		t.Errorf("Identity before any certificate = %q, want the config's %s", g.Identity(), reloadServerID)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for len(logs.lines("waiting for istiod")) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("Run did not say it waits for istiod")
		}
		time.Sleep(10 * time.Millisecond) // polling the log for a bounded time
	}
	readiness := func() (int, string) {
		t.Helper()
		rec := httptest.NewRecorder()
		g.readinessHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/healthz/ready", nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := readiness(); code != http.StatusServiceUnavailable ||
		!strings.Contains(body, "no certificate from Istio's CA yet") || !strings.Contains(body, "first complete xDS push") {
		t.Errorf("readiness before the certificate: %d %q", code, body)
	}
	handshake := func() error {
		t.Helper()
		conf := &tls.Config{Certificates: []tls.Certificate{client}, RootCAs: ca.Pool(), NextProtos: []string{"h2"},
			InsecureSkipVerify: true} // SPIFFE leaves have no DNS name; only whether a handshake completes matters here
		d := &net.Dialer{Timeout: 10 * time.Second}
		c, err := tls.DialWithDialer(d, "tcp", hboneAddr, conf)
		if err != nil {
			return err
		}
		return c.Close()
	}
	if err := handshake(); err == nil {
		t.Error("an HBONE handshake succeeded before the gateway had a certificate")
	}
	// The server logs after its side of the handshake has failed, which
	// may be after the client saw the alert: polled, bounded.
	for deadline := time.Now().Add(10 * time.Second); len(logs.lines("we hold no certificate")) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the refused handshake was not logged")
		}
	}

	other, err := ca.KeyPair("spiffe://cluster.local/ns/meshtun/sa/someone-else")
	if err != nil {
		t.Fatal(err)
	}
	if err := g.SetCertificate(other, ca.Pool()); err == nil {
		t.Error("SetCertificate took a certificate of another identity")
	}
	if err := g.SetCertificate(cert, ca.Pool()); err != nil {
		t.Fatal(err)
	}
	if err := handshake(); err != nil {
		t.Errorf("HBONE handshake after SetCertificate: %v", err)
	}
	if code, body := readiness(); code != http.StatusServiceUnavailable || strings.Contains(body, "certificate") || !strings.Contains(body, "xDS push") {
		t.Errorf("readiness with the certificate, before the xDS state: %d %q", code, body)
	}
	g.ApplyMesh(mesh.State{}) // not complete yet
	select {
	case <-g.Ready():
		t.Fatal("ready before a complete xDS state")
	default:
	}
	g.ApplyMesh(mesh.State{Ready: true})
	select {
	case <-g.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("not ready 10s after a complete xDS state")
	}
	if code, body := readiness(); code != http.StatusOK {
		t.Errorf("readiness when ready: %d %q", code, body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func TestSetCertificateTrustDomain(t *testing.T) {
	ca, err := devca.New("example.org")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.KeyPair("spiffe://example.org/ns/meshtun/sa/node-b")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewWithOptions(meshOnConfig(), nil, Options{Certificate: &cert, Roots: ca.Pool()}); err == nil || !strings.Contains(err.Error(), "trust_domain") {
		t.Fatalf("a certificate of another trust domain: %v", err)
	}
}

// istioMatches is ztunnel's rbac.rs reading of an Authorization, written
// over Istio's own message: the reference the converted policy must agree
// with.
func istioMatches(a *security.Authorization, c AuthzConn) bool {
	principal, ns := strings.TrimPrefix(c.Identity, "spiffe://"), ""
	if parts := strings.Split(principal, "/"); len(parts) == 5 && parts[1] == "ns" && parts[3] == "sa" {
		ns = parts[2]
	}
	str := func(m *security.StringMatch, v string) bool {
		switch x := m.GetMatchType().(type) {
		case *security.StringMatch_Exact:
			return v == x.Exact
		case *security.StringMatch_Prefix:
			return strings.HasPrefix(v, x.Prefix)
		case *security.StringMatch_Suffix:
			return strings.HasSuffix(v, x.Suffix)
		}
		return v != ""
	}
	field := func(pos, neg int, match func(i int, neg bool) bool) bool {
		any := func(n int, neg bool) bool {
			for i := range n {
				if match(i, neg) {
					return true
				}
			}
			return false
		}
		return (pos == 0 || any(pos, false)) && (neg == 0 || !any(neg, true))
	}
	pick := func(neg bool, a, b []*security.StringMatch) []*security.StringMatch {
		if neg {
			return b
		}
		return a
	}
	matchOne := func(m *security.Match) bool {
		if isEmptyIstioMatch(m) {
			return false
		}
		sa := func(s *security.ServiceAccountMatch) bool {
			return ns == s.GetNamespace() && strings.HasSuffix(principal, "/sa/"+s.GetServiceAccount())
		}
		ip := func(as []*security.Address, v netip.Addr) func(int, bool) bool {
			return func(i int, _ bool) bool {
				x, _ := netip.AddrFromSlice(as[i].GetAddress())
				p, _ := x.Prefix(int(as[i].GetLength()))
				return p.Contains(v)
			}
		}
		return field(len(m.GetPrincipals()), len(m.GetNotPrincipals()), func(i int, neg bool) bool {
			return str(pick(neg, m.GetPrincipals(), m.GetNotPrincipals())[i], principal)
		}) && field(len(m.GetNamespaces()), len(m.GetNotNamespaces()), func(i int, neg bool) bool {
			return str(pick(neg, m.GetNamespaces(), m.GetNotNamespaces())[i], ns)
		}) && field(len(m.GetServiceAccounts()), len(m.GetNotServiceAccounts()), func(i int, neg bool) bool {
			if neg {
				return sa(m.GetNotServiceAccounts()[i])
			}
			return sa(m.GetServiceAccounts()[i])
		}) && field(len(m.GetSourceIps()), 0, ip(m.GetSourceIps(), c.Src)) && field(0, len(m.GetNotSourceIps()), ip(m.GetNotSourceIps(), c.Src)) &&
			field(len(m.GetDestinationPorts()), len(m.GetNotDestinationPorts()), func(i int, neg bool) bool {
				if neg {
					return m.GetNotDestinationPorts()[i] == uint32(c.Dst.Port())
				}
				return m.GetDestinationPorts()[i] == uint32(c.Dst.Port())
			})
	}
	for _, g := range a.GetGroups() {
		all := true
		for _, r := range g.GetRules() {
			if len(r.GetMatches()) == 0 {
				continue
			}
			some := false
			for _, m := range r.GetMatches() {
				some = some || matchOne(m)
			}
			all = all && some
		}
		if all {
			return true
		}
	}
	return false
}

func isEmptyIstioMatch(m *security.Match) bool {
	return proto.Equal(m, &security.Match{})
}

// The expansion of Istio's AND-of-ORs into config's OR-of-ANDs decides as
// ztunnel does, connection by connection.
func TestConvertedPolicyDecidesAsIstio(t *testing.T) {
	exact := func(s string) *security.StringMatch {
		return &security.StringMatch{MatchType: &security.StringMatch_Exact{Exact: s}}
	}
	prefix := func(s string) *security.StringMatch {
		return &security.StringMatch{MatchType: &security.StringMatch_Prefix{Prefix: s}}
	}
	cidr := func(s string) []*security.Address {
		p := netip.MustParsePrefix(s)
		return []*security.Address{{Address: p.Addr().AsSlice(), Length: uint32(p.Bits())}}
	}
	rules := func(ms ...[]*security.Match) *security.Group {
		g := &security.Group{}
		for _, m := range ms {
			g.Rules = append(g.Rules, &security.Rules{Matches: m})
		}
		return g
	}
	policies := []*security.Authorization{
		{Name: "from-a-or-b-to-80-or-from-net", Namespace: "ns", Groups: []*security.Group{rules(
			[]*security.Match{{Namespaces: []*security.StringMatch{exact("a")}}, {ServiceAccounts: []*security.ServiceAccountMatch{{Namespace: "b", ServiceAccount: "web"}}}},
			[]*security.Match{{DestinationPorts: []uint32{80}}, {SourceIps: cidr("10.1.0.0/16"), NotSourceIps: cidr("10.1.2.0/24")}},
		)}},
		{Name: "prefixes-and-nots", Namespace: "ns", Groups: []*security.Group{rules(
			[]*security.Match{{Principals: []*security.StringMatch{prefix("cluster.local/ns/")}, NotPrincipals: []*security.StringMatch{exact("cluster.local/ns/a/sa/bad")}}},
			[]*security.Match{{Principals: []*security.StringMatch{prefix("cluster.local/ns/a/")}}, {NotDestinationPorts: []uint32{22}, Namespaces: []*security.StringMatch{exact("b")}}},
			[]*security.Match{},
		), rules([]*security.Match{{DestinationPorts: []uint32{9999}}})}},
		{Name: "any-namespace-even-none", Namespace: "ns", Groups: []*security.Group{rules(
			[]*security.Match{{Namespaces: []*security.StringMatch{prefix("")}, DestinationPorts: []uint32{443}}},
		)}},
	}
	var conns []AuthzConn
	for _, id := range []string{"spiffe://cluster.local/ns/a/sa/web", "spiffe://cluster.local/ns/a/sa/bad", "spiffe://cluster.local/ns/b/sa/web",
		"spiffe://cluster.local/ns/b/sa/db", "spiffe://cluster.local/ns/c/sa/web", "spiffe://other.td/ns/a/sa/web", "spiffe://cluster.local/no-namespace"} {
		for _, src := range []string{"10.1.0.1", "10.1.2.1", "10.2.0.1"} {
			for _, port := range []uint16{22, 80, 443, 9999} {
				conns = append(conns, AuthzConn{Identity: id, Src: netip.MustParseAddr(src), Dst: netip.AddrPortFrom(netip.MustParseAddr("10.0.0.1"), port)})
			}
		}
	}
	for _, a := range policies {
		st := mesh.Convert(mesh.Snapshot{Authorizations: map[string]*security.Authorization{a.Name: a}}, mesh.Node{Namespace: "ns"})
		if len(st.Policies) != 1 || len(st.Rejections) != 0 {
			t.Fatalf("%s: converted to %+v, rejections %v", a.Name, st.Policies, st.Rejections)
		}
		az := NewAuthorizer(st.Policies)
		allowed := 0
		for _, c := range conns {
			want := istioMatches(a, c)
			if got := az.Authorize(c).Allow; got != want {
				t.Errorf("%s: %+v allowed %v, ztunnel's reading says %v (rules %+v)", a.Name, c, got, want, st.Policies[0].Rules)
			}
			if want {
				allowed++
			}
		}
		if allowed == 0 || allowed == len(conns) {
			t.Errorf("%s: %d of %d allowed: the cases do not tell", a.Name, allowed, len(conns))
		}
	}
}

// With [mesh] on and no certificate yet, the gateway serves what the file
// gives that needs none: a flow to a protocol TCP workload is dialled
// directly and relayed, while one that needs HBONE (a peer of the file)
// gets a RST, logged with the reason, without any dial.
func TestOutboundBeforeMeshCertificate(t *testing.T) {
	target := echo(t)
	text := fmt.Sprintf(`version = 1
[gateway]
name = "node-a"
[hbone]
listen = ""
[mesh]
xds_address = "istiod.istio-system.svc:15012"
namespace = "meshtun"
service_account = "node-a"
[[workloads]]
name = "legacy"
namespace = "default"
addresses = [%q]
protocol = "TCP"
[[peers]]
name = "node-b"
cidrs = ["192.0.2.0/24"]
address = "127.0.0.1:15008"
identity = %q
`, target.Addr(), reloadServerID)
	cfg, err := config.Parse([]byte(text), "gateway-a.toml")
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	log := hclog.New(&hclog.LoggerOptions{Output: io.MultiWriter(logs, testWriter{t}), Level: hclog.Info})
	g, err := New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	opts := g.poolOptions()
	opts.Control = nil // the bypass mark needs CAP_NET_ADMIN, and there is no TUN to bypass
	if g.pool, err = hbone.NewPool(opts); err != nil {
		t.Fatal(err)
	}
	defer g.pool.Close()

	t.Run("TCP workload dialled directly", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root: a direct dial carries the bypass mark (SO_MARK needs CAP_NET_ADMIN)")
		}
		direct := newFakeRequest(t, target)
		g.serveOutbound(direct)
		if acc, rej := direct.decisions(); acc != 1 || rej != 0 {
			t.Fatalf("flow to the TCP workload: %d accepts, %d rejects; want 1, 0", acc, rej)
		}
		direct.app.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := direct.app.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		if err := direct.app.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		if back, err := io.ReadAll(direct.app); err != nil || string(back) != "ping" {
			t.Fatalf("flow to the TCP workload read %q, %v; want the echo and EOF", back, err)
		}
	})

	dst := netip.MustParseAddrPort("192.0.2.9:80")
	viaHBONE := newFakeRequest(t, dst)
	g.serveOutbound(viaHBONE)
	if acc, rej := viaHBONE.decisions(); acc != 0 || rej != 1 {
		t.Fatalf("flow needing HBONE: %d accepts, %d rejects; want 0, 1", acc, rej)
	}
	wantIn(t, accessLine(t, logs, dst), "[WARN]", "direction=outbound", "no certificate of ours in force")
	viaHBONE.app.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := viaHBONE.app.Read(make([]byte, 1)); err == nil || err == io.EOF {
		t.Errorf("app read after the refusal: %v, want a reset", err)
	}
	if st := g.pool.Stats(); st.DialsFailed == 0 {
		t.Errorf("pool stats %+v: the refused dial is not counted", st)
	}
	waitFlowsAtMost(t, &g.flows, outbound, 0)
}
