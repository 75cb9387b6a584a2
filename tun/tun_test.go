package tun_test

import (
	"errors"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/meshtun/meshtun/tun"
	"github.com/meshtun/meshtun/tun/tuntest"
)

// state is what netlink reports about a device in a namespace.
type state struct {
	found  bool
	mtu    int
	up     bool
	addrs  []netip.Prefix
	routes []netip.Prefix // routes tagged with tun.RouteProtocol, any device
}

func inspect(ns *tuntest.Netns, name string) (st state, err error) {
	ns.Do(func() {
		var link netlink.Link
		link, err = netlink.LinkByName(name)
		if err == nil {
			st.found = true
			st.mtu = link.Attrs().MTU
			st.up = link.Attrs().Flags&net.FlagUp != 0
			var addrs []netlink.Addr
			addrs, err = netlink.AddrList(link, netlink.FAMILY_ALL)
			if err != nil {
				return
			}
			for _, a := range addrs {
				if a.IP.IsLinkLocalUnicast() {
					continue
				}
				ip, _ := netip.AddrFromSlice(a.IP)
				ones, _ := a.Mask.Size()
				st.addrs = append(st.addrs, netip.PrefixFrom(ip.Unmap(), ones))
			}
		} else {
			var nf netlink.LinkNotFoundError
			if !errors.As(err, &nf) {
				return
			}
			err = nil
		}
		var routes []netlink.Route
		routes, err = netlink.RouteListFiltered(netlink.FAMILY_ALL,
			&netlink.Route{Protocol: tun.RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
		if err != nil {
			return
		}
		for _, r := range routes {
			ip, _ := netip.AddrFromSlice(r.Dst.IP)
			ones, _ := r.Dst.Mask.Size()
			st.routes = append(st.routes, netip.PrefixFrom(ip.Unmap(), ones))
		}
	})
	slices.SortFunc(st.addrs, netip.Prefix.Compare)
	slices.SortFunc(st.routes, netip.Prefix.Compare)
	return st, err
}

func testLogger(t *testing.T) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: t.Name(), Output: tWriter{t}, Level: hclog.Debug})
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

func open(t *testing.T, ns *tuntest.Netns, opts tun.Options) *tun.Device {
	t.Helper()
	var dev *tun.Device
	var err error
	ns.Do(func() { dev, err = tun.Open(opts) })
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { dev.Close() })
	return dev
}

func prefixes(s ...string) []netip.Prefix {
	var ps []netip.Prefix
	for _, p := range s {
		ps = append(ps, netip.MustParsePrefix(p))
	}
	slices.SortFunc(ps, netip.Prefix.Compare)
	return ps
}

func TestOpenConfiguresAndCloseRemoves(t *testing.T) {
	tests := []struct {
		name    string
		mtu     int
		wantMTU int
		addrs   []netip.Prefix
		routes  []netip.Prefix
	}{
		{name: "default MTU, IPv4 and IPv6", wantMTU: tun.DefaultMTU,
			addrs:  prefixes("10.99.0.1/32", "fd00:99::1/128"),
			routes: prefixes("10.244.2.0/24", "10.96.0.0/12", "fd00:244:2::/64")},
		{name: "MTU 1500, IPv4 only", mtu: 1500, wantMTU: 1500,
			addrs: prefixes("10.99.0.1/32"), routes: prefixes("10.244.0.0/16")},
		{name: "IPv6 only", mtu: 9000, wantMTU: 9000,
			addrs: prefixes("fd00:99::1/128"), routes: prefixes("fd00:244::/48")},
		{name: "no addresses or routes", wantMTU: tun.DefaultMTU},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := tuntest.NewNetns(t, "mt-tun")
			dev := open(t, ns, tun.Options{Name: "meshtun0", MTU: tt.mtu,
				Addresses: tt.addrs, Routes: tt.routes, Logger: testLogger(t)})
			if dev.Name() != "meshtun0" || dev.MTU() != tt.wantMTU {
				t.Errorf("Name, MTU = %q, %d; want meshtun0, %d", dev.Name(), dev.MTU(), tt.wantMTU)
			}
			st, err := inspect(ns, "meshtun0")
			if err != nil {
				t.Fatal(err)
			}
			if !st.found || !st.up || st.mtu != tt.wantMTU {
				t.Errorf("device found=%v up=%v mtu=%d; want true true %d", st.found, st.up, st.mtu, tt.wantMTU)
			}
			if !slices.Equal(st.addrs, tt.addrs) {
				t.Errorf("addresses = %v; want %v", st.addrs, tt.addrs)
			}
			if !slices.Equal(st.routes, tt.routes) {
				t.Errorf("tagged routes = %v; want %v", st.routes, tt.routes)
			}

			fd, err := dev.FD()
			if err != nil {
				t.Fatalf("FD: %v", err)
			}
			unix.Close(fd)

			if err := dev.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if err := dev.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
			st, err = inspect(ns, "meshtun0")
			if err != nil {
				t.Fatal(err)
			}
			if st.found || len(st.routes) != 0 {
				t.Errorf("after Close: device found=%v, tagged routes %v; want none", st.found, st.routes)
			}
		})
	}
}

// TestCloseWithOpenFD checks that Close deletes the device even while a
// dup'ed fd (held by the packet path) keeps it open.
func TestCloseWithOpenFD(t *testing.T) {
	ns := tuntest.NewNetns(t, "mt-tun")
	dev := open(t, ns, tun.Options{Name: "meshtun0", Routes: prefixes("10.244.2.0/24")})
	fd, err := dev.FD()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := dev.Close(); err != nil {
		t.Fatal(err)
	}
	st, err := inspect(ns, "meshtun0")
	if err != nil {
		t.Fatal(err)
	}
	if st.found || len(st.routes) != 0 {
		t.Errorf("after Close: device found=%v, tagged routes %v; want none", st.found, st.routes)
	}
}

func TestOpenFailureUndoes(t *testing.T) {
	ns := tuntest.NewNetns(t, "mt-tun")
	var err error
	ns.Do(func() {
		// The same route twice: the second add fails with EEXIST after the
		// device, its address and the first route exist.
		_, err = tun.Open(tun.Options{Name: "meshtun0",
			Addresses: prefixes("10.99.0.1/32"),
			Routes:    prefixes("10.244.2.0/24", "10.244.2.0/24")})
	})
	if !errors.Is(err, unix.EEXIST) {
		t.Fatalf("Open with a duplicate route: err = %v; want EEXIST", err)
	}
	st, err := inspect(ns, "meshtun0")
	if err != nil {
		t.Fatal(err)
	}
	if st.found || len(st.routes) != 0 {
		t.Errorf("after failed Open: device found=%v, tagged routes %v; want none", st.found, st.routes)
	}
}

func TestOpenBusyName(t *testing.T) {
	ns := tuntest.NewNetns(t, "mt-tun")
	open(t, ns, tun.Options{Name: "meshtun0"})
	var err error
	ns.Do(func() { _, err = tun.Open(tun.Options{Name: "meshtun0"}) })
	if err == nil {
		t.Fatal("second Open of the same name succeeded")
	}
}

// TestCleanupRemovesLeftover leaves a persistent TUN device with tagged
// routes behind, as a crashed meshtun would (with the device held open by
// another process), and checks that Cleanup removes it and only its routes.
func TestCleanupRemovesLeftover(t *testing.T) {
	ns := tuntest.NewNetns(t, "mt-tun")
	var err error
	ns.Do(func() {
		la := netlink.NewLinkAttrs()
		la.Name = "meshtun0"
		leftover := &netlink.Tuntap{LinkAttrs: la, Mode: netlink.TUNTAP_MODE_TUN,
			Flags: netlink.TUNTAP_NO_PI | netlink.TUNTAP_DEFAULTS}
		if err = netlink.LinkAdd(leftover); err != nil {
			return
		}
		for _, f := range leftover.Fds {
			f.Close()
		}
		link, e := netlink.LinkByName("meshtun0")
		if err = e; err != nil {
			return
		}
		if err = netlink.LinkSetUp(link); err != nil {
			return
		}
		for _, p := range []string{"10.244.2.0/24", "fd00:244:2::/64"} {
			_, dst, _ := net.ParseCIDR(p)
			if err = netlink.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: dst, Protocol: tun.RouteProtocol}); err != nil {
				return
			}
		}
		// Another device's route, untagged, must survive.
		la2 := netlink.NewLinkAttrs()
		la2.Name = "other0"
		if err = netlink.LinkAdd(&netlink.Veth{LinkAttrs: la2, PeerName: "other1"}); err != nil {
			return
		}
		other, e := netlink.LinkByName("other0")
		if err = e; err != nil {
			return
		}
		if err = netlink.LinkSetUp(other); err != nil {
			return
		}
		_, dst, _ := net.ParseCIDR("10.250.0.0/16")
		err = netlink.RouteAdd(&netlink.Route{LinkIndex: other.Attrs().Index, Dst: dst})
	})
	if err != nil {
		t.Fatalf("setting up the leftover: %v", err)
	}
	st, err := inspect(ns, "meshtun0")
	if err != nil || !st.found || len(st.routes) != 2 {
		t.Fatalf("leftover: %+v, %v", st, err)
	}

	ns.Do(func() { err = tun.Cleanup("meshtun0") })
	if err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	st, err = inspect(ns, "meshtun0")
	if err != nil {
		t.Fatal(err)
	}
	if st.found || len(st.routes) != 0 {
		t.Errorf("after Cleanup: device found=%v, tagged routes %v; want none", st.found, st.routes)
	}
	var otherRoutes []netlink.Route
	ns.Do(func() {
		var other netlink.Link
		if other, err = netlink.LinkByName("other0"); err == nil {
			otherRoutes, err = netlink.RouteList(other, netlink.FAMILY_V4)
		}
	})
	if err != nil || !slices.ContainsFunc(otherRoutes, func(r netlink.Route) bool {
		return r.Dst != nil && r.Dst.String() == "10.250.0.0/16"
	}) {
		t.Errorf("Cleanup touched another device's route: %v, %v", otherRoutes, err)
	}

	// Idempotent, and refuses a device that is not a TUN.
	ns.Do(func() { err = tun.Cleanup("meshtun0") })
	if err != nil {
		t.Errorf("Cleanup of a missing device: %v", err)
	}
	ns.Do(func() { err = tun.Cleanup("other0") })
	if err == nil {
		t.Errorf("Cleanup deleted a veth device")
	}
}

// TestIPv6AddressLocalOnReturn: when Open returns, packets to its IPv6
// address are delivered locally. The kernel installs that local route
// asynchronously after link up; without the wait, about 1 in 25 first
// connections lost their SYN-ACK (Ip6InAddrErrors).
func TestIPv6AddressLocalOnReturn(t *testing.T) {
	addr := netip.MustParseAddr("fd00:99::1")
	for i := range 20 {
		ns := tuntest.NewNetns(t, "mt-tun")
		var typ int
		var err error
		ns.Do(func() {
			var dev *tun.Device
			dev, err = tun.Open(tun.Options{Name: "meshtun0", Addresses: []netip.Prefix{netip.PrefixFrom(addr, 128)}})
			if err != nil {
				return
			}
			defer dev.Close()
			var routes []netlink.Route
			routes, err = netlink.RouteGet(net.IP(addr.AsSlice()))
			if err == nil && len(routes) > 0 {
				typ = routes[0].Type
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		if typ != unix.RTN_LOCAL {
			t.Fatalf("run %d: route to %s right after Open has type %d; want RTN_LOCAL", i, addr, typ)
		}
	}
}
