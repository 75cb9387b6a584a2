package topo

import (
	"context"
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

// DropPercent makes the node drop pct percent of the TCP packets that
// cross its veth, in each direction, at random (nftables `numgen random`,
// counted). Both directions of every connection between the nodes then
// lose packets: data and ACKs, SYNs and FINs. Dropped reports how many
// packets the rules dropped; Close removes them (the namespace's removal
// does too).
func (n *Node) DropPercent(pct int) (*Loss, error) {
	if pct < 1 || pct > 99 {
		return nil, fmt.Errorf("topo: drop %d%%: want 1..99", pct)
	}
	if err := LossAvailable(); err != nil {
		return nil, err
	}
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
		return nil, fmt.Errorf("topo: nft in %s: %v: %s", n.Name, err, out)
	}
	return &Loss{node: n}, nil
}

// Loss is DropPercent's rule set in one node.
type Loss struct {
	node *Node
	once sync.Once
	err  error
}

var nftPackets = regexp.MustCompile(`counter packets (\d+)`)

// Dropped is the number of packets the rules have dropped so far.
func (l *Loss) Dropped() (int64, error) {
	out, err := l.node.Command(context.Background(), "nft", "list", "table", "inet", lossTable).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("topo: nft list in %s: %v: %s", l.node.Name, err, out)
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

// Close removes the rules. It may be called more than once.
func (l *Loss) Close() error {
	l.once.Do(func() {
		if out, err := l.node.Command(context.Background(), "nft", "delete", "table", "inet", lossTable).CombinedOutput(); err != nil {
			l.err = fmt.Errorf("topo: nft delete in %s: %v: %s", l.node.Name, err, out)
		}
	})
	return l.err
}
