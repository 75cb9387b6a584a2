package tun_test

import (
	"net"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/meshtun/meshtun/tun"
	"github.com/meshtun/meshtun/tun/tuntest"
)

// bypassRules lists the rules with tun.RulePriority in the namespace.
func bypassRules(t *testing.T, ns *tuntest.Netns) []netlink.Rule {
	t.Helper()
	var rules []netlink.Rule
	var err error
	ns.Do(func() {
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			var rs []netlink.Rule
			rs, err = netlink.RuleListFiltered(fam, &netlink.Rule{Priority: tun.RulePriority}, netlink.RT_FILTER_PRIORITY)
			if err != nil {
				return
			}
			rules = append(rules, rs...)
		}
	})
	if err != nil {
		t.Fatalf("list rules: %v", err)
	}
	return rules
}

// outDev is the device the kernel routes dst through for a socket with
// mark, or "" when it has no route.
func outDev(t *testing.T, ns *tuntest.Netns, dst string, mark uint32) string {
	t.Helper()
	var name string
	ns.Do(func() {
		routes, err := netlink.RouteGetWithOptions(net.ParseIP(dst), &netlink.RouteGetOptions{Mark: mark})
		if err != nil || len(routes) == 0 {
			return
		}
		if l, err := netlink.LinkByIndex(routes[0].LinkIndex); err == nil {
			name = l.Attrs().Name
		}
	})
	return name
}

// TestBypass: with Options.Bypass, unmarked packets to a captured range
// enter the TUN even when the main table has a more specific route, marked
// ones follow the main table, and Close and Cleanup remove the rules.
func TestBypass(t *testing.T) {
	ns := tuntest.NewNetns(t, "mt-byp")
	// The uplink: one end of a veth pair with a main-table route to one address
	// inside the captured range, as a node has to a plain-TCP workload.
	var err error
	ns.Do(func() {
		la := netlink.NewLinkAttrs()
		la.Name = "uplink0"
		if err = netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "uplink1"}); err != nil {
			return
		}
		l, e := netlink.LinkByName("uplink0")
		if err = e; err != nil {
			return
		}
		if err = netlink.LinkSetUp(l); err != nil {
			return
		}
		for _, p := range []string{"10.244.2.6/32", "fd00:244:2::6/128"} {
			_, dst, _ := net.ParseCIDR(p)
			if err = netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst}); err != nil {
				return
			}
		}
	})
	if err != nil {
		t.Fatalf("uplink: %v", err)
	}
	dev := open(t, ns, tun.Options{Name: "meshtun0", Bypass: true,
		Addresses: prefixes("10.99.0.1/32", "fd00:99::1/128"),
		Routes:    prefixes("10.244.2.0/24", "fd00:244:2::/64"), Logger: testLogger(t)})

	rules := bypassRules(t, ns)
	if len(rules) != 2 {
		t.Fatalf("%d rules with priority %d, want 2 (IPv4, IPv6): %v", len(rules), tun.RulePriority, rules)
	}
	for _, r := range rules {
		if !r.Invert || r.Mark != tun.BypassMark || r.Table != tun.RouteTable {
			t.Errorf("rule %v: want not fwmark %#x lookup %d", r, tun.BypassMark, tun.RouteTable)
		}
	}
	st, err := inspect(ns, "meshtun0")
	if err != nil {
		t.Fatal(err)
	}
	if len(st.routes) != 0 {
		t.Errorf("capture routes in the main table: %v; want them in table %d only", st.routes, tun.RouteTable)
	}

	tests := []struct {
		name string
		dst  string
		mark uint32
		want string
	}{
		{"unmarked, captured despite the main /32", "10.244.2.6", 0, "meshtun0"},
		{"unmarked, captured", "10.244.2.5", 0, "meshtun0"},
		{"marked follows main", "10.244.2.6", tun.BypassMark, "uplink0"},
		{"marked, no main route", "10.244.2.5", tun.BypassMark, ""},
		{"another mark is captured", "10.244.2.6", tun.BypassMark + 1, "meshtun0"},
		{"IPv6 unmarked, captured", "fd00:244:2::6", 0, "meshtun0"},
		{"IPv6 marked follows main", "fd00:244:2::6", tun.BypassMark, "uplink0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := outDev(t, ns, tt.dst, tt.mark); got != tt.want {
				t.Errorf("route to %s with mark %#x: device %q, want %q", tt.dst, tt.mark, got, tt.want)
			}
		})
	}

	if err := dev.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if rules := bypassRules(t, ns); len(rules) != 0 {
		t.Errorf("rules left after Close: %v", rules)
	}
	var tableRoutes []netlink.Route
	ns.Do(func() {
		tableRoutes, err = netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: tun.RouteTable}, netlink.RT_FILTER_TABLE)
	})
	if err != nil || len(tableRoutes) != 0 {
		t.Errorf("table %d after Close: %v, %v", tun.RouteTable, tableRoutes, err)
	}
}

// TestCleanupRemovesBypassRules: the rules outlive a crashed gateway's
// device, and Cleanup removes them whether or not the device is still
// there.
func TestCleanupRemovesBypassRules(t *testing.T) {
	for _, deviceLeft := range []bool{false, true} {
		name := "device gone"
		if deviceLeft {
			name = "device left"
		}
		t.Run(name, func(t *testing.T) {
			ns := tuntest.NewNetns(t, "mt-byp")
			var dev *tun.Device
			var err error
			ns.Do(func() {
				dev, err = tun.Open(tun.Options{Name: "meshtun0", Bypass: true,
					Routes: prefixes("10.244.2.0/24", "fd00:244:2::/64")})
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { dev.Close() })
			if !deviceLeft {
				// A crash: the kernel deletes a TUN device with its last
				// fd, but not the rules.
				ns.Do(func() {
					var l netlink.Link
					if l, err = netlink.LinkByName("meshtun0"); err == nil {
						err = netlink.LinkDel(l)
					}
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			if n := len(bypassRules(t, ns)); n != 2 {
				t.Fatalf("%d rules before Cleanup, want 2", n)
			}
			ns.Do(func() { err = tun.Cleanup("meshtun0") })
			if err != nil {
				t.Fatalf("Cleanup: %v", err)
			}
			if rules := bypassRules(t, ns); len(rules) != 0 {
				t.Errorf("rules left after Cleanup: %v", rules)
			}
		})
	}
}

// TestOpenTakesOverLeftRules: a gateway killed without Close leaves its
// bypass rules (the kernel removes only the device); the next Open takes
// them over instead of failing with EEXIST, holds one rule per family,
// and its Close removes them.
func TestOpenTakesOverLeftRules(t *testing.T) {
	ns := tuntest.NewNetns(t, "mt-byp")
	opts := tun.Options{Name: "meshtun0", Bypass: true, Routes: prefixes("10.244.2.0/24", "fd00:244:2::/64")}
	var crashed, dev *tun.Device
	var err error
	ns.Do(func() { crashed, err = tun.Open(opts) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { crashed.Close() })
	// The crash: the device goes with its last fd, the rules stay.
	ns.Do(func() {
		var l netlink.Link
		if l, err = netlink.LinkByName("meshtun0"); err == nil {
			err = netlink.LinkDel(l)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(bypassRules(t, ns)); n != 2 {
		t.Fatalf("%d rules left by the crashed device, want 2", n)
	}
	ns.Do(func() { dev, err = tun.Open(opts) })
	if err != nil {
		t.Fatalf("Open over the rules a crash left: %v", err)
	}
	if n := len(bypassRules(t, ns)); n != 2 {
		t.Errorf("%d rules after the second Open, want 2 (one per family)", n)
	}
	if got := outDev(t, ns, "10.244.2.5", 0); got != "meshtun0" {
		t.Errorf("an unmarked packet to a captured address goes to %q, want meshtun0", got)
	}
	if err := dev.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if rules := bypassRules(t, ns); len(rules) != 0 {
		t.Errorf("rules left after Close: %v", rules)
	}
}

// TestBypassControl marks a socket with BypassMark.
func TestBypassControl(t *testing.T) {
	ns := tuntest.NewNetns(t, "mt-byp")
	var mark int
	var err error
	ns.Do(func() {
		lc := net.ListenConfig{Control: tun.BypassControl}
		var l net.Listener
		if l, err = lc.Listen(t.Context(), "tcp", "127.0.0.1:0"); err != nil {
			return
		}
		defer l.Close()
		rc, e := l.(*net.TCPListener).SyscallConn()
		if err = e; err != nil {
			return
		}
		rc.Control(func(fd uintptr) { mark, err = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK) })
	})
	if err != nil {
		t.Fatal(err)
	}
	if mark != tun.BypassMark {
		t.Fatalf("SO_MARK = %#x, want %#x", mark, tun.BypassMark)
	}
}
