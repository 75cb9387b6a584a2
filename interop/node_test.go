package interop

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// nodeWait bounds every wait on a Node process: far above what any step
// needs, so a hang fails the test instead of blocking it.
const nodeWait = 60 * time.Second

// runNode runs `node testdata/<script> <config as JSON>` to its end and
// decodes the last line of its stdout into out. It returns the process's
// error (a non-zero exit included) after decoding what it printed.
func runNode(t *testing.T, script string, config any, out any) error {
	t.Helper()
	cfg, err := json.Marshal(config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), nodeWait)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "testdata/"+script, string(cfg))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("node %s did not finish within %v; stderr:\n%s", script, nodeWait, stderr.String())
	}
	if stderr.Len() > 0 {
		t.Logf("node %s stderr:\n%s", script, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	last := lines[len(lines)-1]
	if err := json.Unmarshal([]byte(last), out); err != nil {
		t.Fatalf("node %s printed %q: %v (exit: %v)", script, stdout.String(), err, runErr)
	}
	return runErr
}

// nodeProc is a long-running Node script that reports events as JSON
// lines on stdout. It is killed at cleanup; closing its stdin also makes
// it exit.
type nodeProc struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.Closer
	events chan json.RawMessage // every stdout line; closed at exit
	stderr *lockedBuffer
}

// startNode starts `node testdata/<script> <config as JSON>`.
func startNode(t *testing.T, script string, config any) *nodeProc {
	t.Helper()
	cfg, err := json.Marshal(config)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("node", "testdata/"+script, string(cfg))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &nodeProc{t: t, cmd: cmd, stdin: stdin, events: make(chan json.RawMessage, 4096), stderr: &lockedBuffer{}}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	read := make(chan struct{})
	go func() {
		defer close(read)
		defer close(p.events)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			p.events <- json.RawMessage(bytes.Clone(sc.Bytes()))
		}
	}()
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		<-read
		cmd.Wait()
		if s := p.stderr.String(); s != "" {
			t.Logf("node %s stderr:\n%s", script, s)
		}
	})
	return p
}

// next waits for the next event and decodes it into out.
func (p *nodeProc) next(out any) {
	p.t.Helper()
	select {
	case ev, ok := <-p.events:
		if !ok {
			p.t.Fatalf("node exited; stderr:\n%s", p.stderr.String())
		}
		if err := json.Unmarshal(ev, out); err != nil {
			p.t.Fatalf("event %s: %v", ev, err)
		}
	case <-time.After(nodeWait):
		p.t.Fatal("no event from node in time")
	}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
