package netstack

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// The probe (Stack.Probe) is a TCP handshake the stack answers without a
// client: a SYN made here enters the NIC where the link's read loop hands
// it packets, to a listener of the stack's own; the SYN-ACK the stack
// answers with leaves through the link endpoint's write path, where
// loopbackLink takes it back instead of writing it to the TUN. Both sides
// use probeAddr, the NIC's catch-all address, which nothing routes into a
// TUN (loopback.go): no client has it as its source, so no packet of a
// real flow is ever addressed to it, and none to it reaches the TUN.
var probeAddr = catchAllV4.AddressWithPrefix.Address

// probeBacklog is the probe listener's backlog: the probes' half-open
// connections are reset at once, and gVisor answers with SYN cookies past
// the backlog anyway, so a handful is enough.
const probeBacklog = 8

// probeFirstPort and probePorts are the source ports of successive
// probes, taken in turn from the IANA ephemeral range: gVisor hands each
// segment to one of its TCP processor goroutines by a hash of the 4-tuple,
// so changing the port makes successive probes visit the processors.
const (
	probeFirstPort = 49152
	probePorts     = 65536 - probeFirstPort
)

// prober holds what Probe needs: the listener's port, the dispatcher the
// NIC receives with, and the one answer awaited.
type prober struct {
	listener tcpip.Endpoint // bound to probeAddr:port, listening; aborted by the stack's Close
	port     uint16

	dispatcher atomic.Pointer[stack.NetworkDispatcher] // set by loopbackLink.Attach

	run      sync.Mutex    // one probe at a time
	next     atomic.Uint32 // counter of source ports
	awaiting atomic.Uint32 // the source port of the probe awaiting its answer, 0: none
	answers  chan probeAnswer
}

// probeAnswer is the stack's answer to a probe's SYN, as loopbackLink saw it.
type probeAnswer struct {
	port  uint16 // its destination port: the probe's source port
	flags header.TCPFlags
	ack   uint32
}

func newProber() *prober {
	p := &prober{answers: make(chan probeAnswer, 1)}
	p.next.Store(rand.Uint32N(probePorts))
	return p
}

// listen makes the listener; the NIC and its address must exist.
func (p *prober) listen(s *stack.Stack) error {
	var wq waiter.Queue
	ep, err := s.NewEndpoint(tcp.ProtocolNumber, ipv4.ProtocolNumber, &wq)
	if err != nil {
		return fmt.Errorf("netstack: probe listener: %w", toError(err))
	}
	if err := ep.Bind(tcpip.FullAddress{NIC: nicID, Addr: probeAddr}); err != nil {
		ep.Close()
		return fmt.Errorf("netstack: probe listener: bind: %w", toError(err))
	}
	if err := ep.Listen(probeBacklog); err != nil {
		ep.Close()
		return fmt.Errorf("netstack: probe listener: listen: %w", toError(err))
	}
	la, err := ep.GetLocalAddress()
	if err != nil {
		ep.Close()
		return fmt.Errorf("netstack: probe listener: %w", toError(err))
	}
	p.listener, p.port = ep, la.Port
	return nil
}

// Probe proves that the stack processes packets: it hands the NIC a TCP
// SYN to a listener of the stack's own, exactly where the TUN's read loop
// hands it packets, and waits until the stack has answered with the
// SYN-ACK. On the way the SYN passes gVisor's IPv4 input, the TCP
// demultiplexer and one of its TCP processor goroutines (the ones that
// carry every flow's segments), and the SYN-ACK passes the stack's
// output to the link endpoint's write path, where it is taken back
// before the TUN. The half-open connection is reset at once.
//
// It does not prove that the TUN itself is read or written (that needs a
// kernel to send to it); it fails once the TUN's read loop has ended on
// an error, and after Close. It reaches no Handler and no counter of
// Stats. It returns an error when ctx ends before the answer, or when
// the answer is not the SYN-ACK. One probe runs at a time; successive
// probes use other source ports, so they visit gVisor's processors in
// turn.
func (s *Stack) Probe(ctx context.Context) error {
	if s.isClosed() {
		return ErrClosed
	}
	if err := s.readErr.Load(); err != nil {
		return fmt.Errorf("netstack: the TUN's read loop has ended: %w", *err)
	}
	p := s.prober
	d := p.dispatcher.Load()
	if d == nil {
		return errors.New("netstack: probe: the link is not attached")
	}
	p.run.Lock()
	defer p.run.Unlock()

	port := uint16(probeFirstPort + p.next.Add(1)%probePorts)
	seq := rand.Uint32()
	// Drop a late answer of an earlier probe that timed out.
	select {
	case <-p.answers:
	default:
	}
	p.awaiting.Store(uint32(port))
	defer p.awaiting.Store(0)
	p.inject(*d, port, seq, header.TCPFlagSyn)
	// Whatever happens, the listener's half-open connection goes.
	defer p.inject(*d, port, seq+1, header.TCPFlagRst)

	for {
		select {
		case a := <-p.answers:
			if a.port != port {
				continue // an earlier probe's, retransmitted
			}
			if a.flags != header.TCPFlagSyn|header.TCPFlagAck || a.ack != seq+1 {
				return fmt.Errorf("netstack: probe: the stack answered the SYN with flags %v ack %d, want SYN|ACK ack %d", a.flags, a.ack, seq+1)
			}
			return nil
		case <-ctx.Done():
			return fmt.Errorf("netstack: probe: no answer from the stack: %w", ctx.Err())
		}
	}
}

// inject hands the NIC one IPv4 TCP segment from probeAddr:port to the
// listener, without payload.
func (p *prober) inject(d stack.NetworkDispatcher, port uint16, seq uint32, flags header.TCPFlags) {
	const size = header.IPv4MinimumSize + header.TCPMinimumSize
	b := make([]byte, size)
	ip := header.IPv4(b)
	ip.Encode(&header.IPv4Fields{
		TotalLength: size,
		TTL:         64,
		Protocol:    uint8(header.TCPProtocolNumber),
		SrcAddr:     probeAddr,
		DstAddr:     probeAddr,
	})
	ip.SetChecksum(^ip.CalculateChecksum())
	t := header.TCP(b[header.IPv4MinimumSize:])
	t.Encode(&header.TCPFields{
		SrcPort:    port,
		DstPort:    p.port,
		SeqNum:     seq,
		DataOffset: header.TCPMinimumSize,
		Flags:      flags,
		WindowSize: 65535,
	})
	xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, probeAddr, probeAddr, header.TCPMinimumSize)
	t.SetChecksum(^t.CalculateChecksum(xsum))
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(b)})
	pkt.NetworkProtocolNumber = header.IPv4ProtocolNumber
	d.DeliverNetworkPacket(header.IPv4ProtocolNumber, pkt)
	pkt.DecRef()
}

// isProbeAnswer reports whether pkt, on its way out, is addressed to
// probeAddr: an answer to a probe, which never goes to the TUN.
func isProbeAnswer(pkt *stack.PacketBuffer) bool {
	if pkt.NetworkProtocolNumber != header.IPv4ProtocolNumber {
		return false
	}
	nh := pkt.NetworkHeader().Slice()
	return len(nh) >= header.IPv4MinimumSize && header.IPv4(nh).DestinationAddress() == probeAddr
}

// takeAnswer reports whether pkt is an answer to a probe (isProbeAnswer);
// the one from the listener's port to the awaited probe's is handed to
// Probe.
func (p *prober) takeAnswer(pkt *stack.PacketBuffer) bool {
	if !isProbeAnswer(pkt) {
		return false
	}
	th := pkt.TransportHeader().Slice()
	if pkt.TransportProtocolNumber != header.TCPProtocolNumber || len(th) < header.TCPMinimumSize {
		return true
	}
	t := header.TCP(th)
	if t.SourcePort() != p.port || uint32(t.DestinationPort()) != p.awaiting.Load() {
		return true
	}
	select {
	case p.answers <- probeAnswer{port: t.DestinationPort(), flags: t.Flags(), ack: t.AckNumber()}:
	default: // one is waiting already; Probe reads the first
	}
	return true
}
