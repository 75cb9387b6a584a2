package tun

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The bypass: how the gateway reaches a destination inside a captured
// range without its own packets being captured again.
//
// With Options.Bypass, the capture routes go into their own routing table,
// RouteTable, instead of the main table, and one policy rule per address
// family sends every packet that does NOT carry BypassMark to that table
// first:
//
//	ip rule:  <RulePriority>: not from all fwmark 0x6d74 lookup 109
//	table 109: 10.244.2.0/24 dev meshtun0 proto 109 scope link
//
// An application's packet (mark 0) finds its capture route in table 109
// and enters the TUN; a destination not captured finds nothing there and
// the kernel goes on to the next rules (main, default) as before. A socket
// marked with BypassMark (BypassControl) skips the rule and is routed by
// the main table, e.g. over the node's uplink to a plain-TCP workload or to
// a peer's HBONE port inside a captured range. Because the capture routes
// are no longer in main, a more specific main route (say a /32 to that
// workload over the veth) cannot steal applications' flows from the TUN
// either.
//
// Replies to a bypassing socket arrive on the uplink; their source is
// inside a captured range, so a strict reverse-path filter (rp_filter=1),
// which looks the source up without the mark, would drop them. Nodes that
// use direct dials into captured ranges need rp_filter 0 or 2 (loose) on
// the uplink, which is what Kubernetes nodes commonly run.
//
// Close removes the rules and routes; Cleanup removes any rule with
// RulePriority that looks up RouteTable, and the table's tagged routes.

// BypassMark is the SO_MARK of the gateway's own sockets that must not be
// captured (direct dials to protocol TCP workloads, HBONE dials to peers).
// 0x6d74 is "mt" in ASCII: a value, matched exactly, that the marks of
// other network software on a node (kube-proxy 0x4000/0x8000, Calico's
// upper 16 bits, Cilium's 0x0200–0x0f00, Tailscale's 0x40000/0x80000,
// ztunnel's 0x539) do not use.
const BypassMark = 0x6d74

// RouteTable is the routing table of the capture routes with
// Options.Bypass. 109, like RouteProtocol, so `ip route show table 109`
// lists them; tables 253–255 are the kernel's and 1–252 are free for local
// use.
const RouteTable = 109

// RulePriority is the priority of the bypass rule. It must come before
// the main table's rule (32766) so that captured destinations beat any
// main route; it is far from the priorities other software commonly takes
// (Tailscale 5210–5270, Cilium ≤ 100), so the two do not collide.
const RulePriority = 10109

// BypassControl marks a socket with BypassMark. Use it as net.Dialer's
// Control so the connection is routed by the main table, not into the
// TUN. It needs CAP_NET_ADMIN, as the gateway has.
func BypassControl(network, address string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, BypassMark)
	}); err != nil {
		return fmt.Errorf("tun: mark socket: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("tun: mark socket with %#x (SO_MARK needs CAP_NET_ADMIN): %w", BypassMark, serr)
	}
	return nil
}

// routeTable is the table Open puts the capture routes in.
func routeTable(opts Options) int {
	if opts.Bypass {
		return RouteTable
	}
	return unix.RT_TABLE_MAIN
}

// bypassRule is the rule for one address family.
func bypassRule(family int) *netlink.Rule {
	r := netlink.NewRule()
	r.Family = family
	r.Priority = RulePriority
	r.Table = RouteTable
	r.Mark = BypassMark
	mask := uint32(0xffffffff)
	r.Mask = &mask
	r.Invert = true
	return r
}

// addBypassRules adds the rule of each family opts routes, when
// opts.Bypass is set. A rule that exists already (EEXIST: the kernel
// found one with the same priority, selectors and table, so exactly
// ours) is what a gateway killed without its Close left behind, since the
// rules outlive the device: it is taken over, logged, and removed by
// Close like one added now, so a restart after a crash needs no Cleanup.
func (d *Device) addBypassRules(opts Options) error {
	if !opts.Bypass {
		return nil
	}
	for _, family := range routeFamilies(opts.Routes) {
		r := bypassRule(family)
		if err := d.nl.RuleAdd(r); err != nil {
			if !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("tun: %s: add rule %q: %w", d.name, r, err)
			}
			d.log.Warn("bypass rule left by an earlier run (killed without cleanup); taking it over", "rule", ruleString(r))
		}
		d.rules = append(d.rules, r)
	}
	return nil
}

// delBypassRules removes the rules addBypassRules added.
func (d *Device) delBypassRules() []error {
	var errs []error
	for _, r := range d.rules {
		if err := d.nl.RuleDel(r); err != nil && !gone(err) {
			errs = append(errs, fmt.Errorf("tun: %s: delete rule %q: %w", d.name, r, err))
		}
	}
	d.rules = nil
	return errs
}

// cleanupBypassRules removes, in the calling thread's namespace, every
// rule with RulePriority that looks up RouteTable: what a crashed gateway
// left.
func cleanupBypassRules() []error {
	var errs []error
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rules, err := netlink.RuleListFiltered(family, &netlink.Rule{Priority: RulePriority, Table: RouteTable},
			netlink.RT_FILTER_PRIORITY|netlink.RT_FILTER_TABLE)
		if err != nil {
			if errors.Is(err, unix.EAFNOSUPPORT) {
				continue // no IPv6 in this kernel
			}
			errs = append(errs, fmt.Errorf("tun: cleanup: list rules: %w", err))
			continue
		}
		for i := range rules {
			if err := netlink.RuleDel(&rules[i]); err != nil && !gone(err) {
				errs = append(errs, fmt.Errorf("tun: cleanup: delete rule %q: %w", &rules[i], err))
			}
		}
	}
	return errs
}

// routeFamilies lists the address families among routes, IPv4 first.
func routeFamilies(routes []netip.Prefix) []int {
	var v4, v6 bool
	for _, p := range routes {
		if p.Addr().Is4() {
			v4 = true
		} else {
			v6 = true
		}
	}
	var fams []int
	if v4 {
		fams = append(fams, netlink.FAMILY_V4)
	}
	if v6 {
		fams = append(fams, netlink.FAMILY_V6)
	}
	return fams
}
