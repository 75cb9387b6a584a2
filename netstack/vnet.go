package netstack

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/stack/gro"

	"github.com/meshtun/meshtun/internal/rawsock"
	"github.com/meshtun/meshtun/tun"
)

const (
	// vnetReadSize is the largest packet a read can return: an IP packet
	// of up to 64 KiB, a TSO super-packet included. One pooled view of this
	// size is read into at a time; it is not cleared first (newReadView).
	vnetReadSize = 1<<16 - 1
	// vnetCopyBelow: a packet shorter than this is copied into a view of
	// its own size, so ACKs and small segments don't each pin a 64 KiB
	// view while they wait in a receive queue; larger ones keep the view
	// they were read into.
	vnetCopyBelow = 4 << 10
	// vnetGROBypass: a packet at least this large skips GRO (deliver).
	vnetGROBypass = 32 << 10
	// vnetGSOMaxSize is the largest super-packet we hand the kernel: an
	// IPv4 total length is 16 bits, and larger ("BIG TCP") sizes break
	// parsing (docs/field-notes.md, "The offload mode").
	vnetGSOMaxSize = 1<<16 - 1
	// gsoHeaderRoom is what gVisor keeps below GSOMaxSize for headers when
	// it sizes a super-packet's payload (header.TCPTotalHeaderMaximumSize
	// + 1), and gsoOptionRoom the IP and TCP overhead below the MTU that a
	// connection's MSS can take at most (IPv6 40 + TCP 20 + 40 of options).
	gsoHeaderRoom = 61
	gsoOptionRoom = 100
)

// gsoMaxSize is GSOMaxSize for a device of this MTU. gVisor fills a
// super-packet to GSOMaxSize-61 bytes of payload whatever the
// connection's MSS. Where the MTU lets an MSS exceed half of that (local
// clients of a large-MTU TUN), each super-packet would be one full segment
// plus a small tail the kernel sends on its own: measured at MTU 65000,
// bulk out of the stack fell from 5.3 to 3.0 Gbit/s. Capping the payload
// just below the smallest such MSS keeps those at one segment per packet,
// and clients with a small MSS (1460) still get 44 segments per write.
func gsoMaxSize(mtu int) uint32 {
	limit := vnetGSOMaxSize - gsoHeaderRoom
	if payload := mtu - gsoOptionRoom; payload > limit/2 && payload < limit {
		return uint32(payload + gsoHeaderRoom)
	}
	return vnetGSOMaxSize
}

// vnetLink is a gVisor link endpoint over a TUN opened with offload
// (tun.Options.Offload): every packet is preceded by a virtio_net_hdr
// (tun.VirtioNetHdr), and TCP may come and go as super-packets of up to
// 64 KiB.
//
// Inbound, one goroutine reads header and packet with one readv into a
// pooled 64 KiB view (the fd is non-blocking under the Go poller), feeds
// gVisor's GRO, and flushes GRO whenever the next read would block. The
// endpoint advertises RX checksum offload: packets the kernel marks
// NEEDS_CSUM (partial, from a local sender) or DATA_VALID are trusted, and
// the rare one with neither is validated here and dropped if wrong.
// Outbound, gVisor hands super-packets (GSO) with only the pseudo-header
// checksum; the header asks the kernel to finish the checksum and segment
// at the MSS, and one writev sends header and packet. TX checksum offload
// is never advertised: non-GSO packets leave with full checksums.
//
// fdbased does not fit: it strips no vnet header from a TUN, enables GSO
// only on sockets, and offsets csum_start for an Ethernet header.
type vnetLink struct {
	file   *os.File // our dup of the device's fd; Close closes it
	rc     syscall.RawConn
	fd     int
	mtu    atomic.Uint32
	closed func(tcpip.Error) // the read loop ended other than by a stop

	mu         sync.Mutex
	dispatcher stack.NetworkDispatcher // guarded by mu
	onClose    func()                  // guarded by mu
	stopping   atomic.Bool
	wg         sync.WaitGroup // the read loop

	// BadChecksums counts inbound packets dropped for a wrong checksum.
	badChecksums atomic.Uint64
}

var _ stack.LinkEndpoint = (*vnetLink)(nil)
var _ stack.GSOEndpoint = (*vnetLink)(nil)

// newVnetLink takes ownership of fd.
func newVnetLink(fd, mtu int, closed func(tcpip.Error)) (*vnetLink, error) {
	f := os.NewFile(uintptr(fd), "tun-vnet")
	if f == nil {
		unix.Close(fd)
		return nil, errors.New("netstack: bad TUN fd")
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("netstack: TUN fd: %w", err)
	}
	l := &vnetLink{file: f, rc: rc, fd: fd, closed: closed}
	l.mtu.Store(uint32(mtu))
	return l, nil
}

func (l *vnetLink) MTU() uint32                             { return l.mtu.Load() }
func (l *vnetLink) SetMTU(mtu uint32)                       { l.mtu.Store(mtu) }
func (l *vnetLink) MaxHeaderLength() uint16                 { return 0 }
func (l *vnetLink) LinkAddress() tcpip.LinkAddress          { return "" }
func (l *vnetLink) SetLinkAddress(tcpip.LinkAddress)        {}
func (l *vnetLink) ARPHardwareType() header.ARPHardwareType { return header.ARPHardwareNone }
func (l *vnetLink) AddHeader(*stack.PacketBuffer)           {}
func (l *vnetLink) ParseHeader(*stack.PacketBuffer) bool    { return true }
func (l *vnetLink) GSOMaxSize() uint32                      { return gsoMaxSize(int(l.mtu.Load())) }
func (l *vnetLink) SupportedGSO() stack.SupportedGSO        { return stack.HostGSOSupported }

// Capabilities: RX checksum offload only (see the type's doc).
func (l *vnetLink) Capabilities() stack.LinkEndpointCapabilities {
	return stack.CapabilityRXChecksumOffload
}

// Attach starts the read loop with d, or with nil tells it to stop.
//
// It does not wait for the loop: gVisor calls Attach(nil) (and Wait) while
// holding the stack's lock, and a packet being delivered may need that
// lock (a route for a RST), so waiting there deadlocks. Close, which runs
// without the lock, waits.
func (l *vnetLink) Attach(d stack.NetworkDispatcher) {
	l.mu.Lock()
	if d == nil {
		l.dispatcher = nil
		l.mu.Unlock()
		l.stop()
		return
	}
	defer l.mu.Unlock()
	if l.dispatcher != nil {
		return
	}
	l.dispatcher = d
	l.wg.Add(1)
	go l.readLoop(d)
}

func (l *vnetLink) IsAttached() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dispatcher != nil
}

// stop makes the read loop end and deliver nothing more.
func (l *vnetLink) stop() {
	if l.stopping.CompareAndSwap(false, true) {
		// Wakes the read loop parked in the poller (and makes any later
		// read return at once).
		l.file.SetReadDeadline(time.Unix(1, 0))
	}
}

// Wait does not wait: see Attach. Close waits for the read loop.
func (l *vnetLink) Wait() {}

// Close stops the read loop, waits for it and closes the fd. The NIC's
// removal calls it, after Attach(nil) and without the stack's lock.
func (l *vnetLink) Close() {
	l.stop()
	l.wg.Wait()
	l.mu.Lock()
	f := l.onClose
	l.onClose = nil
	l.mu.Unlock()
	l.file.Close()
	if f != nil {
		f()
	}
}

func (l *vnetLink) SetOnCloseAction(f func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.onClose = f
}

// readLoop reads packets until Attach(nil) or a read error.
func (l *vnetLink) readLoop(d stack.NetworkDispatcher) {
	defer l.wg.Done()
	var g gro.GRO
	g.Init(true)
	g.Dispatcher = d
	var hdr [tun.VnetHdrLen]byte
	view := newReadView()
	defer func() { view.Release() }()
	for {
		var (
			n    int
			rerr error
		)
		err := l.rc.Read(func(fd uintptr) bool {
			buf := view.AsSlice()
			iov := [2]unix.Iovec{
				{Base: &hdr[0], Len: uint64(len(hdr))},
				{Base: &buf[0], Len: uint64(len(buf))},
			}
			r, errno := rawsock.Readv(fd, iov[:])
			switch errno {
			case 0:
				n = r
			case unix.EAGAIN:
				// Nothing more for now: hand what GRO holds to the
				// stack before parking.
				if !l.stopping.Load() {
					g.Flush()
				}
				return false
			default:
				rerr = errno
			}
			return true
		})
		if err == nil {
			err = rerr
		}
		if l.stopping.Load() {
			return
		}
		if err != nil {
			if l.closed != nil {
				l.closed(tcpip.TranslateErrno(errnoOf(err)))
			}
			return
		}
		view = l.deliver(&g, hdr[:], view, n-len(hdr))
	}
}

// newReadView is a view to read one packet into. Its bytes are left as
// the pool held them (third_party/gvisor-patches): the read overwrites
// them, and deliver clears what it did not before the view leaves. A
// cleared 64 KiB view cost as much again as the read's own copy.
func newReadView() *buffer.View { return buffer.NewViewSizeUninitialized(vnetReadSize) }

func errnoOf(err error) unix.Errno {
	var errno unix.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return unix.EBADF
}

// deliver hands one packet of size n, read into view, to GRO. It returns
// the view to read the next packet into.
func (l *vnetLink) deliver(g *gro.GRO, hdr []byte, view *buffer.View, n int) *buffer.View {
	if n <= 0 {
		return view
	}
	data := view.AsSlice()[:n]
	var proto tcpip.NetworkProtocolNumber
	switch header.IPVersion(data) {
	case header.IPv4Version:
		proto = header.IPv4ProtocolNumber
	case header.IPv6Version:
		proto = header.IPv6ProtocolNumber
	default:
		return view
	}
	var vh tun.VirtioNetHdr
	if err := vh.Decode(hdr); err != nil {
		return view // not from readLoop, which always reads a whole header
	}
	if vh.Flags&(tun.VirtioNetHdrFNeedsCsum|tun.VirtioNetHdrFDataValid) == 0 && !checksumsValid(data, proto) {
		l.badChecksums.Add(1)
		return view
	}
	var v *buffer.View
	if n < vnetCopyBelow {
		v = buffer.NewViewWithData(data)
	} else {
		// The view goes to the stack: what the read did not overwrite is
		// cleared, so no byte of an earlier packet stays behind it.
		clear(view.AsSlice()[n:])
		view.CapLength(n)
		v, view = view, newReadView()
	}
	large := n >= vnetGROBypass
	payload := buffer.MakeWithView(v)
	if large {
		payload = splitHeaders(v, proto)
	}
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: payload})
	pkt.NetworkProtocolNumber = proto
	pkt.RXChecksumValidated = true
	if large {
		// Already a super-packet (the sender's TSO or the kernel's own
		// coalescing): GRO has nothing to add. What GRO holds goes first,
		// so the flow's order is kept.
		g.Flush()
		g.Dispatcher.DeliverNetworkPacket(proto, pkt)
	} else {
		g.Enqueue(pkt)
	}
	pkt.DecRef()
	return view
}

// splitHeaders returns a buffer of v's packet with its IP and TCP headers
// copied into a small view of their own, ahead of v trimmed to the
// payload. gVisor's IPv4 input holds a reference to the network header's
// view while it reads the header again, and a read of a shared view
// clones its whole chunk: with the headers in the 64 KiB view of a
// super-packet that was a 64 KiB clear and copy per packet (≈ 8 % of
// gateway A's CPU on uploads). Packets that are not plain TCP (IPv6
// extension headers, fragments, other protocols) keep the one view.
func splitHeaders(v *buffer.View, proto tcpip.NetworkProtocolNumber) buffer.Buffer {
	data := v.AsSlice()
	var ipLen int
	switch proto {
	case header.IPv4ProtocolNumber:
		ip := header.IPv4(data)
		if ip.TransportProtocol() != header.TCPProtocolNumber || ip.FragmentOffset() != 0 || ip.Flags()&header.IPv4FlagMoreFragments != 0 {
			return buffer.MakeWithView(v)
		}
		ipLen = int(ip.HeaderLength())
	case header.IPv6ProtocolNumber:
		if header.IPv6(data).TransportProtocol() != header.TCPProtocolNumber {
			return buffer.MakeWithView(v)
		}
		ipLen = header.IPv6MinimumSize
	default:
		return buffer.MakeWithView(v)
	}
	if len(data) < ipLen+header.TCPMinimumSize {
		return buffer.MakeWithView(v)
	}
	hdrLen := ipLen + int(header.TCP(data[ipLen:]).DataOffset())
	if hdrLen < ipLen+header.TCPMinimumSize || hdrLen > len(data) {
		return buffer.MakeWithView(v)
	}
	b := buffer.MakeWithView(buffer.NewViewWithData(data[:hdrLen]))
	v.TrimFront(hdrLen)
	rest := buffer.MakeWithView(v)
	b.Merge(&rest) // moves the view; Append would copy into the header's chunk
	return b
}

// checksumsValid checks the IPv4 header checksum and the TCP, UDP or ICMP
// checksum of a packet the kernel did not vouch for. Packets it cannot
// parse fully (fragments, IPv6 extension headers) pass: the stack
// validates what it uses of them, except the transport checksum, which
// such packets rarely carry through a TUN.
func checksumsValid(data []byte, proto tcpip.NetworkProtocolNumber) bool {
	var (
		src, dst tcpip.Address
		tp       tcpip.TransportProtocolNumber
		payload  []byte
	)
	switch proto {
	case header.IPv4ProtocolNumber:
		ip := header.IPv4(data)
		if !ip.IsValid(len(data)) || !ip.IsChecksumValid() {
			return false
		}
		if ip.FragmentOffset() != 0 || ip.Flags()&header.IPv4FlagMoreFragments != 0 {
			return true
		}
		src, dst, tp = ip.SourceAddress(), ip.DestinationAddress(), ip.TransportProtocol()
		payload = data[ip.HeaderLength():ip.TotalLength()]
		if tp == header.ICMPv4ProtocolNumber {
			return checksum.Checksum(payload, 0) == 0xffff
		}
	case header.IPv6ProtocolNumber:
		ip := header.IPv6(data)
		if !ip.IsValid(len(data)) {
			return false
		}
		src, dst, tp = ip.SourceAddress(), ip.DestinationAddress(), ip.TransportProtocol()
		payload = data[header.IPv6MinimumSize : header.IPv6MinimumSize+int(ip.PayloadLength())]
	}
	switch tp {
	case header.TCPProtocolNumber, header.ICMPv6ProtocolNumber:
	case header.UDPProtocolNumber:
		if len(payload) >= header.UDPMinimumSize && proto == header.IPv4ProtocolNumber && header.UDP(payload).Checksum() == 0 {
			return true // no checksum, allowed over IPv4
		}
	default:
		return true
	}
	xsum := header.PseudoHeaderChecksum(tp, src, dst, uint16(len(payload)))
	return checksum.Checksum(payload, xsum) == 0xffff
}

// WritePackets writes each packet with its vnet header in one writev. A
// write the kernel refuses drops that packet (as a wire would); TCP
// retransmits.
func (l *vnetLink) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	n := 0
	for _, pkt := range pkts.AsSlice() {
		if err := l.writePacket(pkt); err != nil {
			if n == 0 {
				return 0, err
			}
			break
		}
		n++
	}
	return n, nil
}

func (l *vnetLink) writePacket(pkt *stack.PacketBuffer) tcpip.Error {
	vh, err := vnetHeader(pkt)
	if err != nil {
		return err
	}
	var hdr [tun.VnetHdrLen]byte
	vh.Encode(hdr[:])
	return l.writev(hdr[:], pkt)
}

// vnetHeader returns the virtio_net_hdr to write pkt with: all zero for a
// packet that leaves with full checksums (a GSO packet of one segment
// gets its checksum finished here), else one that asks the kernel to
// finish the checksum and cut the super-packet into MSS-sized segments.
func vnetHeader(pkt *stack.PacketBuffer) (tun.VirtioNetHdr, tcpip.Error) {
	gso := pkt.GSOOptions
	if gso.Type == stack.GSONone || !gso.NeedsCsum {
		return tun.VirtioNetHdr{}, nil
	}
	if pkt.Data().Size() <= int(gso.MSS) {
		// One segment: finish the checksum here and send it as a plain
		// packet. The kernel copies a packet without a vnet header hint
		// into one linear buffer; with NEEDS_CSUM it splits it into page
		// fragments, which costs more than the checksum (measured at MTU
		// 65000: ~1.6 against ~2.5 CPU-s/GiB).
		finishChecksum(pkt)
		return tun.VirtioNetHdr{}, nil
	}
	vh := tun.VirtioNetHdr{
		Flags:      tun.VirtioNetHdrFNeedsCsum,
		HdrLen:     uint16(pkt.HeaderSize()),
		GSOSize:    gso.MSS,
		CsumStart:  gso.L3HdrLen,
		CsumOffset: gso.CsumOffset,
	}
	switch gso.Type {
	case stack.GSOTCPv4:
		vh.GSOType = tun.VirtioNetHdrGSOTCPv4
	case stack.GSOTCPv6:
		vh.GSOType = tun.VirtioNetHdrGSOTCPv6
	default:
		return tun.VirtioNetHdr{}, &tcpip.ErrNotSupported{}
	}
	return vh, nil
}

// finishChecksum turns the pseudo-header sum gVisor leaves in a GSO
// packet's TCP checksum field into the full checksum.
func finishChecksum(pkt *stack.PacketBuffer) {
	th := pkt.TransportHeader().Slice()
	if len(th) < header.TCPMinimumSize {
		return
	}
	tcp := header.TCP(th)
	sum := checksum.Combine(checksum.Checksum(th, 0), pkt.Data().Checksum())
	tcp.SetChecksum(^sum)
}

// writev writes the vnet header and the packet with one system call.
func (l *vnetLink) writev(hdr []byte, pkt *stack.PacketBuffer) tcpip.Error {
	var iovArr [8]unix.Iovec
	iov := append(iovArr[:0], unix.Iovec{Base: &hdr[0], Len: uint64(len(hdr))})
	for _, s := range pkt.AsSlices() {
		if len(s) > 0 {
			iov = append(iov, unix.Iovec{Base: &s[0], Len: uint64(len(s))})
		}
	}
	// Raw (internal/rawsock): the fd is non-blocking, a full queue is
	// EAGAIN, never a wait.
	if _, errno := rawsock.Writev(uintptr(l.fd), iov); errno != 0 {
		return tcpip.TranslateErrno(errno)
	}
	return nil
}
