package netstack

import (
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// catchAllV4 is the one permanent IPv4 address of the NIC, with prefix
// length 0 (see loopbackLink). 192.0.0.8 is the IPv4 dummy address of RFC
// 7600, meant as a source when a host has no address of its own: nothing
// routes it into a TUN, and no real destination is shadowed by it.
var catchAllV4 = tcpip.ProtocolAddress{
	Protocol: header.IPv4ProtocolNumber,
	AddressWithPrefix: tcpip.AddressWithPrefix{
		Address:   tcpip.AddrFrom4([4]byte{192, 0, 0, 8}),
		PrefixLen: 0,
	},
}

// loopbackLink makes the NIC report CapabilityLoopback, which turns the
// IPv4 catch-all from a linear scan into a constant-time match.
//
// Why: in promiscuous mode every destination IP of a live connection is a
// temporary address of the NIC, and on an exact-match miss gVisor's IPv4
// endpoint scans all of them under a lock (AcquireAssignedAddressOrMatching
// with a subnet-broadcast matcher). Every inbound packet misses once (the
// "source is not a subnet broadcast" check looks up the client's address)
// and a new destination costs several scans, so with thousands of
// destinations connection setup and even established flows slowed to a
// crawl (docs/field-notes.md, "Many destination IPs": 5,000
// destinations, bulk 1.1 Gbit/s → 30 Mbit/s).
// On a loopback NIC the matcher also accepts any address inside the subnet
// of an assigned address; with catchAllV4 (a /0) assigned, the first entry
// scanned matches every destination, no temporary address is created, and
// the destination stays the one the client dialled. IPv6 does only the map
// lookup and was never affected.
//
// Costs, handled or accepted:
//   - gVisor computes no TCP/UDP checksums on a loopback route;
//     WritePackets fills them in, except on GSO packets that carry only
//     the pseudo-header sum for the kernel to finish (NeedsCsum).
//   - gVisor answers ICMP echo for every IPv4 address (all are "assigned").
//   - no link address resolution, which a TUN never needs.
//
// It leans on gVisor internals; TestManyDestinations pins the behaviour.
//
// It is also where the stack's self-probe (probe.go) enters and leaves:
// Attach keeps the NIC's dispatcher for Probe to hand its SYN to, and
// WritePackets takes back every packet addressed to probeAddr, which
// never goes to the TUN.
type loopbackLink struct {
	stack.LinkEndpoint
	probe *prober
	syn   *synWriter // nil: SYNs are written inline
}

var _ stack.LinkEndpoint = (*loopbackLink)(nil)
var _ stack.GSOEndpoint = (*loopbackLink)(nil)

// Capabilities adds CapabilityLoopback to the wrapped endpoint's.
func (l *loopbackLink) Capabilities() stack.LinkEndpointCapabilities {
	return l.LinkEndpoint.Capabilities() | stack.CapabilityLoopback
}

// GSOMaxSize passes the wrapped endpoint's through (0 without GSO): the
// stack finds GSO by a type assertion that the embedding would hide.
func (l *loopbackLink) GSOMaxSize() uint32 {
	if g, ok := l.LinkEndpoint.(stack.GSOEndpoint); ok {
		return g.GSOMaxSize()
	}
	return 0
}

// SupportedGSO passes the wrapped endpoint's through.
func (l *loopbackLink) SupportedGSO() stack.SupportedGSO {
	if g, ok := l.LinkEndpoint.(stack.GSOEndpoint); ok {
		return g.SupportedGSO()
	}
	return stack.GSONotSupported
}

// Attach keeps d for the probe, then attaches the wrapped endpoint.
func (l *loopbackLink) Attach(d stack.NetworkDispatcher) {
	if d != nil {
		l.probe.dispatcher.Store(&d)
	} else {
		l.probe.dispatcher.Store(nil)
	}
	l.LinkEndpoint.Attach(d)
}

// WritePackets fills in the transport checksums the stack left out, then
// writes through the wrapped endpoint; answers to the probe are taken out
// of pkts first, and SYN segments go to the synWriter (synwrite.go).
func (l *loopbackLink) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	// Rare (a probe every few seconds, a SYN-ACK per connection): when a
	// packet is taken, the rest of the list is handed on as a new one. The
	// references stay the caller's, which releases every packet of pkts
	// after the write (as with any link endpoint), the taken ones too; the
	// synWriter holds its own.
	var rest stack.PacketBufferList
	taken := 0
	all := pkts.AsSlice()
	for i, pkt := range all {
		if !l.probe.takeAnswer(pkt) {
			fillChecksum(pkt)
			if l.syn == nil || !isSYN(pkt) || !l.syn.queue(pkt) {
				if taken > 0 {
					rest.PushBack(pkt)
				}
				continue
			}
		}
		if taken == 0 {
			for _, p := range all[:i] {
				rest.PushBack(p)
			}
		}
		taken++
	}
	if taken == 0 {
		return l.LinkEndpoint.WritePackets(pkts)
	}
	if rest.Len() == 0 {
		return taken, nil
	}
	n, err := l.LinkEndpoint.WritePackets(rest)
	return n + taken, err
}

// Close stops the synWriter, then closes the wrapped endpoint.
func (l *loopbackLink) Close() {
	if l.syn != nil {
		l.syn.close()
	}
	l.LinkEndpoint.Close()
}

// fillChecksum computes the full TCP or UDP checksum of an outbound packet,
// unless it is a GSO packet whose checksum the kernel completes.
func fillChecksum(pkt *stack.PacketBuffer) {
	if pkt.GSOOptions.Type != stack.GSONone && pkt.GSOOptions.NeedsCsum {
		return
	}
	var src, dst tcpip.Address
	nh := pkt.NetworkHeader().Slice()
	switch pkt.NetworkProtocolNumber {
	case header.IPv4ProtocolNumber:
		if len(nh) < header.IPv4MinimumSize {
			return
		}
		ip := header.IPv4(nh)
		src, dst = ip.SourceAddress(), ip.DestinationAddress()
	case header.IPv6ProtocolNumber:
		if len(nh) < header.IPv6MinimumSize {
			return
		}
		ip := header.IPv6(nh)
		src, dst = ip.SourceAddress(), ip.DestinationAddress()
	default:
		return
	}
	th := pkt.TransportHeader().Slice()
	length := uint16(len(th) + pkt.Data().Size())
	switch pkt.TransportProtocolNumber {
	case header.TCPProtocolNumber:
		if len(th) < header.TCPMinimumSize {
			return
		}
		tcp := header.TCP(th)
		tcp.SetChecksum(0)
		xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, src, dst, length)
		xsum = checksum.Combine(xsum, pkt.Data().Checksum())
		tcp.SetChecksum(^tcp.CalculateChecksum(xsum))
	case header.UDPProtocolNumber:
		if len(th) < header.UDPMinimumSize {
			return
		}
		udp := header.UDP(th)
		udp.SetChecksum(0)
		xsum := header.PseudoHeaderChecksum(header.UDPProtocolNumber, src, dst, length)
		xsum = checksum.Combine(xsum, pkt.Data().Checksum())
		// A computed 0 is sent as 0xffff: 0 means "no checksum" in UDP.
		if c := ^udp.CalculateChecksum(xsum); c != 0 {
			udp.SetChecksum(c)
		} else {
			udp.SetChecksum(0xffff)
		}
	}
}
