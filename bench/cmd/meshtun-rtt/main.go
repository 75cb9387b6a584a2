// Command meshtun-rtt reads the execution traces of both gateways taken
// during the bench's rr scenario and prints where one round trip's time
// goes, segment by segment, as medians and means over every round trip
// the traces hold:
//
//	meshtun-bench -scenarios rr -runs 1 -rr 20000 -profile DIR -trace -profile-seconds 2
//	go run ./bench/cmd/meshtun-rtt DIR/rr-1-node-a.trace DIR/rr-1-node-b.trace
//
// Both traces use the same clock (CLOCK_MONOTONIC on one machine), so
// events of the two processes are put on one timeline. The round trip is
// cut at goroutine transitions, each goroutine told by what its system
// calls' stacks hold:
//
//   - A's TUN reader (vnetLink.readLoop) becomes runnable: the client's
//     request is in the TUN;
//   - A's relay (a syscall under copyHalf and batchConn.flushLocked)
//     enters its TLS write(2);
//   - B's HBONE reader (h2Conn.readLoop) becomes runnable;
//   - B writes to the server (a write(2) under copyBuffered, by the
//     relay, or under TryWrite, by the reader itself: run to completion);
//   - B's relay from the server (readTCPPooled) becomes runnable: the
//     server answered; then it enters its TLS write(2);
//   - A's HBONE reader becomes runnable;
//   - A writes the reply to the TUN (vnetLink.writev under
//     WriteBufferedTo or TryWrite);
//   - A's TUN reader becomes runnable again: the next request.
//
// Tracing slows a round trip by about a quarter; compare the segments,
// and two binaries traced the same way, rather than the sums with
// untraced figures (docs/field-notes.md, "Latency through the pair").
package main

import (
	"fmt"
	"os"

	"github.com/meshtun/meshtun/bench"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: meshtun-rtt NODE-A.trace NODE-B.trace (from meshtun-bench -scenarios rr -profile DIR -trace)")
		os.Exit(2)
	}
	if _, err := bench.RoundTrips(os.Args[1], os.Args[2], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "meshtun-rtt:", err)
		os.Exit(1)
	}
}
