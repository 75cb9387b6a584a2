package netstack_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/meshtun/meshtun/netstack"
)

// TestProbe: the probe is answered by a live stack, reaches no Handler
// and no counter, writes nothing to the link (its answers never reach
// the TUN), and fails once the stack is closed.
func TestProbe(t *testing.T) {
	var handled atomic.Int64
	e := newChanEnv(t, netstack.Options{Handler: func(*netstack.Request) { handled.Add(1) }})
	// Enough probes that several of gVisor's processors take one.
	for i := range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
		err := e.st.Probe(ctx)
		cancel()
		if err != nil {
			t.Fatalf("probe %d: %v", i, err)
		}
	}
	if n := handled.Load(); n != 0 {
		t.Errorf("the probes reached the Handler %d times", n)
	}
	if st := e.st.Stats(); st != (netstack.Stats{}) {
		t.Errorf("the probes moved the counters: %+v", st)
	}
	select {
	case b := <-e.tap.out:
		seg, _ := parseSegment(b)
		t.Errorf("a probe's packet reached the link: %v", seg)
	default:
	}
	if n := e.tap.lost.Load(); n != 0 {
		t.Errorf("%d packets reached the link", n)
	}

	// A real flow is still carried beside the probes.
	src, dst := chanFamilies[0].src, chanFamilies[0].dst
	p := e.peer(src, dst)
	p.send(header.TCPFlagSyn, nil)
	p.expectRST(t) // the Handler decided nothing: a RST, through the link
	if n := handled.Load(); n != 1 {
		t.Errorf("the real SYN reached the Handler %d times, want once", n)
	}

	if err := e.st.Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	if err := e.st.Probe(ctx); !errors.Is(err, netstack.ErrClosed) {
		t.Fatalf("probe of a closed stack: %v, want ErrClosed", err)
	}
}

// TestProbeDeadline: a probe given no time fails with the context's error
// rather than blocking.
func TestProbeDeadline(t *testing.T) {
	e := newChanEnv(t, netstack.Options{Handler: func(*netstack.Request) {}})
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	err := e.st.Probe(ctx)
	// The stack may answer within the injection itself, before the
	// deadline is looked at: then the probe passed, and that is true too.
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("probe with an expired deadline: %v", err)
	}
}
