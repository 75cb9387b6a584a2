package gateway

import (
	"net/netip"
	"testing"

	"github.com/meshtun/meshtun/config"
)

// The namespace policies match is that of an Istio workload identity;
// any other identity has none.
func TestSubjectNamespace(t *testing.T) {
	tests := []struct{ id, want string }{
		{"spiffe://cluster.local/ns/default/sa/web", "default"},
		{"spiffe://td/ns/a-b/sa/x", "a-b"},
		{"cluster.local/ns/default/sa/web", ""}, // no scheme
		{"spiffe://cluster.local/ns/default", ""},
		{"spiffe://cluster.local/ns//sa/web", ""},
		{"spiffe://cluster.local/sa/web/ns/default", ""},
		{"spiffe://cluster.local/ns/default/sa/web/extra", ""},
		{"", ""},
	}
	for _, tt := range tests {
		if got := newAuthzSubject(AuthzConn{Identity: tt.id}).namespace; got != tt.want {
			t.Errorf("namespace of %q = %q, want %q", tt.id, got, tt.want)
		}
	}
}

func TestStringMatch(t *testing.T) {
	tests := []struct {
		pattern, value string
		want           bool
	}{
		{"foo", "foo", true},
		{"foo", "foobar", false},
		{"foo", "", false},
		{"foo*", "foobar", true},
		{"foo*", "foo", true},
		{"foo*", "barfoo", false},
		{"foo*", "", false},
		{"*foo", "barfoo", true},
		{"*foo", "foobar", false},
		{"*foo", "", false},
		{"*", "x", true},
		{"*", "", false}, // presence: not empty
	}
	for _, tt := range tests {
		m := compileMatches([]string{tt.pattern})[0]
		if got := m.match(tt.value); got != tt.want {
			t.Errorf("%q matches %q = %v, want %v", tt.pattern, tt.value, got, tt.want)
		}
	}
}

// The connections the table below is evaluated against.
var (
	connClient = AuthzConn{ // default/client on node A, to web's 8080
		Identity: "spiffe://cluster.local/ns/default/sa/client",
		Src:      netip.MustParseAddr("10.244.1.5"),
		Dst:      netip.MustParseAddrPort("10.244.2.5:8080"),
	}
	connOther = AuthzConn{ // prod/batch from elsewhere, to 9090 on another address
		Identity: "spiffe://cluster.local/ns/prod/sa/batch",
		Src:      netip.MustParseAddr("10.244.9.9"),
		Dst:      netip.MustParseAddrPort("10.244.2.6:9090"),
	}
	connOddID = AuthzConn{ // an identity not of the ns/sa shape
		Identity: "spiffe://cluster.local/gateway/node-a",
		Src:      netip.MustParseAddr("192.0.2.1"),
		Dst:      netip.MustParseAddrPort("10.244.2.5:8080"),
	}
)

func allowPolicy(name string, rules ...config.Rule) config.Policy {
	return config.Policy{Name: name, Action: "allow", Rules: rules}
}

func denyPolicy(name string, rules ...config.Rule) config.Policy {
	return config.Policy{Name: name, Action: "deny", Rules: rules}
}

func cidrs(s ...string) []netip.Prefix {
	var ps []netip.Prefix
	for _, c := range s {
		ps = append(ps, netip.MustParsePrefix(c))
	}
	return ps
}

// TestAuthorizeFields checks each match field, and its not_ form, inside
// one allow policy: allowed = the rule matched.
func TestAuthorizeFields(t *testing.T) {
	tests := []struct {
		name   string
		rule   config.Rule
		client bool // allowed for connClient
		other  bool // allowed for connOther
		oddID  bool // allowed for connOddID
	}{
		{"empty rule matches all", config.Rule{}, true, true, true},
		{"principal exact, no spiffe://", config.Rule{Principals: []string{"cluster.local/ns/default/sa/client"}}, true, false, false},
		{"principal with spiffe:// never matches", config.Rule{Principals: []string{"spiffe://cluster.local/ns/default/sa/client"}}, false, false, false},
		{"principal prefix", config.Rule{Principals: []string{"cluster.local/ns/default/*"}}, true, false, false},
		{"principal suffix", config.Rule{Principals: []string{"*/sa/batch"}}, false, true, false},
		{"principal presence", config.Rule{Principals: []string{"*"}}, true, true, true},
		{"principals OR'ed", config.Rule{Principals: []string{"cluster.local/ns/default/sa/client", "*/batch"}}, true, true, false},
		{"not_principals", config.Rule{NotPrincipals: []string{"cluster.local/ns/default/sa/client"}}, false, true, true},
		{"not_principals any entry excludes", config.Rule{NotPrincipals: []string{"nope", "*batch"}}, true, false, true},
		{"namespace exact", config.Rule{Namespaces: []string{"default"}}, true, false, false},
		{"namespace prefix", config.Rule{Namespaces: []string{"pro*"}}, false, true, false},
		{"namespace suffix", config.Rule{Namespaces: []string{"*ault"}}, true, false, false},
		{"namespace presence needs the ns/sa shape", config.Rule{Namespaces: []string{"*"}}, true, true, false},
		{"not_namespaces", config.Rule{NotNamespaces: []string{"default"}}, false, true, true},
		{"source_ips", config.Rule{SourceIPs: cidrs("10.244.1.0/24")}, true, false, false},
		{"source_ips OR'ed", config.Rule{SourceIPs: cidrs("10.244.1.0/24", "10.244.9.9/32")}, true, true, false},
		{"not_source_ips", config.Rule{NotSourceIPs: cidrs("10.244.1.0/24")}, false, true, true},
		{"source_ips IPv6 never matches IPv4", config.Rule{SourceIPs: cidrs("::/0")}, false, false, false},
		{"destination_ips", config.Rule{DestinationIPs: cidrs("10.244.2.5/32")}, true, false, true},
		{"not_destination_ips", config.Rule{NotDestinationIPs: cidrs("10.244.2.5/32")}, false, true, false},
		{"destination_ports is the target port", config.Rule{DestinationPorts: []uint16{8080}}, true, false, true},
		{"destination_ports 15008 matches nothing", config.Rule{DestinationPorts: []uint16{15008}}, false, false, false},
		{"not_destination_ports", config.Rule{NotDestinationPorts: []uint16{8080}}, false, true, false},
		{"fields AND'ed", config.Rule{Namespaces: []string{"default"}, DestinationPorts: []uint16{9090}}, false, false, false},
		{"fields AND'ed, all match", config.Rule{Principals: []string{"*/sa/client"}, SourceIPs: cidrs("10.244.1.0/24"), DestinationIPs: cidrs("10.244.2.0/24"), DestinationPorts: []uint16{8080}}, true, false, false},
		{"positive and not_ of one field", config.Rule{Namespaces: []string{"*"}, NotNamespaces: []string{"prod"}}, true, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := NewAuthorizer([]config.Policy{allowPolicy("p", tt.rule)})
			for _, c := range []struct {
				name string
				conn AuthzConn
				want bool
			}{{"client", connClient, tt.client}, {"other", connOther, tt.other}, {"odd identity", connOddID, tt.oddID}} {
				d := a.Authorize(c.conn)
				if d.Allow != c.want {
					t.Errorf("%s: allow = %v, want %v (%s)", c.name, d.Allow, c.want, d.Reason)
				}
				if d.Allow && d.Policy != "p" {
					t.Errorf("%s: allowed by %q, want p", c.name, d.Policy)
				}
			}
		})
	}
}

// TestAuthorizeOrder checks ztunnel's evaluation order over policy sets.
func TestAuthorizeOrder(t *testing.T) {
	client := config.Rule{Principals: []string{"cluster.local/ns/default/sa/client"}}
	port8080 := config.Rule{DestinationPorts: []uint16{8080}}
	tests := []struct {
		name       string
		policies   []config.Policy
		client     bool
		other      bool
		wantPolicy string // for connClient
	}{
		{name: "no policies allow", client: true, other: true},
		{name: "only a non-matching deny allows", policies: []config.Policy{denyPolicy("d", config.Rule{Namespaces: []string{"kube-system"}})}, client: true, other: true},
		{name: "matching deny denies", policies: []config.Policy{denyPolicy("d", port8080)}, client: false, other: true, wantPolicy: "d"},
		{name: "deny beats a matching allow", policies: []config.Policy{allowPolicy("a", client), denyPolicy("d", client)}, client: false, other: false, wantPolicy: "d"},
		{name: "an allow policy turns on default deny", policies: []config.Policy{allowPolicy("a", client)}, client: true, other: false, wantPolicy: "a"},
		{name: "allow policies OR'ed", policies: []config.Policy{allowPolicy("a", client), allowPolicy("b", config.Rule{Namespaces: []string{"prod"}})}, client: true, other: true, wantPolicy: "a"},
		{name: "rules OR'ed", policies: []config.Policy{allowPolicy("a", client, config.Rule{DestinationPorts: []uint16{9090}})}, client: true, other: true, wantPolicy: "a"},
		{name: "allow without rules allows nothing", policies: []config.Policy{allowPolicy("a")}, client: false, other: false},
		{name: "deny without rules denies nothing", policies: []config.Policy{denyPolicy("d")}, client: true, other: true},
		{name: "deny with an empty rule denies all", policies: []config.Policy{denyPolicy("d", config.Rule{})}, client: false, other: false, wantPolicy: "d"},
		{name: "allow with an empty rule allows all", policies: []config.Policy{allowPolicy("a", config.Rule{}), denyPolicy("d", config.Rule{Namespaces: []string{"prod"}})}, client: true, other: false, wantPolicy: "a"},
		{name: "deny by not_ field", policies: []config.Policy{denyPolicy("d", config.Rule{NotNamespaces: []string{"default"}})}, client: true, other: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := NewAuthorizer(tt.policies)
			d := a.Authorize(connClient)
			if d.Allow != tt.client {
				t.Errorf("client: allow = %v, want %v (%s)", d.Allow, tt.client, d.Reason)
			}
			if d.Policy != tt.wantPolicy {
				t.Errorf("client: decided by %q, want %q", d.Policy, tt.wantPolicy)
			}
			if d.Reason == "" {
				t.Errorf("client: decision without a reason")
			}
			if d := a.Authorize(connOther); d.Allow != tt.other {
				t.Errorf("other: allow = %v, want %v (%s)", d.Allow, tt.other, d.Reason)
			}
		})
	}
}

func TestAuthorizeIPv4MappedAndIPv6(t *testing.T) {
	a := NewAuthorizer([]config.Policy{allowPolicy("a",
		config.Rule{SourceIPs: cidrs("10.244.1.0/24"), DestinationIPs: cidrs("10.244.2.0/24")},
		config.Rule{SourceIPs: cidrs("fd00:10:244:1::/64"), DestinationIPs: cidrs("fd00:10:244:2::/64")})})
	tests := []struct {
		name string
		src  string
		dst  string
		want bool
	}{
		{"IPv4", "10.244.1.5", "10.244.2.5:80", true},
		{"IPv4-mapped is IPv4", "::ffff:10.244.1.5", "[::ffff:10.244.2.5]:80", true},
		{"IPv6", "fd00:10:244:1::5", "[fd00:10:244:2::5]:80", true},
		{"IPv6 wrong source", "fd00:10:244:9::5", "[fd00:10:244:2::5]:80", false},
	}
	for _, tt := range tests {
		d := a.Authorize(AuthzConn{Identity: connClient.Identity, Src: netip.MustParseAddr(tt.src), Dst: netip.MustParseAddrPort(tt.dst)})
		if d.Allow != tt.want {
			t.Errorf("%s: allow = %v, want %v", tt.name, d.Allow, tt.want)
		}
	}
}
