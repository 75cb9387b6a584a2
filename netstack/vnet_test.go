package netstack

import (
	"bytes"
	"testing"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/meshtun/meshtun/tun"
)

// tcpPacket builds an IP packet carrying a TCP segment with correct
// checksums.
func tcpPacket(v6 bool, payload []byte) []byte {
	src4, dst4 := tcpip.AddrFrom4([4]byte{10, 99, 0, 1}), tcpip.AddrFrom4([4]byte{10, 244, 2, 5})
	src6 := tcpip.AddrFrom16([16]byte{0xfd, 0, 0, 0x99, 15: 1})
	dst6 := tcpip.AddrFrom16([16]byte{0xfd, 0, 2, 0x44, 15: 5})
	ipLen := header.IPv4MinimumSize
	if v6 {
		ipLen = header.IPv6MinimumSize
	}
	b := make([]byte, ipLen+header.TCPMinimumSize+len(payload))
	tl := header.TCPMinimumSize + len(payload)
	var src, dst tcpip.Address
	if v6 {
		header.IPv6(b).Encode(&header.IPv6Fields{PayloadLength: uint16(tl), TransportProtocol: header.TCPProtocolNumber, HopLimit: 64, SrcAddr: src6, DstAddr: dst6})
		src, dst = src6, dst6
	} else {
		ip := header.IPv4(b)
		ip.Encode(&header.IPv4Fields{TotalLength: uint16(len(b)), TTL: 64, Protocol: uint8(header.TCPProtocolNumber), SrcAddr: src4, DstAddr: dst4})
		ip.SetChecksum(^ip.CalculateChecksum())
		src, dst = src4, dst4
	}
	tcp := header.TCP(b[ipLen:])
	tcp.Encode(&header.TCPFields{SrcPort: 40000, DstPort: 8080, SeqNum: 1, DataOffset: header.TCPMinimumSize, Flags: header.TCPFlagAck, WindowSize: 1000})
	copy(b[ipLen+header.TCPMinimumSize:], payload)
	xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, src, dst, uint16(tl))
	tcp.SetChecksum(^checksum.Checksum(b[ipLen:], xsum))
	return b
}

func TestChecksumsValid(t *testing.T) {
	payload := []byte("hello, offload")
	tests := []struct {
		name    string
		v6      bool
		corrupt int // byte offset to flip, -1 for none
		want    bool
	}{
		{"IPv4 good", false, -1, true},
		{"IPv4 payload flipped", false, 45, false},
		{"IPv4 header flipped", false, 8, false},
		{"IPv6 good", true, -1, true},
		{"IPv6 payload flipped", true, 65, false},
		{"IPv6 address flipped", true, 39, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := tcpPacket(tt.v6, payload)
			if tt.corrupt >= 0 {
				b[tt.corrupt] ^= 0x40
			}
			proto := header.IPv4ProtocolNumber
			if tt.v6 {
				proto = header.IPv6ProtocolNumber
			}
			if got := checksumsValid(b, proto); got != tt.want {
				t.Fatalf("checksumsValid = %v, want %v", got, tt.want)
			}
		})
	}
}

// FuzzChecksumsValid: whatever the kernel hands over, validation neither
// panics nor reads out of bounds.
func FuzzChecksumsValid(f *testing.F) {
	f.Add(tcpPacket(false, []byte("x")))
	f.Add(tcpPacket(true, []byte("x")))
	f.Add([]byte{0x45})
	f.Fuzz(func(t *testing.T, b []byte) {
		switch header.IPVersion(b) {
		case header.IPv4Version:
			checksumsValid(b, header.IPv4ProtocolNumber)
		case header.IPv6Version:
			checksumsValid(b, header.IPv6ProtocolNumber)
		}
	})
}

// splitHeaders puts exactly the IP and TCP headers in a view of their own
// and keeps every byte; anything but plain TCP stays one view.
func TestSplitHeaders(t *testing.T) {
	payload := make([]byte, 40<<10)
	for i := range payload {
		payload[i] = byte(i)
	}
	udp := tcpPacket(false, payload)
	udp[9] = uint8(header.UDPProtocolNumber) // the IPv4 protocol field
	frag := tcpPacket(false, payload)
	header.IPv4(frag).SetFlagsFragmentOffset(header.IPv4FlagMoreFragments, 0)
	for _, tt := range []struct {
		name      string
		pkt       []byte
		proto     tcpip.NetworkProtocolNumber
		wantFirst int // length of the first view; the whole packet if not split
	}{
		{"ipv4 tcp", tcpPacket(false, payload), header.IPv4ProtocolNumber, header.IPv4MinimumSize + header.TCPMinimumSize},
		{"ipv6 tcp", tcpPacket(true, payload), header.IPv6ProtocolNumber, header.IPv6MinimumSize + header.TCPMinimumSize},
		{"ipv4 udp", udp, header.IPv4ProtocolNumber, len(udp)},
		{"ipv4 fragment", frag, header.IPv4ProtocolNumber, len(frag)},
		{"truncated", tcpPacket(false, nil)[:header.IPv4MinimumSize+4], header.IPv4ProtocolNumber, header.IPv4MinimumSize + 4},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := splitHeaders(buffer.NewViewWithData(tt.pkt), tt.proto)
			defer b.Release()
			if got := b.Flatten(); !bytes.Equal(got, tt.pkt) {
				t.Fatalf("bytes changed: %d bytes, want %d", len(got), len(tt.pkt))
			}
			var lens []int
			b.Apply(func(v *buffer.View) { lens = append(lens, v.Size()) })
			if lens[0] != tt.wantFirst {
				t.Fatalf("view sizes %v, want the first %d", lens, tt.wantFirst)
			}
		})
	}
}

// gsoPacket is an outbound packet as gVisor hands it to the link: IP and
// TCP headers pushed in front of payloadLen bytes, with GSO options of
// type typ and mss, and (for NeedsCsum) only the pseudo-header sum in
// the TCP checksum field.
func gsoPacket(v6 bool, payloadLen int, typ stack.GSOType, needsCsum bool, mss uint16) *stack.PacketBuffer {
	payload := make([]byte, payloadLen)
	for i := range payload {
		payload[i] = byte(i * 13)
	}
	full := tcpPacket(v6, payload)
	ipLen := header.IPv4MinimumSize
	if v6 {
		ipLen = header.IPv6MinimumSize
	}
	hdrLen := ipLen + header.TCPMinimumSize
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{
		ReserveHeaderBytes: hdrLen,
		Payload:            buffer.MakeWithData(full[hdrLen:]),
	})
	th := header.TCP(pkt.TransportHeader().Push(header.TCPMinimumSize))
	copy(th, full[ipLen:hdrLen])
	copy(pkt.NetworkHeader().Push(ipLen), full[:ipLen])
	pkt.NetworkProtocolNumber = header.IPv4ProtocolNumber
	var src, dst tcpip.Address
	if v6 {
		pkt.NetworkProtocolNumber = header.IPv6ProtocolNumber
		ip := header.IPv6(full)
		src, dst = ip.SourceAddress(), ip.DestinationAddress()
	} else {
		ip := header.IPv4(full)
		src, dst = ip.SourceAddress(), ip.DestinationAddress()
	}
	if needsCsum {
		th.SetChecksum(header.PseudoHeaderChecksum(header.TCPProtocolNumber, src, dst, uint16(header.TCPMinimumSize+payloadLen)))
	}
	pkt.GSOOptions = stack.GSO{Type: typ, NeedsCsum: needsCsum, CsumOffset: 16, MSS: mss, L3HdrLen: uint16(ipLen)}
	return pkt
}

// TestVnetHeader: the header written in front of each outbound packet.
// Plain packets and single-segment GSO packets go without one (the
// latter with their checksum finished here); super-packets ask the kernel
// to finish the checksum and segment at the MSS.
func TestVnetHeader(t *testing.T) {
	tests := []struct {
		name      string
		pkt       func() *stack.PacketBuffer
		want      tun.VirtioNetHdr
		wantErr   bool
		wantValid bool // the packet's checksums are full afterwards
	}{
		{"plain", func() *stack.PacketBuffer { return gsoPacket(false, 100, stack.GSONone, false, 0) },
			tun.VirtioNetHdr{}, false, true},
		{"GSO without NeedsCsum", func() *stack.PacketBuffer { return gsoPacket(false, 4000, stack.GSOTCPv4, false, 1448) },
			tun.VirtioNetHdr{}, false, true},
		{"IPv4 one segment", func() *stack.PacketBuffer { return gsoPacket(false, 1448, stack.GSOTCPv4, true, 1448) },
			tun.VirtioNetHdr{}, false, true},
		{"IPv6 one segment", func() *stack.PacketBuffer { return gsoPacket(true, 999, stack.GSOTCPv6, true, 1448) },
			tun.VirtioNetHdr{}, false, true},
		{"IPv4 super-packet", func() *stack.PacketBuffer { return gsoPacket(false, 4000, stack.GSOTCPv4, true, 1448) },
			tun.VirtioNetHdr{Flags: tun.VirtioNetHdrFNeedsCsum, GSOType: tun.VirtioNetHdrGSOTCPv4, HdrLen: 40, GSOSize: 1448, CsumStart: 20, CsumOffset: 16}, false, false},
		{"IPv6 super-packet", func() *stack.PacketBuffer { return gsoPacket(true, 1449, stack.GSOTCPv6, true, 1448) },
			tun.VirtioNetHdr{Flags: tun.VirtioNetHdrFNeedsCsum, GSOType: tun.VirtioNetHdrGSOTCPv6, HdrLen: 60, GSOSize: 1448, CsumStart: 40, CsumOffset: 16}, false, false},
		{"gVisor GSO", func() *stack.PacketBuffer { return gsoPacket(false, 4000, stack.GSOGvisor, true, 1448) },
			tun.VirtioNetHdr{}, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pkt := tt.pkt()
			defer pkt.DecRef()
			got, err := vnetHeader(pkt)
			if (err != nil) != tt.wantErr {
				t.Fatalf("vnetHeader error %v; want error %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Fatalf("vnetHeader = %+v; want %+v", got, tt.want)
			}
			if tt.wantErr {
				return
			}
			v := pkt.ToView()
			defer v.Release()
			if valid := checksumsValid(v.AsSlice(), pkt.NetworkProtocolNumber); valid != tt.wantValid {
				t.Fatalf("checksums valid %v after vnetHeader; want %v", valid, tt.wantValid)
			}
		})
	}
}

// TestVnetHeaderAllocs: the per-packet header work on both paths (build
// and encode on write, decode on read) allocates nothing.
func TestVnetHeaderAllocs(t *testing.T) {
	pkt := gsoPacket(false, 4000, stack.GSOTCPv4, true, 1448)
	defer pkt.DecRef()
	var b [tun.VnetHdrLen]byte
	var in tun.VirtioNetHdr
	allocs := testing.AllocsPerRun(1000, func() {
		vh, err := vnetHeader(pkt)
		if err != nil {
			panic(err)
		}
		vh.Encode(b[:])
		if err := in.Decode(b[:]); err != nil {
			panic(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per packet header; want 0", allocs)
	}
	if in.GSOType != tun.VirtioNetHdrGSOTCPv4 || in.GSOSize != 1448 {
		t.Fatalf("header read back as %+v", in)
	}
}
