package netstack

import (
	"bytes"
	"testing"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/stack/gro"

	"github.com/meshtun/meshtun/tun"
)

// The receive buffer is not cleared before a read (newReadView, and the
// patch to gVisor's pkg/buffer in third_party/gvisor-patches). These tests
// hold what that may not change: no byte of an earlier packet is ever
// behind a view the stack gets, and gVisor's own views stay zero wherever
// nothing wrote.

// capture is a dispatcher that keeps the packets delivered to it.
type capture struct{ pkts []*stack.PacketBuffer }

func (c *capture) DeliverNetworkPacket(_ tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) {
	c.pkts = append(c.pkts, pkt.IncRef())
}

func (c *capture) DeliverLinkPacket(tcpip.NetworkProtocolNumber, *stack.PacketBuffer) {}

func TestDeliverLeavesNoStaleBytes(t *testing.T) {
	for _, size := range []int{vnetCopyBelow + 100, vnetGROBypass + 100} {
		pkt := tcpPacket(false, bytes.Repeat([]byte("m"), size))
		var c capture
		var g gro.GRO
		g.Init(true)
		g.Dispatcher = &c
		// What an earlier, larger packet left in the buffer.
		view := newReadView()
		buf := view.AsSlice()
		for i := range buf {
			buf[i] = 0xaa
		}
		copy(buf, pkt)
		handed, mem := view, buf[:cap(buf)]
		var hdr [tun.VnetHdrLen]byte
		next := (&vnetLink{}).deliver(&g, hdr[:], view, len(pkt))
		g.Flush()
		if next == handed {
			t.Fatalf("%d B: deliver kept the view it handed on", len(pkt))
		}
		next.Release()
		// Every byte of the handed view's memory past the packet (the
		// packet holds it): what a Grow of the view would expose.
		if i := bytes.IndexByte(mem[len(pkt):], 0xaa); i >= 0 {
			t.Errorf("%d B: byte %d past the packet is an earlier packet's", len(pkt), i)
		}
		if len(c.pkts) != 1 {
			t.Fatalf("%d B: %d packets delivered, want 1", len(pkt), len(c.pkts))
		}
		got := c.pkts[0].ToView()
		if !bytes.Equal(got.AsSlice(), pkt) {
			t.Errorf("%d B: the stack got %d bytes that are not the packet", len(pkt), got.Size())
		}
		got.Release()
		c.pkts[0].DecRef()
	}
}

// dirty fills size-class chunks with 0xaa and returns them to their pool.
func dirty(size int) {
	for range 4 {
		v := buffer.NewViewSize(size)
		b := v.AsSlice()
		for i := range b {
			b[i] = 0xaa
		}
		v.Release()
	}
}

func zeroPast(t *testing.T, what string, v *buffer.View) {
	t.Helper()
	b := v.AsSlice()
	if i := bytes.IndexByte(b[:cap(b)][len(b):], 0xaa); i >= 0 {
		t.Errorf("%s: byte %d past the view's data is a pooled chunk's old one", what, i)
	}
}

func TestPatchedBufferZeroWhereNothingWrote(t *testing.T) {
	const size = 1500
	dirty(2048)
	v := buffer.NewViewWithData(bytes.Repeat([]byte("x"), size))
	zeroPast(t, "NewViewWithData", v)
	v.Release()

	dirty(4096)
	v = buffer.NewViewWithData(bytes.Repeat([]byte("y"), 1024))
	if _, err := v.Write(bytes.Repeat([]byte("z"), 2048)); err != nil { // past its chunk: growCap
		t.Fatal(err)
	}
	if want := append(bytes.Repeat([]byte("y"), 1024), bytes.Repeat([]byte("z"), 2048)...); !bytes.Equal(v.AsSlice(), want) {
		t.Errorf("grown view holds %q…, want y×1024 z×2048", v.AsSlice()[:16])
	}
	zeroPast(t, "growCap", v)
	v.Release()

	dirty(vnetReadSize)
	v = buffer.NewViewSizeUninitialized(vnetReadSize)
	if v.Size() != vnetReadSize {
		t.Fatalf("NewViewSizeUninitialized(%d) has %d bytes", vnetReadSize, v.Size())
	}
	zeroPast(t, "NewViewSizeUninitialized", v)
	v.Release()

	// What a TCP endpoint's Write queues (WriteFromReader): the rest of
	// the pooled chunk past what it copied stays zero.
	dirty(1024)
	var buf buffer.Buffer
	data := bytes.Repeat([]byte("w"), 1000)
	if n, err := buf.WriteFromReader(bytes.NewReader(data), int64(len(data))); n != int64(len(data)) || err != nil {
		t.Fatalf("WriteFromReader: %d, %v; want %d, nil", n, err, len(data))
	}
	if !bytes.Equal(buf.Flatten(), data) {
		t.Error("WriteFromReader did not write what it read")
	}
	buf.Apply(func(v *buffer.View) { zeroPast(t, "WriteFromReader", v) })
	buf.Release()

	// A shared chunk written to is copied (Clone): every byte the same.
	dirty(2048)
	a := buffer.NewViewWithData(bytes.Repeat([]byte("c"), size))
	b := a.Clone()
	if _, err := b.Write([]byte("d")); err != nil {
		t.Fatal(err)
	}
	if want := append(bytes.Repeat([]byte("c"), size), 'd'); !bytes.Equal(b.AsSlice(), want) {
		t.Errorf("written clone holds %d bytes, not the original's and the write", b.Size())
	}
	if !bytes.Equal(a.AsSlice(), bytes.Repeat([]byte("c"), size)) {
		t.Error("a write to a clone changed the original")
	}
	zeroPast(t, "a written clone", b)
	a.Release()
	b.Release()
}

// TestReadViewIsNotCleared holds the saving itself: a receive buffer
// comes from the pool as its last user left it. sync.Pool may drop an
// object (often, under -race), so a few tries.
func TestReadViewIsNotCleared(t *testing.T) {
	for range 100 {
		dirty(vnetReadSize)
		v := newReadView()
		reused := v.AsSlice()[0] == 0xaa
		v.Release()
		if reused {
			return
		}
	}
	t.Fatal("100 receive buffers taken right after dirty ones were all cleared: is the uninitialized view patched out of third_party/gvisor?")
}
