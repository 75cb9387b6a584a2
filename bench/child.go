package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/meshtun/meshtun/bench/relay"
	"github.com/meshtun/meshtun/internal/topo"
)

// The idle scenario holds 10,000 flows open, and both of their ends would
// be sockets of this process: twice the file descriptors that many
// machines allow one process (RLIMIT_NOFILE's hard limit, which only
// CAP_SYS_RESOURCE may raise). So the server end of those flows is a
// helper: this same executable, started inside node B with childEnv set,
// serving echo until its stdin closes.
const childEnv = "MESHTUN_BENCH_ECHO_SERVER"

// IdlePort is where the helper serves echo in node B.
const IdlePort = 7103

// Child runs the helper server if this process was started as one, and
// then reports true with the exit code. main and TestMain call it first:
//
//	if code, ok := bench.Child(); ok { os.Exit(code) }
func Child() (code int, ok bool) {
	if fwds := os.Getenv(relayEnv); fwds != "" {
		return relayChild(fwds), true
	}
	addr := os.Getenv(childEnv)
	if addr == "" {
		return 0, false
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench helper:", err)
		return 1, true
	}
	s := &Server{ls: []net.Listener{l}}
	s.wg.Add(1)
	go s.accept(l, serveEcho)
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin) // returns when the parent closes it or dies
	s.Close()
	return 0, true
}

// helper is a running child process: the echo helper, or a peer's proxy.
type helper struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

// pid is the child's process id (ip netns exec execs the command: the
// same process).
func (h *helper) pid() int { return h.cmd.Process.Pid }

// helperTimeout bounds the helper's start and its exit.
const helperTimeout = 10 * time.Second

// startHelper starts the echo helper in node B of p and waits until it
// listens.
func startHelper(ctx context.Context, p *path) (*helper, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("bench: helper: %w", err)
	}
	h, err := startChild(ctx, p.tp.B, []string{fmt.Sprintf("%s=0.0.0.0:%d", childEnv, IdlePort)}, os.Stderr, exe)
	if err != nil {
		return nil, fmt.Errorf("bench: helper server in %s: %w", p.tp.B.Name, err)
	}
	return h, nil
}

// startChild runs name with args in node n, with env added to ours and
// its stderr to stderr, and waits (bounded) for the line "ready" on its
// stdout, which every child prints once it listens; earlier lines are
// skipped. The child runs until its stdin closes (stop).
func startChild(ctx context.Context, n *topo.Node, env []string, stderr io.Writer, name string, args ...string) (*helper, error) {
	cmd := n.Command(context.Background(), name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	h := &helper{cmd: cmd, stdin: stdin}
	ready := make(chan error, 1)
	go func() {
		r := bufio.NewReader(stdout)
		for i := 0; ; i++ {
			line, err := r.ReadString('\n')
			if err != nil {
				ready <- fmt.Errorf("exited before it was ready (%v)", err)
				return
			}
			if line == "ready\n" {
				break
			}
			if i == 1000 {
				ready <- fmt.Errorf("said %q, not ready", line)
				return
			}
		}
		ready <- nil
		io.Copy(io.Discard, stdout)
	}()
	select {
	case err = <-ready:
	case <-time.After(helperTimeout):
		err = fmt.Errorf("not ready after %v", helperTimeout)
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		h.stop()
		return nil, fmt.Errorf("%s in %s: %w", filepath.Base(name), n.Name, err)
	}
	return h, nil
}

// stop closes the helper's stdin (it closes its flows and exits) and
// waits for it, killing it after helperTimeout.
func (h *helper) stop() {
	h.stdin.Close()
	done := make(chan struct{})
	go func() { h.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(helperTimeout):
		h.cmd.Process.Kill()
		<-done
	}
}

// relayEnv starts this executable as one relay of the plain relay pair:
// its value is relay.ParseForwards' LISTEN=DIAL,… .
const relayEnv = "MESHTUN_BENCH_RELAY"

// relayChild relays every connection to the forwards' listeners until
// stdin closes, and says on stderr how many failed.
func relayChild(forwards string) int {
	fwds, err := relay.ParseForwards(forwards)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench relay:", err)
		return 1
	}
	s := relay.NewServer()
	for _, f := range fwds {
		l, err := net.Listen("tcp", f.Listen)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench relay:", err)
			s.Close()
			return 1
		}
		s.Serve(l, relay.DialTCP(f.Dial, dialTimeout))
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin) // returns when the parent closes it or dies
	errs := s.Errors()
	s.Close()
	for _, err := range errs {
		fmt.Fprintln(os.Stderr, "bench relay:", err)
	}
	if len(errs) > 0 {
		return 1
	}
	return 0
}
