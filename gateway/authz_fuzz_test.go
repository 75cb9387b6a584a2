package gateway

import (
	"net/netip"
	"testing"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/identity"
)

// FuzzAuthorize holds policy matching to properties any input must keep,
// for any pattern, identity and addresses:
//   - one rule as an allow policy admits exactly what the same rule as a
//     deny policy refuses;
//   - a field and its not_ form match exactly the complementary sets;
//   - a principal, a namespace, an address or a port written out exactly
//     matches the connection it was taken from.
func FuzzAuthorize(f *testing.F) {
	f.Add("cluster.local/ns/web/sa/front", "web", "10.0.0.0/8", uint16(80),
		"spiffe://cluster.local/ns/web/sa/front", []byte{10, 0, 0, 7}, []byte{10, 96, 0, 1}, uint16(80))
	f.Add("cluster.local/ns/*", "*", "fd00::/8", uint16(443),
		"spiffe://cluster.local/ns/db/sa/pg", []byte{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, []byte{10, 96, 0, 2}, uint16(5432))
	f.Add("*", "", "0.0.0.0/0", uint16(0), "", []byte{127, 0, 0, 1}, []byte{127, 0, 0, 1}, uint16(15008))
	f.Add("*/sa/front", "kube-system", "not a prefix", uint16(8080),
		"spiffe://other.domain/path/without/ns", []byte{192, 0, 2, 1}, []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1}, uint16(8080))

	f.Fuzz(func(t *testing.T, principal, namespace, prefix string, port uint16,
		id string, src, dst []byte, dport uint16) {
		srcIP, ok1 := netip.AddrFromSlice(src)
		dstIP, ok2 := netip.AddrFromSlice(dst)
		if !ok1 || !ok2 {
			return // not an address: the gateway never builds such a connection
		}
		c := AuthzConn{Identity: id, Src: srcIP, Dst: netip.AddrPortFrom(dstIP, dport)}

		// matches says whether r matches c, through both actions.
		matches := func(what string, r config.Rule) bool {
			t.Helper()
			allow := NewAuthorizer([]config.Policy{{Name: "p", Action: "allow", Rules: []config.Rule{r}}}).Authorize(c)
			deny := NewAuthorizer([]config.Policy{{Name: "p", Action: "deny", Rules: []config.Rule{r}}}).Authorize(c)
			if allow.Allow == deny.Allow {
				t.Errorf("%s: rule %+v allows %+v as an allow policy (%v) and as a deny policy (%v): %q, %q",
					what, r, c, allow.Allow, deny.Allow, allow.Reason, deny.Reason)
			}
			return allow.Allow
		}
		complement := func(what string, pos, neg config.Rule) {
			t.Helper()
			if matches(what, pos) == matches("not_"+what, neg) {
				t.Errorf("%s %+v and not_%s %+v agree on %+v", what, pos, what, neg, c)
			}
		}
		complement("principals", config.Rule{Principals: []string{principal}}, config.Rule{NotPrincipals: []string{principal}})
		complement("namespaces", config.Rule{Namespaces: []string{namespace}}, config.Rule{NotNamespaces: []string{namespace}})
		complement("destination_ports", config.Rule{DestinationPorts: []uint16{port}}, config.Rule{NotDestinationPorts: []uint16{port}})
		if p, err := netip.ParsePrefix(prefix); err == nil {
			complement("source_ips", config.Rule{SourceIPs: []netip.Prefix{p}}, config.Rule{NotSourceIPs: []netip.Prefix{p}})
			complement("destination_ips", config.Rule{DestinationIPs: []netip.Prefix{p}}, config.Rule{NotDestinationIPs: []netip.Prefix{p}})
		}

		exact := config.Rule{
			SourceIPs:        []netip.Prefix{netip.PrefixFrom(srcIP.Unmap(), srcIP.Unmap().BitLen())},
			DestinationIPs:   []netip.Prefix{netip.PrefixFrom(dstIP.Unmap(), dstIP.Unmap().BitLen())},
			DestinationPorts: []uint16{dport},
		}
		if pid, err := identity.Parse(id); err == nil {
			exact.Principals = []string{pid.Principal()}
			if ns := pid.Namespace(); ns != "" {
				exact.Namespaces = []string{ns}
			}
		}
		if !matches("exact", exact) {
			t.Errorf("rule %+v, written out from %+v, does not match it", exact, c)
		}
	})
}
