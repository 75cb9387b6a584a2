package tun

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Self-repair: what Open configured comes back when something else on
// the host removes or changes it.
//
// A network manager, a cleanup script or an operator's `ip` command may
// take down the link, change its MTU, flush its addresses, delete a
// capture route or a bypass rule; without them, captured traffic
// silently stops reaching the gateway. A Repairer watches the kernel's
// routing events (one netlink socket subscribed to the link, address,
// route and rule groups of both families; the kernel pushes them, nothing
// is polled) and, after a short debounce that gathers a burst into one
// pass, compares the whole state Open configured with what the kernel
// holds and restores what differs: the link up and its MTU, then the
// addresses, then the routes (a route on a link that is down fails), then
// the rules. Each restoration is logged as one line ("restored route
// 10.244.2.0/24 dev meshtun0 table 109") and counted by kind in Stats.
//
// The comparison is idempotent: our own restorations raise events too,
// and the pass they cause finds everything in place and changes nothing,
// so the two do not feed each other. Something that keeps undoing our
// state would make us restore it as often; after fightFree restorations
// in a row, each within fightWindow of the last, the delay before the
// next pass doubles up to fightMaxDelay (logged), so the fight costs a
// pass every half minute at most.
//
// When the socket's receive buffer overflows (ENOBUFS: events were lost)
// or any other receive error occurs, the Repairer logs it, opens a new
// subscription and makes a full pass, which covers whatever the lost
// events said.
//
// The desired state is the Device's: Open sets it and nothing changes it
// afterwards, so the routes a Repairer restores are exactly the ones Open
// added (the gateway's tun.routes and tun.addresses are keys a reload does
// not apply: no reload removes a route on purpose). Close stops the
// restorations before it removes anything (Device.mu, Device.closing), so
// shutting down never races a repair.

// Kinds of restoration, as RepairStats counts them (RepairStats.Of); a
// fixed set, as a metric label's values must be.
const (
	RepairLink    = "link"    // the link was down and was set up, or its MTU was changed and was set back
	RepairAddress = "address" // an address was missing and was added
	RepairRoute   = "route"   // a capture route was missing or changed and was put back
	RepairRule    = "rule"    // a bypass rule was missing and was added
)

// RepairKinds lists every kind of restoration.
var RepairKinds = [...]string{RepairLink, RepairAddress, RepairRoute, RepairRule}

// RepairStats counts what a Repairer did.
type RepairStats struct {
	// Restorations by kind (RepairKinds).
	Link, Address, Route, Rule uint64
	// Passes: comparisons of the kernel's state with the desired one.
	Reconciles uint64
	// Passes that met an error; each is retried (retryAfter).
	Failures uint64
	// Subscriptions reopened after a receive error (ENOBUFS: events lost).
	Resubscribes uint64
}

// Of returns the count of restorations of kind what (one of RepairKinds).
func (s RepairStats) Of(what string) uint64 {
	switch what {
	case RepairLink:
		return s.Link
	case RepairAddress:
		return s.Address
	case RepairRoute:
		return s.Route
	case RepairRule:
		return s.Rule
	}
	return 0
}

// Tuning of the Repairer.
const (
	// debounce is the wait between the first event of a burst and the
	// pass: `ip link set down` or `ip addr flush` raise a handful of events
	// within a millisecond or two; 50 ms gathers them into one pass and
	// still restores well within a second.
	debounce = 50 * time.Millisecond
	// retryDelay is the first wait before a pass that failed is tried
	// again: a transient error (a dump interrupted by a concurrent change)
	// clears in that time; a lasting one waits longer each time
	// (retryAfter), so it is not logged in a busy loop.
	retryDelay = time.Second
	// fightWindow and fightFree: restorations closer together than
	// fightWindow count as one fight; after fightFree of them the pass
	// delay doubles per restoration, up to fightMaxDelay. One outside
	// change makes one restoring pass (the pass our own events start finds
	// nothing); an operator or a script changing things one by one makes
	// a few in a row. Ten, each within 2 s of the last, is something
	// reacting to our restorations, which a daemon does within
	// milliseconds.
	fightWindow   = 2 * time.Second
	fightFree     = 10
	fightMaxDelay = 30 * time.Second
	// receiveBuffer is the subscription's socket buffer. A host whose
	// routing daemon replaces many routes at once can send thousands of
	// events in a burst; 1 MiB holds several thousand before the kernel
	// drops (ENOBUFS, which costs only a resubscription and a pass).
	receiveBuffer = 1 << 20
)

// repairGroups are the rtnetlink multicast groups a Repairer listens to.
var repairGroups = []uint{
	unix.RTNLGRP_LINK,
	unix.RTNLGRP_IPV4_IFADDR, unix.RTNLGRP_IPV6_IFADDR,
	unix.RTNLGRP_IPV4_ROUTE, unix.RTNLGRP_IPV6_ROUTE,
	unix.RTNLGRP_IPV4_RULE, unix.RTNLGRP_IPV6_RULE,
}

// Repairer keeps a Device's configuration in the kernel: make it with
// NewRepairer, run it with Run until the context ends or the Device is
// closed.
type Repairer struct {
	dev *Device
	log hclog.Logger

	started                        atomic.Bool
	counts                         [len(RepairKinds)]atomic.Uint64
	passes, failures, resubscribes atomic.Uint64

	// For the tests (repair_internal_test.go): the socket buffer size (0:
	// receiveBuffer), and a hook run before each receive.
	rcvbuf        int
	beforeReceive func()
}

// NewRepairer returns a Repairer of d that logs to log (d's logger if
// nil). It does nothing until Run.
func NewRepairer(d *Device, log hclog.Logger) *Repairer {
	if log == nil {
		log = d.log
	}
	return &Repairer{dev: d, log: log}
}

// Stats returns what the Repairer has done so far.
func (r *Repairer) Stats() RepairStats {
	return RepairStats{
		Link:         r.counts[0].Load(),
		Address:      r.counts[1].Load(),
		Route:        r.counts[2].Load(),
		Rule:         r.counts[3].Load(),
		Reconciles:   r.passes.Load(),
		Failures:     r.failures.Load(),
		Resubscribes: r.resubscribes.Load(),
	}
}

// Run subscribes to the kernel's events in the Device's namespace, makes a
// first pass (anything changed since Open), and then restores what events
// show changed, until ctx ends or the Device is closed. It returns an error
// only if the first subscription fails; later receive errors are logged
// and lead to a new subscription. Run may be called once.
func (r *Repairer) Run(ctx context.Context) error {
	if r.started.Swap(true) {
		return fmt.Errorf("tun: %s: repair: Run called twice", r.dev.name)
	}
	sub, err := r.subscribe()
	if err != nil {
		return fmt.Errorf("tun: %s: repair: subscribe to netlink events: %w", r.dev.name, err)
	}
	defer func() {
		if sub != nil {
			sub.stop()
		}
	}()
	r.log.Debug("self-repair watching", "device", r.dev.name)

	var (
		p        pacer
		failures int // passes failed in a row
	)
	timer := time.NewTimer(0) // the first pass, at once
	defer timer.Stop()
	pending := true // a pass is scheduled on timer
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.dev.closed:
			return nil
		case <-sub.events:
			if !pending {
				pending = true
				timer.Reset(p.delay(time.Now()))
			}
		case err := <-sub.errs:
			if errors.Is(err, unix.ENOBUFS) {
				r.log.Warn("netlink events lost (receive buffer overflowed); resubscribing and checking the whole state")
			} else {
				r.log.Warn("netlink subscription failed; resubscribing and checking the whole state", "error", err)
			}
			sub.stop()
			if sub = r.resubscribe(ctx); sub == nil {
				return nil // ctx ended or the Device closed
			}
			pending = true
			timer.Reset(0)
		case <-timer.C:
			pending = false
			n, err := r.reconcile()
			if err != nil {
				r.failures.Add(1)
				failures++
				retry := retryAfter(failures)
				r.log.Warn("self-repair pass failed; retrying", "error", err, "retry_in", retry)
				pending = true
				timer.Reset(retry)
			} else {
				failures = 0
			}
			if n > 0 {
				if d, slowed := p.restored(time.Now()); slowed {
					r.log.Warn("something keeps undoing the device's configuration; slowing down self-repair",
						"restorations_in_a_row", p.streak, "next_pass_after", d)
				}
			}
		}
	}
}

// resubscribe opens a new subscription, retrying every retryDelay until
// it succeeds or ctx ends or the Device is closed (nil then).
func (r *Repairer) resubscribe(ctx context.Context) *subscription {
	for {
		sub, err := r.subscribe()
		if err == nil {
			r.resubscribes.Add(1)
			return sub
		}
		r.log.Error("self-repair: cannot subscribe to netlink events; retrying", "error", err, "retry_in", retryDelay)
		t := time.NewTimer(retryDelay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-r.dev.closed:
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// retryAfter is the wait before the next try after failures passes
// failed in a row: retryDelay, doubling up to fightMaxDelay, so a lasting
// failure (the device deleted from outside) is logged ever more rarely.
func retryAfter(failures int) time.Duration {
	d := retryDelay
	for i := 1; i < failures && d < fightMaxDelay; i++ {
		d *= 2
	}
	return min(d, fightMaxDelay)
}

// pacer spaces the passes: debounce normally, longer while something
// keeps undoing what the passes restore (fightWindow, fightFree).
type pacer struct {
	streak int           // restoring passes in a row, each soon after the last (fighting)
	last   time.Time     // the last restoring pass
	wait   time.Duration // the delay the streak puts before the next pass
}

// fighting reports whether a pass at now continues the streak: it comes
// within fightWindow of the end of the wait the streak imposed.
func (p *pacer) fighting(now time.Time) bool {
	return p.streak > 0 && now.Sub(p.last) <= p.wait+fightWindow
}

// delay is the wait before a pass asked for at now.
func (p *pacer) delay(now time.Time) time.Duration {
	if !p.fighting(now) {
		return debounce
	}
	return p.wait
}

// restored records a pass at now that restored something and returns
// the wait before the next one; slowed says it is longer than debounce.
func (p *pacer) restored(now time.Time) (wait time.Duration, slowed bool) {
	if p.fighting(now) {
		p.streak++
	} else {
		p.streak = 1
	}
	p.last = now
	p.wait = debounce
	if over := p.streak - fightFree; over >= 0 {
		p.wait = fightMaxDelay
		if over < 20 { // 50 ms << 20 is far past the cap
			p.wait = min(debounce<<(over+1), fightMaxDelay)
		}
	}
	return p.wait, p.wait > debounce
}

// subscription is one netlink socket subscribed to repairGroups and the
// goroutine that reads it (owned by the subscription: stop ends it).
type subscription struct {
	sock   *nl.NetlinkSocket
	events chan struct{} // a relevant event arrived since the last receive from it
	errs   chan error    // the receive error that ended the reader
	done   chan struct{} // closed when the reader has returned
}

func (r *Repairer) subscribe() (*subscription, error) {
	sock, err := nl.SubscribeAt(r.dev.ns, netns.None(), unix.NETLINK_ROUTE, repairGroups...)
	if err != nil {
		return nil, err
	}
	size := r.rcvbuf
	if size == 0 {
		size = receiveBuffer
	}
	// SO_RCVBUFFORCE (CAP_NET_ADMIN, which the gateway has) goes past
	// net.core.rmem_max; without it, SO_RCVBUF within that limit.
	if err := sock.SetReceiveBufferSize(size, true); err != nil {
		if err := sock.SetReceiveBufferSize(size, false); err != nil {
			r.log.Debug("cannot size the netlink receive buffer; keeping the default", "error", err)
		}
	}
	s := &subscription{sock: sock, events: make(chan struct{}, 1), errs: make(chan error, 1), done: make(chan struct{})}
	go s.read(r)
	return s, nil
}

// stop closes the socket and waits for the reader to return.
func (s *subscription) stop() {
	s.sock.Close()
	<-s.done
}

// read receives events until the socket fails or is closed, and signals
// those that concern the Device.
func (s *subscription) read(r *Repairer) {
	defer close(s.done)
	for {
		if r.beforeReceive != nil {
			r.beforeReceive()
		}
		msgs, from, err := s.sock.Receive()
		if err != nil {
			s.errs <- err // the only send: errs has room for it
			return
		}
		if from.Pid != nl.PidKernel {
			continue
		}
		for i := range msgs {
			if r.dev.concerns(&msgs[i]) {
				select {
				case s.events <- struct{}{}:
				default: // a pass is already due
				}
				break
			}
		}
	}
}

// concerns reports whether m may be about the Device's link, addresses,
// routes or rules. It errs on the side of yes: a pass that finds
// everything in place costs a few dumps.
func (d *Device) concerns(m *syscall.NetlinkMessage) bool {
	b := m.Data
	switch m.Header.Type {
	case unix.RTM_NEWLINK, unix.RTM_DELLINK:
		// struct ifinfomsg: family, pad, type (u16), index (s32), ...
		return len(b) >= unix.SizeofIfInfomsg && int(int32(binary.NativeEndian.Uint32(b[4:8]))) == d.index
	case unix.RTM_NEWADDR, unix.RTM_DELADDR:
		// struct ifaddrmsg: family, prefixlen, flags, scope, index (u32)
		return len(b) >= unix.SizeofIfAddrmsg && int(binary.NativeEndian.Uint32(b[4:8])) == d.index
	case unix.RTM_NEWROUTE, unix.RTM_DELROUTE:
		return d.routeConcerns(m)
	case unix.RTM_NEWRULE, unix.RTM_DELRULE:
		return true // rules change rarely, and any may displace ours
	}
	return false
}

// routeConcerns: a route in the Device's table, with RouteProtocol, or
// through the Device.
func (d *Device) routeConcerns(m *syscall.NetlinkMessage) bool {
	b := m.Data
	if len(b) < unix.SizeofRtMsg {
		return false
	}
	// struct rtmsg: family, dst_len, src_len, tos, table, protocol, ...
	table, proto := int(b[4]), b[5]
	if proto == byte(RouteProtocol) {
		return true
	}
	attrs, err := syscall.ParseNetlinkRouteAttr(m)
	if err != nil {
		return true
	}
	for _, a := range attrs {
		switch {
		case a.Attr.Type == unix.RTA_TABLE && len(a.Value) >= 4:
			table = int(binary.NativeEndian.Uint32(a.Value))
		case a.Attr.Type == unix.RTA_OIF && len(a.Value) >= 4 && int(binary.NativeEndian.Uint32(a.Value)) == d.index:
			return true
		}
	}
	return table == d.table
}

// reconcile makes one pass: it restores each part of the desired state the
// kernel lacks, in the order the kernel needs, and returns how many it
// restored. It changes nothing once Close has begun.
func (r *Repairer) reconcile() (restored int, err error) {
	d := r.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closing {
		return 0, nil
	}
	defer r.passes.Add(1)
	link, err := d.nl.LinkByIndex(d.index)
	if err != nil {
		return 0, fmt.Errorf("tun: %s: repair: find link %d: %w", d.name, d.index, err)
	}
	if n := link.Attrs().Name; n != d.name {
		return 0, fmt.Errorf("tun: %s: repair: link %d is now called %s; not touching it", d.name, d.index, n)
	}
	var errs []error
	note := func(kind int, what string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("tun: %s: repair: restore %s: %w", d.name, what, err))
			return
		}
		restored++
		// Logged before it is counted: whoever sees the count (the
		// metrics, Stats) finds its line.
		r.log.Info("restored " + what)
		r.counts[kind].Add(1)
	}

	if link.Attrs().Flags&net.FlagUp == 0 {
		note(0, fmt.Sprintf("link %s up", d.name), d.nl.LinkSetUp(link))
	}
	if link.Attrs().MTU != d.mtu {
		note(0, fmt.Sprintf("link %s mtu %d", d.name, d.mtu), d.nl.LinkSetMTU(link, d.mtu))
	}

	if len(d.addrs) > 0 {
		have, err := d.nl.AddrList(link, netlink.FAMILY_ALL)
		if err != nil {
			return restored, fmt.Errorf("tun: %s: repair: list addresses: %w", d.name, err)
		}
		for _, want := range d.addrs {
			if !hasAddr(have, want) {
				note(1, fmt.Sprintf("address %s dev %s", want.IPNet, d.name), d.nl.AddrAdd(link, want))
			}
		}
	}

	var fams [2][]netlink.Route // by family: IPv4, IPv6
	listed := [2]bool{}
	for _, want := range d.routes {
		f, fam := 0, netlink.FAMILY_V4
		if want.Dst.IP.To4() == nil {
			f, fam = 1, netlink.FAMILY_V6
		}
		if !listed[f] {
			have, err := d.nl.RouteListFiltered(fam, &netlink.Route{Table: d.table}, netlink.RT_FILTER_TABLE)
			if err != nil {
				return restored, fmt.Errorf("tun: %s: repair: list routes: %w", d.name, err)
			}
			fams[f], listed[f] = have, true
		}
		if !hasRoute(fams[f], want) {
			// Replace, not add: a route of the same destination put in
			// ours' place (another device, another protocol) is swapped
			// back rather than refused as existing.
			note(2, fmt.Sprintf("route %s dev %s table %d", want.Dst, d.name, d.table), d.nl.RouteReplace(want))
		}
	}

	for _, want := range d.rules {
		have, err := d.nl.RuleListFiltered(want.Family, &netlink.Rule{Priority: want.Priority, Table: want.Table},
			netlink.RT_FILTER_PRIORITY|netlink.RT_FILTER_TABLE)
		if err != nil {
			return restored, fmt.Errorf("tun: %s: repair: list rules: %w", d.name, err)
		}
		if !hasRule(have, want) {
			note(3, ruleString(want), d.nl.RuleAdd(want))
		}
	}
	return restored, errors.Join(errs...)
}

func hasAddr(have []netlink.Addr, want *netlink.Addr) bool {
	for _, a := range have {
		if a.IPNet != nil && a.IPNet.String() == want.IPNet.String() {
			return true
		}
	}
	return false
}

// hasRoute: a route to want's destination through want's device, tagged
// RouteProtocol (the list is of want's table already).
func hasRoute(have []netlink.Route, want *netlink.Route) bool {
	for _, r := range have {
		if r.Dst != nil && r.Dst.String() == want.Dst.String() &&
			r.LinkIndex == want.LinkIndex && r.Protocol == want.Protocol {
			return true
		}
	}
	return false
}

// hasRule: a rule that selects what want does (the list is of want's
// priority and table already).
func hasRule(have []netlink.Rule, want *netlink.Rule) bool {
	for _, r := range have {
		if r.Invert == want.Invert && r.Mark == want.Mark && maskOf(r.Mask) == maskOf(want.Mask) {
			return true
		}
	}
	return false
}

func maskOf(m *uint32) uint32 {
	if m == nil {
		return 0xffffffff // the kernel's default with a mark
	}
	return *m
}

// ruleString describes a bypass rule as `ip rule` shows it, with its family.
func ruleString(r *netlink.Rule) string {
	fam := "IPv4"
	if r.Family == netlink.FAMILY_V6 {
		fam = "IPv6"
	}
	not := ""
	if r.Invert {
		not = "not "
	}
	return fmt.Sprintf("rule %d: %sfrom all fwmark %#x lookup %d (%s)", r.Priority, not, r.Mark, r.Table, fam)
}
