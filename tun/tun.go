// Package tun opens and configures the TUN device that mesh traffic is
// routed into, and removes what it configured when it is done.
//
// Open creates the device with water (IFF_TUN|IFF_NO_PI), then, over
// netlink, sets its MTU, adds its addresses, brings it up and adds the routes
// that capture mesh destinations into it. Every route it adds carries the
// routing protocol number RouteProtocol, so Close and Cleanup remove exactly
// the routes meshtun added ("ip route show proto 109" lists them).
//
// With Options.Bypass the capture routes live in their own table,
// RouteTable, behind a rule that only packets without BypassMark follow:
// the gateway's own marked sockets (BypassControl) are routed by the main
// table and never loop back into the TUN. bypass.go explains the design;
// Close and Cleanup remove the rules too.
//
// Lifecycle:
//
//	dev, err := tun.Open(tun.Options{Name: "meshtun0", Routes: ...})
//	fd, err := dev.FD()   // a dup'ed fd for the packet path (e.g. netstack)
//	...
//	dev.Close()           // routes, addresses and the device are removed
//
// After a crash, Cleanup(name) removes a leftover device and its routes.
//
// A Repairer (repair.go) keeps what Open configured in place while the
// device is open: a link set down, an address flushed, a route or rule
// deleted by something else on the host is restored within a second.
//
// Open and Cleanup act in the network namespace of the calling OS thread;
// the Device remembers that namespace, so Close may be called from anywhere.
package tun

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/songgao/water"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// RouteProtocol is the routing protocol number (rtm_protocol) that tags the
// routes meshtun adds. 109 is not assigned in iproute2's rt_protos or by the
// kernel, and no widely used routing daemon claims it.
const RouteProtocol = netlink.RouteProtocol(109)

// DefaultMTU is the MTU used when Options.MTU is 0. The TUN's packets never
// leave the host (they go between the kernel and the userspace stack), so a
// large MTU lets local applications hand over ≈ 64 KiB segments: measured
// 8 Gbit/s at MTU 65000 against 0.5–1.7 Gbit/s at 1500 (docs/field-notes.md,
// "TUN and MTU").
const DefaultMTU = 65000

// Options configures Open.
type Options struct {
	// Name is the device name, e.g. "meshtun0". Required.
	Name string
	// MTU of the device; DefaultMTU if 0.
	MTU int
	// Addresses are assigned to the device. IPv6 addresses are added
	// without duplicate address detection so they are usable at once.
	Addresses []netip.Prefix
	// Routes are the destinations captured into the device, each added to
	// the main table with protocol RouteProtocol.
	Routes []netip.Prefix
	// Logger receives the device's logs; a null logger if nil.
	Logger hclog.Logger
	// Bypass puts Routes in table RouteTable behind a rule that sockets
	// marked with BypassMark skip (bypass.go), instead of the main table.
	Bypass bool
	// Offload is OffloadOff (or empty), OffloadOn or OffloadAuto: whether
	// the device carries a virtio_net_hdr with each packet and takes and
	// gives TCP super-packets (offload_linux.go). Device.Offload reports
	// what Open got.
	Offload string
}

// Device is an open, configured TUN device.
type Device struct {
	name  string
	mtu   int
	log   hclog.Logger
	ifce  *water.Interface // kept referenced: its finalizer closes the fd; nil with offload
	file  *os.File
	nl    *netlink.Handle // bound to the namespace the device lives in
	ns    netns.NsHandle  // that namespace, where a Repairer subscribes (repair.go)
	index int
	table int // the table of the routes: RouteTable with Options.Bypass, else main

	// What Open configured: the state a Repairer restores (repair.go)
	// and Close removes. Written by Open; Close clears rules.
	addrs  []*netlink.Addr
	routes []*netlink.Route
	rules  []*netlink.Rule // Options.Bypass (bypass.go)

	// mu serializes a Repairer's changes with Close: once closing is set,
	// under mu, nothing restores what Close removes.
	mu      sync.Mutex
	closing bool          // guarded by mu
	closed  chan struct{} // closed when Close begins

	closeOnce sync.Once
	closeErr  error

	// offload: every packet on the fd is preceded by a virtio_net_hdr and
	// TSO is on (Options.Offload, offload_linux.go).
	offload bool
}

// Open creates the device and configures it as opts says. On any failure it
// undoes what it did and returns the error.
func Open(opts Options) (*Device, error) {
	if opts.Name == "" {
		return nil, errors.New("tun: open: empty device name")
	}
	if len(opts.Name) >= unix.IFNAMSIZ {
		return nil, fmt.Errorf("tun: open %s: name longer than %d bytes", opts.Name, unix.IFNAMSIZ-1)
	}
	if opts.MTU == 0 {
		opts.MTU = DefaultMTU
	}
	if opts.MTU < 68 || opts.MTU > 65535 {
		return nil, fmt.Errorf("tun: open %s: MTU %d out of range 68..65535", opts.Name, opts.MTU)
	}
	log := opts.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}

	d := &Device{mtu: opts.MTU, log: log, table: routeTable(opts), closed: make(chan struct{})}
	if err := d.openOffload(opts); err != nil {
		return nil, err
	}
	if d.file == nil {
		ifce, err := water.New(water.Config{
			DeviceType:             water.TUN,
			PlatformSpecificParams: water.PlatformSpecificParams{Name: opts.Name},
		})
		if err != nil {
			return nil, fmt.Errorf("tun: open %s: %w", opts.Name, busyHint(err))
		}
		file, ok := ifce.ReadWriteCloser.(*os.File)
		if !ok {
			ifce.Close()
			return nil, fmt.Errorf("tun: open %s: water returned %T, not an *os.File", opts.Name, ifce.ReadWriteCloser)
		}
		d.ifce, d.file, d.name = ifce, file, ifce.Name()
	}
	nl, err := netlink.NewHandle()
	if err != nil {
		d.closeFile()
		return nil, fmt.Errorf("tun: open %s: netlink: %w", opts.Name, err)
	}
	d.nl = nl
	if d.ns, err = netns.Get(); err != nil {
		nl.Close()
		d.closeFile()
		return nil, fmt.Errorf("tun: open %s: network namespace: %w", opts.Name, err)
	}
	if err := d.configure(opts); err != nil {
		d.Close()
		return nil, err
	}
	log.Info("device open", "name", d.name, "mtu", d.mtu, "offload", d.offload,
		"addresses", fmt.Sprint(opts.Addresses), "routes", fmt.Sprint(opts.Routes))
	return d, nil
}

// configure sets the MTU, addresses, link state and routes, in the order the
// kernel needs: routes on a link that is down fail with ENETDOWN.
func (d *Device) configure(opts Options) error {
	link, err := d.nl.LinkByName(d.name)
	if err != nil {
		return fmt.Errorf("tun: %s: find link: %w", d.name, err)
	}
	d.index = link.Attrs().Index
	if err := d.nl.LinkSetMTU(link, opts.MTU); err != nil {
		return fmt.Errorf("tun: %s: set MTU %d: %w", d.name, opts.MTU, err)
	}
	if needsIPv6(opts) {
		if err := enableIPv6(d.name); err != nil {
			return err
		}
	}
	for _, p := range opts.Addresses {
		a := &netlink.Addr{IPNet: ipNet(p)}
		if p.Addr().Is6() {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := d.nl.AddrAdd(link, a); err != nil {
			return fmt.Errorf("tun: %s: add address %s: %w", d.name, p, err)
		}
		d.addrs = append(d.addrs, a)
	}
	if err := d.nl.LinkSetUp(link); err != nil {
		return fmt.Errorf("tun: %s: set link up: %w", d.name, err)
	}
	for _, p := range opts.Routes {
		r := &netlink.Route{
			LinkIndex: d.index,
			Dst:       ipNet(p.Masked()),
			Protocol:  RouteProtocol,
			Table:     d.table,
		}
		if p.Addr().Is4() {
			r.Scope = netlink.SCOPE_LINK
		}
		if err := d.nl.RouteAdd(r); err != nil {
			return fmt.Errorf("tun: %s: add route %s: %w", d.name, p.Masked(), err)
		}
		d.routes = append(d.routes, r)
	}
	if err := d.addBypassRules(opts); err != nil {
		return err
	}
	d.waitLocal(opts.Addresses)
	return nil
}

// localRouteTimeout bounds waitLocal. The kernel's address work item runs
// within milliseconds; a second means something else is wrong, and the
// device is still usable (replies are merely delayed), so Open goes on.
const localRouteTimeout = time.Second

// waitLocal waits until the kernel delivers locally the packets sent to
// each IPv6 address. The local route of an IPv6 address is installed by
// the kernel's address work item after the link comes up, not by the add
// itself: in between, the address is already chosen as a source, but
// packets to it are dropped (Ip6InAddrErrors). Measured: 1 in ≈ 25 first
// connections over IPv6 lost the SYN-ACK or RST and waited for the 1 s SYN
// retransmission. IPv4 installs its local route synchronously.
func (d *Device) waitLocal(addrs []netip.Prefix) {
	start := time.Now()
	deadline := start.Add(localRouteTimeout)
	defer func() { d.log.Debug("IPv6 addresses local", "after", time.Since(start)) }()
	for _, p := range addrs {
		if !p.Addr().Is6() {
			continue
		}
		for {
			routes, err := d.nl.RouteGet(net.IP(p.Addr().AsSlice()))
			if err == nil && len(routes) > 0 && routes[0].Type == unix.RTN_LOCAL {
				break
			}
			if time.Now().After(deadline) {
				d.log.Warn("IPv6 address not local yet; first connections may be delayed",
					"address", p.Addr(), "error", err)
				return
			}
			time.Sleep(time.Millisecond) // polling the kernel's work item; bounded by deadline
		}
	}
}

// Name returns the device's name.
func (d *Device) Name() string { return d.name }

// MTU returns the device's MTU.
func (d *Device) MTU() int { return d.mtu }

// FD returns a new file descriptor for the device's packet queue, a dup of
// the one the Device holds; the caller owns it and must close it. It is taken
// through SyscallConn so the Device's own fd stays under the Go poller
// (os.File.Fd would switch it to blocking mode). The dup shares the open file
// description, so it is non-blocking too.
func (d *Device) FD() (int, error) {
	rc, err := d.file.SyscallConn()
	if err != nil {
		return -1, fmt.Errorf("tun: %s: fd: %w", d.name, err)
	}
	fd := -1
	var dupErr error
	if err := rc.Control(func(raw uintptr) {
		fd, dupErr = unix.FcntlInt(raw, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return -1, fmt.Errorf("tun: %s: fd: %w", d.name, err)
	}
	if dupErr != nil {
		return -1, fmt.Errorf("tun: %s: dup fd: %w", d.name, dupErr)
	}
	return fd, nil
}

// Close removes the routes and addresses Open added, deletes the device and
// closes its fd. fds handed out by FD stay open but see the device gone.
// A Repairer of the device stops restoring first (it waits for a repair
// under way to end), so the two never fight. Close is idempotent; later
// calls return the first call's error.
func (d *Device) Close() error {
	d.closeOnce.Do(func() {
		d.mu.Lock()
		d.closing = true
		close(d.closed)
		d.mu.Unlock()
		errs := d.delBypassRules()
		for _, r := range d.routes {
			if err := d.nl.RouteDel(r); err != nil && !gone(err) {
				errs = append(errs, fmt.Errorf("tun: %s: delete route %s: %w", d.name, r.Dst, err))
			}
		}
		if link, err := d.nl.LinkByIndex(d.index); err == nil && link.Attrs().Name == d.name {
			for _, a := range d.addrs {
				if err := d.nl.AddrDel(link, a); err != nil && !gone(err) {
					errs = append(errs, fmt.Errorf("tun: %s: delete address %s: %w", d.name, a.IPNet, err))
				}
			}
			if err := d.nl.LinkDel(link); err != nil && !gone(err) {
				errs = append(errs, fmt.Errorf("tun: %s: delete link: %w", d.name, err))
			}
		}
		if err := d.closeFile(); err != nil {
			errs = append(errs, fmt.Errorf("tun: %s: close: %w", d.name, err))
		}
		d.nl.Close()
		d.ns.Close()
		d.closeErr = errors.Join(errs...)
		d.log.Info("device closed", "name", d.name, "error", d.closeErr)
	})
	return d.closeErr
}

// Cleanup removes a leftover device called name, in the calling thread's
// network namespace, together with the routes through it that carry
// RouteProtocol (in any table). A missing device is not an error. It refuses
// to delete a device of that name that is not a TUN/TAP device.
func Cleanup(name string) error {
	errs := cleanupBypassRules() // they outlive the device (bypass.go)
	link, err := netlink.LinkByName(name)
	if err != nil {
		var notFound netlink.LinkNotFoundError
		if errors.As(err, &notFound) || gone(err) {
			return errors.Join(errs...)
		}
		return fmt.Errorf("tun: cleanup %s: %w", name, err)
	}
	if t := link.Type(); t != "tuntap" {
		return fmt.Errorf("tun: cleanup %s: device is of type %q, not a TUN device; not deleting it", name, t)
	}
	filter := &netlink.Route{LinkIndex: link.Attrs().Index, Protocol: RouteProtocol, Table: unix.RT_TABLE_UNSPEC}
	mask := netlink.RT_FILTER_OIF | netlink.RT_FILTER_PROTOCOL | netlink.RT_FILTER_TABLE
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := netlink.RouteListFiltered(family, filter, mask)
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			errs = append(errs, fmt.Errorf("tun: cleanup %s: list routes: %w", name, err))
			continue
		}
		for i := range routes {
			if err := netlink.RouteDel(&routes[i]); err != nil && !gone(err) {
				errs = append(errs, fmt.Errorf("tun: cleanup %s: delete route %s: %w", name, routes[i].Dst, err))
			}
		}
	}
	if err := netlink.LinkDel(link); err != nil && !gone(err) {
		errs = append(errs, fmt.Errorf("tun: cleanup %s: delete link: %w", name, err))
	}
	return errors.Join(errs...)
}

func needsIPv6(opts Options) bool {
	for _, p := range append(append([]netip.Prefix(nil), opts.Addresses...), opts.Routes...) {
		if p.Addr().Is6() {
			return true
		}
	}
	return false
}

// enableIPv6 clears net.ipv6.conf.<name>.disable_ipv6, which a host may set
// for new devices through net.ipv6.conf.default; without it IPv6 addresses
// and routes cannot be added to the device.
func enableIPv6(name string) error {
	path := "/proc/sys/net/ipv6/conf/" + name + "/disable_ipv6"
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("tun: %s: IPv6 requested but %s is unreadable (is IPv6 disabled in the kernel?): %w", name, path, err)
	}
	if strings.TrimSpace(string(b)) == "0" {
		return nil
	}
	if err := os.WriteFile(path, []byte("0"), 0o644); err != nil {
		return fmt.Errorf("tun: %s: enable IPv6: %w", name, err)
	}
	return nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{
		IP:   net.IP(p.Addr().AsSlice()),
		Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen()),
	}
}

// gone reports whether err says the thing to remove is already gone.
func gone(err error) bool {
	return errors.Is(err, unix.ESRCH) || errors.Is(err, unix.ENODEV) ||
		errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EADDRNOTAVAIL) ||
		errors.Is(err, syscall.ENXIO)
}
