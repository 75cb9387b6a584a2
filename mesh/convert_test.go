package mesh

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/emptypb"
	"istio.io/istio/pkg/workloadapi"
	"istio.io/istio/pkg/workloadapi/security"

	"github.com/meshtun/meshtun/config"
)

func ip(s string) []byte { return netip.MustParseAddr(s).AsSlice() }

func wlAddr(w *workloadapi.Workload) *workloadapi.Address {
	return &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: w}}
}

func svcAddr(s *workloadapi.Service) *workloadapi.Address {
	return &workloadapi.Address{Type: &workloadapi.Address_Service{Service: s}}
}

var convNode = Node{Name: "vm-1", Namespace: "vm", ServiceAccount: "vm-sa", InstanceIPs: []netip.Addr{netip.MustParseAddr("10.0.0.9")}}

func ports(pairs ...uint32) *workloadapi.PortList {
	pl := &workloadapi.PortList{}
	for i := 0; i+1 < len(pairs); i += 2 {
		pl.Ports = append(pl.Ports, &workloadapi.Port{ServicePort: pairs[i], TargetPort: pairs[i+1]})
	}
	return pl
}

// meshSnapshot is a small mesh: this node's WorkloadEntry, two pods of
// service web (one with its own target port, one unhealthy), a TCP pod,
// a pod of another network, a waypoint service and its pod, and a service
// behind that waypoint.
func meshSnapshot() Snapshot {
	return Snapshot{
		AddressesReady: true, AuthorizationsReady: true, Generation: 3,
		Addresses: map[string]*workloadapi.Address{
			"self": wlAddr(&workloadapi.Workload{Uid: "self", Name: "vm-1", Namespace: "vm", ServiceAccount: "vm-sa",
				Addresses: [][]byte{ip("10.0.0.9")}, TunnelProtocol: workloadapi.TunnelProtocol_HBONE, Network: "net-1",
				AuthorizationPolicies: []string{"vm/selected"},
				WorkloadName:          "db-vm", WorkloadType: workloadapi.WorkloadType_POD, CanonicalName: "db", CanonicalRevision: "v2", ClusterId: "c1"}),
			"web-1": wlAddr(&workloadapi.Workload{Uid: "web-1", Name: "web-1", Namespace: "default", ServiceAccount: "web",
				Addresses: [][]byte{ip("10.1.0.1")}, TunnelProtocol: workloadapi.TunnelProtocol_HBONE, Network: "net-1", TrustDomain: "example.org",
				WorkloadName: "web", WorkloadType: workloadapi.WorkloadType_DEPLOYMENT, CanonicalName: "web app", CanonicalRevision: "v1", ClusterId: "c1",
				Services: map[string]*workloadapi.PortList{"default/web.default.svc.cluster.local": ports(80, 8081)}}),
			"web-2": wlAddr(&workloadapi.Workload{Uid: "web-2", Name: "web-2", Namespace: "default",
				Addresses: [][]byte{ip("10.1.0.2")}, TunnelProtocol: workloadapi.TunnelProtocol_HBONE, Network: "net-1",
				Services: map[string]*workloadapi.PortList{"default/web.default.svc.cluster.local": ports()}}),
			"web-3": wlAddr(&workloadapi.Workload{Uid: "web-3", Name: "web-3", Namespace: "default", Status: workloadapi.WorkloadStatus_UNHEALTHY,
				Addresses: [][]byte{ip("10.1.0.3")}, TunnelProtocol: workloadapi.TunnelProtocol_HBONE, Network: "net-1",
				Services: map[string]*workloadapi.PortList{"default/web.default.svc.cluster.local": ports()}}),
			"db": wlAddr(&workloadapi.Workload{Uid: "db", Name: "db", Namespace: "data", ServiceAccount: "db",
				Addresses: [][]byte{ip("10.2.0.1")}, Network: "net-1"}),
			"far": wlAddr(&workloadapi.Workload{Uid: "far", Name: "far", Namespace: "default",
				Addresses: [][]byte{ip("10.9.0.1")}, TunnelProtocol: workloadapi.TunnelProtocol_HBONE, Network: "net-2"}),
			"dns-only": wlAddr(&workloadapi.Workload{Uid: "dns-only", Name: "ext", Namespace: "default", Hostname: "ext.example.com"}),
			"wp-pod": wlAddr(&workloadapi.Workload{Uid: "wp-pod", Name: "waypoint-0", Namespace: "default", ServiceAccount: "waypoint",
				Addresses: [][]byte{ip("10.1.0.50")}, TunnelProtocol: workloadapi.TunnelProtocol_HBONE, Network: "net-1",
				Services: map[string]*workloadapi.PortList{"default/waypoint.default.svc.cluster.local": ports(15008, 15008)}}),
			"pinned": wlAddr(&workloadapi.Workload{Uid: "pinned", Name: "pinned", Namespace: "default",
				Addresses: [][]byte{ip("10.1.0.60")}, TunnelProtocol: workloadapi.TunnelProtocol_HBONE, Network: "net-1",
				Waypoint: &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Address{Address: &workloadapi.NetworkAddress{Network: "net-1", Address: ip("10.1.0.50")}}, HboneMtlsPort: 15008}}),
			"lost": wlAddr(&workloadapi.Workload{Uid: "lost", Name: "lost", Namespace: "default",
				Addresses: [][]byte{ip("10.1.0.61")}, TunnelProtocol: workloadapi.TunnelProtocol_HBONE, Network: "net-1",
				Waypoint: &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Hostname{Hostname: &workloadapi.NamespacedHostname{Namespace: "default", Hostname: "gone.default.svc.cluster.local"}}}}),
			"default/web.default.svc.cluster.local": svcAddr(&workloadapi.Service{Name: "web", Namespace: "default", Hostname: "web.default.svc.cluster.local",
				Addresses: []*workloadapi.NetworkAddress{{Network: "net-1", Address: ip("10.96.0.10")}, {Network: "net-2", Address: ip("10.200.0.10")}},
				Ports:     []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}, SubjectAltNames: []string{"spiffe://cluster.local/ns/default/sa/web-canary"}}),
			"default/waypoint.default.svc.cluster.local": svcAddr(&workloadapi.Service{Name: "waypoint", Namespace: "default", Hostname: "waypoint.default.svc.cluster.local",
				Addresses: []*workloadapi.NetworkAddress{{Network: "net-1", Address: ip("10.96.0.50")}}, Ports: []*workloadapi.Port{{ServicePort: 15008, TargetPort: 15008}}}),
			"default/api.default.svc.cluster.local": svcAddr(&workloadapi.Service{Name: "api", Namespace: "default", Hostname: "api.default.svc.cluster.local",
				Addresses: []*workloadapi.NetworkAddress{{Network: "net-1", Address: ip("10.96.0.20")}}, Ports: []*workloadapi.Port{{ServicePort: 443, TargetPort: 8443}},
				Waypoint: &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Hostname{Hostname: &workloadapi.NamespacedHostname{Namespace: "default", Hostname: "waypoint.default.svc.cluster.local"}}, HboneMtlsPort: 15008}}),
		},
		Authorizations: map[string]*security.Authorization{
			"global":   {Name: "global", Namespace: "istio-system", Scope: security.Scope_GLOBAL, Action: security.Action_DENY},
			"ours":     {Name: "ns-wide", Namespace: "vm", Scope: security.Scope_NAMESPACE},
			"theirs":   {Name: "ns-wide", Namespace: "default", Scope: security.Scope_NAMESPACE},
			"selected": {Name: "selected", Namespace: "vm", Scope: security.Scope_WORKLOAD_SELECTOR},
			"other":    {Name: "other", Namespace: "vm", Scope: security.Scope_WORKLOAD_SELECTOR},
			"dry":      {Name: "dry", Namespace: "vm", Scope: security.Scope_NAMESPACE, DryRun: true},
		},
	}
}

func find[T any](list []T, name func(T) string, want string) *T {
	for i := range list {
		if name(list[i]) == want {
			return &list[i]
		}
	}
	return nil
}

func TestConvertMesh(t *testing.T) {
	st := Convert(meshSnapshot(), convNode)
	if !st.Ready || st.Generation != 3 {
		t.Errorf("Ready, Generation = %v, %d", st.Ready, st.Generation)
	}
	if len(st.Rejections) != 0 {
		t.Errorf("Rejections = %v", st.Rejections)
	}
	if st.Self == nil || st.Self.Name != "vm-1" || st.Network != "net-1" {
		t.Fatalf("Self = %+v, Network %q", st.Self, st.Network)
	}
	if s := st.Self.Labels; s == nil || *s != (config.WorkloadLabels{WorkloadName: "db-vm", WorkloadKind: "pod", CanonicalService: "db", CanonicalRevision: "v2", Cluster: "c1"}) {
		t.Errorf("Self's description = %+v, want db-vm pod db v2 c1", s)
	}
	wname := func(w config.Workload) string { return w.Namespace + "/" + w.Name }
	// A value that is not a name is left unknown; the workload stays.
	if w := find(st.Workloads, wname, "default/web-1"); w == nil || w.Labels == nil || w.Labels.WorkloadName != "web" || w.Labels.WorkloadKind != "deployment" || w.Labels.CanonicalService != "" || w.Labels.CanonicalRevision != "v1" {
		t.Errorf("web-1's description = %+v, want web deployment, no canonical service (not a name), v1", w)
	}
	if w := find(st.Workloads, wname, "default/ext"); w != nil {
		t.Errorf("a hostname-only workload is kept: %+v", w)
	}
	for _, tc := range []struct {
		name, protocol, identity, network string
		hbone                             string
	}{
		{"default/web-1", "HBONE", "spiffe://example.org/ns/default/sa/web", "net-1", "10.1.0.1:15008"},
		{"default/web-2", "HBONE", "spiffe://cluster.local/ns/default/sa/default", "net-1", "10.1.0.2:15008"},
		{"data/db", "TCP", "spiffe://cluster.local/ns/data/sa/db", "net-1", ""},
		{"default/far", "HBONE", "spiffe://cluster.local/ns/default/sa/default", "net-2", "10.9.0.1:15008"},
	} {
		w := find(st.Workloads, wname, tc.name)
		if w == nil {
			t.Errorf("workload %s missing", tc.name)
			continue
		}
		hb := ""
		if w.HBONEAddress.IsValid() {
			hb = w.HBONEAddress.String()
		}
		if w.Protocol != tc.protocol || w.Identity != tc.identity || w.Network != tc.network || hb != tc.hbone || w.Source != config.SourceXDS {
			t.Errorf("workload %s = %+v", tc.name, w)
		}
	}
	if w := find(st.Workloads, wname, "default/pinned"); w == nil || w.Waypoint == nil ||
		!reflect.DeepEqual(w.Waypoint.Endpoints, []config.WaypointEndpoint{{Address: netip.MustParseAddrPort("10.1.0.50:15008"), Identity: "spiffe://cluster.local/ns/default/sa/waypoint"}}) {
		t.Errorf("workload with a waypoint by address: %+v", w)
	}
	if w := find(st.Workloads, wname, "default/lost"); w == nil || w.Waypoint == nil || w.Waypoint.Name != "default/gone.default.svc.cluster.local" || len(w.Waypoint.Endpoints) != 0 {
		t.Errorf("workload with an unknown waypoint: %+v", w)
	}

	sname := func(s config.Service) string { return s.Namespace + "/" + s.Name }
	web := find(st.Services, sname, "default/web")
	if web == nil {
		t.Fatal("service web missing")
	}
	if !reflect.DeepEqual(web.VIPs, []netip.Addr{netip.MustParseAddr("10.96.0.10")}) {
		t.Errorf("web VIPs = %v, want the net-1 one only", web.VIPs)
	}
	if !reflect.DeepEqual(web.Ports, map[uint16]uint16{80: 8080}) || web.Hostname != "web.default.svc.cluster.local" {
		t.Errorf("web = %+v", web)
	}
	if !reflect.DeepEqual(web.Endpoints, []string{"default/web-1", "default/web-2"}) {
		t.Errorf("web endpoints = %v (the unhealthy one must be left out)", web.Endpoints)
	}
	if !reflect.DeepEqual(web.EndpointPorts, map[string]map[uint16]uint16{"default/web-1": {80: 8081}}) {
		t.Errorf("web endpoint ports = %v", web.EndpointPorts)
	}
	api := find(st.Services, sname, "default/api")
	if api == nil || api.Waypoint == nil || api.Waypoint.Name != "default/waypoint.default.svc.cluster.local" ||
		!reflect.DeepEqual(api.Waypoint.Endpoints, []config.WaypointEndpoint{{Address: netip.MustParseAddrPort("10.1.0.50:15008"), Identity: "spiffe://cluster.local/ns/default/sa/waypoint"}}) {
		t.Errorf("service with a waypoint by hostname: %+v", api)
	}

	var got []string
	for _, p := range st.Policies {
		got = append(got, p.Name+"="+p.Action)
	}
	if want := []string{"istio-system/global=deny", "vm/ns-wide=allow", "vm/selected=allow"}; !reflect.DeepEqual(got, want) {
		t.Errorf("policies = %v, want %v (global, our namespace's, those selecting our workload; no dry run)", got, want)
	}
}

// Without our own workload, only global and namespace policies apply,
// and the network is the default one.
func TestConvertWithoutSelf(t *testing.T) {
	node := convNode
	node.InstanceIPs = []netip.Addr{netip.MustParseAddr("192.0.2.1")}
	st := Convert(meshSnapshot(), node)
	if st.Self != nil || st.Network != "" {
		t.Fatalf("Self = %+v, Network = %q", st.Self, st.Network)
	}
	for _, p := range st.Policies {
		if p.Name == "vm/selected" {
			t.Errorf("a workload-selector policy applies without our workload")
		}
	}
	// Our address alone is not enough: the identity must be ours too.
	node = convNode
	node.ServiceAccount = "other"
	if st := Convert(meshSnapshot(), node); st.Self != nil {
		t.Errorf("Self found with another service account: %+v", st.Self)
	}
}

func TestConvertClashes(t *testing.T) {
	snap := meshSnapshot()
	snap.Addresses["dup"] = wlAddr(&workloadapi.Workload{Uid: "dup", Name: "dup", Namespace: "default", Network: "net-1",
		Addresses: [][]byte{ip("10.1.0.1")}, TunnelProtocol: workloadapi.TunnelProtocol_HBONE})
	snap.Addresses["default/web2.default.svc.cluster.local"] = svcAddr(&workloadapi.Service{Name: "web2", Namespace: "default", Hostname: "web2.default.svc.cluster.local",
		Addresses: []*workloadapi.NetworkAddress{{Network: "net-1", Address: ip("10.96.0.10")}}, Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 80}}})
	// Another network may reuse an address: its workload is left out
	// without a rejection.
	snap.Addresses["overlap"] = wlAddr(&workloadapi.Workload{Uid: "overlap", Name: "a-overlap", Namespace: "default", Network: "net-2",
		Addresses: [][]byte{ip("10.1.0.2")}, TunnelProtocol: workloadapi.TunnelProtocol_HBONE})
	st := Convert(snap, convNode)
	if w := find(st.Workloads, func(w config.Workload) string { return w.Name }, "web-2"); w == nil || w.Network != "net-1" {
		t.Errorf("our network's workload at a reused address: %+v", w)
	}
	var names []string
	for _, r := range st.Rejections {
		names = append(names, r.Name)
		if !strings.Contains(r.Reason, "also") {
			t.Errorf("rejection %s: reason %q", r.Name, r.Reason)
		}
	}
	// The first by resource name stays: "dup" sorts before "web-1".
	if !reflect.DeepEqual(names, []string{"web-1", "default/web2.default.svc.cluster.local"}) {
		t.Errorf("rejected %v", names)
	}
}

func sm(kind, v string) *security.StringMatch {
	switch kind {
	case "exact":
		return &security.StringMatch{MatchType: &security.StringMatch_Exact{Exact: v}}
	case "prefix":
		return &security.StringMatch{MatchType: &security.StringMatch_Prefix{Prefix: v}}
	case "suffix":
		return &security.StringMatch{MatchType: &security.StringMatch_Suffix{Suffix: v}}
	}
	return &security.StringMatch{MatchType: &security.StringMatch_Presence{Presence: &emptypb.Empty{}}}
}

func policyOf(groups ...*security.Group) *security.Authorization {
	return &security.Authorization{Name: "p", Namespace: "ns", Action: security.Action_ALLOW, Groups: groups}
}

func group(rules ...[]*security.Match) *security.Group {
	g := &security.Group{}
	for _, r := range rules {
		g.Rules = append(g.Rules, &security.Rules{Matches: r})
	}
	return g
}

func TestConvertPolicy(t *testing.T) {
	pfx := func(s string) []*security.Address {
		p := netip.MustParsePrefix(s)
		return []*security.Address{{Address: p.Addr().AsSlice(), Length: uint32(p.Bits())}}
	}
	for _, tc := range []struct {
		name string
		in   *security.Authorization
		want []config.Rule
		err  string
	}{
		{name: "no groups: matches nothing", in: policyOf(), want: nil},
		{name: "a group without rules matches all", in: policyOf(group()), want: []config.Rule{{}}},
		{name: "a rule without matches holds", in: policyOf(group([]*security.Match{})), want: []config.Rule{{}}},
		{name: "an empty match never matches", in: policyOf(group([]*security.Match{{}})), want: nil},
		{name: "string matches", in: policyOf(group([]*security.Match{{
			Principals:    []*security.StringMatch{sm("exact", "cluster.local/ns/a/sa/b"), sm("prefix", "cluster.local/ns/a/"), sm("suffix", "/sa/b"), sm("presence", "")},
			NotNamespaces: []*security.StringMatch{sm("exact", "kube-system")},
		}})), want: []config.Rule{{Principals: []string{"cluster.local/ns/a/sa/b", "cluster.local/ns/a/*", "*/sa/b", "*"}, NotNamespaces: []string{"kube-system"}}}},
		{name: "addresses, ports and service accounts", in: policyOf(group([]*security.Match{{
			SourceIps: pfx("10.0.0.0/8"), NotDestinationIps: pfx("fd00::/64"), DestinationPorts: []uint32{80, 443}, NotDestinationPorts: []uint32{22},
			ServiceAccounts: []*security.ServiceAccountMatch{{Namespace: "a", ServiceAccount: "b"}}, NotServiceAccounts: []*security.ServiceAccountMatch{{Namespace: "c", ServiceAccount: "d"}},
		}})), want: []config.Rule{{SourceIPs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, NotDestinationIPs: []netip.Prefix{netip.MustParsePrefix("fd00::/64")},
			DestinationPorts: []uint16{80, 443}, NotDestinationPorts: []uint16{22}, Principals: []string{"*/ns/a/sa/b"}, NotPrincipals: []string{"*/ns/c/sa/d"}}}},
		{name: "distribution: (a or b) and (80 or c)", in: policyOf(group(
			[]*security.Match{{Namespaces: []*security.StringMatch{sm("exact", "a")}}, {Namespaces: []*security.StringMatch{sm("exact", "b")}}},
			[]*security.Match{{DestinationPorts: []uint32{80}}, {Namespaces: []*security.StringMatch{sm("prefix", "c")}}},
		)), want: []config.Rule{
			{Namespaces: []string{"a"}, DestinationPorts: []uint16{80}},
			{Namespaces: []string{"b"}, DestinationPorts: []uint16{80}},
			// a ∧ c*, b ∧ c*: no namespace is both, so no rule.
		}},
		{name: "intersections", in: policyOf(group(
			[]*security.Match{{Principals: []*security.StringMatch{sm("prefix", "td/ns/"), sm("exact", "x")}, SourceIps: pfx("10.0.0.0/8"), DestinationPorts: []uint32{1, 2}, NotSourceIps: pfx("10.9.0.0/16")}},
			[]*security.Match{{Principals: []*security.StringMatch{sm("prefix", "td/ns/a/")}, SourceIps: pfx("10.1.0.0/16"), DestinationPorts: []uint32{2, 3}, NotSourceIps: pfx("10.8.0.0/16")}},
		)), want: []config.Rule{{Principals: []string{"td/ns/a/*"}, SourceIPs: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}, DestinationPorts: []uint16{2},
			NotSourceIPs: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16"), netip.MustParsePrefix("10.8.0.0/16")}}}},
		{name: "prefix and suffix in one rule", in: policyOf(group(
			[]*security.Match{{Principals: []*security.StringMatch{sm("prefix", "td/")}}},
			[]*security.Match{{Principals: []*security.StringMatch{sm("suffix", "/sa/b")}}},
		)), err: "cannot say both"},
		{name: "an empty prefix matches every namespace, none too", in: policyOf(group([]*security.Match{{
			Namespaces: []*security.StringMatch{sm("prefix", ""), sm("exact", "a")}, DestinationPorts: []uint32{80}}})),
			want: []config.Rule{{DestinationPorts: []uint16{80}}}},
		{name: "an empty suffix in a not_ list matches nothing", in: policyOf(group([]*security.Match{{
			NotNamespaces: []*security.StringMatch{sm("suffix", "")}, DestinationPorts: []uint32{80}}})), want: nil},
		{name: "a star in an exact match", in: policyOf(group([]*security.Match{{Principals: []*security.StringMatch{sm("exact", "a*")}}})), err: "wildcard"},
		{name: "port out of range", in: policyOf(group([]*security.Match{{DestinationPorts: []uint32{70000}}})), err: "out of range"},
		{name: "prefix too long", in: policyOf(group([]*security.Match{{SourceIps: []*security.Address{{Address: ip("10.0.0.0"), Length: 33}}}})), err: "not a prefix"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := convertPolicy(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "ns/p") {
					t.Fatalf("err = %v, want one naming the policy and saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.Name != "ns/p" || p.Action != "allow" || !reflect.DeepEqual(p.Rules, tc.want) {
				t.Errorf("got %+v\nwant rules %+v", p, tc.want)
			}
		})
	}
}

func TestConvertPolicyBound(t *testing.T) {
	var rules [][]*security.Match
	for i := range 3 { // 8 × 8 × 8 = 512 terms, each a port, a source and a principal
		var ms []*security.Match
		for j := range 8 {
			switch i {
			case 0:
				ms = append(ms, &security.Match{DestinationPorts: []uint32{uint32(j + 1)}})
			case 1:
				ms = append(ms, &security.Match{SourceIps: []*security.Address{{Address: ip("10.0.0." + string(rune('1'+j))), Length: 32}}})
			case 2:
				ms = append(ms, &security.Match{Principals: []*security.StringMatch{sm("exact", "td/ns/a/sa/"+string(rune('a'+j)))}})
			}
		}
		rules = append(rules, ms)
	}
	_, err := convertPolicy(policyOf(group(rules...)))
	if err == nil || !strings.Contains(err.Error(), "more than 256 rules") {
		t.Fatalf("err = %v, want the bound", err)
	}
	// Two of them (64 terms) are within it.
	p, err := convertPolicy(policyOf(group(rules[:2]...)))
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Rules) != 64 || len(p.Rules[63].DestinationPorts) != 1 || len(p.Rules[63].SourceIPs) != 1 {
		t.Errorf("%d rules (last %+v), want 64 of a port and a source each", len(p.Rules), p.Rules[len(p.Rules)-1])
	}
	// Matches that cannot hold together leave no rule: ports 1 and 2.
	p, err = convertPolicy(policyOf(group([]*security.Match{{DestinationPorts: []uint32{1}}}, []*security.Match{{DestinationPorts: []uint32{2}}})))
	if err != nil || len(p.Rules) != 0 {
		t.Errorf("disjoint ports: %+v, %v; want no rule", p.Rules, err)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		msg  Resource
		err  string
	}{
		{"good workload", Resource{Message: wlAddr(&workloadapi.Workload{Name: "a", Namespace: "b", Addresses: [][]byte{ip("10.0.0.1")}})}, ""},
		{"bad address", Resource{Message: wlAddr(&workloadapi.Workload{Name: "a", Namespace: "b", Addresses: [][]byte{{1, 2, 3}}})}, "3 bytes"},
		{"legacy mTLS", Resource{Message: wlAddr(&workloadapi.Workload{Name: "a", Namespace: "b", TunnelProtocol: workloadapi.TunnelProtocol_LEGACY_ISTIO_MTLS})}, "not supported"},
		{"service port", Resource{Message: svcAddr(&workloadapi.Service{Namespace: "b", Hostname: "h", Ports: []*workloadapi.Port{{ServicePort: 0}}})}, "out of range"},
		{"service SAN", Resource{Message: svcAddr(&workloadapi.Service{Namespace: "b", Hostname: "h", SubjectAltNames: []string{"not a spiffe id"}})}, "subject_alt_names"},
		{"policy", Resource{Message: policyOf(group([]*security.Match{{DestinationPorts: []uint32{0}}}))}, "out of range"},
		{"unknown action", Resource{Message: &security.Authorization{Name: "p", Namespace: "ns", Action: 7}}, "not enforced"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(tc.msg)
			if tc.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("err = %v, want %q", err, tc.err)
			}
		})
	}
}

// A workload of another network gets that network's gateway, resolved
// as ztunnel's fetch_network_gateway: by address, the workload there; by
// hostname, the gateway service's endpoints in that network at its
// hbone_mtls_port, with its subject_alt_names. A workload of ours keeps
// none.
func TestConvertNetworkGateway(t *testing.T) {
	ewSvc := "istio-system/istio-eastwestgateway.istio-system.svc.cluster.local"
	byHost := &workloadapi.GatewayAddress{HboneMtlsPort: 15009, Destination: &workloadapi.GatewayAddress_Hostname{
		Hostname: &workloadapi.NamespacedHostname{Namespace: "istio-system", Hostname: "istio-eastwestgateway.istio-system.svc.cluster.local"}}}
	byAddr := &workloadapi.GatewayAddress{HboneMtlsPort: 15008, Destination: &workloadapi.GatewayAddress_Address{
		Address: &workloadapi.NetworkAddress{Network: "net-2", Address: ip("203.0.113.10")}}}
	snap := meshSnapshot()
	snap.Addresses["ew-pod"] = wlAddr(&workloadapi.Workload{Uid: "ew-pod", Name: "ew-1", Namespace: "istio-system", ServiceAccount: "istio-eastwestgateway",
		Addresses: [][]byte{ip("203.0.113.10")}, TunnelProtocol: workloadapi.TunnelProtocol_HBONE, Network: "net-2",
		Services: map[string]*workloadapi.PortList{ewSvc: ports(15008, 15008)}})
	snap.Addresses["ew-svc"] = svcAddr(&workloadapi.Service{Name: "istio-eastwestgateway", Namespace: "istio-system",
		Hostname: "istio-eastwestgateway.istio-system.svc.cluster.local", SubjectAltNames: []string{"spiffe://cluster.local/ns/istio-system/sa/ew-alt"},
		Ports: []*workloadapi.Port{{ServicePort: 15008, TargetPort: 15008}}})
	snap.Addresses["remote-h"] = wlAddr(&workloadapi.Workload{Uid: "remote-h", Name: "remote-h", Namespace: "default",
		Addresses: [][]byte{ip("10.9.0.5")}, TunnelProtocol: workloadapi.TunnelProtocol_HBONE, Network: "net-2", NetworkGateway: byHost})
	snap.Addresses["remote-a"] = wlAddr(&workloadapi.Workload{Uid: "remote-a", Name: "remote-a", Namespace: "default",
		Addresses: [][]byte{ip("10.9.0.6")}, TunnelProtocol: workloadapi.TunnelProtocol_HBONE, Network: "net-2", NetworkGateway: byAddr})
	snap.Addresses["ours"] = wlAddr(&workloadapi.Workload{Uid: "ours", Name: "ours", Namespace: "default",
		Addresses: [][]byte{ip("10.1.0.9")}, TunnelProtocol: workloadapi.TunnelProtocol_HBONE, Network: "net-1", NetworkGateway: byAddr})
	st := Convert(snap, convNode)
	wl := func(name string) *config.Workload {
		w := find(st.Workloads, func(w config.Workload) string { return w.Name }, name)
		if w == nil {
			t.Fatalf("workload %s missing", name)
		}
		return w
	}
	ewID := "spiffe://cluster.local/ns/istio-system/sa/istio-eastwestgateway"
	if got, want := wl("remote-h").NetworkGateway, (&config.Waypoint{Name: ewSvc,
		Endpoints:       []config.WaypointEndpoint{{Address: netip.MustParseAddrPort("203.0.113.10:15009"), Identity: ewID}},
		SubjectAltNames: []string{"spiffe://cluster.local/ns/istio-system/sa/ew-alt"}}); !reflect.DeepEqual(got, want) {
		t.Errorf("by hostname: NetworkGateway = %+v, want %+v", got, want)
	}
	if got, want := wl("remote-a").NetworkGateway, (&config.Waypoint{Name: "203.0.113.10",
		Endpoints: []config.WaypointEndpoint{{Address: netip.MustParseAddrPort("203.0.113.10:15008"), Identity: ewID}}}); !reflect.DeepEqual(got, want) {
		t.Errorf("by address: NetworkGateway = %+v, want %+v", got, want)
	}
	if got := wl("ours").NetworkGateway; got != nil {
		t.Errorf("a workload of our network got a network gateway: %+v", got)
	}
	// The gateway's pod goes away: its users are emitted again, without
	// instances (flows to them are then refused with the reason).
	tr := NewTracker(convNode)
	tr.Apply(Delta{Addresses: snap.Addresses, Authorizations: snap.Authorizations})
	ch := tr.Apply(Delta{RemovedAddresses: []string{"ew-pod"}})
	for _, res := range []string{"remote-h", "remote-a"} {
		w, ok := ch.Workloads[res]
		if !ok || w == nil || w.NetworkGateway == nil || len(w.NetworkGateway.Endpoints) != 0 {
			t.Errorf("after the gateway's pod left, %s: emitted %v, %+v; want it again with a gateway of no instance", res, ok, w)
		}
	}
}

// Node.Network (mesh.network, ztunnel's NETWORK) is this node's network
// whatever its own workload says, and with none at all.
func TestConvertConfiguredNetwork(t *testing.T) {
	node := convNode
	node.Network = "vm-net"
	st := Convert(meshSnapshot(), node)
	if st.Network != "vm-net" {
		t.Fatalf("Network = %q, want the configured vm-net", st.Network)
	}
	node.InstanceIPs = []netip.Addr{netip.MustParseAddr("192.0.2.1")} // no workload of ours
	if st := Convert(meshSnapshot(), node); st.Network != "vm-net" || st.Self != nil {
		t.Fatalf("without our workload: Network = %q, Self = %v; want vm-net, nil", st.Network, st.Self)
	}
}

// A service whose VIPs are all of another network (a multi-network
// istiod gives a cluster's services the cluster network's VIPs only) is
// addressed by them; one with a VIP in ours keeps only ours.
func TestConvertOtherNetworkVIPs(t *testing.T) {
	snap := meshSnapshot()
	snap.Addresses["only-far"] = svcAddr(&workloadapi.Service{Name: "far", Namespace: "default", Hostname: "far.default.svc.cluster.local",
		Addresses: []*workloadapi.NetworkAddress{{Network: "net-2", Address: ip("10.96.9.1")}},
		Ports:     []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}})
	snap.Addresses["both"] = svcAddr(&workloadapi.Service{Name: "both", Namespace: "default", Hostname: "both.default.svc.cluster.local",
		Addresses: []*workloadapi.NetworkAddress{{Network: "net-2", Address: ip("10.96.9.2")}, {Network: "net-1", Address: ip("10.96.9.3")}},
		Ports:     []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}})
	st := Convert(snap, convNode)
	for name, want := range map[string]string{"far": "10.96.9.1", "both": "10.96.9.3"} {
		s := find(st.Services, func(s config.Service) string { return s.Name }, name)
		if s == nil || len(s.VIPs) != 1 || s.VIPs[0] != netip.MustParseAddr(want) {
			t.Errorf("service %s: %+v, want the one VIP %s", name, s, want)
		}
	}
}

// An endpoint's own target ports are kept only where they route
// differently from the service's: the router takes a non-zero one over
// the service's, so the rest would cost memory and change nothing.
func TestEndpointPortsOnlyWhereTheyDiffer(t *testing.T) {
	snap := Snapshot{AddressesReady: true, AuthorizationsReady: true, Addresses: map[string]*workloadapi.Address{}}
	service := func(name, vip string, target uint32) {
		snap.Addresses[name] = svcAddr(&workloadapi.Service{Name: name, Namespace: "default", Hostname: name + ".default.svc.cluster.local",
			Addresses: []*workloadapi.NetworkAddress{{Address: ip(vip)}},
			Ports:     []*workloadapi.Port{{ServicePort: 80, TargetPort: target}, {ServicePort: 81, TargetPort: target}}})
	}
	service("fixed", "10.96.1.1", 8080) // 80 → 8080, 81 → 8080
	service("named", "10.96.1.2", 0)    // the endpoint's
	pod := func(name, addr, svc string, pl *workloadapi.PortList) {
		snap.Addresses[name] = wlAddr(&workloadapi.Workload{Uid: name, Name: name, Namespace: "default",
			Addresses: [][]byte{ip(addr)}, TunnelProtocol: workloadapi.TunnelProtocol_HBONE,
			Services: map[string]*workloadapi.PortList{"default/" + svc + ".default.svc.cluster.local": pl}})
	}
	pod("same", "10.1.0.1", "fixed", ports(80, 8080, 81, 8080))
	pod("zero", "10.1.0.2", "fixed", ports(80, 0))
	pod("one-differs", "10.1.0.3", "fixed", ports(80, 8080, 81, 9091))
	pod("own", "10.1.0.4", "named", ports(80, 9090, 81, 9091))
	st := Convert(snap, convNode)
	want := map[string]map[string]map[uint16]uint16{
		"fixed": {"default/one-differs": {80: 8080, 81: 9091}},
		"named": {"default/own": {80: 9090, 81: 9091}},
	}
	for name, ports := range want {
		s := find(st.Services, func(s config.Service) string { return s.Name }, name)
		if s == nil {
			t.Fatalf("service %s missing", name)
		}
		if !reflect.DeepEqual(s.EndpointPorts, ports) {
			t.Errorf("service %s: endpoint ports %v, want %v", name, s.EndpointPorts, ports)
		}
	}
	if s := find(st.Services, func(s config.Service) string { return s.Name }, "fixed"); !reflect.DeepEqual(s.Endpoints, []string{"default/one-differs", "default/same", "default/zero"}) {
		t.Errorf("service fixed: endpoints %v, want all three", s.Endpoints)
	}
}
