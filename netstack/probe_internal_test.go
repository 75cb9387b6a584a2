package netstack

import (
	"context"
	"errors"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
)

// TestProbeWedged: while the segments of the probe's listener cannot be
// processed (its endpoint held, as a user goroutine holds an endpoint it
// works on, so gVisor's processor leaves its segments queued), the probe
// gets no answer and fails; once released, the queued work is done and
// the next probe passes. This is the probe's one proof that it waits for
// gVisor's processing rather than for the injection.
func TestProbeWedged(t *testing.T) {
	st, err := New(Options{Link: channel.New(64, 1500, ""), Handler: func(*Request) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ep, ok := st.prober.listener.(*tcp.Endpoint)
	if !ok {
		t.Fatalf("probe listener is a %T", st.prober.listener)
	}
	ep.LockUser()
	// Any short deadline: no answer can come while the lock is held.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	err = st.Probe(ctx)
	cancel()
	ep.UnlockUser()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("probe of a wedged listener: %v, want no answer (deadline exceeded)", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := st.Probe(ctx); err != nil {
		t.Fatalf("probe after the wedge: %v", err)
	}
}

// TestStackOptions pins the TCP options New sets on gVisor
// (docs/field-notes.md, "gVisor setup"): SACK on, RACK off, Nagle off
// (gVisor's default, which a newer version could change: a Nagle ×
// delayed-ACK stall costs ≈ 40 ms per exchange), TIME_WAIT short.
func TestStackOptions(t *testing.T) {
	st, err := New(Options{Link: channel.New(64, 1500, ""), Handler: func(*Request) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var sack tcpip.TCPSACKEnabled
	var recovery tcpip.TCPRecovery
	var delay tcpip.TCPDelayEnabled
	var tw tcpip.TCPTimeWaitTimeoutOption
	for _, opt := range []tcpip.GettableTransportProtocolOption{&sack, &recovery, &delay, &tw} {
		if err := st.stack.TransportProtocolOption(tcp.ProtocolNumber, opt); err != nil {
			t.Fatalf("read %T: %v", opt, err)
		}
	}
	if !bool(sack) || recovery != 0 || bool(delay) || time.Duration(tw) != timeWait {
		t.Fatalf("SACK %v, recovery %#x (RACK is %#x), Nagle %v, TIME_WAIT %v; want SACK on, no RACK, Nagle off, %v",
			sack, recovery, tcpip.TCPRACKLossDetection, delay, time.Duration(tw), timeWait)
	}
}
