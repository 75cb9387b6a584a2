package netstack

import (
	"sync"

	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
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
//
// Before a write, settle waits until the sending endpoint's lock is free
// (the handshake has returned from sending): queued a few µs before the
// sender lets go of the lock, a SYN-ACK written at once could still wake
// the client while the lock is held, and if the sender's thread is then
// descheduled (the woken client took its CPU) the processor spins again:
// a trace with the plain queue showed one such spin of 2.9 ms in 2 s of
// short connections.
type synWriter struct {
	link   stack.LinkEndpoint
	settle func(*stack.PacketBuffer) // nil: write at once
	ch     chan *stack.PacketBuffer
	done   chan struct{}
	wg     sync.WaitGroup

	mu     sync.RWMutex
	closed bool // guarded by mu
}

func newSynWriter(link stack.LinkEndpoint, settle func(*stack.PacketBuffer)) *synWriter {
	w := &synWriter{
		link:   link,
		settle: settle,
		ch:     make(chan *stack.PacketBuffer, synQueueLen),
		done:   make(chan struct{}),
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
	if w.settle != nil {
		w.settle(pkt)
	}
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

// settleSYN waits until no one holds the lock of the endpoint that sent
// pkt, a SYN or SYN-ACK on its way out. An endpoint already gone needs no
// wait.
func (s *Stack) settleSYN(pkt *stack.PacketBuffer) {
	var id stack.TransportEndpointID
	nh := pkt.NetworkHeader().Slice()
	switch pkt.NetworkProtocolNumber {
	case header.IPv4ProtocolNumber:
		if len(nh) < header.IPv4MinimumSize {
			return
		}
		ip := header.IPv4(nh)
		id.LocalAddress, id.RemoteAddress = ip.SourceAddress(), ip.DestinationAddress()
	case header.IPv6ProtocolNumber:
		if len(nh) < header.IPv6MinimumSize {
			return
		}
		ip := header.IPv6(nh)
		id.LocalAddress, id.RemoteAddress = ip.SourceAddress(), ip.DestinationAddress()
	default:
		return
	}
	th := pkt.TransportHeader().Slice()
	if len(th) < header.TCPMinimumSize {
		return
	}
	t := header.TCP(th)
	id.LocalPort, id.RemotePort = t.SourcePort(), t.DestinationPort()
	ep, ok := s.stack.FindTransportEndpoint(pkt.NetworkProtocolNumber, header.TCPProtocolNumber, id, nicID).(*tcp.Endpoint)
	if !ok {
		return
	}
	// As a user: the processor leaves a user's segments queued for
	// UnlockUser instead of spinning on them.
	ep.LockUser()
	ep.UnlockUser()
}

// isSYN reports whether pkt is a TCP segment with SYN set.
func isSYN(pkt *stack.PacketBuffer) bool {
	if pkt.TransportProtocolNumber != header.TCPProtocolNumber {
		return false
	}
	th := pkt.TransportHeader().Slice()
	return len(th) >= header.TCPMinimumSize && header.TCP(th).Flags().Contains(header.TCPFlagSyn)
}
