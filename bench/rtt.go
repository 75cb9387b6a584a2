package bench

// The round-trip account of the rr scenario, from the execution traces
// of both gateways (-trace): RoundTrips. bench/cmd/meshtun-rtt prints it.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"golang.org/x/exp/trace"
)

type transition struct {
	t        trace.Time
	g        trace.GoID
	from, to trace.GoState
	stack    []string // function names, innermost first
}

func (tr transition) has(fn string) bool {
	for _, f := range tr.stack {
		if strings.Contains(f, fn) {
			return true
		}
	}
	return false
}

func readTrace(file string) ([]transition, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r, err := trace.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	var out []transition
	for {
		ev, err := r.ReadEvent()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		if ev.Kind() != trace.EventStateTransition {
			continue
		}
		st := ev.StateTransition()
		if st.Resource.Kind != trace.ResourceGoroutine {
			continue
		}
		from, to := st.Goroutine()
		tr := transition{t: ev.Time(), g: st.Resource.Goroutine(), from: from, to: to}
		if to == trace.GoSyscall {
			for fr := range st.Stack.Frames() {
				tr.stack = append(tr.stack, fr.Func)
			}
		}
		out = append(out, tr)
	}
}

// busiest is the goroutine that made the most system calls whose stack has
// every one of fns.
func busiest(ts []transition, fns ...string) (trace.GoID, bool) {
	n := map[trace.GoID]int{}
	for _, t := range ts {
		if t.to != trace.GoSyscall {
			continue
		}
		ok := true
		for _, fn := range fns {
			ok = ok && t.has(fn)
		}
		if ok {
			n[t.g]++
		}
	}
	best, max := trace.NoGoroutine, 0
	for g, k := range n {
		if k > max {
			best, max = g, k
		}
	}
	return best, max > 0
}

type rttPoint struct {
	t    trace.Time
	kind int // index into the cut points
}

// The cut points of a round trip, in order; the last is the next
// round trip's first.
const (
	aRequest = iota // A's TUN reader runnable
	aTLSWrite
	bRequest
	bServerWrite
	bReply
	bTLSWrite
	aReply
	aTUNWrite
	nPoints
)

var rttSegments = [nPoints]string{
	"A, request: TUN readable → TLS write begins",
	"A → B: TLS write(2) → B's reader woken",
	"B, request: reader woken → write to the server begins",
	"the server: B's write → its reply wakes B's relay",
	"B, reply: relay woken → TLS write begins",
	"B → A: TLS write(2) → A's reader woken",
	"A, reply: reader woken → TUN writev begins",
	"the client: A's writev → its next request wakes A",
}

// RoundTrips reads the execution traces of gateway A and gateway B taken
// during the rr scenario (-trace) and writes where one round trip's time
// goes: the median and mean of each segment between the cut points (see
// bench/cmd/meshtun-rtt) over every round trip the traces hold. It
// returns the number of complete round trips.
func RoundTrips(fileA, fileB string, w io.Writer) (int, error) {
	ta, err := readTrace(fileA)
	if err != nil {
		return 0, err
	}
	tb, err := readTrace(fileB)
	if err != nil {
		return 0, err
	}
	var missing []string
	find := func(ts []transition, what string, fns ...string) trace.GoID {
		g, ok := busiest(ts, fns...)
		if !ok {
			missing = append(missing, what)
		}
		return g
	}
	tunReader := find(ta, "A's TUN reader", "vnetLink).readLoop")
	relayA := find(ta, "A's relay to HBONE", "gateway.copyHalf", "batchConn).flushLocked")
	readerA := find(ta, "A's HBONE reader", "h2Conn).readLoop", "batchConn).Read")
	readerB := find(tb, "B's HBONE reader", "h2Conn).readLoop", "batchConn).Read")
	relayB := find(tb, "B's relay from the server", "gateway.readTCPPooled")
	if len(missing) > 0 {
		return 0, fmt.Errorf("no goroutine found for %s: are these traces of the rr scenario, node A's first?", strings.Join(missing, ", "))
	}

	var pts []rttPoint
	for _, t := range ta {
		switch {
		case t.g == tunReader && t.from == trace.GoWaiting && t.to == trace.GoRunnable:
			pts = append(pts, rttPoint{t.t, aRequest})
		case t.g == relayA && t.to == trace.GoSyscall && t.has("batchConn).flushLocked"):
			pts = append(pts, rttPoint{t.t, aTLSWrite})
		case t.g == readerA && t.from == trace.GoWaiting && t.to == trace.GoRunnable:
			pts = append(pts, rttPoint{t.t, aReply})
		case t.to == trace.GoSyscall && t.has("vnetLink).writev") && (t.has("WriteBufferedTo") || t.has("TryWrite")):
			pts = append(pts, rttPoint{t.t, aTUNWrite})
		}
	}
	for _, t := range tb {
		switch {
		case t.g == readerB && t.from == trace.GoWaiting && t.to == trace.GoRunnable:
			pts = append(pts, rttPoint{t.t, bRequest})
		case t.g != relayB && t.to == trace.GoSyscall && (t.has("gateway.copyBuffered") || t.has("TryWrite")) && !t.has("batchConn"):
			pts = append(pts, rttPoint{t.t, bServerWrite})
		case t.g == relayB && t.from == trace.GoWaiting && t.to == trace.GoRunnable:
			pts = append(pts, rttPoint{t.t, bReply})
		case t.g == relayB && t.to == trace.GoSyscall && t.has("batchConn).flushLocked"):
			pts = append(pts, rttPoint{t.t, bTLSWrite})
		}
	}
	slices.SortStableFunc(pts, func(x, y rttPoint) int { return int(x.t - y.t) })

	// Walk the timeline: a round trip is the first occurrence of each
	// cut point in order, from one request to the next; one with a point
	// missing or out of order (a GC, a keepalive, the trace's edges) is
	// left out.
	var (
		durs  [nPoints + 1][]float64 // µs per segment, and the whole
		cur   [nPoints]trace.Time
		next  = -1 // the next cut point expected; -1: waiting for a request
		kept  int
		total int
	)
	for _, p := range pts {
		if p.kind == aRequest {
			if next == nPoints {
				for i := range nPoints - 1 {
					durs[i] = append(durs[i], float64(cur[i+1]-cur[i])/1e3)
				}
				durs[nPoints-1] = append(durs[nPoints-1], float64(p.t-cur[nPoints-1])/1e3)
				durs[nPoints] = append(durs[nPoints], float64(p.t-cur[0])/1e3)
				kept++
			}
			if next >= 0 {
				total++
			}
			cur[0], next = p.t, 1
			continue
		}
		if next > 0 && next < nPoints && p.kind == next {
			cur[next] = p.t
			next++
		}
	}
	if kept == 0 {
		return 0, errors.New("no complete round trip found in the traces")
	}
	fmt.Fprintf(w, "%d round trips (%d with every cut point, in order)\n", total, kept)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "segment\tp50 µs\tmean µs\t\n")
	for i := range nPoints + 1 {
		name := "round trip (traced)"
		if i < nPoints {
			name = rttSegments[i]
		}
		var sum float64
		for _, d := range durs[i] {
			sum += d
		}
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t\n", name, summarize(durs[i]).Median, sum/float64(len(durs[i])))
	}
	return kept, tw.Flush()
}
