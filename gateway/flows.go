package gateway

import (
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
)

// flowTable holds every connection the gateway carries, outbound and
// inbound, from the moment its handler takes it (begin) to its end (end):
// the one record of an open flow. It serves
//
//   - drain and shutdown, which wait for it to be empty (idleCh, wait).
//     Unlike a sync.WaitGroup it lets a flow begin while someone waits (a
//     SYN or a stream arriving during the drain), which WaitGroup forbids
//     once its counter is zero;
//   - re-authorization after a reload: an inbound flow, once relayed, is
//     watched (watch), and Reload swaps the snapshot under the table's lock
//     and authorizes the watched flows again (swap, see reload.go);
//   - the open-flow counts by direction (open), and by source within a
//     direction for gateway.max_flows_per_source (admit);
//   - the access log: end writes the flow's one line and counts its close
//     in the metrics.
//
// The zero value is an empty table without an access log.
type flowTable struct {
	log hclog.Logger // the access log; nil when it is off

	mu    sync.Mutex
	flows map[*flow]struct{} // guarded by mu
	count [2]int             // guarded by mu; open flows by direction (dirIndex)
	idle  chan struct{}      // guarded by mu; closed when the table empties, nil while nobody waits

	perSource map[sourceKey]int // guarded by mu; admitted flows by direction and source
	overLimit [2]atomic.Uint64  // flows refused at gateway.max_flows_per_source, by direction
}

// sourceKey is a direction and a flow's source address.
type sourceKey struct {
	dir int
	src netip.Addr
}

// flow is one connection in the table.
type flow struct {
	// log is what the access-log line will say. Only the goroutine that
	// carries the flow at the time writes it: the handler, then the relay.
	log   flowLog
	ended atomic.Bool // set by the first end

	source   sourceKey // set by admit, under the table's lock
	admitted bool      // counted in perSource; guarded by the table's lock

	// Set once under the table's lock by watch, for an inbound flow being
	// relayed: what a reload authorizes again, and the two sides it resets
	// when that denies it.
	watched        bool
	ac             AuthzConn
	stream, target conn
	denyOnce       sync.Once
	denied         atomic.Pointer[string] // why a reload ended it, once one did

	// info is what /flows lists, set under the table's lock once the
	// flow is relayed (relaying); up and down count its bytes as they go.
	info     *FlowInfo
	up, down liveBytes
}

// outcome is how a flow's setup ended when it did not reach the relay, or
// how the relay ended it: what its access-log line and the metrics' close
// say. The zero value is a flow that got through.
type outcome struct {
	flag string // a response flag (flagDeny, ...), "" for none
	// status is the CONNECT's refusal: inbound, the status the stream is
	// answered with (0: no answer is due, the stream was accepted or is
	// gone); outbound, the status the peer answered with, if it did.
	status int
	err    error
}

// dirIndex is the index of a direction in flowTable.count.
func dirIndex(direction string) int {
	if direction == inbound || direction == eastWest { // east-west: inbound to this node
		return 1
	}
	return 0
}

// begin registers a new flow in direction (outbound or inbound), started
// now. Pair it with end.
func (t *flowTable) begin(direction string) *flow {
	f := &flow{log: flowLog{direction: direction, start: time.Now()}}
	t.mu.Lock()
	if t.flows == nil {
		t.flows = make(map[*flow]struct{})
	}
	t.flows[f] = struct{}{}
	t.count[dirIndex(direction)]++
	t.mu.Unlock()
	return f
}

// end is the one place a flow ends: o becomes its access-log line (a
// reload's denial overrides it) and the metrics' close, then the flow
// leaves the table. It does nothing for a flow that already ended.
func (t *flowTable) end(f *flow, o outcome) {
	if f.ended.Swap(true) {
		return
	}
	if err := f.deniedErr(); err != nil {
		o.flag, o.err = flagDeny, err
	}
	f.log.flag, f.log.err = o.flag, o.err
	// Logged and counted before the flow leaves the table, so whoever
	// waited for the drain finds its line and its close.
	f.log.emit(t.log)

	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.flows, f)
	t.count[dirIndex(f.log.direction)]--
	if f.admitted {
		if n := t.perSource[f.source] - 1; n > 0 {
			t.perSource[f.source] = n
		} else {
			delete(t.perSource, f.source)
		}
	}
	if len(t.flows) == 0 && t.idle != nil {
		close(t.idle)
		t.idle = nil
	}
}

// admit counts f against its source src, and reports false, counting a
// refusal, when max flows of that direction from src are open already (0:
// no limit). Call it once, when the flow's source is known; end gives the
// place back.
func (t *flowTable) admit(f *flow, src netip.Addr, max int) bool {
	key := sourceKey{dirIndex(f.log.direction), src.Unmap()}
	t.mu.Lock()
	defer t.mu.Unlock()
	if max > 0 && t.perSource[key] >= max {
		t.overLimit[key.dir].Add(1)
		return false
	}
	if t.perSource == nil {
		t.perSource = make(map[sourceKey]int)
	}
	t.perSource[key]++
	f.source, f.admitted = key, true
	return true
}

// refusedOverLimit is the number of flows of direction admit refused.
func (t *flowTable) refusedOverLimit(direction string) uint64 {
	return t.overLimit[dirIndex(direction)].Load()
}

// open is the number of flows open in direction.
func (t *flowTable) open(direction string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.count[dirIndex(direction)]
}

// idleCh returns a channel closed once no flow is open.
func (t *flowTable) idleCh() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.flows) == 0 {
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	if t.idle == nil {
		t.idle = make(chan struct{})
	}
	return t.idle
}

// wait blocks until no flow is open.
func (t *flowTable) wait() { <-t.idleCh() }

// watch makes f, an inbound flow relayed between stream and target and
// authorized as ac, one that a reload authorizes again. It returns what
// current returns under the table's lock: the snapshot in force at the
// moment f became watched, which a caller compares with the one it
// authorized f by (see Gateway.watchInbound).
func (t *flowTable) watch(f *flow, ac AuthzConn, stream, target conn, current func() *snapshot) *snapshot {
	t.mu.Lock()
	defer t.mu.Unlock()
	f.watched, f.ac, f.stream, f.target = true, ac, stream, target
	return current()
}

// swap runs store (the reload's swap of the snapshot) under the table's
// lock and returns the flows watched at that moment: a flow that becomes
// watched later sees what store stored (watch), and none is missed.
func (t *flowTable) swap(store func()) []*flow {
	t.mu.Lock()
	defer t.mu.Unlock()
	store()
	var watched []*flow
	for f := range t.flows {
		if f.watched {
			watched = append(watched, f)
		}
	}
	return watched
}

// deny ends a watched flow that a reload denied: RST_STREAM towards the
// peer, RST towards the target. The relay then returns, and end logs the
// flow with flagDeny and reason.
func (f *flow) deny(reason string) {
	f.denyOnce.Do(func() {
		f.denied.Store(&reason)
		reset(f.stream)
		reset(f.target)
	})
}

// deniedErr is why a reload ended the flow, or nil.
func (f *flow) deniedErr() error {
	if r := f.denied.Load(); r != nil {
		return fmt.Errorf("denied by policy after reload: %s", *r)
	}
	return nil
}

// carry hands a flow whose setup connected its client side a and the
// other side b to the relay (a nil a: setup failed with o, and the flow
// ends here). From then the relay's goroutines carry it and end it when
// both directions are done; the handler's goroutine returns.
func (g *Gateway) carry(f *flow, a, b conn, o outcome) {
	if a == nil {
		g.flows.end(f, o)
		return
	}
	c := f.log.metrics.relayCounters()
	f.up.next, f.down.next = c.aToB, c.bToA
	g.flows.relaying(f)
	startRelay(a, b, relayCounters{aToB: &f.up, bToA: &f.down}, func(res relayResult) {
		f.log.sent, f.log.recv = res.AToB, res.BToA
		g.flows.end(f, outcome{err: res.Err})
	})
}
