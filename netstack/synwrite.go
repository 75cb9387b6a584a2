package netstack

import (
	"sync"

	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// synQueueLen bounds the SYN segments waiting for the synWriter; beyond
// it a SYN is written inline, as before (nothing is dropped).
const synQueueLen = 256

// synWriter writes TCP segments that carry SYN from a goroutine of its
// own instead of from the goroutine that sent them.
//
// Why: gVisor sends a connection's SYN-ACK from inside the handshake
// (the forwarder's CreateEndpoint) while it holds the new endpoint's lock,
// and not as a "user" of it. A write to a TUN runs the receiving side in
// the writer's system call: the client's kernel takes the SYN-ACK, sends
// its ACK back into the TUN and wakes the client, which may take the CPU
// from the writer. The ACK is read at once on another thread, and gVisor's
// TCP processor, finding the endpoint locked by a non-user, puts it back
// on its queue and tries again without parking: it spins on a core for as
// long as the write system call lasts. On a 2-core node that spin and the
// woken client share what is left, and the write took 2.5–3.6 ms instead
// of tens of µs (docs/field-notes.md, "Short connections: the account").
// Written here, the segment leaves a moment later, the endpoint's lock is
// free when the ACK arrives, and the processor does not spin.
//
// Only segments with SYN go this way: nothing else of the connection is
// sent until the peer answers the SYN, so no reordering is possible, and
// established traffic keeps its inline write.
type synWriter struct {
	link stack.LinkEndpoint
	ch   chan *stack.PacketBuffer
	done chan struct{}
	wg   sync.WaitGroup

	mu     sync.RWMutex
	closed bool // guarded by mu
}

func newSynWriter(link stack.LinkEndpoint) *synWriter {
	w := &synWriter{
		link: link,
		ch:   make(chan *stack.PacketBuffer, synQueueLen),
		done: make(chan struct{}),
	}
	w.wg.Add(1)
	go w.run()
	return w
}

// queue hands pkt to the writer and reports whether it took it; a packet
// it did not take (closed, or the queue full) is the caller's to write.
func (w *synWriter) queue(pkt *stack.PacketBuffer) bool {
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.closed {
		return false
	}
	pkt.IncRef()
	select {
	case w.ch <- pkt:
		return true
	default:
		pkt.DecRef()
		return false
	}
}

func (w *synWriter) run() {
	defer w.wg.Done()
	for {
		select {
		case pkt := <-w.ch:
			w.write(pkt)
		case <-w.done:
			// close holds mu: no queue is sending; release what is left.
			for {
				select {
				case pkt := <-w.ch:
					pkt.DecRef()
				default:
					return
				}
			}
		}
	}
}

func (w *synWriter) write(pkt *stack.PacketBuffer) {
	var l stack.PacketBufferList
	l.PushBack(pkt)
	// A refused write drops the segment, as a wire would: TCP sends the
	// SYN-ACK again.
	w.link.WritePackets(l)
	pkt.DecRef()
}

// close stops the writer; segments still queued are dropped.
func (w *synWriter) close() {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.closed = true
	close(w.done)
	w.mu.Unlock()
	w.wg.Wait()
}

// isSYN reports whether pkt is a TCP segment with SYN set.
func isSYN(pkt *stack.PacketBuffer) bool {
	if pkt.TransportProtocolNumber != header.TCPProtocolNumber {
		return false
	}
	th := pkt.TransportHeader().Slice()
	return len(th) >= header.TCPMinimumSize && header.TCP(th).Flags().Contains(header.TCPFlagSyn)
}
