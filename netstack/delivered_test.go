package netstack_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// TestWaitDelivered: a Conn written and closed by our side still holds
// its last bytes and FIN until the client acknowledges them; WaitDelivered
// waits for that (the gateway's drain calls it before Close, which would
// abort the connection and lose them), and returns once the client has
// acknowledged the data and the FIN.
func TestWaitDelivered(t *testing.T) {
	fam := chanFamilies[0]
	e, p, c := connected(t, fam.src, fam.dst)
	if err := e.st.WaitDelivered(context.Background()); err != nil {
		t.Fatalf("WaitDelivered with one open connection and nothing closed: %v", err)
	}
	msg := []byte("the last bytes of a flow")
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// Nothing acknowledged yet: WaitDelivered must not return nil.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	err := e.st.WaitDelivered(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitDelivered with unacknowledged data: %v, want the context's deadline", err)
	}
	// The client reads the data and the FIN and acknowledges both.
	var got []byte
	for fin := false; !fin; {
		seg := p.next(t, "data or FIN", func(s segment) bool {
			return len(s.payload) > 0 || s.flags&header.TCPFlagFin != 0
		})
		if seg.seq != p.ack {
			continue // a retransmission of what was read already
		}
		got = append(got, seg.payload...)
		p.ack += uint32(len(seg.payload))
		if seg.flags&header.TCPFlagFin != 0 {
			p.ack++
			fin = true
		}
	}
	if string(got) != string(msg) {
		t.Fatalf("the client read %q, want %q", got, msg)
	}
	p.send(header.TCPFlagAck, nil)
	ctx, cancel = context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	if err := e.st.WaitDelivered(ctx); err != nil {
		t.Fatalf("WaitDelivered after the client acknowledged everything: %v", err)
	}
}
