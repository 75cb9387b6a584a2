package netstack_test

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/meshtun/meshtun/netstack"
)

// The tests over gVisor's channel endpoint (Options.Link) need no root and
// no TUN: the test is the client's kernel. It injects TCP segments built
// with gVisor's header package and reads what the stack sends back, every
// packet checked for valid IPv4 and TCP checksums (which the loopback
// wrapper fills in: gVisor leaves them out on a loopback NIC). The tests
// in namespaces stay the proof of the TUN path.

const (
	// chanMTU is the channel endpoint's MTU, a TUN's usual one.
	chanMTU = 1500
	// chanQueue is the channel endpoint's outbound queue; tap drains it
	// as each packet is written, so it only needs to absorb a burst.
	chanQueue = 256
	// chanTapSize is how many sent packets tap holds for the test to
	// read; more are dropped, as a full wire would, and counted (read
	// reports the count when it times out).
	chanTapSize = 4096
	// readBound is how many packets a test reads at most while looking
	// for one segment (pure ACKs and window updates are skipped).
	readBound = 64
)

// chanFamilies are the flows the channel tests use: a client and the
// destination it dials (the addresses of the TUN tests).
var chanFamilies = []struct {
	name     string
	src, dst netip.AddrPort
}{
	{"IPv4", netip.MustParseAddrPort("10.99.0.1:40000"), netip.MustParseAddrPort("10.244.2.5:8080")},
	{"IPv6", netip.MustParseAddrPort("[fd00:99::1]:40000"), netip.MustParseAddrPort("[fd00:244:2::5]:8080")},
}

// chanEnv is a Stack over a channel endpoint, and what it sent.
type chanEnv struct {
	st  *netstack.Stack
	ep  *channel.Endpoint
	tap *tap
}

// tap moves every packet the stack writes out of the channel endpoint as
// it is written, so packets sent during Close (which drains the endpoint)
// are kept too.
type tap struct {
	ep   *channel.Endpoint
	out  chan []byte
	lost atomic.Int64
	// holdSYN, when set, makes the write of a segment with SYN wait
	// until the channel is closed (after handing the segment on).
	holdSYN atomic.Pointer[chan struct{}]
}

var _ channel.Notification = (*tap)(nil)

// WriteNotify runs in the stack's write path, once per queued packet.
func (w *tap) WriteNotify() {
	pkt := w.ep.Read()
	if pkt == nil {
		return
	}
	v := pkt.ToView()
	b := append([]byte(nil), v.AsSlice()...)
	v.Release()
	pkt.DecRef()
	select {
	case w.out <- b:
	default:
		w.lost.Add(1)
	}
	if hold := w.holdSYN.Load(); hold != nil {
		if seg, err := parseSegment(b); err == nil && seg.flags&header.TCPFlagSyn != 0 {
			<-*hold
		}
	}
}

func newChanEnv(t *testing.T, opts netstack.Options) *chanEnv {
	t.Helper()
	ep := channel.New(chanQueue, chanMTU, "")
	w := &tap{ep: ep, out: make(chan []byte, chanTapSize)}
	ep.AddNotify(w)
	opts.Link = ep
	opts.Logger = hclog.New(&hclog.LoggerOptions{Output: tWriter{t}, Level: hclog.Debug})
	return &chanEnv{st: startStack(t, opts), ep: ep, tap: w}
}

// segment is one TCP segment the stack sent.
type segment struct {
	src, dst netip.AddrPort
	flags    header.TCPFlags
	seq, ack uint32
	payload  []byte
}

func (s segment) String() string {
	return fmt.Sprintf("%s -> %s %s seq %d ack %d len %d", s.src, s.dst, s.flags, s.seq, s.ack, len(s.payload))
}

// read returns the next packet the stack sent, parsed; it fails the test
// on a timeout, a packet that is not TCP, or a wrong checksum.
func (e *chanEnv) read(t *testing.T) segment {
	t.Helper()
	select {
	case b := <-e.tap.out:
		seg, err := parseSegment(b)
		if err != nil {
			t.Fatalf("stack sent %x: %v", b, err)
		}
		return seg
	case <-time.After(ioTimeout):
		t.Fatalf("no packet from the stack in %v (%d lost)", ioTimeout, e.tap.lost.Load())
		return segment{}
	}
}

// parseSegment parses an IPv4 or IPv6 packet carrying TCP and checks its
// checksums.
func parseSegment(b []byte) (segment, error) {
	var (
		src, dst tcpip.Address
		tcp      []byte
	)
	switch header.IPVersion(b) {
	case header.IPv4Version:
		ip := header.IPv4(b)
		if !ip.IsValid(len(b)) {
			return segment{}, fmt.Errorf("invalid IPv4 header")
		}
		if !ip.IsChecksumValid() {
			return segment{}, fmt.Errorf("bad IPv4 header checksum %#04x", ip.Checksum())
		}
		if ip.TransportProtocol() != header.TCPProtocolNumber {
			return segment{}, fmt.Errorf("IPv4 protocol %d, want TCP", ip.TransportProtocol())
		}
		src, dst, tcp = ip.SourceAddress(), ip.DestinationAddress(), ip.Payload()
	case header.IPv6Version:
		ip := header.IPv6(b)
		if !ip.IsValid(len(b)) {
			return segment{}, fmt.Errorf("invalid IPv6 header")
		}
		if ip.TransportProtocol() != header.TCPProtocolNumber {
			return segment{}, fmt.Errorf("IPv6 next header %d, want TCP", ip.TransportProtocol())
		}
		src, dst, tcp = ip.SourceAddress(), ip.DestinationAddress(), ip.Payload()
	default:
		return segment{}, fmt.Errorf("IP version %d", header.IPVersion(b))
	}
	if len(tcp) < header.TCPMinimumSize {
		return segment{}, fmt.Errorf("TCP segment of %d bytes", len(tcp))
	}
	// The checksum over the pseudo-header and the whole segment, its own
	// field included, is 0xffff when the field is right.
	xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, src, dst, uint16(len(tcp)))
	if got := checksum.Checksum(tcp, xsum); got != 0xffff {
		return segment{}, fmt.Errorf("bad TCP checksum %#04x (sum %#04x)", header.TCP(tcp).Checksum(), got)
	}
	h := header.TCP(tcp)
	off := int(h.DataOffset())
	if off < header.TCPMinimumSize || off > len(tcp) {
		return segment{}, fmt.Errorf("TCP data offset %d in %d bytes", off, len(tcp))
	}
	return segment{
		src:     netip.AddrPortFrom(addrOf(src), h.SourcePort()),
		dst:     netip.AddrPortFrom(addrOf(dst), h.DestinationPort()),
		flags:   h.Flags(),
		seq:     h.SequenceNumber(),
		ack:     h.AckNumber(),
		payload: tcp[off:],
	}, nil
}

func addrOf(a tcpip.Address) netip.Addr {
	ip, _ := netip.AddrFromSlice(a.AsSlice())
	return ip
}

func tcpipAddr(a netip.Addr) tcpip.Address {
	if a.Is4() {
		return tcpip.AddrFrom4(a.As4())
	}
	return tcpip.AddrFrom16(a.As16())
}

// buildSegment returns an IP packet from src to dst carrying one TCP
// segment, with correct checksums; IPv4 or IPv6 after src.
func buildSegment(src, dst netip.AddrPort, flags header.TCPFlags, seq, ack uint32, payload []byte) []byte {
	ipLen := header.IPv4MinimumSize
	if !src.Addr().Is4() {
		ipLen = header.IPv6MinimumSize
	}
	tcpLen := header.TCPMinimumSize + len(payload)
	b := make([]byte, ipLen+tcpLen)
	s, d := tcpipAddr(src.Addr()), tcpipAddr(dst.Addr())
	if src.Addr().Is4() {
		ip := header.IPv4(b)
		ip.Encode(&header.IPv4Fields{
			TotalLength: uint16(len(b)),
			TTL:         64,
			Protocol:    uint8(header.TCPProtocolNumber),
			SrcAddr:     s,
			DstAddr:     d,
		})
		ip.SetChecksum(^ip.CalculateChecksum())
	} else {
		header.IPv6(b).Encode(&header.IPv6Fields{
			PayloadLength:     uint16(tcpLen),
			TransportProtocol: header.TCPProtocolNumber,
			HopLimit:          64,
			SrcAddr:           s,
			DstAddr:           d,
		})
	}
	tcp := header.TCP(b[ipLen:])
	tcp.Encode(&header.TCPFields{
		SrcPort:    src.Port(),
		DstPort:    dst.Port(),
		SeqNum:     seq,
		AckNum:     ack,
		DataOffset: header.TCPMinimumSize,
		Flags:      flags,
		WindowSize: 65535,
	})
	copy(b[ipLen+header.TCPMinimumSize:], payload)
	xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, s, d, uint16(tcpLen))
	tcp.SetChecksum(^checksum.Checksum(b[ipLen:], xsum))
	return b
}

// inject hands one IP packet to the stack as if the TUN had read it.
func (e *chanEnv) inject(b []byte) { injectInto(e.ep, b) }

// injectInto hands one IP packet to the stack behind ep.
func injectInto(ep *channel.Endpoint, b []byte) {
	proto := header.IPv4ProtocolNumber
	if header.IPVersion(b) == header.IPv6Version {
		proto = header.IPv6ProtocolNumber
	}
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(b)})
	ep.InjectInbound(proto, pkt)
	pkt.DecRef()
}

// peer is the client end of one flow, driven by hand.
type peer struct {
	e        *chanEnv
	src, dst netip.AddrPort
	seq      uint32 // the next sequence number to send
	ack      uint32 // the next byte expected from the stack
}

// clientISN is every peer's initial sequence number.
const clientISN = 1000

func (e *chanEnv) peer(src, dst netip.AddrPort) *peer {
	return &peer{e: e, src: src, dst: dst, seq: clientISN}
}

// send injects one segment at the peer's sequence numbers and advances
// them past what it carries.
func (p *peer) send(flags header.TCPFlags, payload []byte) {
	p.e.inject(buildSegment(p.src, p.dst, flags, p.seq, p.ack, payload))
	p.seq += uint32(len(payload))
	if flags&(header.TCPFlagSyn|header.TCPFlagFin) != 0 {
		p.seq++
	}
}

// Write sends b in one segment, as a client's write of it.
func (p *peer) Write(b []byte) (int, error) {
	p.send(header.TCPFlagAck|header.TCPFlagPsh, b)
	return len(b), nil
}

// Close sends a FIN, as a client's shutdown of its write side.
func (p *peer) Close() error {
	p.send(header.TCPFlagAck|header.TCPFlagFin, nil)
	return nil
}

var _ io.WriteCloser = (*peer)(nil)

// next returns the next segment of this flow for which want is true,
// skipping the others of this flow (ACKs, window updates); a packet of
// another flow fails the test.
func (p *peer) next(t *testing.T, what string, want func(segment) bool) segment {
	t.Helper()
	for range readBound {
		seg := p.e.read(t)
		if seg.src != p.dst || seg.dst != p.src {
			t.Fatalf("waiting for %s of %s -> %s: got %s", what, p.src, p.dst, seg)
		}
		if want(seg) {
			return seg
		}
	}
	t.Fatalf("no %s of %s -> %s in %d packets", what, p.src, p.dst, readBound)
	return segment{}
}

// synAck sends a SYN and returns the stack's SYN-ACK.
func (p *peer) synAck(t *testing.T) segment {
	t.Helper()
	p.send(header.TCPFlagSyn, nil)
	seg := p.next(t, "SYN-ACK", func(s segment) bool { return s.flags&header.TCPFlagSyn != 0 })
	if seg.flags != header.TCPFlagSyn|header.TCPFlagAck || seg.ack != clientISN+1 {
		t.Fatalf("answer to SYN: %s; want SYN|ACK acking %d", seg, clientISN+1)
	}
	p.ack = seg.seq + 1
	return seg
}

// connect completes the three-way handshake.
func (p *peer) connect(t *testing.T) {
	t.Helper()
	p.synAck(t)
	p.send(header.TCPFlagAck, nil)
}

// expectRST reads up to the stack's RST on this flow and checks it
// acknowledges what the peer sent.
func (p *peer) expectRST(t *testing.T) segment {
	t.Helper()
	seg := p.next(t, "RST", func(s segment) bool { return s.flags&header.TCPFlagRst != 0 })
	if seg.flags&header.TCPFlagAck != 0 && seg.ack != p.seq {
		t.Fatalf("RST %s acks %d; the peer sent up to %d", seg, seg.ack, p.seq)
	}
	return seg
}

// readData reads the stack's data segments until n bytes have come, and
// acknowledges them.
func (p *peer) readData(t *testing.T, n int) []byte {
	t.Helper()
	var got []byte
	for len(got) < n {
		seg := p.next(t, "data", func(s segment) bool { return len(s.payload) > 0 })
		if seg.seq != p.ack {
			t.Fatalf("data %s; want seq %d", seg, p.ack)
		}
		got = append(got, seg.payload...)
		p.ack += uint32(len(seg.payload))
		p.send(header.TCPFlagAck, nil)
	}
	return got
}

// handlerConns is a Handler that accepts every request and hands the Conn
// to the test, which must close it; Accept errors go to the test too.
func handlerConns(conns chan<- *netstack.Conn, errs chan<- error) func(*netstack.Request) {
	return func(r *netstack.Request) {
		c, err := r.Accept()
		if err != nil {
			errs <- err
			return
		}
		conns <- c
	}
}

func recvConn(t *testing.T, conns <-chan *netstack.Conn, errs <-chan error) *netstack.Conn {
	t.Helper()
	select {
	case c := <-conns:
		t.Cleanup(func() { c.Close() })
		return c
	case err := <-errs:
		t.Fatalf("Accept: %v", err)
	case <-time.After(ioTimeout):
		t.Fatalf("no Conn from Accept in %v", ioTimeout)
	}
	return nil
}

// connected starts a Stack whose Handler accepts every request, and
// completes a handshake from src to dst: the test's peer and the Conn.
func connected(t *testing.T, src, dst netip.AddrPort) (*chanEnv, *peer, *netstack.Conn) {
	t.Helper()
	conns, errs := make(chan *netstack.Conn, 1), make(chan error, 1)
	e := newChanEnv(t, netstack.Options{Handler: handlerConns(conns, errs)})
	p := e.peer(src, dst)
	p.connect(t)
	return e, p, recvConn(t, conns, errs)
}

// TestChanRefused is TestRefused over the channel: the Handler sees the
// client's address and the destination it dialled, and a Reject, or no
// decision, answers the SYN with a RST from that destination.
func TestChanRefused(t *testing.T) {
	tests := []struct {
		name    string
		handler func(*testing.T, *netstack.Request)
	}{
		{"Reject", func(_ *testing.T, r *netstack.Request) { r.Reject() }},
		{"no decision", func(*testing.T, *netstack.Request) {}},
		{"Reject then Accept", func(t *testing.T, r *netstack.Request) {
			r.Reject()
			if c, err := r.Accept(); !errors.Is(err, netstack.ErrDecided) {
				t.Errorf("Accept after Reject = %v, %v; want ErrDecided", c, err)
			}
		}},
	}
	for _, fam := range chanFamilies {
		for _, tt := range tests {
			t.Run(fam.name+"/"+tt.name, func(t *testing.T) {
				reqs := make(chan seen, 1)
				e := newChanEnv(t, netstack.Options{Handler: func(r *netstack.Request) {
					reqs <- seen{r.Src(), r.Dst()}
					tt.handler(t, r)
				}})
				p := e.peer(fam.src, fam.dst)
				p.send(header.TCPFlagSyn, nil)
				rst := p.expectRST(t)
				if rst.flags != header.TCPFlagRst|header.TCPFlagAck {
					t.Errorf("refusal %s; want RST|ACK", rst)
				}
				got := <-reqs // the RST comes after the Handler was called
				if got.src != fam.src || got.dst != fam.dst {
					t.Errorf("Request Src, Dst = %s, %s; want %s, %s", got.src, got.dst, fam.src, fam.dst)
				}
				if st := e.st.Stats(); st.Requests != 1 || st.Rejected != 1 || st.Forwarded != 0 {
					t.Errorf("Stats = %+v; want 1 request, rejected", st)
				}
			})
		}
	}
}

// TestChanAccept: Accept answers with a SYN-ACK from the dialled
// destination and returns once the client's ACK completes the handshake;
// the client's data reaches Conn.Read, and Conn.Write's reaches the client.
func TestChanAccept(t *testing.T) {
	for _, fam := range chanFamilies {
		t.Run(fam.name, func(t *testing.T) {
			conns, errs := make(chan *netstack.Conn, 1), make(chan error, 1)
			e := newChanEnv(t, netstack.Options{Handler: handlerConns(conns, errs)})
			p := e.peer(fam.src, fam.dst)
			p.synAck(t)
			select {
			case c := <-conns:
				c.Close()
				t.Fatal("Accept returned before the handshake completed")
			case err := <-errs:
				t.Fatalf("Accept: %v", err)
			default:
			}
			p.send(header.TCPFlagAck, nil)
			c := recvConn(t, conns, errs)
			if c.LocalAddr().String() != fam.dst.String() || c.RemoteAddr().String() != fam.src.String() {
				t.Errorf("Conn %s <- %s; want %s <- %s", c.LocalAddr(), c.RemoteAddr(), fam.dst, fam.src)
			}

			p.Write([]byte("ping"))
			c.SetDeadline(time.Now().Add(ioTimeout))
			buf := make([]byte, 16)
			n, err := c.Read(buf)
			if err != nil || string(buf[:n]) != "ping" {
				t.Fatalf("Conn.Read = %q, %v; want ping", buf[:n], err)
			}
			if _, err := c.Write([]byte("pong")); err != nil {
				t.Fatalf("Conn.Write: %v", err)
			}
			if got := p.readData(t, 4); string(got) != "pong" {
				t.Fatalf("client got %q; want pong", got)
			}
			if st := e.st.Stats(); st.Requests != 1 || st.Forwarded != 1 || st.Rejected != 0 {
				t.Errorf("Stats = %+v; want 1 request, forwarded", st)
			}
		})
	}
}

// TestChanChecksums: what the stack sends (SYN-ACK, data of odd and even
// length, FIN) carries a full TCP checksum, which gVisor leaves out on the
// loopback NIC and the loopback wrapper fills in. parseSegment checks
// every packet; this test makes sure each kind was seen and that the
// field is not left zero.
func TestChanChecksums(t *testing.T) {
	for _, fam := range chanFamilies {
		t.Run(fam.name, func(t *testing.T) {
			_, p, c := connected(t, fam.src, fam.dst)
			for _, size := range []int{1, 2, 999, 1000} {
				msg := make([]byte, size)
				for i := range msg {
					msg[i] = byte(i*7 + size)
				}
				if _, err := c.Write(msg); err != nil {
					t.Fatalf("Conn.Write: %v", err)
				}
				if got := p.readData(t, size); string(got) != string(msg) {
					t.Fatalf("client got %d bytes, not the %d written", len(got), size)
				}
			}
			if err := c.CloseWrite(); err != nil {
				t.Fatalf("CloseWrite: %v", err)
			}
			fin := p.next(t, "FIN", func(s segment) bool { return s.flags&header.TCPFlagFin != 0 })
			if fin.seq != p.ack {
				t.Fatalf("FIN %s; want seq %d", fin, p.ack)
			}
		})
	}
	// The check above must be able to fail: a segment whose checksum was
	// left out is refused.
	b := buildSegment(chanFamilies[0].src, chanFamilies[0].dst, header.TCPFlagAck, 1, 2, []byte("x"))
	header.TCP(b[header.IPv4MinimumSize:]).SetChecksum(0)
	if _, err := parseSegment(b); err == nil {
		t.Fatal("parseSegment accepted a segment with its checksum zeroed")
	}
}

// TestChanDecideTwice is TestDecideTwice over the channel: a second Accept
// fails with ErrDecided and a Reject after Accept sends no RST.
func TestChanDecideTwice(t *testing.T) {
	for _, fam := range chanFamilies {
		t.Run(fam.name, func(t *testing.T) {
			conns, errs := make(chan *netstack.Conn, 1), make(chan error, 1)
			e := newChanEnv(t, netstack.Options{Handler: func(r *netstack.Request) {
				c, err := r.Accept()
				if err != nil {
					errs <- err
					return
				}
				if c2, err := r.Accept(); !errors.Is(err, netstack.ErrDecided) {
					errs <- fmt.Errorf("second Accept = %v, %v; want ErrDecided", c2, err)
					c.Close()
					return
				}
				r.Reject()
				conns <- c
			}})
			p := e.peer(fam.src, fam.dst)
			p.connect(t)
			c := recvConn(t, conns, errs)
			// Anything the Reject sent would come before this data.
			if _, err := c.Write([]byte("still open")); err != nil {
				t.Fatalf("Conn.Write: %v", err)
			}
			seg := p.next(t, "data", func(s segment) bool {
				if s.flags&header.TCPFlagRst != 0 {
					t.Fatalf("Reject after Accept sent %s", s)
				}
				return len(s.payload) > 0
			})
			if string(seg.payload) != "still open" {
				t.Fatalf("client got %q", seg.payload)
			}
			if st := e.st.Stats(); st.Forwarded != 1 || st.Rejected != 0 {
				t.Errorf("Stats = %+v; want 1 forwarded, 0 rejected", st)
			}
		})
	}
}

// TestChanConnReset is TestConnReset over the channel: Reset sends a RST
// at the connection's next sequence number, not a FIN.
func TestChanConnReset(t *testing.T) {
	for _, fam := range chanFamilies {
		t.Run(fam.name, func(t *testing.T) {
			_, p, c := connected(t, fam.src, fam.dst)
			p.Write([]byte("x"))
			c.SetDeadline(time.Now().Add(ioTimeout))
			if _, err := c.Read(make([]byte, 1)); err != nil {
				t.Fatalf("Conn.Read: %v", err)
			}
			if err := c.Reset(); err != nil {
				t.Fatalf("Reset: %v", err)
			}
			rst := p.next(t, "RST", func(s segment) bool {
				if s.flags&header.TCPFlagFin != 0 {
					t.Fatalf("Reset sent a FIN: %s", s)
				}
				return s.flags&header.TCPFlagRst != 0
			})
			if rst.seq != p.ack {
				t.Fatalf("RST %s; want seq %d", rst, p.ack)
			}
			if err := c.Close(); err != nil {
				t.Errorf("Close after Reset: %v", err)
			}
		})
	}
}

// TestChanMaxInFlight is TestMaxInFlight over the channel: with the one
// slot held by an undecided request, a second SYN gets no answer and is
// counted in Stats.InFlightDrops; once the first is decided, the second
// SYN sent again reaches the Handler.
func TestChanMaxInFlight(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	reqs := make(chan seen, 2)
	e := newChanEnv(t, netstack.Options{MaxInFlight: 1, Handler: func(r *netstack.Request) {
		reqs <- seen{r.Src(), r.Dst()}
		if r.Src() == chanFamilies[0].src {
			<-release
		}
		r.Reject()
	}})
	first := e.peer(chanFamilies[0].src, chanFamilies[0].dst)
	second := e.peer(netip.AddrPortFrom(first.src.Addr(), first.src.Port()+1), first.dst)

	first.send(header.TCPFlagSyn, nil)
	if got := <-reqs; got.src != first.src {
		t.Fatalf("first Request from %s; want %s", got.src, first.src)
	}
	// The forwarder decides on a SYN within InjectInbound: the drop is
	// counted by the time it returns.
	second.send(header.TCPFlagSyn, nil)
	if st := e.st.Stats(); st.InFlightDrops != 1 || st.Requests != 1 {
		t.Fatalf("Stats = %+v after a SYN past the limit; want 1 in-flight drop, 1 request", st)
	}
	if n := len(e.tap.out); n != 0 {
		t.Fatalf("the stack sent %d packets for the dropped SYN", n)
	}
	close(release)
	// The first packet out is the first flow's RST: the dropped SYN was
	// not answered.
	first.seq = clientISN + 1
	first.expectRST(t)

	second.seq = clientISN // the client's retransmission
	second.send(header.TCPFlagSyn, nil)
	second.expectRST(t)
	if got := <-reqs; got.src != second.src {
		t.Fatalf("second Request from %s; want %s", got.src, second.src)
	}
	if st := e.st.Stats(); st.InFlightDrops != 1 || st.Requests != 2 || st.Rejected != 2 {
		t.Errorf("Stats = %+v; want 1 in-flight drop, 2 requests rejected", st)
	}
}

// TestChanCloseDuringHandshake is TestCloseDuringHandshake over the
// channel: a Handler blocked in Accept on a client that never sends its
// ACK does not hold up Close, and its Accept fails.
func TestChanCloseDuringHandshake(t *testing.T) {
	acceptErr := make(chan error, 1)
	e := newChanEnv(t, netstack.Options{Handler: acceptOnce(acceptErr)})
	p := e.peer(chanFamilies[0].src, chanFamilies[0].dst)
	p.synAck(t) // Accept is now blocked in the handshake
	checkCloseDuringHandshake(t, e.st, acceptErr)
}

// TestChanCloseNoLeak is TestCloseNoLeak over the channel: Close aborts a
// live connection (the client gets a RST, the Handler's Read fails),
// waits for the Handler, closes the endpoint, a second Close returns the
// same, and no goroutine is left behind.
func TestChanCloseNoLeak(t *testing.T) {
	for _, fam := range chanFamilies {
		t.Run(fam.name, func(t *testing.T) {
			before := runtime.NumGoroutine()
			reading := make(chan struct{})
			handlerErr := make(chan error, 1)
			e := newChanEnv(t, netstack.Options{Handler: readUntilClosed(reading, handlerErr)})
			p := e.peer(fam.src, fam.dst)
			p.connect(t)
			select {
			case <-reading:
			case err := <-handlerErr:
				t.Fatalf("Accept: %v", err)
			case <-time.After(ioTimeout):
				t.Fatal("Handler not reading")
			}
			checkCloseAborts(t, e.st, handlerErr)
			p.expectRST(t)
			if e.ep.IsAttached() {
				t.Error("endpoint still attached after Close")
			}
			if !linkClosed(e.ep) {
				t.Error("endpoint still open after Close")
			}
			waitNoLeak(t, before)
		})
	}
}

// linkClosed reports whether a channel endpoint was closed: a write to it
// then fails.
func linkClosed(ep *channel.Endpoint) bool {
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{})
	defer pkt.DecRef()
	var l stack.PacketBufferList
	l.PushBack(pkt)
	_, err := ep.WritePackets(l)
	ep.Drain()
	return err != nil
}

// TestChanWaitRead is TestWaitRead over the channel: WaitRead returns on
// the client's data, on its FIN, and when the Conn is closed under it.
func TestChanWaitRead(t *testing.T) {
	for _, fam := range chanFamilies {
		for _, tt := range waitReadTests {
			t.Run(fam.name+"/"+tt.name, func(t *testing.T) {
				_, p, c := connected(t, fam.src, fam.dst)
				checkWaitRead(t, p, c, tt.wake, tt.want, tt.eof)
			})
		}
	}
}

// TestChanDestinations: each of many distinct destinations, IPv4 and
// IPv6, reaches the Handler as the client dialled it and is answered from
// it; on the IPv4 side they all fall inside the catch-all address (no
// temporary address per destination, see loopback.go), which
// TestManyDestinations measures at scale.
func TestChanDestinations(t *testing.T) {
	const n = 200
	conns, errs := make(chan *netstack.Conn, n), make(chan error, n)
	reqs := make(chan seen, n)
	accept := handlerConns(conns, errs)
	e := newChanEnv(t, netstack.Options{Handler: func(r *netstack.Request) {
		reqs <- seen{r.Src(), r.Dst()}
		accept(r)
	}})
	for i := range n {
		src := chanFamilies[i%2].src
		var dst netip.AddrPort
		if i%2 == 0 {
			dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(100 + i/250), byte(1 + i%250)}), 80)
		} else {
			dst = netip.AddrPortFrom(netip.AddrFrom16([16]byte{0xfd, 0, 2, 0x44, 0, 0, 0, 7, 14: byte((i + 1) >> 8), 15: byte(i + 1)}), 80)
		}
		p := e.peer(src, dst)
		p.connect(t) // the SYN-ACK comes from dst, or next fails
		c := recvConn(t, conns, errs)
		if got := <-reqs; got.dst != dst || got.src != src {
			t.Fatalf("Request %s -> %s; the client dialled %s -> %s", got.src, got.dst, src, dst)
		}
		if c.LocalAddr().String() != dst.String() {
			t.Fatalf("Conn local address %s; want %s", c.LocalAddr(), dst)
		}
	}
	if st := e.st.Stats(); st.Forwarded != n {
		t.Errorf("Stats = %+v; want %d forwarded", st, n)
	}
}

// TestNewLink: New refuses a Link without an MTU and closes it; a Stack
// over a Link attaches it and closes it in Close.
func TestNewLink(t *testing.T) {
	h := func(*netstack.Request) {}
	ep := channel.New(1, 0, "")
	if _, err := netstack.New(netstack.Options{Link: ep, Handler: h}); err == nil {
		t.Fatal("New with a Link of MTU 0 succeeded")
	}
	if !linkClosed(ep) {
		t.Error("New failed but left the Link open")
	}

	ep = channel.New(1, chanMTU, "")
	st, err := netstack.New(netstack.Options{Link: ep, Handler: h})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if !ep.IsAttached() {
		t.Error("New did not attach the Link")
	}
	if err := st.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if !linkClosed(ep) {
		t.Error("Close left the Link open")
	}
}
