// Package topo builds the standard two-node topology that meshtun's
// end-to-end tests, `make demo` and the bench share:
//
//	ns A                                               ns B
//	client ── route 10.244.2.0/24 ──▶ TUN ─ gateway A ══ veth 192.0.2.1 ↔ 192.0.2.2 ══ gateway B :15008 ── server 10.244.2.5
//
// Each node has a veth end (IPv4 and IPv6) and its workload addresses on
// its loopback device (node A 10.244.1.5, node B 10.244.2.5, and IPv6
// twins). The gateways themselves are not part of the topology: the caller
// starts them (see Gateway). Without gateways the same topology is the
// kernel baseline: route the workload CIDRs over the veth with Direct.
//
// Everything runs as root. Namespaces are named "<prefix>-<pid>-a" and
// "...-b" so concurrent users do not collide, and Close removes them (and
// with them every device inside).
package topo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"

	"github.com/vishvananda/netns"
)

// Node is one side of the topology: a network namespace.
type Node struct {
	Name string // "node-a" or "node-b"
	NS   string // network namespace name
	Veth string // this node's end of the veth pair: "veth-a" or "veth-b"

	VethIP4, VethIP6 netip.Addr // this node's veth addresses
	// Workload4 and Workload6 are a workload address of this node, on lo,
	// inside WorkloadCIDR4 / WorkloadCIDR6.
	Workload4, Workload6         netip.Addr
	WorkloadCIDR4, WorkloadCIDR6 netip.Prefix
	// TUNAddr4 and TUNAddr6 are what a gateway's TUN on this node is given.
	TUNAddr4, TUNAddr6 netip.Prefix
}

// Topology is two nodes joined by a veth pair.
type Topology struct {
	A, B *Node
}

// Fixed addresses of the standard topology (documentation and private
// ranges that exist only inside the namespaces).
func nodes(prefix string) (*Node, *Node) {
	id := fmt.Sprintf("%s-%d", prefix, os.Getpid())
	a := &Node{
		Name: "node-a", NS: id + "-a",
		VethIP4: netip.MustParseAddr("192.0.2.1"), VethIP6: netip.MustParseAddr("2001:db8::1"),
		Workload4: netip.MustParseAddr("10.244.1.5"), Workload6: netip.MustParseAddr("fd00:10:244:1::5"),
		WorkloadCIDR4: netip.MustParsePrefix("10.244.1.0/24"), WorkloadCIDR6: netip.MustParsePrefix("fd00:10:244:1::/64"),
		TUNAddr4: netip.MustParsePrefix("100.64.0.1/32"), TUNAddr6: netip.MustParsePrefix("fd00:100:64::1/128"),
	}
	b := &Node{
		Name: "node-b", NS: id + "-b",
		VethIP4: netip.MustParseAddr("192.0.2.2"), VethIP6: netip.MustParseAddr("2001:db8::2"),
		Workload4: netip.MustParseAddr("10.244.2.5"), Workload6: netip.MustParseAddr("fd00:10:244:2::5"),
		WorkloadCIDR4: netip.MustParsePrefix("10.244.2.0/24"), WorkloadCIDR6: netip.MustParsePrefix("fd00:10:244:2::/64"),
		TUNAddr4: netip.MustParsePrefix("100.64.0.2/32"), TUNAddr6: netip.MustParsePrefix("fd00:100:64::2/128"),
	}
	return a, b
}

// ErrNotPermitted means the machine does not let us build namespaces (not
// root, or no iproute2); callers skip rather than fail.
var ErrNotPermitted = errors.New("topo: needs root, /dev/net/tun and iproute2 ('ip')")

// Available reports why the topology cannot be built here, or nil.
func Available() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: not running as root", ErrNotPermitted)
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		return fmt.Errorf("%w: %v", ErrNotPermitted, err)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("%w: %v", ErrNotPermitted, err)
	}
	return nil
}

// New builds the topology. prefix names the namespaces; keep it short
// (e.g. "mte2e"). On error, whatever was built is removed.
func New(prefix string) (t *Topology, err error) {
	if err := Available(); err != nil {
		return nil, err
	}
	a, b := nodes(prefix)
	t = &Topology{A: a, B: b}
	// Remove leftovers of a crashed run with the same pid (rare, harmless).
	t.Close()
	defer func() {
		if err != nil {
			t.Close()
		}
	}()
	vethA, vethB := "veth-"+a.Name[5:], "veth-"+b.Name[5:] // veth-a, veth-b
	a.Veth, b.Veth = vethA, vethB
	steps := [][]string{
		{"netns", "add", a.NS},
		{"netns", "add", b.NS},
		{"link", "add", vethA, "netns", a.NS, "type", "veth", "peer", "name", vethB, "netns", b.NS},
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			return nil, err
		}
	}
	for _, n := range []struct {
		node *Node
		veth string
		peer *Node
	}{{a, vethA, b}, {b, vethB, a}} {
		nd := n.node
		cmds := [][]string{
			{"link", "set", "lo", "up"},
			{"addr", "add", n.node.VethIP4.String() + "/24", "dev", n.veth},
			{"addr", "add", n.node.VethIP6.String() + "/64", "dev", n.veth, "nodad"},
			{"link", "set", n.veth, "up"},
			{"addr", "add", nd.Workload4.String() + "/32", "dev", "lo"},
			{"addr", "add", nd.Workload6.String() + "/128", "dev", "lo", "nodad"},
		}
		for _, c := range cmds {
			if err := nd.IP(c...); err != nil {
				return nil, err
			}
		}
	}
	return t, nil
}

// Direct routes each node's workload CIDRs over the veth, with no gateway:
// the kernel baseline.
func (t *Topology) Direct() error {
	for _, p := range []struct{ from, to *Node }{{t.A, t.B}, {t.B, t.A}} {
		if err := p.from.IP("route", "replace", p.to.WorkloadCIDR4.String(), "via", p.to.VethIP4.String()); err != nil {
			return err
		}
		if err := p.from.IP("-6", "route", "replace", p.to.WorkloadCIDR6.String(), "via", p.to.VethIP6.String()); err != nil {
			return err
		}
	}
	return nil
}

// Close removes both namespaces and everything in them. It may be called
// more than once.
func (t *Topology) Close() error {
	var errs []error
	for _, n := range []*Node{t.A, t.B} {
		if _, err := os.Stat("/run/netns/" + n.NS); err != nil {
			continue
		}
		if err := ip("netns", "del", n.NS); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("topo: ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// IP runs `ip ARGS...` inside the node's namespace.
func (n *Node) IP(args ...string) error {
	return ip(append([]string{"-n", n.NS}, args...)...)
}

// Command is name with args, to be run inside the node's namespace.
func (n *Node) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.NS, name}, args...)...)
}

// Do runs fn on an OS thread that has entered the node's namespace.
// Sockets created inside fn belong to the namespace for their whole life,
// so a test process can be a client in one node and a server in the other.
func (n *Node) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		target, err := netns.GetFromName(n.NS)
		if err != nil {
			errc <- fmt.Errorf("topo: open namespace %s: %w", n.NS, err)
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			errc <- fmt.Errorf("topo: enter namespace %s: %w", n.NS, err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err == nil {
			// Back home: the thread may serve other goroutines again.
			// Otherwise it stays locked and the runtime retires it.
			runtime.UnlockOSThread()
		}
		errc <- ferr
	}()
	return <-errc
}

// Dial opens a connection from inside the node.
func (n *Node) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Listen opens a listener inside the node.
func (n *Node) Listen(network, addr string) (net.Listener, error) {
	var l net.Listener
	err := n.Do(func() error {
		var err error
		l, err = net.Listen(network, addr)
		return err
	})
	return l, err
}
