package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/meshtun/meshtun/internal/topo"
	"github.com/meshtun/meshtun/internal/xfer"
)

// faultNet is the two-node setup whose gateways the fault tests kill,
// stop and start again.
type faultNet struct {
	top      *testing.T // the gateways' logs go to the top test: they outlive subtests
	bin, dir string
	tp       *topo.Topology
	gwA, gwB *topo.Gateway
	all      []*topo.Gateway
	killed   map[*topo.Gateway]bool
	received atomic.Int64 // bytes the xfer server in node B has read
}

// The drain timeouts of the fault tests. Node B's is short: the graceful
// restart waits it out for a flow that does not end. Node A's is far above
// what its clients' 64 KiB transfers need on a loaded machine: a restart
// of A must let every flow it accepted finish.
const (
	faultDrainA = "10s"
	faultDrainB = "3s"
)

func setupFaults(t *testing.T) *faultNet {
	bin, dir, tp := twoNodes(t, "mtflt", func(n, s string) string {
		drain := faultDrainA
		if n == "node-b" {
			drain = faultDrainB
		}
		return strings.Replace(s, `drain_timeout = "5s"`, `drain_timeout = "`+drain+`"`, 1)
	})
	f := &faultNet{top: t, bin: bin, dir: dir, tp: tp, killed: map[*topo.Gateway]bool{}}
	// Registered after the topology's removal, so it runs before it.
	t.Cleanup(func() {
		for i := len(f.all) - 1; i >= 0; i-- {
			g := f.all[i]
			if err := g.Stop(15 * time.Second); err != nil && !f.killed[g] {
				t.Errorf("gateway %s: %v", g.Node.Name, err)
			}
		}
	})
	f.gwB = f.start(t, tp.B)
	f.gwA = f.start(t, tp.A)
	return f
}

// start runs a gateway in n from its config and waits until it is ready.
func (f *faultNet) start(t *testing.T, n *topo.Node) *topo.Gateway {
	t.Helper()
	g, err := n.StartGateway(f.bin, filepath.Join(f.dir, n.Name+".toml"), testLogWriter{f.top})
	if err != nil {
		t.Fatal(err)
	}
	f.all = append(f.all, g)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := g.WaitReady(ctx, "127.0.0.1:15021"); err != nil {
		t.Fatal(err)
	}
	return g
}

// serve starts an xfer server in node B on addr that counts what it reads
// into f.received; closed at cleanup.
func (f *faultNet) serve(t *testing.T, addr string) {
	t.Helper()
	l, err := f.tp.B.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { xfer.Serve(byteCounter{l, &f.received}); close(done) }()
	t.Cleanup(func() { l.Close(); <-done })
}

func (f *faultNet) dialA(addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return f.tp.A.Dial(ctx, "tcp", addr)
}

// transfer moves up bytes to addr and down bytes back, both checked,
// within a minute.
func (f *faultNet) transfer(addr string, up, down int64) error {
	c, err := f.dialA(addr)
	if err != nil {
		return fmt.Errorf("dial %s: %w", addr, err)
	}
	c.SetDeadline(time.Now().Add(time.Minute))
	_, err = xfer.Run(c, up, down)
	return err
}

// startGated begins a transfer of size bytes (1 back) to addr whose client
// may send only its first `first` bytes until the gate is opened, and
// returns once the server has read them. The transfer's result arrives
// on the channel; its connection has a 60 s deadline, and cleanup opens
// the gate and waits for the result.
func (f *faultNet) startGated(t *testing.T, addr string, size, first int64) (*gatedConn, <-chan error) {
	t.Helper()
	before := f.received.Load()
	c, err := f.dialA(addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	c.SetDeadline(time.Now().Add(time.Minute))
	gc := &gatedConn{TCPConn: c.(*net.TCPConn), limit: first}
	gc.cond = sync.NewCond(&gc.mu)
	res := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, err := xfer.Run(gc, size, 1)
		res <- err
	}()
	t.Cleanup(func() {
		gc.open(math.MaxInt64) // the writer may still be parked at the gate
		c.Close()
		<-done
	})
	want := before + first // the gate counts the reply-size header too
	waitFor(t, "the server reads the first bytes of the transfer", 15*time.Second, func() bool {
		return f.received.Load() >= want
	})
	return gc, res
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(10 * time.Millisecond) // polling the condition; bounded by deadline
	}
}

// isReset reports whether err is the end of a connection by a TCP RST:
// ECONNRESET on a read, EPIPE on a write after it.
func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// poolConns is node A's meshtun_hbone_pool_connections_open.
func (f *faultNet) poolConns(t *testing.T) float64 {
	return promSum(scrapeNode(t, f.tp.A, "/metrics"), "meshtun_hbone_pool_connections_open", nil)
}

// waitResult waits for a flow's result, up to timeout.
func waitResult(t *testing.T, res <-chan error, timeout time.Duration, what string) error {
	t.Helper()
	select {
	case err := <-res:
		return err
	case <-time.After(timeout):
		t.Fatalf("%s: no result within %v", what, timeout)
		return nil
	}
}

// peerResetBound is how soon a client in node A must see the reset of a
// flow whose peer gateway died: a dead peer's kernel resets the HBONE
// connection at once, so this is only a bound for a loaded CI machine,
// well under the 30 s the HBONE keepalive (10 s + 20 s) would take.
const peerResetBound = 10 * time.Second

// TestEndToEndFaults: the faults of issue 12 with the real binaries in the
// two-node topology. Each subtest states its load and its pass criterion.
func TestEndToEndFaults(t *testing.T) {
	f := setupFaults(t)
	target := f.tp.B.Workload4.String() + ":7001"
	f.serve(t, target)
	if err := f.transfer(target, 1<<20, 1<<20); err != nil {
		t.Fatalf("first transfer: %v", err)
	}

	// Load: one transfer of 64 MiB held after its first MiB. Pass: when
	// node B's gateway is killed, the client sees a reset within
	// peerResetBound; a new flow while B is down is refused; once B runs
	// again (started as it is, without `meshtun cleanup`), new flows work
	// through the same gateway A (same process), whose pool dropped the
	// dead connection. Killed again with the connection idle in A's pool:
	// the pool drops it within peerResetBound, and the first flow once B
	// is back succeeds.
	t.Run("peer killed mid-transfer", func(t *testing.T) {
		pidA := f.gwA.PID()
		_, res := f.startGated(t, target, 64<<20, 1<<20)
		start := time.Now()
		if err := f.gwB.Kill(); err != nil {
			t.Fatal(err)
		}
		f.killed[f.gwB] = true
		err := waitResult(t, res, peerResetBound, "the flow through the killed peer")
		if err == nil || !isReset(err) {
			t.Fatalf("the flow through the killed peer ended with %v, want a reset", err)
		}
		t.Logf("the client saw %v %v after the kill", err, time.Since(start).Round(time.Millisecond))

		if _, err := f.dialA(target); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("a new flow while node B is down: %v, want connection refused", err)
		}
		// No `meshtun cleanup` first: the new gateway takes over the
		// bypass rules the killed one left.
		f.gwB = f.start(t, f.tp.B)
		if len(f.gwB.LogsContaining("bypass rule left by an earlier run")) == 0 {
			t.Error("node B's new gateway did not say it took over the killed one's bypass rules")
		}
		if err := f.transfer(target, 1<<20, 1<<20); err != nil {
			t.Fatalf("a new flow after node B is back: %v", err)
		}
		if f.gwA.PID() != pidA {
			t.Fatal("gateway A was restarted")
		}
		select {
		case <-f.gwA.Exited():
			t.Fatal("gateway A exited")
		default:
		}
		waitFor(t, "node A's pool holds one connection (the dead one dropped)", 15*time.Second, func() bool {
			return f.poolConns(t) == 1
		})

		// Killed again while that connection is idle in A's pool: once B
		// is back, the first new flow must not be handed the dead
		// connection (A's pool saw it close and dropped it).
		if err := f.gwB.Kill(); err != nil {
			t.Fatal(err)
		}
		f.killed[f.gwB] = true
		waitFor(t, "node A's pool drops the idle connection to the killed peer", peerResetBound, func() bool {
			return f.poolConns(t) == 0
		})
		f.gwB = f.start(t, f.tp.B)
		if err := f.transfer(target, 1<<20, 1<<20); err != nil {
			t.Fatalf("the first flow after node B, killed with the pool idle, is back: %v", err)
		}
	})

	// Load: one transfer held after its first MiB, one idle echo flow.
	// Pass: SIGTERM to node B's gateway lets the transfer finish intact
	// during the drain, a new flow meanwhile is refused, the idle flow is
	// reset at the drain timeout, B exits cleanly; once B runs again new
	// flows work through the same gateway A.
	t.Run("peer restarted gracefully", func(t *testing.T) {
		echo := f.tp.B.Workload4.String() + ":7003"
		echoServer(t, f.tp.B, echo)
		gc, res := f.startGated(t, target, 2<<20, 1<<20)
		idle := dialEcho(t, f.tp.A, echo)
		defer idle.Close()
		if err := echoOnce(idle, "before the restart"); err != nil {
			t.Fatal(err)
		}
		stopped := make(chan error, 1)
		gwB := f.gwB
		go func() { stopped <- gwB.Stop(30 * time.Second) }()
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if _, err := gwB.WaitLog(ctx, "draining"); err != nil {
			t.Fatal(err)
		}
		if _, err := f.dialA(target); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("a new flow while node B drains: %v, want connection refused", err)
		}
		gc.open(math.MaxInt64)
		if err := waitResult(t, res, 30*time.Second, "the open transfer during the drain"); err != nil {
			t.Fatalf("the transfer open when node B began to drain: %v", err)
		}
		idle.SetReadDeadline(time.Now().Add(30 * time.Second))
		if _, err := idle.Read(make([]byte, 1)); !isReset(err) {
			t.Fatalf("the idle flow after node B's drain: %v, want a reset", err)
		}
		if err := waitResult(t, stopped, 40*time.Second, "node B's stop"); err != nil {
			t.Fatalf("node B's graceful stop: %v", err)
		}
		f.gwB = f.start(t, f.tp.B)
		if err := f.transfer(target, 1<<20, 1<<20); err != nil {
			t.Fatalf("a new flow after node B is back: %v", err)
		}
	})

	// Load: one flow each way, 64 KiB before the reset. Pass: a server in
	// node B that resets its connection (SO_LINGER 0) makes the client in
	// node A read ECONNRESET, not a clean EOF, after all the data sent
	// before it; a client in A that resets makes the server read
	// ECONNRESET. docs/hbone.md, "Ending a stream": a TCP RST at one end
	// becomes RST_STREAM(CONNECT_ERROR), then a RST at the other.
	t.Run("target resets mid-stream", func(t *testing.T) {
		const before = 64 << 10
		for _, dir := range []string{"server resets", "client resets"} {
			addr := f.tp.B.Workload4.String() + ":7002"
			l, err := f.tp.B.Listen("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			received := make(chan struct{}) // the receiving end has all the data
			serverErr := make(chan error, 1)
			go func() { serverErr <- resettingServer(l, dir == "server resets", before, received) }()
			c, err := f.dialA(addr)
			if err != nil {
				t.Fatalf("%s: dial: %v", dir, err)
			}
			c.SetDeadline(time.Now().Add(30 * time.Second))
			if dir == "server resets" {
				if _, err := io.ReadFull(c, make([]byte, before)); err != nil {
					t.Fatalf("%s: read the data before the reset: %v", dir, err)
				}
				close(received)
				if n, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
					t.Fatalf("%s: the client read %d, %v after the server's reset; want ECONNRESET", dir, n, err)
				}
				if err := <-serverErr; err != nil {
					t.Fatalf("%s: server: %v", dir, err)
				}
			} else {
				if _, err := c.Write(make([]byte, before)); err != nil {
					t.Fatalf("%s: write: %v", dir, err)
				}
				select {
				case <-received:
				case err := <-serverErr:
					t.Fatalf("%s: server: %v", dir, err)
				case <-time.After(30 * time.Second):
					t.Fatalf("%s: the server did not get the data", dir)
				}
				c.(*net.TCPConn).SetLinger(0)
				c.Close()
				if err := waitResult(t, serverErr, 30*time.Second, dir); err != nil {
					t.Fatalf("%s: %v", dir, err)
				}
			}
			c.Close()
			l.Close()
		}
	})

	// Load: 4 concurrent transfers of 2 MiB each way while node B drops
	// 1 %, then 5 % of the TCP packets on its veth, both directions, in
	// segments of one MTU. Pass: every transfer completes with both hashes right, and
	// the rules did drop packets.
	t.Run("packet loss between the nodes", func(t *testing.T) {
		needTool(t, "nft", "nftables")
		for _, pct := range []int{1, 5} { // the ends of the range asked for
			t.Run(fmt.Sprintf("%d%%", pct), func(t *testing.T) {
				loss, err := f.tp.DropPercent(pct)
				if err != nil {
					t.Fatal(err)
				}
				defer loss.Close()
				const flows, size = 4, 2 << 20
				errs := make(chan error, flows)
				for range flows {
					go func() { errs <- f.transfer(target, size, size) }()
				}
				for i := range flows {
					if err := <-errs; err != nil { // each bounded by transfer's deadline
						t.Errorf("transfer %d under %d%% loss: %v", i, pct, err)
					}
				}
				dropped, err := loss.Dropped()
				if err != nil {
					t.Fatal(err)
				}
				if dropped == 0 {
					t.Fatal("the loss rules dropped no packet: the fault was not injected")
				}
				t.Logf("%d%% loss: %d transfers of %d bytes each way intact; %d packets dropped", pct, flows, size, dropped)
			})
		}
	})

	// Load: 16 clients in node A, each transferring 64 KiB each way in a
	// loop. Pass: while node A's gateway restarts (SIGTERM, drain, exit,
	// start) clients see refused connections, never a reset of a flow it
	// accepted (the drain lets those finish and deliver their last bytes),
	// a hang (every dial and transfer has a deadline) nor corrupted or
	// truncated data; before and after, not even refusals; every client
	// completes transfers again after the restart.
	t.Run("own gateway restarted under load", func(t *testing.T) {
		const clients = 16
		l := newRestartLoad(f, target, clients, 20*time.Second, false)
		defer l.stop()
		l.waitOK(t, "every client completes a transfer before the restart", 30*time.Second)
		l.phase.Store(1)
		if err := f.gwA.Stop(30 * time.Second); err != nil {
			t.Fatalf("node A's graceful stop: %v", err)
		}
		down := l.refused[1].Load()
		waitFor(t, "a client sees a refused connection while node A is down", 15*time.Second, func() bool {
			return l.refused[1].Load() > down
		})
		f.gwA = f.start(t, f.tp.A)
		l.phase.Store(2)
		l.waitOK(t, "every client completes a transfer after the restart", 30*time.Second)
		l.stop()
		for p, name := range []string{"before", "restart (drain, down, start)", "after ready"} {
			t.Logf("%s: %d transfers intact, %d refused, %d reset", name, l.ok[p].Load(), l.refused[p].Load(), l.reset[p].Load())
		}
		l.mu.Lock()
		for _, n := range l.notes {
			t.Log(n)
		}
		l.mu.Unlock()
		if bad := l.failures(); len(bad) > 0 {
			t.Fatalf("%d failures other than refused or reset:\n%s", len(bad), strings.Join(bad, "\n"))
		}
		for _, p := range []int{0, 2} {
			if n := l.refused[p].Load(); n > 0 {
				t.Errorf("%d refused while the gateway was up (phase %d), want none", n, p)
			}
		}
		for p := range l.reset {
			if n := l.reset[p].Load(); n > 0 {
				t.Errorf("%d transfers reset in phase %d, want none: the drain lets every accepted flow finish and deliver its last bytes", n, p)
			}
		}
	})

	// Load: the same 16 clients, each dial and transfer with a 5 s
	// deadline. Pass: when node A's gateway is killed with SIGKILL (no
	// drain, no cleanup) and started again at once, as systemd's
	// Restart= would, the flows and dials it carried end with a reset (a
	// client that retransmits into the new stack gets its RST) or at their
	// client's own deadline (one whose packets went into the dead TUN and
	// that has nothing to retransmit: nobody is left to tell it), and
	// nothing is corrupted or truncated; the new gateway starts without a
	// cleanup, and before and after, every transfer is intact.
	t.Run("own gateway killed under load", func(t *testing.T) {
		const clients = 16
		l := newRestartLoad(f, target, clients, 5*time.Second, true)
		defer l.stop()
		l.waitOK(t, "every client completes a transfer before the kill", 30*time.Second)
		l.phase.Store(1)
		f.killed[f.gwA] = true
		if err := f.gwA.Kill(); err != nil {
			t.Fatal(err)
		}
		f.gwA = f.start(t, f.tp.A)
		l.phase.Store(2)
		l.waitOK(t, "every client completes a transfer after the restart", 30*time.Second)
		l.stop()
		for p, name := range []string{"before", "killed, down, started", "after ready"} {
			t.Logf("%s: %d transfers intact, %d refused, %d reset, %d dials or transfers ended at their deadline",
				name, l.ok[p].Load(), l.refused[p].Load(), l.reset[p].Load(), l.timedOut[p].Load())
		}
		if bad := l.failures(); len(bad) > 0 {
			t.Fatalf("%d failures other than refused, reset or the kill's timeouts:\n%s", len(bad), strings.Join(bad, "\n"))
		}
		for _, p := range []int{0, 2} {
			if n := l.refused[p].Load() + l.reset[p].Load(); n > 0 {
				t.Errorf("%d refused or reset while the gateway was up (phase %d), want none", n, p)
			}
		}
	})
}

// resettingServer accepts one connection on l. If it resets, it writes n
// bytes, waits for received to close and resets (SO_LINGER 0); else it
// reads n bytes, closes received and must then read ECONNRESET.
func resettingServer(l net.Listener, resets bool, n int, received chan struct{}) error {
	c, err := l.Accept()
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if resets {
		if _, err := c.Write(make([]byte, n)); err != nil {
			return fmt.Errorf("write: %w", err)
		}
		select {
		case <-received:
		case <-time.After(30 * time.Second):
			return errors.New("the client never got the data")
		}
		c.(*net.TCPConn).SetLinger(0)
		return nil // the deferred Close sends the RST
	}
	if _, err := io.ReadFull(c, make([]byte, n)); err != nil {
		return fmt.Errorf("read the data before the reset: %w", err)
	}
	close(received)
	if k, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		return fmt.Errorf("the server read %d, %v after the client's reset; want ECONNRESET", k, err)
	}
	return nil
}

// restartLoad is clients in node A transferring in a loop, counting what
// happened to each transfer by the phase it began in: 0 before the
// restart, 1 from SIGTERM (or SIGKILL) through the drain, the gateway's
// absence and its start until ready, 2 after.
type restartLoad struct {
	phase              atomic.Int32
	ok, refused, reset [3]atomic.Int64
	// timedOut counts, with killed, the transfers of phase 1 that ended
	// at their deadline: a gateway killed with SIGKILL leaves no one to
	// reset a flow whose client waits for data without sending any.
	timedOut   [3]atomic.Int64
	killed     bool
	deadline   time.Duration  // of one transfer
	okClient   []atomic.Int64 // transfers intact in the current phase, per client
	done       chan struct{}
	wg         sync.WaitGroup
	stopOnce   sync.Once
	mu         sync.Mutex
	bad, notes []string
}

// newRestartLoad starts the clients, each dial and transfer bounded by
// deadline (dials by 10 s at most); killed tolerates phase 1's timeouts.
func newRestartLoad(f *faultNet, target string, clients int, deadline time.Duration, killed bool) *restartLoad {
	l := &restartLoad{okClient: make([]atomic.Int64, clients), done: make(chan struct{}), deadline: deadline, killed: killed}
	for i := range clients {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for {
				select {
				case <-l.done:
					return
				default:
				}
				l.one(f, target, i)
			}
		}()
	}
	return l
}

// one is one transfer of client i. It counts under the phase it began
// and ended in, or under 1 when it overlapped a change of phase (the
// phases run 0, 1, 2: any overlap touches the restart).
func (l *restartLoad) one(f *faultNet, target string, i int) {
	start := l.phase.Load()
	phase := func() int32 {
		if end := l.phase.Load(); end != start {
			return 1
		}
		return start
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(10*time.Second, l.deadline))
	c, err := f.tp.A.Dial(ctx, "tcp", target)
	cancel()
	if err != nil {
		p := phase()
		if l.killed && p == 1 && errors.Is(err, context.DeadlineExceeded) {
			l.timedOut[p].Add(1) // its SYN went into the TUN of the killed gateway
			return
		}
		if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENETUNREACH) || errors.Is(err, syscall.EHOSTUNREACH) {
			l.refused[p].Add(1)
			// Pacing, not synchronization: a refused dial returns at
			// once, and the loop must not spin while the gateway is down.
			select {
			case <-l.done:
			case <-time.After(20 * time.Millisecond):
			}
			return
		}
		l.fail(fmt.Sprintf("client %d, phase %d: dial: %v", i, p, err))
		return
	}
	c.SetDeadline(time.Now().Add(l.deadline))
	_, err = xfer.Run(c, 64<<10, 64<<10)
	p := phase()
	switch {
	case err == nil:
		l.ok[p].Add(1)
		if p == start {
			l.okClient[i].Add(1)
		}
	case isReset(err):
		if l.reset[p].Add(1) <= 5 {
			l.note(fmt.Sprintf("client %d, phase %d: %v", i, p, err))
		}
	case l.killed && p == 1 && errors.Is(err, os.ErrDeadlineExceeded):
		l.timedOut[p].Add(1)
	default: // a deadline (a hang), corrupted or truncated data
		l.fail(fmt.Sprintf("client %d, phase %d: %v", i, p, err))
	}
}

// note keeps a line for the log (the first resets of each phase).
func (l *restartLoad) note(s string) {
	l.mu.Lock()
	l.notes = append(l.notes, s)
	l.mu.Unlock()
}

func (l *restartLoad) fail(s string) {
	l.mu.Lock()
	l.bad = append(l.bad, s)
	l.mu.Unlock()
}

func (l *restartLoad) failures() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.bad...)
}

// waitOK resets the per-client counts and waits until every client has
// completed a transfer since.
func (l *restartLoad) waitOK(t *testing.T, what string, timeout time.Duration) {
	t.Helper()
	for i := range l.okClient {
		l.okClient[i].Store(0)
	}
	waitFor(t, what, timeout, func() bool {
		for i := range l.okClient {
			if l.okClient[i].Load() == 0 {
				return false
			}
		}
		return true
	})
}

// stop ends the clients and waits for them (each transfer is bounded by
// its deadlines). It may be called more than once.
func (l *restartLoad) stop() {
	l.stopOnce.Do(func() { close(l.done) })
	l.wg.Wait()
}
