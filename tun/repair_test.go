package tun_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vishvananda/netlink"

	"github.com/meshtun/meshtun/tun"
	"github.com/meshtun/meshtun/tun/tuntest"
)

// repairWait bounds every wait for a restoration. The Repairer restores
// within a second; the margin is for a loaded CI machine.
const repairWait = 10 * time.Second

// lockedBuffer collects log output written from the Repairer's goroutine.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// repairRig is a device with a running Repairer in a namespace of its own.
type repairRig struct {
	ns   *tuntest.Netns
	dev  *tun.Device
	rep  *tun.Repairer
	logs *lockedBuffer
	done chan error // Run's result
	stop context.CancelFunc
}

const repairDev = "mtrep0"

var (
	repairAddrs  = prefixes("10.99.0.1/32", "fd00:99::1/128")
	repairRoutes = prefixes("10.244.2.0/24", "10.96.0.0/12", "fd00:244:2::/64")
)

// newRepairRig opens the device as the gateway does (bypass rules and
// table) and starts its Repairer; both are stopped at cleanup, the
// Repairer first.
func newRepairRig(t *testing.T) *repairRig {
	t.Helper()
	ns := tuntest.NewNetns(t, "mt-rep")
	logs := &lockedBuffer{}
	log := hclog.New(&hclog.LoggerOptions{Name: "tun", Output: io.MultiWriter(tWriter{t}, logs), Level: hclog.Debug})
	dev := open(t, ns, tun.Options{Name: repairDev, Addresses: repairAddrs, Routes: repairRoutes, Bypass: true, Logger: log})
	ctx, cancel := context.WithCancel(context.Background())
	rg := &repairRig{ns: ns, dev: dev, rep: tun.NewRepairer(dev, nil), logs: logs, done: make(chan error, 1), stop: cancel}
	go func() { rg.done <- rg.rep.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-rg.done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(repairWait):
			t.Errorf("Run did not return within %v of its context's end", repairWait)
		}
	})
	// The first pass proves the subscription is open: events from here
	// on are seen.
	rg.waitFor(t, "the first pass", func(s tun.RepairStats) bool { return s.Reconciles >= 1 })
	if err := rg.intact(); err != nil {
		t.Fatalf("right after Open: %v", err)
	}
	return rg
}

// ip runs the ip command in the rig's namespace, as an operator or a
// network manager would.
func (rg *repairRig) ip(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"-n", rg.ns.Name}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// waitFor polls the Repairer's stats until ok, failing after repairWait.
func (rg *repairRig) waitFor(t *testing.T, what string, ok func(tun.RepairStats) bool) tun.RepairStats {
	t.Helper()
	deadline := time.Now().Add(repairWait)
	for {
		s := rg.rep.Stats()
		if ok(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v; stats %+v", what, repairWait, s)
		}
		time.Sleep(10 * time.Millisecond) // polling Stats; bounded by deadline
	}
}

// intact reports what of the configured state the kernel lacks.
func (rg *repairRig) intact() error {
	var problems []string
	rg.ns.Do(func() {
		link, err := netlink.LinkByName(repairDev)
		if err != nil {
			problems = append(problems, err.Error())
			return
		}
		if link.Attrs().Flags&net.FlagUp == 0 {
			problems = append(problems, "link down")
		}
		if m := link.Attrs().MTU; m != tun.DefaultMTU {
			problems = append(problems, fmt.Sprintf("MTU %d", m))
		}
		addrs, err := netlink.AddrList(link, netlink.FAMILY_ALL)
		if err != nil {
			problems = append(problems, err.Error())
		}
		for _, want := range repairAddrs {
			found := false
			for _, a := range addrs {
				found = found || a.IPNet.String() == want.String()
			}
			if !found {
				problems = append(problems, "no address "+want.String())
			}
		}
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: tun.RouteTable}, netlink.RT_FILTER_TABLE)
		if err != nil {
			problems = append(problems, err.Error())
		}
		for _, want := range repairRoutes {
			found := false
			for _, r := range routes {
				found = found || (r.Dst != nil && r.Dst.String() == want.String() &&
					r.LinkIndex == link.Attrs().Index && r.Protocol == tun.RouteProtocol)
			}
			if !found {
				problems = append(problems, "no route "+want.String()+" dev "+repairDev)
			}
		}
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			rules, err := netlink.RuleListFiltered(fam, &netlink.Rule{Priority: tun.RulePriority, Table: tun.RouteTable},
				netlink.RT_FILTER_PRIORITY|netlink.RT_FILTER_TABLE)
			if err != nil {
				problems = append(problems, err.Error())
			}
			found := false
			for _, r := range rules {
				found = found || (r.Invert && r.Mark == tun.BypassMark)
			}
			if !found {
				problems = append(problems, fmt.Sprintf("no bypass rule of family %d", fam))
			}
		}
	})
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return nil
}

// waitIntact polls the kernel's state until it is whole again.
func (rg *repairRig) waitIntact(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(repairWait)
	for {
		err := rg.intact()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not restored within %v: %v", repairWait, err)
		}
		time.Sleep(10 * time.Millisecond) // polling the kernel's state; bounded by deadline
	}
}

// TestRepair: each outside change, made with the real ip command, is
// noticed and undone, counted under its kind and logged by name.
func TestRepair(t *testing.T) {
	tests := []struct {
		name string
		cmd  []string
		kind string
		// exact: the change removes one thing, so exactly one
		// restoration, of kind, is expected.
		exact bool
		log   string
	}{
		{name: "route deleted", cmd: []string{"route", "del", "10.244.2.0/24", "table", "109"},
			kind: tun.RepairRoute, exact: true, log: "restored route 10.244.2.0/24 dev mtrep0 table 109"},
		{name: "route moved to another device", cmd: []string{"route", "replace", "10.96.0.0/12", "dev", "lo", "table", "109"},
			kind: tun.RepairRoute, exact: true, log: "restored route 10.96.0.0/12 dev mtrep0 table 109"},
		{name: "IPv6 route deleted", cmd: []string{"-6", "route", "del", "fd00:244:2::/64", "table", "109"},
			kind: tun.RepairRoute, exact: true, log: "restored route fd00:244:2::/64 dev mtrep0 table 109"},
		{name: "rule deleted", cmd: []string{"rule", "del", "priority", "10109"},
			kind: tun.RepairRule, exact: true, log: "restored rule 10109: not from all fwmark 0x6d74 lookup 109 (IPv4)"},
		{name: "IPv6 rule deleted", cmd: []string{"-6", "rule", "del", "priority", "10109"},
			kind: tun.RepairRule, exact: true, log: "restored rule 10109: not from all fwmark 0x6d74 lookup 109 (IPv6)"},
		{name: "link set down", cmd: []string{"link", "set", repairDev, "down"},
			kind: tun.RepairLink, log: "restored link mtrep0 up"},
		{name: "MTU changed", cmd: []string{"link", "set", repairDev, "mtu", "1500"},
			kind: tun.RepairLink, exact: true, log: "restored link mtrep0 mtu 65000"},
		{name: "addresses flushed", cmd: []string{"addr", "flush", "dev", repairDev},
			kind: tun.RepairAddress, log: "restored address 10.99.0.1/32 dev mtrep0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rg := newRepairRig(t)
			rg.ip(t, tt.cmd...)
			s := rg.waitFor(t, "a restoration of kind "+tt.kind, func(s tun.RepairStats) bool { return s.Of(tt.kind) >= 1 })
			rg.waitIntact(t)
			if tt.exact {
				for _, k := range tun.RepairKinds {
					want := uint64(0)
					if k == tt.kind {
						want = 1
					}
					if got := s.Of(k); got != want {
						t.Errorf("restorations of kind %s: %d, want %d (stats %+v)", k, got, want, s)
					}
				}
			}
			if !strings.Contains(rg.logs.String(), tt.log) {
				t.Errorf("log lacks %q:\n%s", tt.log, rg.logs.String())
			}
			if s.Failures != 0 {
				t.Errorf("failed passes: %d", s.Failures)
			}
		})
	}
}

// TestRepairLinkDownRestoresAll: a link set down loses its IPv4 routes
// (the kernel flushes them without an event of their own); the pass that
// the link's event starts restores them too.
func TestRepairLinkDownRestoresAll(t *testing.T) {
	rg := newRepairRig(t)
	rg.ip(t, "link", "set", repairDev, "down")
	s := rg.waitFor(t, "link and routes restored", func(s tun.RepairStats) bool { return s.Link >= 1 && s.Route >= 2 })
	rg.waitIntact(t)
	for _, want := range []string{"restored link mtrep0 up", "restored route 10.244.2.0/24 dev mtrep0 table 109", "restored route 10.96.0.0/12 dev mtrep0 table 109"} {
		if !strings.Contains(rg.logs.String(), want) {
			t.Errorf("log lacks %q (stats %+v)", want, s)
		}
	}
}

// TestRepairStopsAtClose: closing the device ends Run, and what Close
// removes stays removed.
func TestRepairStopsAtClose(t *testing.T) {
	rg := newRepairRig(t)
	if err := rg.dev.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case err := <-rg.done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		rg.done <- nil // for the rig's cleanup
	case <-time.After(repairWait):
		t.Fatalf("Run did not return within %v of Close", repairWait)
	}
	before := rg.rep.Stats()
	if before.Link+before.Address+before.Route+before.Rule != 0 {
		t.Errorf("restorations while closing: %+v", before)
	}
	if err := rg.intact(); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("after Close, the device should be gone: %v", err)
	}
	if rules := bypassRules(t, rg.ns); len(rules) != 0 {
		t.Errorf("after Close, rules left: %v", rules)
	}
}

// TestRepairRunTwice: a second Run is refused, not a second watcher.
func TestRepairRunTwice(t *testing.T) {
	rg := newRepairRig(t)
	if err := rg.rep.Run(context.Background()); err == nil {
		t.Fatal("second Run: no error")
	}
}
