package topo

// PID is the gateway's process id. `ip netns exec` replaces itself with the
// command (execvp, no fork), so this is meshtun's own process: /proc/<PID>
// has its CPU times and resident memory (the bench reads them).
func (g *Gateway) PID() int { return g.cmd.Process.Pid }
