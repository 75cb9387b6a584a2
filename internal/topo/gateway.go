package topo

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Gateway is a meshtun process running inside a node.
type Gateway struct {
	Node *Node
	cmd  *exec.Cmd
	done chan struct{}
	err  error // valid after done

	mu      sync.Mutex
	logs    []string
	newLine chan struct{} // closed and replaced on every new line
}

// StartGateway runs `bin run --config config` inside node. Its stderr (the
// log) is kept, and copied line by line to logw if not nil.
func (n *Node) StartGateway(bin, config string, logw io.Writer) (*Gateway, error) {
	g := &Gateway{Node: n, done: make(chan struct{}), newLine: make(chan struct{})}
	g.cmd = n.Command(context.Background(), bin, "run", "--config", config)
	stderr, err := g.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	g.cmd.Stdout = g.cmd.Stderr
	if err := g.cmd.Start(); err != nil {
		return nil, fmt.Errorf("topo: start gateway in %s: %w", n.Name, err)
	}
	logsDone := make(chan struct{})
	go func() {
		defer close(logsDone)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			g.mu.Lock()
			g.logs = append(g.logs, line)
			close(g.newLine)
			g.newLine = make(chan struct{})
			g.mu.Unlock()
			if logw != nil {
				fmt.Fprintf(logw, "[%s] %s\n", n.Name, line)
			}
		}
	}()
	go func() {
		<-logsDone // Wait must not run before the pipe is drained
		g.err = g.cmd.Wait()
		close(g.done)
	}()
	return g, nil
}

// Logs returns the lines the gateway has logged so far.
func (g *Gateway) Logs() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.logs...)
}

// LogsContaining returns the logged lines that contain s.
func (g *Gateway) LogsContaining(s string) []string {
	var out []string
	for _, l := range g.Logs() {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return out
}

// WaitLog waits until the gateway has logged a line containing s, and
// returns it; or fails when ctx ends or the process exits.
func (g *Gateway) WaitLog(ctx context.Context, s string) (string, error) {
	seen := 0
	for {
		g.mu.Lock()
		lines, wake := g.logs[seen:], g.newLine
		seen = len(g.logs)
		g.mu.Unlock()
		for _, l := range lines {
			if strings.Contains(l, s) {
				return l, nil
			}
		}
		select {
		case <-wake:
		case <-g.done:
			return "", fmt.Errorf("topo: gateway in %s exited without logging %q", g.Node.Name, s)
		case <-ctx.Done():
			return "", fmt.Errorf("topo: gateway in %s did not log %q: %w", g.Node.Name, s, ctx.Err())
		}
	}
}

// WaitReady polls the gateway's readiness endpoint (addr, inside the node)
// until it answers 200, the process exits, or ctx ends.
func (g *Gateway) WaitReady(ctx context.Context, addr string) error {
	client := &http.Client{
		Timeout: time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
				return g.Node.Dial(ctx, network, a)
			},
			DisableKeepAlives: true,
		},
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		resp, err := client.Get("http://" + addr + "/healthz/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-g.done:
			return fmt.Errorf("topo: gateway in %s exited before it was ready: %v\n%s", g.Node.Name, g.err, strings.Join(g.Logs(), "\n"))
		case <-ctx.Done():
			return fmt.Errorf("topo: gateway in %s not ready: %w (last: %v)", g.Node.Name, ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// Stop sends SIGTERM and waits for the process to drain and exit, up to
// timeout; then it is killed. It returns the process's exit error.
func (g *Gateway) Stop(timeout time.Duration) error {
	select {
	case <-g.done:
		return g.err
	default:
	}
	g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.done:
		return g.err
	case <-time.After(timeout):
		g.cmd.Process.Kill()
		<-g.done
		return fmt.Errorf("topo: gateway in %s did not stop within %v after SIGTERM; killed", g.Node.Name, timeout)
	}
}

// Kill sends SIGKILL, as a crash or the OOM killer would: no drain, no
// cleanup of the device's routes and rules (the kernel removes the TUN
// with the process's last descriptor and resets its sockets). It waits
// for the process to be gone, up to 10 s. Stop on a killed gateway
// returns the kill's exit error.
func (g *Gateway) Kill() error {
	select {
	case <-g.done:
		return fmt.Errorf("topo: gateway in %s had exited already: %v", g.Node.Name, g.err)
	default:
	}
	if err := g.cmd.Process.Kill(); err != nil {
		return fmt.Errorf("topo: kill gateway in %s: %w", g.Node.Name, err)
	}
	select {
	case <-g.done:
		return nil
	case <-time.After(10 * time.Second): // SIGKILL is not deferred; this is a stuck kernel
		return fmt.Errorf("topo: gateway in %s still running 10 s after SIGKILL", g.Node.Name)
	}
}

// Signal sends sig to the process without waiting.
func (g *Gateway) Signal(sig syscall.Signal) error {
	return g.cmd.Process.Signal(sig)
}

// Exited is closed when the process has ended.
func (g *Gateway) Exited() <-chan struct{} { return g.done }
