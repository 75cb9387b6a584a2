package tun_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/meshtun/meshtun/tun"
)

// le returns the ten header bytes written little-endian (as on x86), in
// the host's order: the 16-bit fields are swapped on a big-endian host.
func le(b ...byte) []byte {
	if len(b) != tun.VnetHdrLen {
		panic("le: not a virtio_net_hdr")
	}
	out := append([]byte(nil), b...)
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		for i := 2; i < len(out); i += 2 {
			out[i], out[i+1] = out[i+1], out[i]
		}
	}
	return out
}

var hdrTests = []struct {
	name  string
	wire  []byte
	value tun.VirtioNetHdr
}{
	{"plain packet", le(0, 0, 0, 0, 0, 0, 0, 0, 0, 0), tun.VirtioNetHdr{}},
	{"validated by the kernel", le(2, 0, 0, 0, 0, 0, 0, 0, 0, 0),
		tun.VirtioNetHdr{Flags: tun.VirtioNetHdrFDataValid}},
	{"partial checksum, one IPv4 TCP segment", le(1, 0, 0, 0, 0, 0, 20, 0, 16, 0),
		tun.VirtioNetHdr{Flags: tun.VirtioNetHdrFNeedsCsum, CsumStart: 20, CsumOffset: 16}},
	{"TSO IPv4, MSS 1448", le(1, 1, 52, 0, 0xa8, 0x05, 20, 0, 16, 0),
		tun.VirtioNetHdr{Flags: tun.VirtioNetHdrFNeedsCsum, GSOType: tun.VirtioNetHdrGSOTCPv4, HdrLen: 52, GSOSize: 1448, CsumStart: 20, CsumOffset: 16}},
	{"TSO IPv6 with ECN, MSS 65000-60", le(1, 0x84, 72, 0, 0xac, 0xfd, 40, 0, 16, 0),
		tun.VirtioNetHdr{Flags: tun.VirtioNetHdrFNeedsCsum, GSOType: tun.VirtioNetHdrGSOTCPv6 | tun.VirtioNetHdrGSOECN, HdrLen: 72, GSOSize: 64940, CsumStart: 40, CsumOffset: 16}},
	{"USO", le(1, 5, 28, 0, 0xdc, 0x05, 20, 0, 6, 0),
		tun.VirtioNetHdr{Flags: tun.VirtioNetHdrFNeedsCsum, GSOType: tun.VirtioNetHdrGSOUDPL4, HdrLen: 28, GSOSize: 1500, CsumStart: 20, CsumOffset: 6}},
	{"every bit set", le(0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff),
		tun.VirtioNetHdr{Flags: 0xff, GSOType: 0xff, HdrLen: 0xffff, GSOSize: 0xffff, CsumStart: 0xffff, CsumOffset: 0xffff}},
	{"each field its own value", le(1, 4, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08),
		tun.VirtioNetHdr{Flags: 1, GSOType: 4, HdrLen: 0x0201, GSOSize: 0x0403, CsumStart: 0x0605, CsumOffset: 0x0807}},
}

func TestVirtioNetHdrDecode(t *testing.T) {
	for _, tt := range hdrTests {
		t.Run(tt.name, func(t *testing.T) {
			var h tun.VirtioNetHdr
			if err := h.Decode(tt.wire); err != nil {
				t.Fatalf("Decode(%x): %v", tt.wire, err)
			}
			if h != tt.value {
				t.Fatalf("Decode(%x) = %+v; want %+v", tt.wire, h, tt.value)
			}
			// The packet that follows the header is not the header's.
			withPacket := append(append([]byte(nil), tt.wire...), 0x45, 0, 0, 40)
			var h2 tun.VirtioNetHdr
			if err := h2.Decode(withPacket); err != nil || h2 != tt.value {
				t.Fatalf("Decode of header + packet = %+v, %v; want %+v", h2, err, tt.value)
			}
		})
	}
}

func TestVirtioNetHdrEncode(t *testing.T) {
	for _, tt := range hdrTests {
		t.Run(tt.name, func(t *testing.T) {
			// Encode writes the header and nothing past it.
			b := bytes.Repeat([]byte{0xee}, tun.VnetHdrLen+4)
			tt.value.Encode(b)
			if !bytes.Equal(b[:tun.VnetHdrLen], tt.wire) {
				t.Fatalf("Encode(%+v) = %x; want %x", tt.value, b[:tun.VnetHdrLen], tt.wire)
			}
			if !bytes.Equal(b[tun.VnetHdrLen:], []byte{0xee, 0xee, 0xee, 0xee}) {
				t.Fatalf("Encode wrote past the header: %x", b)
			}
		})
	}
}

// TestVirtioNetHdrTruncated: fewer than ten bytes are an error that says
// so, and the header keeps its value.
func TestVirtioNetHdrTruncated(t *testing.T) {
	full := le(1, 1, 52, 0, 0xa8, 0x05, 20, 0, 16, 0)
	prev := tun.VirtioNetHdr{Flags: 2, GSOSize: 7}
	for n := 0; n < tun.VnetHdrLen; n++ {
		h := prev
		err := h.Decode(full[:n])
		if !errors.Is(err, tun.ErrShortVirtioNetHdr) {
			t.Fatalf("Decode of %d bytes: %v; want ErrShortVirtioNetHdr", n, err)
		}
		if h != prev {
			t.Fatalf("Decode of %d bytes changed the header to %+v", n, h)
		}
	}
	var h tun.VirtioNetHdr
	if err := h.Decode(nil); !errors.Is(err, tun.ErrShortVirtioNetHdr) {
		t.Fatalf("Decode(nil): %v; want ErrShortVirtioNetHdr", err)
	}
}

// TestVirtioNetHdrEncodeShort: Encode into a buffer too small is a
// programming error and panics before writing anything.
func TestVirtioNetHdrEncodeShort(t *testing.T) {
	b := make([]byte, tun.VnetHdrLen-1)
	defer func() {
		if recover() == nil {
			t.Fatal("Encode into 9 bytes did not panic")
		}
		if !bytes.Equal(b, make([]byte, len(b))) {
			t.Fatalf("Encode into 9 bytes wrote %x before panicking", b)
		}
	}()
	h := tun.VirtioNetHdr{Flags: 1, GSOType: 1, HdrLen: 1, GSOSize: 1, CsumStart: 1, CsumOffset: 1}
	h.Encode(b)
}

// TestVirtioNetHdrAllocs: the codec allocates nothing, so the packet path
// can use it per packet.
func TestVirtioNetHdrAllocs(t *testing.T) {
	var b [tun.VnetHdrLen]byte
	h := hdrTests[3].value
	var out tun.VirtioNetHdr
	allocs := testing.AllocsPerRun(1000, func() {
		h.Encode(b[:])
		if err := out.Decode(b[:]); err != nil {
			panic(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("Encode + Decode: %v allocations per header; want 0", allocs)
	}
	if out != h {
		t.Fatalf("round trip: %+v; want %+v", out, h)
	}
}

// FuzzVirtioNetHdr: Decode never panics; what it accepts encodes back to
// the same ten bytes, and decodes again to the same value.
func FuzzVirtioNetHdr(f *testing.F) {
	for _, tt := range hdrTests {
		f.Add(tt.wire)
	}
	f.Add([]byte{})
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		var h tun.VirtioNetHdr
		if err := h.Decode(b); err != nil {
			if len(b) >= tun.VnetHdrLen {
				t.Fatalf("Decode of %d bytes: %v", len(b), err)
			}
			return
		}
		if len(b) < tun.VnetHdrLen {
			t.Fatalf("Decode accepted %d bytes", len(b))
		}
		var enc [tun.VnetHdrLen]byte
		h.Encode(enc[:])
		if !bytes.Equal(enc[:], b[:tun.VnetHdrLen]) {
			t.Fatalf("Encode(Decode(%x)) = %x", b[:tun.VnetHdrLen], enc)
		}
		var again tun.VirtioNetHdr
		if err := again.Decode(enc[:]); err != nil || again != h {
			t.Fatalf("Decode(Encode(%+v)) = %+v, %v", h, again, err)
		}
	})
}
