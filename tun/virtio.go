package tun

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// VnetHdrLen is the size of the struct virtio_net_hdr that precedes every
// packet read from or written to a device opened with offload (the
// kernel's default vnet header size; num_buffers is not used).
const VnetHdrLen = 10

// Values of VirtioNetHdr.Flags (VIRTIO_NET_HDR_F_*, linux/virtio_net.h).
const (
	// VirtioNetHdrFNeedsCsum: the transport checksum is partial (the
	// pseudo-header sum only); the receiver completes it over the bytes
	// from CsumStart and stores it at CsumStart+CsumOffset.
	VirtioNetHdrFNeedsCsum = 1
	// VirtioNetHdrFDataValid: the checksums were already validated.
	VirtioNetHdrFDataValid = 2
	// VirtioNetHdrFRSCInfo: receive-segment-coalescing information is
	// present (not used by a TUN).
	VirtioNetHdrFRSCInfo = 4
)

// Values of VirtioNetHdr.GSOType (VIRTIO_NET_HDR_GSO_*).
const (
	// VirtioNetHdrGSONone: a single packet, not to be segmented.
	VirtioNetHdrGSONone = 0
	// VirtioNetHdrGSOTCPv4: an IPv4 TCP super-packet, to be cut into
	// segments of GSOSize payload bytes (TSO).
	VirtioNetHdrGSOTCPv4 = 1
	// VirtioNetHdrGSOUDP: an IPv4/IPv6 UDP packet to fragment (UFO).
	VirtioNetHdrGSOUDP = 3
	// VirtioNetHdrGSOTCPv6: as VirtioNetHdrGSOTCPv4, for IPv6.
	VirtioNetHdrGSOTCPv6 = 4
	// VirtioNetHdrGSOUDPL4: a UDP super-packet to cut into datagrams (USO).
	VirtioNetHdrGSOUDPL4 = 5
	// VirtioNetHdrGSOECN: a bit or-ed into a TCP GSO type: the packet has
	// the ECN CWR flag set, for the first segment only.
	VirtioNetHdrGSOECN = 0x80
)

// ErrShortVirtioNetHdr is returned (wrapped) by Decode for fewer than
// VnetHdrLen bytes.
var ErrShortVirtioNetHdr = errors.New("tun: virtio_net_hdr truncated")

// VirtioNetHdr is struct virtio_net_hdr (linux/virtio_net.h), the header
// of every packet on a device opened with offload. Its 16-bit fields are
// in the host's byte order (little-endian on x86 and arm64): the legacy
// layout a TUN uses while it is not told TUNSETVNETLE/BE.
//
// Encode and Decode work on a caller's buffer and allocate nothing, so the
// packet path can use them per packet.
type VirtioNetHdr struct {
	Flags   uint8 // VirtioNetHdrF* bits
	GSOType uint8 // a VirtioNetHdrGSO* value, maybe with VirtioNetHdrGSOECN
	// HdrLen is the length of the headers (IP + TCP) of a GSO packet, the
	// part copied in front of each segment. The kernel's value is a hint;
	// parse the headers rather than trust it.
	HdrLen uint16
	// GSOSize is the payload bytes per segment (the MSS) of a GSO packet.
	GSOSize uint16
	// CsumStart is the offset from the start of the packet (the IP
	// header) where checksumming starts, and CsumOffset the offset of the
	// checksum field from CsumStart (16 for TCP, 6 for UDP). Set with
	// VirtioNetHdrFNeedsCsum.
	CsumStart  uint16
	CsumOffset uint16
}

// Encode writes h into the first VnetHdrLen bytes of b. It panics if b is
// shorter, as binary.ByteOrder's Put methods do: the buffer is the
// caller's own, never input.
func (h *VirtioNetHdr) Encode(b []byte) {
	_ = b[VnetHdrLen-1] // one bounds check for all the stores
	b[0] = h.Flags
	b[1] = h.GSOType
	binary.NativeEndian.PutUint16(b[2:], h.HdrLen)
	binary.NativeEndian.PutUint16(b[4:], h.GSOSize)
	binary.NativeEndian.PutUint16(b[6:], h.CsumStart)
	binary.NativeEndian.PutUint16(b[8:], h.CsumOffset)
}

// Decode reads h from the first VnetHdrLen bytes of b. Fewer bytes are an
// error wrapping ErrShortVirtioNetHdr, and h is left unchanged. Any field
// values are accepted: checking them is up to the user.
func (h *VirtioNetHdr) Decode(b []byte) error {
	if len(b) < VnetHdrLen {
		return fmt.Errorf("%w: %d bytes, want %d", ErrShortVirtioNetHdr, len(b), VnetHdrLen)
	}
	*h = VirtioNetHdr{
		Flags:      b[0],
		GSOType:    b[1],
		HdrLen:     binary.NativeEndian.Uint16(b[2:]),
		GSOSize:    binary.NativeEndian.Uint16(b[4:]),
		CsumStart:  binary.NativeEndian.Uint16(b[6:]),
		CsumOffset: binary.NativeEndian.Uint16(b[8:]),
	}
	return nil
}
