package gateway

import (
	"net/netip"
	"slices"
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

func TestRoute(t *testing.T) {
	r := NewRouter(testRouterConfig())
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
		{name: "IPv6 no match denied", dst: "[2001:db8::1]:80", kind: Deny},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := r.Route(netip.MustParseAddrPort(tt.dst))
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
