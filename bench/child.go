package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"time"
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
	addr := os.Getenv(childEnv)
	if addr == "" {
		return 0, false
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench helper:", err)
		return 1, true
	}
	s := &Server{conns: map[net.Conn]struct{}{}, ls: []net.Listener{l}}
	s.wg.Add(1)
	go s.accept(l, serveEcho)
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin) // returns when the parent closes it or dies
	s.Close()
	return 0, true
}

// helper is a running helper server.
type helper struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

// helperTimeout bounds the helper's start and its exit.
const helperTimeout = 10 * time.Second

// startHelper starts the echo helper in node B of p and waits until it
// listens.
func startHelper(ctx context.Context, p *path) (*helper, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("bench: helper: %w", err)
	}
	cmd := p.tp.B.Command(context.Background(), exe)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=0.0.0.0:%d", childEnv, IdlePort))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: start helper: %w", err)
	}
	h := &helper{cmd: cmd, stdin: stdin}
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err == nil && line != "ready\n" {
			err = fmt.Errorf("said %q", line)
		}
		ready <- err
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
		return nil, fmt.Errorf("bench: helper server in %s: %w", p.tp.B.Name, err)
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
