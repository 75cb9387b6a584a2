package topo

import (
	"context"
	"fmt"
	"strings"
)

// Established counts the established TCP connections in n whose local
// port is port (for node B's :15008, the HBONE connections the pool made),
// as `ss` sees them.
func (n *Node) Established(ctx context.Context, port int) (int, error) {
	out, err := n.Command(ctx, "ss", "-Htn", "state", "established", fmt.Sprintf("( sport = :%d )", port)).Output()
	if err != nil {
		return 0, fmt.Errorf("topo: ss in %s: %w", n.Name, err)
	}
	count := 0
	for _, l := range strings.Split(string(out), "\n") {
		if strings.TrimSpace(l) != "" {
			count++
		}
	}
	return count, nil
}
