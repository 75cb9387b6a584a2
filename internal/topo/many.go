package topo

import (
	"context"
	"fmt"
	"net/netip"
)

// AddLocalPrefix makes every address of p local to the node at once (the
// "AnyIP" route: `ip route add local p dev lo`). A server listening on the
// wildcard address then accepts connections to any of them: thousands of
// distinct destination IPs without thousands of `ip addr add`.
func (n *Node) AddLocalPrefix(p netip.Prefix) error {
	args := []string{"route", "replace", "local", p.String(), "dev", "lo"}
	if p.Addr().Is6() {
		args = append([]string{"-6"}, args...)
	}
	return n.IP(args...)
}

// RouteVia routes p over the veth to peer, with no gateway (what Direct
// does for the workload CIDRs, for any other prefix).
func (n *Node) RouteVia(p netip.Prefix, peer *Node) error {
	via := peer.VethIP4
	args := []string{"route", "replace", p.String(), "via"}
	if p.Addr().Is6() {
		via = peer.VethIP6
		args = append([]string{"-6"}, args...)
	}
	return n.IP(append(args, via.String())...)
}

// Sysctl sets a sysctl inside the node's namespace (net.* keys are per
// namespace), e.g. Sysctl("net.ipv4.ip_local_port_range", "1024 65535").
func (n *Node) Sysctl(key, value string) error {
	cmd := n.Command(context.Background(), "sysctl", "-q", "-w", key+"="+value)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("topo: sysctl %s=%s in %s: %v: %s", key, value, n.Name, err, out)
	}
	return nil
}
