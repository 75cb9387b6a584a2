package gateway

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/meshtun/meshtun/internal/tcptest"
)

// relayed builds app ⇄ [relay] ⇄ target over real sockets and runs the
// relay in the background; the result arrives on the returned channel.
// With plain, the relay sees its two sockets as bare conns that cannot wait
// for readiness (as HBONE streams are), so the small-buffer path runs.
func relayed(t *testing.T, plain bool) (app, target *net.TCPConn, done <-chan relayResult) {
	app, a := tcptest.Pair(t)
	b, target := tcptest.Pair(t)
	ch := make(chan relayResult, 1)
	if plain {
		go func() { ch <- relay(plainConn{a}, plainConn{b}) }()
	} else {
		go func() { ch <- relay(a, b) }()
	}
	return app, target, ch
}

// plainConn hides everything of a TCP connection but the conn interface
// and a Reset, like an HBONE stream.
type plainConn struct{ c *net.TCPConn }

func (p plainConn) Read(b []byte) (int, error)  { return p.c.Read(b) }
func (p plainConn) Write(b []byte) (int, error) { return p.c.Write(b) }
func (p plainConn) CloseWrite() error           { return p.c.CloseWrite() }
func (p plainConn) Close() error                { return p.c.Close() }
func (p plainConn) Reset() error                { p.c.SetLinger(0); return p.c.Close() }

var _ resetter = plainConn{}

// paths are the two ways copyHalf reads: waiting for readiness, or a
// small buffer first.
var paths = []struct {
	name  string
	plain bool
}{{"readiness", false}, {"small-buffer", true}}

func TestRelayHalfClose(t *testing.T) {
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) { testRelayHalfClose(t, p.plain) })
	}
}

func testRelayHalfClose(t *testing.T, plain bool) {
	// relaySmallSize exactly: the small read fills, the next one is large.
	for _, size := range []int{0, 1, relaySmallSize, relayBufSize, 1 << 20, 8 << 20} {
		app, target, done := relayed(t, plain)
		req := make([]byte, size)
		rand.Read(req)
		reply := make([]byte, size/2+3)
		rand.Read(reply)

		// The app sends its request and half-closes; the target reads to
		// EOF, then answers and closes; the app still reads the whole
		// answer.
		go func() { app.Write(req); app.CloseWrite() }()
		got, err := io.ReadAll(target)
		if err != nil {
			t.Fatalf("size %d: target read: %v", size, err)
		}
		if !bytes.Equal(got, req) {
			t.Fatalf("size %d: request corrupted: got %d bytes", size, len(got))
		}
		go func() { target.Write(reply); target.CloseWrite() }()
		back, err := io.ReadAll(app)
		if err != nil {
			t.Fatalf("size %d: app read: %v", size, err)
		}
		if sha256.Sum256(back) != sha256.Sum256(reply) {
			t.Fatalf("size %d: reply corrupted", size)
		}
		r := <-done
		if r.Err != nil || r.AToB != int64(size) || r.BToA != int64(len(reply)) {
			t.Fatalf("size %d: relay result %+v", size, r)
		}
	}
}

func TestRelayHalfCloseMirror(t *testing.T) {
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) { testRelayHalfCloseMirror(t, p.plain) })
	}
}

func testRelayHalfCloseMirror(t *testing.T, plain bool) {
	app, target, done := relayed(t, plain)
	// The target speaks first and closes its write side; the app reads to
	// EOF and only then sends, and the target still receives it.
	if _, err := target.Write([]byte("banner")); err != nil {
		t.Fatal(err)
	}
	target.CloseWrite()
	got, err := io.ReadAll(app)
	if err != nil || string(got) != "banner" {
		t.Fatalf("app read %q, %v", got, err)
	}
	app.Write([]byte("late request"))
	app.CloseWrite()
	got, err = io.ReadAll(target)
	if err != nil || string(got) != "late request" {
		t.Fatalf("target read %q, %v", got, err)
	}
	if r := <-done; r.Err != nil {
		t.Fatalf("relay error: %v", r.Err)
	}
}

func TestRelayResetPropagates(t *testing.T) {
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) { testRelayResetPropagates(t, p.plain) })
	}
}

func testRelayResetPropagates(t *testing.T, plain bool) {
	app, target, done := relayed(t, plain)
	if _, err := app.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1)
	if _, err := io.ReadFull(target, buf); err != nil {
		t.Fatal(err)
	}
	target.SetLinger(0)
	target.Close() // RST towards the relay

	r := <-done
	if r.Err == nil {
		t.Fatalf("relay ended cleanly after a reset")
	}
	app.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := app.Read(buf)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("app read after target reset: %v, want ECONNRESET", err)
	}
}

// TestRelayIdleHoldsNoBuffer opens relays, moves data through them (a
// burst through the readiness path, a short exchange through the
// small-buffer path) and leaves them idle: none may keep a pooled copy
// buffer. It reports the heap and goroutines each idle relay costs.
func TestRelayIdleHoldsNoBuffer(t *testing.T) {
	const flows = 50
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			burst := 1<<20 + 3 // several full pooled reads, then a short one
			if p.plain {
				// A read that exactly fills a pooled buffer keeps it
				// until the next data (copyHalf's doc); a short exchange
				// stays on the small buffer.
				burst = 100
			}
			// relayBufsOut counts the whole package's relays: those of
			// tests before this one may still be ending. Only this
			// subtest's relays are held to zero.
			base := relayBufsOut.Load()
			runtime.GC()
			var before runtime.MemStats
			runtime.ReadMemStats(&before)
			g0 := runtime.NumGoroutine()
			msg := make([]byte, burst)
			rand.Read(msg)
			got := make([]byte, burst)
			for i := 0; i < flows; i++ {
				app, target, _ := relayed(t, p.plain)
				go app.Write(msg)
				if _, err := io.ReadFull(target, got); err != nil {
					t.Fatalf("flow %d: target read: %v", i, err)
				}
				go target.Write(msg)
				if _, err := io.ReadFull(app, got); err != nil {
					t.Fatalf("flow %d: app read: %v", i, err)
				}
			}
			// The last write's buffer is given back just after the peer
			// saw the bytes: wait for that, bounded.
			deadline := time.Now().Add(10 * time.Second)
			for relayBufsOut.Load() > base && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond) // polling the counter, bounded
			}
			if n := relayBufsOut.Load() - base; n > 0 {
				t.Fatalf("%d pooled buffers held by %d idle relays, want 0", n, flows)
			}
			runtime.GC()
			var after runtime.MemStats
			runtime.ReadMemStats(&after)
			t.Logf("per idle relay (with its 4 loopback sockets): heap %d B, goroutines %.1f, stack in use %d B",
				(int64(after.HeapInuse)-int64(before.HeapInuse))/flows,
				float64(runtime.NumGoroutine()-g0)/flows,
				(int64(after.StackInuse)-int64(before.StackInuse))/flows)
		})
	}
}

// startRelay returns at once and carries each flow on exactly two
// goroutines (one per direction), counts bytes live in its counters, and
// calls done once, after both sides ended.
func TestStartRelayTwoGoroutinesLiveCounts(t *testing.T) {
	const flows = 20
	msg := []byte("ping through the relay")
	type flow struct {
		app, target *net.TCPConn
		up, down    liveCount
		done        chan relayResult
	}
	fs := make([]*flow, flows)
	for i := range fs {
		f := &flow{done: make(chan relayResult, 2)}
		var a, b *net.TCPConn
		f.app, a = tcptest.Pair(t)
		b, f.target = tcptest.Pair(t)
		startRelay(a, b, relayCounters{aToB: &f.up, bToA: &f.down}, func(r relayResult) { f.done <- r })
		got := make([]byte, len(msg))
		for _, d := range []struct{ from, to *net.TCPConn }{{f.app, f.target}, {f.target, f.app}} {
			if _, err := d.from.Write(msg); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(d.to, got); err != nil {
				t.Fatalf("flow %d: %v", i, err)
			}
		}
		fs[i] = f
	}
	// The counters are added right after each write returns, and relays
	// of earlier tests end once their sockets' cleanup closed them: wait
	// for both (bounded), then count the goroutines in copyHalf.
	deadline := time.Now().Add(10 * time.Second)
	settled := func() bool {
		for _, f := range fs {
			if f.up.Load() != uint64(len(msg)) || f.down.Load() != uint64(len(msg)) {
				return false
			}
		}
		return copyHalfGoroutines() == 2*flows
	}
	for !settled() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := copyHalfGoroutines(); n != 2*flows {
		t.Fatalf("%d goroutines in copyHalf for %d idle relays, want %d", n, flows, 2*flows)
	}
	for i, f := range fs {
		if f.up.Load() != uint64(len(msg)) || f.down.Load() != uint64(len(msg)) {
			t.Fatalf("flow %d: live counts %d/%d, want %d each way", i, f.up.Load(), f.down.Load(), len(msg))
		}
		select {
		case <-f.done:
			t.Fatalf("flow %d: done before either side closed", i)
		default:
		}
	}
	for i, f := range fs {
		f.app.CloseWrite()
		f.target.CloseWrite()
		select {
		case r := <-f.done:
			if r.Err != nil || r.AToB != int64(len(msg)) || r.BToA != int64(len(msg)) {
				t.Fatalf("flow %d: result %+v", i, r)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("flow %d: no result 10 s after both sides closed", i)
		}
		if len(f.done) != 0 {
			t.Fatalf("flow %d: done called twice", i)
		}
	}
}

// copyHalfGoroutines counts the goroutines running copyHalf.
func copyHalfGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte("gateway.copyHalf(")) {
			count++
		}
	}
	return count
}

// liveCount is a byteCounter that a test reads back.
type liveCount struct{ atomic.Uint64 }

func (c *liveCount) Add(v float64) { c.Uint64.Add(uint64(v)) }
