package gateway

import (
	"errors"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meshtun/meshtun/internal/tcptest"
)

func TestFlowTableIdle(t *testing.T) {
	var ft flowTable
	select {
	case <-ft.idleCh():
	default:
		t.Fatal("an empty table is not idle")
	}
	first := ft.begin(outbound)
	idle := ft.idleCh()
	select {
	case <-idle:
		t.Fatal("idle with a flow open")
	default:
	}
	// Flows may begin and end while someone waits (a WaitGroup forbids
	// Add at zero during Wait; the race detector caught that in drain).
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); ft.end(ft.begin(inbound), outcome{}) }()
	}
	wg.Wait()
	select {
	case <-idle:
		t.Fatal("idle while the first flow is still open")
	default:
	}
	ft.end(first, outcome{})
	select {
	case <-idle:
	case <-time.After(10 * time.Second):
		t.Fatal("not idle after the last flow ended")
	}
}

// accessLogTable is a flow table whose access log is kept in a buffer.
func accessLogTable() (*flowTable, *syncBuffer) {
	buf := &syncBuffer{}
	return &flowTable{log: hclog.New(&hclog.LoggerOptions{Output: buf, Level: hclog.Info})}, buf
}

// Each direction is counted on its own; a flow ends once, however often
// end is called, with one access-log line that says its outcome.
func TestFlowTableCountsAndEndsOnce(t *testing.T) {
	ft, logs := accessLogTable()
	out1, out2, in := ft.begin(outbound), ft.begin(outbound), ft.begin(inbound)
	if o, i := ft.open(outbound), ft.open(inbound); o != 2 || i != 1 {
		t.Fatalf("open: %d outbound, %d inbound; want 2, 1", o, i)
	}
	ft.end(out1, outcome{flag: flagNoRoute, err: errors.New("no route: nothing")})
	ft.end(out1, outcome{}) // a second end changes nothing
	if o, i := ft.open(outbound), ft.open(inbound); o != 1 || i != 1 {
		t.Fatalf("open after one end: %d outbound, %d inbound; want 1, 1", o, i)
	}
	lines := logs.lines("connection complete")
	if len(lines) != 1 || !strings.Contains(lines[0], "[WARN]") || !strings.Contains(lines[0], "response_flags=NO_ROUTE") ||
		!strings.Contains(lines[0], "direction=outbound") || !strings.Contains(lines[0], `error="no route: nothing"`) {
		t.Fatalf("access log after one end: %q", lines)
	}
	in.log.sent, in.log.recv = 3, 4
	ft.end(in, outcome{err: io.EOF}) // a clean end
	ft.end(out2, outcome{})
	if o, i := ft.open(outbound), ft.open(inbound); o != 0 || i != 0 {
		t.Fatalf("open after every end: %d outbound, %d inbound", o, i)
	}
	lines = logs.lines("connection complete")
	if len(lines) != 3 {
		t.Fatalf("%d access-log lines for 3 flows: %q", len(lines), lines)
	}
	for _, want := range []string{"[INFO]", "direction=inbound", "response_flags=-", "bytes_sent=3", "bytes_recv=4"} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("line of the inbound flow lacks %s: %s", want, lines[1])
		}
	}
	if strings.Contains(lines[1], "error=") {
		t.Errorf("a clean end logged an error: %s", lines[1])
	}
}

// A watched flow is in what swap returns; one watched after the swap sees
// what the swap stored. deny resets both sides, and end logs the flow as
// denied whatever the relay said.
func TestFlowTableWatchSwapDeny(t *testing.T) {
	ft, logs := accessLogTable()
	old, next := &snapshot{}, &snapshot{}
	cur := old
	current := func() *snapshot { return cur }

	app, stream := tcptest.Pair(t)
	target, peer := tcptest.Pair(t)
	before := ft.begin(inbound)
	ft.begin(outbound) // never watched
	if got := ft.watch(before, AuthzConn{}, stream, target, current); got != old {
		t.Fatal("watch did not return the snapshot in force")
	}
	watched := ft.swap(func() { cur = next })
	if len(watched) != 1 || watched[0] != before {
		t.Fatalf("swap returned %d flows, want the one watched", len(watched))
	}
	after := ft.begin(inbound)
	if got := ft.watch(after, AuthzConn{}, stream, target, current); got != next {
		t.Fatal("a flow watched after the swap did not see the new snapshot")
	}

	before.deny("no more")
	before.deny("twice") // the first reason stays
	for name, c := range map[string]interface {
		SetReadDeadline(time.Time) error
		Read([]byte) (int, error)
	}{"client": app, "target": peer} {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil || err == io.EOF || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("%s side after deny: %v, want a reset", name, err)
		}
	}
	ft.end(before, outcome{err: io.EOF})
	lines := logs.lines("connection complete")
	if len(lines) != 1 || !strings.Contains(lines[0], "response_flags=DENY") ||
		!strings.Contains(lines[0], `error="denied by policy after reload: no more"`) {
		t.Fatalf("access log of the denied flow: %q", lines)
	}
}
