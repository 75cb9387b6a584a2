package gateway

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/meshtun/meshtun/config"
)

func testRouterConfig() *config.Config {
	cfg := config.Default()
	cfg.Gateway.TrustDomain = "cluster.local"
	cfg.Peers = []config.Peer{
		{Name: "wide", CIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, Address: netip.MustParseAddrPort("192.0.2.9:15008"), Identity: "spiffe://cluster.local/ns/meshtun/sa/wide"},
		{Name: "node-b", CIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24"), netip.MustParsePrefix("fd00:10:244:2::/64")}, Address: netip.MustParseAddrPort("192.0.2.2:15008"), Identity: "spiffe://cluster.local/ns/meshtun/sa/node-b"},
	}
	cfg.Workloads = []config.Workload{
		{Name: "web", Namespace: "default", ServiceAccount: "web", Protocol: "HBONE",
			Addresses: []netip.Addr{netip.MustParseAddr("10.244.2.5")}, HBONEAddress: netip.MustParseAddrPort("10.244.2.5:15008")},
		{Name: "legacy", Namespace: "default", ServiceAccount: "legacy", Protocol: "TCP",
			Addresses: []netip.Addr{netip.MustParseAddr("10.244.2.6")}, HBONEAddress: netip.MustParseAddrPort("10.244.2.6:15008")},
		{Name: "pinned", Namespace: "ops", ServiceAccount: "x", Protocol: "HBONE", Identity: "spiffe://cluster.local/ns/ops/sa/override",
			Addresses: []netip.Addr{netip.MustParseAddr("10.244.2.7")}, HBONEAddress: netip.MustParseAddrPort("192.0.2.2:15008")},
	}
	return cfg
}

// TestRoute: precedence service VIP:port > workload address > longest
// peer CIDR.
func TestRoute(t *testing.T) {
	r := NewRouter(testServiceConfig())
	tests := []struct {
		name      string
		dst       string
		kind      Kind
		hbone     string
		identity  string
		via       string
		wantAuthz string
	}{
		{name: "workload beats peer CIDR", dst: "10.244.2.5:8080", kind: HBONE, hbone: "10.244.2.5:15008",
			identity: "spiffe://cluster.local/ns/default/sa/web", via: "workload default/web", wantAuthz: "10.244.2.5:8080"},
		{name: "workload identity override", dst: "10.244.2.7:80", kind: HBONE, hbone: "192.0.2.2:15008",
			identity: "spiffe://cluster.local/ns/ops/sa/override", via: "workload ops/pinned", wantAuthz: "10.244.2.7:80"},
		{name: "longest peer CIDR", dst: "10.244.2.77:443", kind: HBONE, hbone: "192.0.2.2:15008",
			identity: "spiffe://cluster.local/ns/meshtun/sa/node-b", via: "peer node-b", wantAuthz: "10.244.2.77:443"},
		{name: "shorter peer CIDR", dst: "10.244.9.1:443", kind: HBONE, hbone: "192.0.2.9:15008",
			identity: "spiffe://cluster.local/ns/meshtun/sa/wide", via: "peer wide", wantAuthz: "10.244.9.1:443"},
		{name: "IPv6 peer CIDR", dst: "[fd00:10:244:2::5]:8080", kind: HBONE, hbone: "192.0.2.2:15008",
			identity: "spiffe://cluster.local/ns/meshtun/sa/node-b", via: "peer node-b", wantAuthz: "[fd00:10:244:2::5]:8080"},
		{name: "IPv4-mapped IPv6 is IPv4", dst: "[::ffff:10.244.2.5]:8080", kind: HBONE, hbone: "10.244.2.5:15008",
			identity: "spiffe://cluster.local/ns/default/sa/web", via: "workload default/web", wantAuthz: "10.244.2.5:8080"},
		{name: "TCP workload is direct", dst: "10.244.2.6:5432", kind: Direct, via: "workload default/legacy", wantAuthz: "10.244.2.6:5432"},
		{name: "no match denied", dst: "172.16.0.1:80", kind: Deny},
		{name: "service VIP beats workload and peer", dst: "10.244.2.100:80", kind: HBONE, hbone: "10.244.2.5:15008",
			identity: "spiffe://cluster.local/ns/default/sa/web", via: "service default/shadow", wantAuthz: "10.244.2.5:8080"},
		{name: "IPv6 no match denied", dst: "[2001:db8::1]:80", kind: Deny},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := r.Route(netip.MustParseAddrPort(tt.dst), nil)
			if p.Kind != tt.kind {
				t.Fatalf("kind = %v, want %v (plan %v)", p.Kind, tt.kind, p)
			}
			if tt.kind == Deny {
				if p.Reason == "" {
					t.Errorf("denied plan has no reason")
				}
				return
			}
			if p.Via != tt.via {
				t.Errorf("via = %q, want %q", p.Via, tt.via)
			}
			if got := p.Target.String(); got != tt.wantAuthz {
				t.Errorf("target = %s, want %s", got, tt.wantAuthz)
			}
			if tt.kind == HBONE {
				if got := p.HBONEAddress.String(); got != tt.hbone {
					t.Errorf("hbone address = %s, want %s", got, tt.hbone)
				}
				if !slices.Equal(p.Identities, []string{tt.identity}) {
					t.Errorf("identities = %v, want [%s]", p.Identities, tt.identity)
				}
			}
		})
	}
}

// testServiceConfig adds services to testRouterConfig: web with two HBONE
// endpoints (one of them dual-stack) and extra SANs, db with a TCP
// endpoint, empty with none, and shadow whose VIP is also a workload
// address inside a peer CIDR.
func testServiceConfig() *config.Config {
	cfg := testRouterConfig()
	cfg.Workloads = append(cfg.Workloads,
		config.Workload{Name: "web2", Namespace: "default", ServiceAccount: "web", Protocol: "HBONE",
			Addresses:    []netip.Addr{netip.MustParseAddr("fd00:10:244:2::8"), netip.MustParseAddr("10.244.2.8")},
			HBONEAddress: netip.MustParseAddrPort("192.0.2.2:15008")},
		config.Workload{Name: "shadowed", Namespace: "default", ServiceAccount: "x", Protocol: "HBONE",
			Addresses: []netip.Addr{netip.MustParseAddr("10.244.2.100")}, HBONEAddress: netip.MustParseAddrPort("192.0.2.9:15008")},
	)
	cfg.Services = []config.Service{
		{Name: "web", Namespace: "default", Hostname: "web.default.svc.cluster.local",
			VIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:96::10")}, Ports: map[uint16]uint16{80: 8080, 443: 8443},
			Endpoints:       []string{"default/web", "default/web2"},
			SubjectAltNames: []string{"spiffe://cluster.local/ns/default/sa/web-canary", "spiffe://cluster.local/ns/default/sa/web"}},
		{Name: "db", Namespace: "data", VIPs: []netip.Addr{netip.MustParseAddr("10.96.0.20")}, Ports: map[uint16]uint16{5432: 5432},
			Endpoints: []string{"default/legacy"}},
		{Name: "empty", Namespace: "default", VIPs: []netip.Addr{netip.MustParseAddr("10.96.0.30")}, Ports: map[uint16]uint16{80: 80}},
		{Name: "shadow", Namespace: "default", VIPs: []netip.Addr{netip.MustParseAddr("10.244.2.100")}, Ports: map[uint16]uint16{80: 8080},
			Endpoints: []string{"default/web"}},
	}
	return cfg
}

func TestRouteServices(t *testing.T) {
	r := NewRouter(testServiceConfig())
	webIDs := []string{"spiffe://cluster.local/ns/default/sa/web", "spiffe://cluster.local/ns/default/sa/web-canary"}
	tests := []struct {
		name       string
		dst        string
		pick       int // the endpoint index the Pick returns
		kind       Kind
		target     string
		hbone      string
		identities []string
		endpoint   string
		host       string
		reason     string // for Deny: a substring
	}{
		{name: "first endpoint", dst: "10.96.0.10:80", pick: 0, kind: HBONE, target: "10.244.2.5:8080", hbone: "10.244.2.5:15008",
			identities: webIDs, endpoint: "default/web", host: "web.default.svc.cluster.local"},
		{name: "second endpoint, IPv4 address of a dual-stack workload", dst: "10.96.0.10:80", pick: 1, kind: HBONE, target: "10.244.2.8:8080", hbone: "192.0.2.2:15008",
			identities: webIDs, endpoint: "default/web2", host: "web.default.svc.cluster.local"},
		{name: "pick reduced modulo n", dst: "10.96.0.10:443", pick: 3, kind: HBONE, target: "10.244.2.8:8443", hbone: "192.0.2.2:15008",
			identities: webIDs, endpoint: "default/web2", host: "web.default.svc.cluster.local"},
		{name: "negative pick reduced too", dst: "10.96.0.10:443", pick: -1, kind: HBONE, target: "10.244.2.8:8443", hbone: "192.0.2.2:15008",
			identities: webIDs, endpoint: "default/web2", host: "web.default.svc.cluster.local"},
		{name: "IPv6 VIP picks the IPv6 address", dst: "[fd00:96::10]:80", pick: 1, kind: HBONE, target: "[fd00:10:244:2::8]:8080", hbone: "192.0.2.2:15008",
			identities: webIDs, endpoint: "default/web2", host: "web.default.svc.cluster.local"},
		{name: "IPv6 VIP, endpoint without IPv6 uses its IPv4", dst: "[fd00:96::10]:80", pick: 0, kind: HBONE, target: "10.244.2.5:8080", hbone: "10.244.2.5:15008",
			identities: webIDs, endpoint: "default/web", host: "web.default.svc.cluster.local"},
		{name: "IPv4-mapped VIP", dst: "[::ffff:10.96.0.10]:80", pick: 0, kind: HBONE, target: "10.244.2.5:8080", hbone: "10.244.2.5:15008",
			identities: webIDs, endpoint: "default/web", host: "web.default.svc.cluster.local"},
		{name: "TCP endpoint is direct", dst: "10.96.0.20:5432", kind: Direct, target: "10.244.2.6:5432", endpoint: "default/legacy"},
		{name: "VIP port not in ports", dst: "10.96.0.10:81", kind: Deny, reason: "service default/web has no port 81 (its ports: 80, 443)"},
		{name: "VIP port not in ports, even inside a peer CIDR", dst: "10.244.2.100:81", kind: Deny, reason: "service default/shadow has no port 81"},
		{name: "no endpoints", dst: "10.96.0.30:80", kind: Deny, reason: "no endpoints"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var asked []string
			pick := func(service string, n int) int { asked = append(asked, service); return tt.pick }
			p := r.Route(netip.MustParseAddrPort(tt.dst), pick)
			if p.Kind != tt.kind {
				t.Fatalf("kind = %v, want %v (plan %v)", p.Kind, tt.kind, p)
			}
			if tt.kind == Deny {
				if !strings.Contains(p.Reason, tt.reason) {
					t.Errorf("reason %q does not contain %q", p.Reason, tt.reason)
				}
				return
			}
			if got := p.Target.String(); got != tt.target {
				t.Errorf("target = %s, want %s", got, tt.target)
			}
			if p.Endpoint != tt.endpoint || p.Host != tt.host {
				t.Errorf("endpoint, host = %q, %q; want %q, %q", p.Endpoint, p.Host, tt.endpoint, tt.host)
			}
			if tt.kind == HBONE {
				if got := p.HBONEAddress.String(); got != tt.hbone {
					t.Errorf("hbone address = %s, want %s", got, tt.hbone)
				}
				if !slices.Equal(p.Identities, tt.identities) {
					t.Errorf("identities = %v, want %v", p.Identities, tt.identities)
				}
			}
			if p.Endpoints > 1 && !slices.Equal(asked, []string{p.Service}) {
				t.Errorf("pick asked for %v, want once for %s", asked, p.Service)
			}
		})
	}
}

// A round-robin pick, as the gateway's, gives every endpoint its share.
func TestRouteServiceSpread(t *testing.T) {
	r := NewRouter(testServiceConfig())
	turn := 0
	pick := func(string, int) int { turn++; return turn - 1 }
	seen := map[string]int{}
	for range 10 {
		seen[r.Route(netip.MustParseAddrPort("10.96.0.10:80"), pick).Endpoint]++
	}
	if seen["default/web"] != 5 || seen["default/web2"] != 5 {
		t.Fatalf("endpoints chosen %v, want 5 each", seen)
	}
}

// Route is pure: the same inputs give the same plan, and the config's
// slices are not shared with plans (a caller appending to Identities must
// not change the next plan).
func TestRoutePure(t *testing.T) {
	r := NewRouter(testServiceConfig())
	dst := netip.MustParseAddrPort("10.96.0.10:80")
	a := r.Route(dst, nil)
	a.Identities = append(a.Identities[:1], "spiffe://evil/ns/x/sa/y")
	b := r.Route(dst, nil)
	if len(b.Identities) != 2 || b.Identities[1] != "spiffe://cluster.local/ns/default/sa/web-canary" {
		t.Fatalf("second plan's identities %v: changed by the first caller", b.Identities)
	}
}

// meshRouterConfig holds entries as mesh.Convert makes them: this node in
// net-1, a service whose endpoints have target ports of their own, a
// service and a workload behind waypoints, a workload of net-2.
func meshRouterConfig() *config.Config {
	cfg := config.Default()
	cfg.Network = "net-1"
	ap := netip.MustParseAddrPort
	ad := netip.MustParseAddr
	wp := &config.Waypoint{Name: "default/waypoint.default.svc.cluster.local",
		Endpoints:       []config.WaypointEndpoint{{Address: ap("10.1.0.50:15008"), Identity: "spiffe://cluster.local/ns/default/sa/waypoint"}, {Address: ap("10.1.0.51:15008"), Identity: "spiffe://cluster.local/ns/default/sa/waypoint"}},
		SubjectAltNames: []string{"spiffe://cluster.local/ns/default/sa/waypoint-alt"}}
	xw := func(name, addr, network string) config.Workload {
		return config.Workload{Name: name, Namespace: "default", ServiceAccount: name, Protocol: "HBONE", Source: config.SourceXDS, Network: network,
			Addresses: []netip.Addr{ad(addr)}, HBONEAddress: netip.AddrPortFrom(ad(addr), 15008), Identity: "spiffe://cluster.local/ns/default/sa/" + name}
	}
	cfg.Workloads = []config.Workload{
		xw("web-1", "10.1.0.1", "net-1"), xw("web-2", "10.1.0.2", "net-1"), xw("web-3", "10.1.0.3", "net-1"),
		xw("far", "10.9.0.1", "net-2"), xw("pinned", "10.1.0.60", "net-1"), xw("lost", "10.1.0.61", "net-1"),
		// A file workload has no network: it is ours.
		{Name: "local", Namespace: "default", ServiceAccount: "local", Protocol: "HBONE", Addresses: []netip.Addr{ad("10.1.0.70")}, HBONEAddress: ap("10.1.0.70:15008")},
	}
	cfg.Workloads[4].Waypoint = wp
	cfg.Workloads[5].Waypoint = &config.Waypoint{Name: "default/gone.default.svc.cluster.local"}
	cfg.Services = []config.Service{
		{Name: "web", Namespace: "default", Hostname: "web.default.svc.cluster.local", Source: config.SourceXDS,
			VIPs: []netip.Addr{ad("10.96.0.10")}, Ports: map[uint16]uint16{80: 8080, 81: 0},
			Endpoints:       []string{"default/web-1", "default/web-2", "default/web-3"},
			EndpointPorts:   map[string]map[uint16]uint16{"default/web-1": {80: 8081}, "default/web-3": {81: 9091}},
			SubjectAltNames: []string{"spiffe://cluster.local/ns/default/sa/web-canary"}},
		{Name: "api", Namespace: "default", Hostname: "api.default.svc.cluster.local", Source: config.SourceXDS,
			VIPs: []netip.Addr{ad("10.96.0.20")}, Ports: map[uint16]uint16{443: 8443}, Endpoints: []string{"default/web-1"}, Waypoint: wp},
		{Name: "remote", Namespace: "default", Hostname: "remote.default.svc.cluster.local", Source: config.SourceXDS,
			VIPs: []netip.Addr{ad("10.96.0.30")}, Ports: map[uint16]uint16{80: 80}, Endpoints: []string{"default/far"}},
	}
	return cfg
}

func TestRouteMesh(t *testing.T) {
	r := NewRouter(meshRouterConfig())
	fixed := func(i int) Pick { return func(string, int) int { return i } }
	for _, tc := range []struct {
		name       string
		dst        string
		pick       int
		want       string // Plan.String()
		network    string
		endpoints  int
		identities []string
	}{
		{name: "endpoint's own target port", dst: "10.96.0.10:80", pick: 0,
			want:       "10.96.0.10:80 via service default/web, endpoint default/web-1 (1 of 3): CONNECT 10.1.0.1:8081 at 10.1.0.1:15008, expecting spiffe://cluster.local/ns/default/sa/web-1 or spiffe://cluster.local/ns/default/sa/web-canary",
			endpoints:  3,
			identities: []string{"spiffe://cluster.local/ns/default/sa/web-1", "spiffe://cluster.local/ns/default/sa/web-canary"}},
		{name: "the service's target port", dst: "10.96.0.10:80", pick: 1,
			want:      "10.96.0.10:80 via service default/web, endpoint default/web-2 (2 of 3): CONNECT 10.1.0.2:8080 at 10.1.0.2:15008, expecting spiffe://cluster.local/ns/default/sa/web-2 or spiffe://cluster.local/ns/default/sa/web-canary",
			endpoints: 3},
		{name: "target port 0: only endpoints that name one", dst: "10.96.0.10:81", pick: 5,
			want:      "10.96.0.10:81 via service default/web, endpoint default/web-3 (1 of 1): CONNECT 10.1.0.3:9091 at 10.1.0.3:15008, expecting spiffe://cluster.local/ns/default/sa/web-3 or spiffe://cluster.local/ns/default/sa/web-canary",
			endpoints: 1},
		{name: "service waypoint: the VIP is the authority", dst: "10.96.0.20:443", pick: 1,
			want:       "10.96.0.20:443 via service default/api, waypoint default/waypoint.default.svc.cluster.local: CONNECT 10.96.0.20:443 at 10.1.0.51:15008, expecting spiffe://cluster.local/ns/default/sa/waypoint or spiffe://cluster.local/ns/default/sa/waypoint-alt",
			identities: []string{"spiffe://cluster.local/ns/default/sa/waypoint", "spiffe://cluster.local/ns/default/sa/waypoint-alt"}},
		{name: "workload waypoint", dst: "10.1.0.60:8080", pick: 0,
			want: "10.1.0.60:8080 via workload default/pinned, waypoint default/waypoint.default.svc.cluster.local: CONNECT 10.1.0.60:8080 at 10.1.0.50:15008, expecting spiffe://cluster.local/ns/default/sa/waypoint or spiffe://cluster.local/ns/default/sa/waypoint-alt"},
		{name: "unknown waypoint", dst: "10.1.0.61:8080",
			want: "10.1.0.61:8080: denied: workload default/lost: its waypoint default/gone.default.svc.cluster.local is not known (or has no instance)"},
		{name: "workload of another network", dst: "10.9.0.1:80", network: "net-2",
			want: `10.9.0.1:80: denied: workload default/far is in network "net-2", not this node's (net-1), which has no network gateway: crossing networks (double HBONE) needs one`},
		{name: "service with endpoints in another network only", dst: "10.96.0.30:80", network: "net-2",
			want: `10.96.0.30:80: denied: every endpoint of service default/remote is in network "net-2", not this node's (net-1), which has no network gateway: crossing networks (double HBONE) needs one`},
		{name: "a file workload is in our network", dst: "10.1.0.70:22",
			want: "10.1.0.70:22 via workload default/local: CONNECT 10.1.0.70:22 at 10.1.0.70:15008, expecting spiffe://cluster.local/ns/default/sa/local"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := r.Route(netip.MustParseAddrPort(tc.dst), fixed(tc.pick))
			if got := p.String(); got != tc.want {
				t.Errorf("plan\n got %s\nwant %s", got, tc.want)
			}
			if p.OtherNetwork != tc.network {
				t.Errorf("OtherNetwork = %q, want %q", p.OtherNetwork, tc.network)
			}
			if tc.endpoints != 0 && p.Endpoints != tc.endpoints {
				t.Errorf("Endpoints = %d, want %d", p.Endpoints, tc.endpoints)
			}
			if tc.identities != nil && !slices.Equal(p.Identities, tc.identities) {
				t.Errorf("Identities = %q, want %q", p.Identities, tc.identities)
			}
		})
	}
}

// meshCrossNetworkConfig is meshRouterConfig with net-2's gateway known
// to some of net-2's workloads: far-gw and the endpoint of service
// "cross", whose other endpoint is ours; lost-gw names a gateway istiod
// did not send; far-tcp speaks plain TCP.
func meshCrossNetworkConfig() *config.Config {
	cfg := meshRouterConfig()
	ap := netip.MustParseAddrPort
	ad := netip.MustParseAddr
	gw := &config.Waypoint{Name: "istio-system/istio-eastwestgateway.istio-system.svc.cluster.local",
		Endpoints: []config.WaypointEndpoint{
			{Address: ap("203.0.113.10:15008"), Identity: "spiffe://cluster.local/ns/istio-system/sa/istio-eastwestgateway"},
			{Address: ap("203.0.113.11:15008"), Identity: "spiffe://cluster.local/ns/istio-system/sa/istio-eastwestgateway"}},
		SubjectAltNames: []string{"spiffe://cluster.local/ns/istio-system/sa/ew-alt"}}
	xw := func(name, addr string) config.Workload {
		return config.Workload{Name: name, Namespace: "default", ServiceAccount: name, Protocol: "HBONE", Source: config.SourceXDS, Network: "net-2",
			Addresses: []netip.Addr{ad(addr)}, HBONEAddress: netip.AddrPortFrom(ad(addr), 15008), Identity: "spiffe://cluster.local/ns/default/sa/" + name,
			NetworkGateway: gw}
	}
	lost := xw("lost-gw", "10.9.0.3")
	lost.NetworkGateway = &config.Waypoint{Name: "198.51.100.1"}
	tcp := xw("far-tcp", "10.9.0.4")
	tcp.Protocol = "TCP"
	cfg.Workloads = append(cfg.Workloads, xw("far-gw", "10.9.0.2"), lost, tcp)
	cfg.Services = append(cfg.Services, config.Service{Name: "cross", Namespace: "default", Hostname: "cross.default.svc.cluster.local", Source: config.SourceXDS,
		VIPs: []netip.Addr{ad("10.96.0.40")}, Ports: map[uint16]uint16{80: 8080}, Endpoints: []string{"default/far-gw", "default/web-1"},
		SubjectAltNames: []string{"spiffe://cluster.local/ns/default/sa/cross"}})
	return cfg
}

func TestRouteCrossNetwork(t *testing.T) {
	r := NewRouter(meshCrossNetworkConfig())
	fixed := func(i int) Pick { return func(string, int) int { return i } }
	gwIDs := []string{"spiffe://cluster.local/ns/istio-system/sa/istio-eastwestgateway", "spiffe://cluster.local/ns/istio-system/sa/ew-alt"}
	for _, tc := range []struct {
		name      string
		dst       string
		pick      int
		want      string // Plan.String()
		network   string // Plan.OtherNetwork
		authority string
		gwAddr    string
		inner     []string
	}{
		{name: "service endpoint behind the gateway: hostname and service port both hops", dst: "10.96.0.40:80", pick: 0,
			want:      `10.96.0.40:80 via service default/cross, endpoint default/far-gw (1 of 2): double HBONE: outer CONNECT cross.default.svc.cluster.local:80 at network gateway istio-system/istio-eastwestgateway.istio-system.svc.cluster.local of network "net-2" (1 of 2) at 203.0.113.10:15008, expecting spiffe://cluster.local/ns/istio-system/sa/istio-eastwestgateway or spiffe://cluster.local/ns/istio-system/sa/ew-alt; inner CONNECT cross.default.svc.cluster.local:80 to 10.9.0.2:8080 (10.9.0.2:15008), expecting spiffe://cluster.local/ns/default/sa/far-gw or spiffe://cluster.local/ns/default/sa/cross`,
			authority: "cross.default.svc.cluster.local:80", gwAddr: "203.0.113.10:15008",
			inner: []string{"spiffe://cluster.local/ns/default/sa/far-gw", "spiffe://cluster.local/ns/default/sa/cross"}},
		{name: "the service's endpoint of our network stays direct", dst: "10.96.0.40:80", pick: 1,
			want: "10.96.0.40:80 via service default/cross, endpoint default/web-1 (2 of 2): CONNECT 10.1.0.1:8080 at 10.1.0.1:15008, expecting spiffe://cluster.local/ns/default/sa/web-1 or spiffe://cluster.local/ns/default/sa/cross"},
		{name: "workload by address: its ip:port both hops", dst: "10.9.0.2:9000", pick: 1,
			want:   `10.9.0.2:9000 via workload default/far-gw: double HBONE: outer CONNECT 10.9.0.2:9000 at network gateway istio-system/istio-eastwestgateway.istio-system.svc.cluster.local of network "net-2" (2 of 2) at 203.0.113.11:15008, expecting spiffe://cluster.local/ns/istio-system/sa/istio-eastwestgateway or spiffe://cluster.local/ns/istio-system/sa/ew-alt; inner CONNECT 10.9.0.2:9000 to 10.9.0.2:9000 (10.9.0.2:15008), expecting spiffe://cluster.local/ns/default/sa/far-gw`,
			gwAddr: "203.0.113.11:15008", inner: []string{"spiffe://cluster.local/ns/default/sa/far-gw"}},
		{name: "gateway named but not known", dst: "10.9.0.3:80", network: "net-2",
			want: `10.9.0.3:80: denied: workload default/lost-gw is in network "net-2", not this node's (net-1), whose network gateway 198.51.100.1 is not known (or has no instance): crossing networks (double HBONE) needs one`},
		{name: "a plain TCP workload cannot end the inner HBONE", dst: "10.9.0.4:80", network: "net-2",
			want: `10.9.0.4:80: denied: workload default/far-tcp is in network "net-2", not this node's (net-1), and speaks plain TCP: nothing behind network gateway istio-system/istio-eastwestgateway.istio-system.svc.cluster.local would end the inner HBONE: crossing networks (double HBONE) needs one`},
		{name: "no gateway: today's refusal", dst: "10.9.0.1:80", network: "net-2",
			want: `10.9.0.1:80: denied: workload default/far is in network "net-2", not this node's (net-1), which has no network gateway: crossing networks (double HBONE) needs one`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := r.Route(netip.MustParseAddrPort(tc.dst), fixed(tc.pick))
			if got := p.String(); got != tc.want {
				t.Errorf("plan\n got %s\nwant %s", got, tc.want)
			}
			if p.OtherNetwork != tc.network {
				t.Errorf("OtherNetwork = %q, want %q", p.OtherNetwork, tc.network)
			}
			if p.Authority != tc.authority {
				t.Errorf("Authority = %q, want %q", p.Authority, tc.authority)
			}
			if tc.gwAddr == "" {
				if p.Gateway != nil {
					t.Errorf("Gateway = %+v, want none", p.Gateway)
				}
				return
			}
			if p.Kind != HBONE || p.Gateway == nil || p.Gateway.Address.String() != tc.gwAddr || !slices.Equal(p.Gateway.Identities, gwIDs) {
				t.Fatalf("Kind %v Gateway %+v, want HBONE through %s expecting %v", p.Kind, p.Gateway, tc.gwAddr, gwIDs)
			}
			if !slices.Equal(p.Identities, tc.inner) {
				t.Errorf("inner Identities = %q, want %q", p.Identities, tc.inner)
			}
		})
	}
}

// The file form: a [[networks]] entry and a workload that names it are
// routed as the mesh's would be; a network the file does not declare is
// refused by Validate.
func TestRouteFileNetworks(t *testing.T) {
	text := `version = 1
[gateway]
name = "vm-1"
[tls]
cert = "c.pem"
key = "k.pem"
trust_bundle = "ca.pem"
[[networks]]
name = "cluster-net"
gateway = "203.0.113.10:15008"
identity = "spiffe://cluster.local/ns/istio-system/sa/istio-eastwestgateway"
[[workloads]]
name = "db"
namespace = "data"
addresses = ["10.244.7.5"]
network = "cluster-net"
[[workloads]]
name = "local"
namespace = "data"
addresses = ["10.0.0.5"]
[[services]]
name = "db"
namespace = "data"
hostname = "db.data.svc.cluster.local"
vips = ["10.96.7.1"]
ports = { 5432 = 5432 }
endpoints = ["data/db"]
`
	cfg, err := config.Parse([]byte(text), "networks.toml")
	if err != nil {
		t.Fatal(err)
	}
	a := ExplainConfig(cfg, netip.MustParseAddrPort("10.96.7.1:5432"), 0)
	want := `10.96.7.1:5432 via service data/db, endpoint data/db (1 of 1): double HBONE: outer CONNECT db.data.svc.cluster.local:5432 at network gateway 203.0.113.10:15008 of network "cluster-net" (1 of 1) at 203.0.113.10:15008, expecting spiffe://cluster.local/ns/istio-system/sa/istio-eastwestgateway; inner CONNECT db.data.svc.cluster.local:5432 to 10.244.7.5:5432 (10.244.7.5:15008), expecting spiffe://cluster.local/ns/data/sa/default`
	if got := a.Plan.String(); got != want {
		t.Errorf("plan\n got %s\nwant %s", got, want)
	}
	if p := ExplainConfig(cfg, netip.MustParseAddrPort("10.0.0.5:22"), 0); p.Gateway != nil || p.Kind != HBONE {
		t.Errorf("a workload without a network is ours: %s", p.Plan)
	}
	bad := strings.Replace(text, `network = "cluster-net"`, `network = "elsewhere"`, 1)
	if _, err := config.Parse([]byte(bad), "bad.toml"); err == nil || !strings.Contains(err.Error(), `network "elsewhere" is not declared`) {
		t.Errorf("Parse of a workload in an undeclared network = %v", err)
	}
}
