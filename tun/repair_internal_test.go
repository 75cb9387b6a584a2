package tun

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/meshtun/meshtun/tun/tuntest"
)

// openIn opens a bypass device like the gateway's in ns, closed at cleanup.
func openIn(t *testing.T, ns *tuntest.Netns, name string) *Device {
	t.Helper()
	var (
		d   *Device
		err error
	)
	ns.Do(func() {
		d, err = Open(Options{Name: name, Bypass: true,
			Addresses: []netip.Prefix{netip.MustParsePrefix("10.99.0.1/32")},
			Routes:    []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24"), netip.MustParsePrefix("fd00:244:2::/64")}})
	})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func ipIn(t *testing.T, ns *tuntest.Netns, args ...string) {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"-n", ns.Name}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// TestReconcileIdempotent: a pass restores what is missing, and the pass
// after it (the one our own changes' events start) finds nothing to do:
// restorations cannot feed each other.
func TestReconcileIdempotent(t *testing.T) {
	ns := tuntest.NewNetns(t, "mt-rci")
	d := openIn(t, ns, "mtrci0")
	r := NewRepairer(d, hclog.NewNullLogger())
	if n, err := r.reconcile(); n != 0 || err != nil {
		t.Fatalf("pass right after Open: %d restored, %v; want 0, nil", n, err)
	}
	ipIn(t, ns, "link", "set", "mtrci0", "down")
	ipIn(t, ns, "rule", "del", "priority", fmt.Sprint(RulePriority))
	n, err := r.reconcile()
	if err != nil {
		t.Fatalf("pass: %v", err)
	}
	// The link, the IPv4 route the kernel flushed with it, the rule; the
	// IPv6 route stays through a link down, the IPv4 address too.
	if s := r.Stats(); n < 3 || s.Link != 1 || s.Rule != 1 || s.Route < 1 {
		t.Fatalf("pass: %d restored, stats %+v; want link 1, rule 1, route >= 1", n, s)
	}
	for i := range 3 {
		if n, err := r.reconcile(); n != 0 || err != nil {
			t.Fatalf("pass %d after the restoring one: %d restored, %v; want 0, nil", i+1, n, err)
		}
	}
	d.Close()
	if n, err := r.reconcile(); n != 0 || err != nil {
		t.Fatalf("pass after Close: %d restored, %v; want 0, nil (nothing touched)", n, err)
	}
}

// TestRepairResubscribes: with the reader held while the kernel sends more
// events than the socket's buffer holds, the receive fails with ENOBUFS;
// the Repairer subscribes again, makes a full pass, and goes on restoring.
func TestRepairResubscribes(t *testing.T) {
	ns := tuntest.NewNetns(t, "mt-rsb")
	d := openIn(t, ns, "mtrsb0")
	r := NewRepairer(d, hclog.New(&hclog.LoggerOptions{Output: testWriter{t}, Level: hclog.Debug}))
	r.rcvbuf = 1 // the kernel rounds it up to its minimum, a few KiB
	held := make(chan struct{})
	release := make(chan struct{})
	first := true
	r.beforeReceive = func() { // the reader's goroutine only
		if first {
			first = false
			close(held)
			<-release
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("Run did not return")
		}
	})
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the reader never started")
	}
	// 400 routes added and removed in another table: 800 events, far more
	// than the buffer holds while the reader is held.
	var batch strings.Builder
	for i := range 200 {
		fmt.Fprintf(&batch, "route add 198.18.%d.%d/32 dev lo table 200\n", i/100, i%100)
	}
	for i := range 200 {
		fmt.Fprintf(&batch, "route del 198.18.%d.%d/32 dev lo table 200\n", i/100, i%100)
	}
	path := filepath.Join(t.TempDir(), "batch")
	if err := os.WriteFile(path, []byte(batch.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	ipIn(t, ns, "-batch", path)
	close(release)

	deadline := time.Now().Add(10 * time.Second)
	for r.Stats().Resubscribes < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("no resubscription after the overflow; stats %+v", r.Stats())
		}
		time.Sleep(10 * time.Millisecond) // polling Stats; bounded by deadline
	}
	// The new subscription works: a deleted route comes back.
	ipIn(t, ns, "route", "del", "10.244.2.0/24", "table", fmt.Sprint(RouteTable))
	for r.Stats().Route < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("route not restored after the resubscription; stats %+v", r.Stats())
		}
		time.Sleep(10 * time.Millisecond) // polling Stats; bounded by deadline
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

// TestPacer: passes wait debounce; a run of restorations, each coming
// right after the wait the last one imposed (something undoing each one
// at once), slows them, doubling up to fightMaxDelay and staying there; a
// quiet fightWindow brings debounce back.
func TestPacer(t *testing.T) {
	var p pacer
	now := time.Unix(1000, 0)
	if d := p.delay(now); d != debounce {
		t.Fatalf("fresh: %v, want %v", d, debounce)
	}
	// An operator's changes, one every second: never slowed.
	for i := 1; i < fightFree; i++ {
		now = now.Add(time.Second)
		if d, slowed := p.restored(now); slowed || d != debounce {
			t.Fatalf("restoration %d: %v slowed=%v, want %v", i, d, slowed, debounce)
		}
	}
	// Something undoes each restoration at once: the next pass comes as
	// soon as the pacer allows.
	wait := debounce
	var waits []time.Duration
	for i := range 20 {
		now = now.Add(p.delay(now.Add(time.Millisecond)) + time.Millisecond)
		d, slowed := p.restored(now)
		if !slowed || d < wait || d > fightMaxDelay {
			t.Fatalf("restoration %d of a fight: %v slowed=%v (previous %v)", fightFree+i, d, slowed, wait)
		}
		wait = d
		waits = append(waits, d)
	}
	if wait != fightMaxDelay {
		t.Errorf("a long fight: waits %v, want the cap %v at the end", waits, fightMaxDelay)
	}
	if d := p.delay(now.Add(time.Millisecond)); d != fightMaxDelay {
		t.Errorf("an event right after a restoration in a long fight: %v, want %v", d, fightMaxDelay)
	}
	quiet := now.Add(fightMaxDelay + fightWindow + time.Second)
	if d := p.delay(quiet); d != debounce {
		t.Errorf("after a quiet window: %v, want %v", d, debounce)
	}
	if d, slowed := p.restored(quiet); slowed || d != debounce {
		t.Errorf("a restoration after a quiet window: %v slowed=%v, want %v", d, slowed, debounce)
	}
}

// TestRetryAfter: failed passes wait longer each time, up to the cap.
func TestRetryAfter(t *testing.T) {
	want := []time.Duration{retryDelay, 2 * retryDelay, 4 * retryDelay, 8 * retryDelay, 16 * retryDelay, fightMaxDelay, fightMaxDelay}
	for i, w := range want {
		if got := retryAfter(i + 1); got != w {
			t.Errorf("retryAfter(%d) = %v, want %v", i+1, got, w)
		}
	}
}

// TestConcerns: the events that start a pass are those about the
// device's link and addresses, routes in its table, tagged RouteProtocol
// or through it, and any rule; others are ignored.
func TestConcerns(t *testing.T) {
	d := &Device{index: 7, table: RouteTable}
	ne := binary.NativeEndian
	ifinfo := func(index int32) []byte {
		b := make([]byte, unix.SizeofIfInfomsg)
		ne.PutUint32(b[4:], uint32(index))
		return b
	}
	ifaddr := func(index uint32) []byte {
		b := make([]byte, unix.SizeofIfAddrmsg)
		ne.PutUint32(b[4:], index)
		return b
	}
	// rtmsg with a table byte, a protocol and optional u32 attributes.
	rt := func(table, proto byte, attrs ...uint32) []byte {
		b := make([]byte, unix.SizeofRtMsg)
		b[4], b[5] = table, proto
		for i := 0; i+1 < len(attrs); i += 2 {
			a := make([]byte, 8)
			ne.PutUint16(a[0:], 8)
			ne.PutUint16(a[2:], uint16(attrs[i]))
			ne.PutUint32(a[4:], attrs[i+1])
			b = append(b, a...)
		}
		return b
	}
	for _, c := range []struct {
		name string
		typ  uint16
		data []byte
		want bool
	}{
		{"our link", unix.RTM_NEWLINK, ifinfo(7), true},
		{"our link deleted", unix.RTM_DELLINK, ifinfo(7), true},
		{"another link", unix.RTM_NEWLINK, ifinfo(8), false},
		{"our address removed", unix.RTM_DELADDR, ifaddr(7), true},
		{"another link's address", unix.RTM_NEWADDR, ifaddr(3), false},
		{"a route in table 109", unix.RTM_DELROUTE, rt(RouteTable, unix.RTPROT_BOOT), true},
		{"a route tagged 109 elsewhere", unix.RTM_NEWROUTE, rt(unix.RT_TABLE_MAIN, byte(RouteProtocol)), true},
		{"a main route through the device", unix.RTM_NEWROUTE, rt(unix.RT_TABLE_MAIN, unix.RTPROT_BOOT, unix.RTA_OIF, 7), true},
		{"a route in a table past 255 that is 109's", unix.RTM_NEWROUTE, rt(unix.RT_TABLE_COMPAT, unix.RTPROT_BOOT, unix.RTA_TABLE, RouteTable), true},
		{"another table's route", unix.RTM_NEWROUTE, rt(200, unix.RTPROT_BOOT, unix.RTA_TABLE, 200, unix.RTA_OIF, 3), false},
		{"a main route elsewhere", unix.RTM_DELROUTE, rt(unix.RT_TABLE_MAIN, unix.RTPROT_KERNEL, unix.RTA_OIF, 3), false},
		{"any rule", unix.RTM_DELRULE, rt(unix.RT_TABLE_MAIN, 0), true},
		{"a neighbour", unix.RTM_NEWNEIGH, ifaddr(7), false},
		{"a truncated link message", unix.RTM_NEWLINK, []byte{0, 0}, false},
	} {
		m := &syscall.NetlinkMessage{Header: syscall.NlMsghdr{Type: c.typ}, Data: c.data}
		if got := d.concerns(m); got != c.want {
			t.Errorf("%s: concerns = %v, want %v", c.name, got, c.want)
		}
	}
}
