package topo

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// lossTable is the nftables table DropPercent adds; one per namespace.
const lossTable = "meshtun_loss"

// LossAvailable reports why DropPercent cannot work here (no `nft`), or
// nil. tc netem is not available in the kernels the tests run on, so
// packet loss is an nftables rule.
func LossAvailable() error {
	if _, err := exec.LookPath("nft"); err != nil {
		return fmt.Errorf("topo: packet loss needs nft (Debian package nftables): %w", err)
	}
	return nil
}

// lossGSO is the largest segment the veth ends hand down while packets
// are dropped: one MTU, so that a drop loses one segment, as on a wire,
// not a 64 KiB GSO super-packet that stands for 44 of them.
const lossGSO = 1500

// DropPercent makes node B drop pct percent of the TCP packets that cross
// its veth, in each direction, at random (nftables `numgen random`,
// counted). Both directions of every connection between the nodes then
// lose packets: data and ACKs, SYNs and FINs. Both veth ends send
// segments of one MTU meanwhile (lossGSO). Dropped reports how many
// packets the rules dropped; Close removes them and restores the segment
// size (the namespaces' removal does too).
func (t *Topology) DropPercent(pct int) (*Loss, error) {
	n := t.B
	if pct < 1 || pct > 99 {
		return nil, fmt.Errorf("topo: drop %d%%: want 1..99", pct)
	}
	if err := LossAvailable(); err != nil {
		return nil, err
	}
	for _, nd := range []*Node{t.A, t.B} {
		if err := nd.IP("link", "set", nd.Veth, "gso_max_size", strconv.Itoa(lossGSO)); err != nil {
			return nil, err
		}
	}
	l := &Loss{topo: t}
	script := fmt.Sprintf(`table inet %[1]s {
	chain in {
		type filter hook input priority 0; policy accept;
		iifname %[2]q meta l4proto tcp numgen random mod 100 < %[3]d counter drop
	}
	chain out {
		type filter hook output priority 0; policy accept;
		oifname %[2]q meta l4proto tcp numgen random mod 100 < %[3]d counter drop
	}
}
`, lossTable, n.Veth, pct)
	cmd := n.Command(context.Background(), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		l.Close()
		return nil, fmt.Errorf("topo: nft in %s: %v: %s", n.Name, err, out)
	}
	return l, nil
}

// Loss is DropPercent's rule set in one node.
type Loss struct {
	topo *Topology
	once sync.Once
	err  error
}

var nftPackets = regexp.MustCompile(`counter packets (\d+)`)

// Dropped is the number of packets the rules have dropped so far.
func (l *Loss) Dropped() (int64, error) {
	n := l.topo.B
	out, err := n.Command(context.Background(), "nft", "list", "table", "inet", lossTable).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("topo: nft list in %s: %v: %s", n.Name, err, out)
	}
	var sum int64
	for _, m := range nftPackets.FindAllSubmatch(out, -1) {
		v, err := strconv.ParseInt(string(m[1]), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("topo: nft counter %q: %w", m[1], err)
		}
		sum += v
	}
	return sum, nil
}

// Close removes the rules and restores the veth ends' segment size. It
// may be called more than once.
func (l *Loss) Close() error {
	l.once.Do(func() {
		var errs []error
		n := l.topo.B
		out, err := n.Command(context.Background(), "nft", "delete", "table", "inet", lossTable).CombinedOutput()
		if err != nil && !strings.Contains(string(out), "No such file") {
			errs = append(errs, fmt.Errorf("topo: nft delete in %s: %v: %s", n.Name, err, out))
		}
		for _, nd := range []*Node{l.topo.A, l.topo.B} {
			if err := nd.IP("link", "set", nd.Veth, "gso_max_size", "65536"); err != nil {
				errs = append(errs, err)
			}
		}
		l.err = errors.Join(errs...)
	})
	return l.err
}
