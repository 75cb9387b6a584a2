package netstack_test

import (
	"bytes"
	"io"
	"testing"

	"github.com/meshtun/meshtun/netstack"
)

// TestSynAckWriteOffHandshake: the handshake completes while the write of
// its SYN-ACK is still in the link. A TUN write runs the client's side in
// the writer's system call, and its ACK comes back before the call
// returns; written inline, the SYN-ACK's write holds the new endpoint's
// lock until then, and gVisor's processor spins on the ACK
// (docs/field-notes.md, "Short connections: the account"). Here the link
// holds the SYN-ACK's write until the connection is accepted and has
// carried data both ways: written inline, Accept could not return.
func TestSynAckWriteOffHandshake(t *testing.T) {
	for _, fam := range chanFamilies {
		t.Run(fam.name, func(t *testing.T) {
			conns, errs := make(chan *netstack.Conn, 1), make(chan error, 1)
			e := newChanEnv(t, netstack.Options{Handler: handlerConns(conns, errs)})
			hold := make(chan struct{})
			e.tap.holdSYN.Store(&hold)
			released := false
			release := func() {
				if !released {
					released = true
					close(hold)
				}
			}
			// Registered after newChanEnv's: runs before the stack closes.
			t.Cleanup(release)

			p := e.peer(fam.src, fam.dst)
			p.connect(t)
			c := recvConn(t, conns, errs)

			if _, err := p.Write([]byte("ping")); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, 4)
			if _, err := io.ReadFull(c, got); err != nil || string(got) != "ping" {
				t.Fatalf("read %q, %v; want ping", got, err)
			}
			if _, err := c.Write([]byte("pong")); err != nil {
				t.Fatal(err)
			}
			if d := p.readData(t, 4); !bytes.Equal(d, []byte("pong")) {
				t.Fatalf("peer read %q; want pong", d)
			}
			release()
		})
	}
}
