package netstack

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/fdbased"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"

	"github.com/meshtun/meshtun/tun"
)

const (
	// DefaultMaxInFlight is the default Options.MaxInFlight. A request holds
	// its slot until the Handler decides, which with dial-first is the whole
	// upstream dial; past the limit gVisor drops SYNs silently (the client
	// retransmits), so the limit stays in the thousands.
	DefaultMaxInFlight = 4096

	// DefaultReceiveWindow is the default Options.ReceiveWindow: gVisor's
	// own default receive buffer, 1 MiB. It must be passed to the forwarder
	// explicitly: tcp.NewForwarder ignores the stack's configured default.
	DefaultReceiveWindow = 1 << 20

	nicID tcpip.NICID = 1

	// timeWait is how long a flow our side closed first stays in
	// TIME_WAIT (gVisor's default: 60 s). The client's kernel, which
	// closed second, keeps nothing and may reuse the source port for its
	// next connection to the same destination at once; gVisor gives a SYN
	// that meets a TIME_WAIT endpoint only to a listening endpoint, and
	// the forwarder is none, so that SYN and its retransmissions were
	// dropped until TIME_WAIT ended: a client connect timing out. Shorter
	// than a kernel's first SYN retransmission (1 s, RFC 6298), so such a
	// SYN costs at most that one retransmission. What TIME_WAIT guards
	// against (old duplicates, a lost last ACK) hardly exists on a TUN: a
	// retransmitted FIN after it gets a RST, and the client's socket, in
	// LAST_ACK, just closes.
	timeWait = 500 * time.Millisecond
)

// Options configures New. One of Device, Link, or FD and MTU must be set.
type Options struct {
	// Device is the TUN device to serve. The Stack takes a dup of its fd,
	// which it closes in Close; the Device stays the caller's to close,
	// after the Stack.
	Device *tun.Device
	// Link, when Device is nil, is a gVisor link endpoint to serve instead
	// of a TUN: it must carry bare IP packets (no link header), and its
	// MTU is the stack's. Everything else is set up as for a Device: the
	// loopback wrapper, the catch-all address, the forwarder. Unit tests
	// pass gVisor's channel endpoint (link/channel) to inject packets and
	// read the replies without root. The Stack owns it from New on: the
	// NIC's removal in Close closes it, and so does a failing New.
	Link stack.LinkEndpoint
	// FD and MTU are used when Device and Link are nil (tests): a
	// TUN-like fd that carries one IP packet per read and write. The
	// caller owns FD and closes it after Close returns.
	FD  int
	MTU int

	// MaxInFlight bounds the requests whose Handler has not decided yet;
	// past it SYNs are dropped and counted in Stats.InFlightDrops.
	// DefaultMaxInFlight if 0.
	MaxInFlight int
	// ReceiveWindow is the initial receive buffer of accepted connections,
	// in bytes; gVisor auto-tunes it from there. DefaultReceiveWindow if 0.
	ReceiveWindow int
	// GRO turns on gVisor's generic receive offload on the fdbased link
	// endpoint, which coalesces inbound segments. A Device opened with
	// offload always has it (vnet.go); it does not apply to an injected
	// Link. It needs RX checksum offload (set with it: gVisor then trusts
	// the kernel's checksums) or uploads stall (docs/field-notes.md, "TUN
	// and gVisor"). It pays at small MTUs; off by default.
	GRO bool

	// Handler is called once per SYN, in its own goroutine. Required.
	Handler func(*Request)
	// Logger; a null logger if nil.
	Logger hclog.Logger
}

// Stats are counters since New.
type Stats struct {
	// Requests is the number of SYNs handed to the Handler.
	Requests uint64
	// Forwarded is the number of requests accepted with a completed
	// handshake.
	Forwarded uint64
	// Rejected is the number of requests answered with a RST (Reject, no
	// decision, or a stack that was closing).
	Rejected uint64
	// AcceptFailures is the number of Accepts whose handshake failed.
	AcceptFailures uint64
	// InFlightDrops is the number of SYNs dropped because MaxInFlight
	// requests were undecided.
	InFlightDrops uint64
	// BadChecksums is the number of inbound packets the offload link
	// (vnet.go) dropped for a wrong checksum before the stack saw them;
	// always 0 on a device without offload, where gVisor checks them.
	BadChecksums uint64
}

// Stack is a gVisor TCP/IP stack serving one TUN device.
type Stack struct {
	log     hclog.Logger
	stack   *stack.Stack
	fd      int
	ownFD   bool
	handler func(*Request)

	mu       sync.Mutex
	closed   bool           // guarded by mu
	handlers sync.WaitGroup // Handler calls; Add only under mu while !closed

	closeOnce sync.Once
	closeErr  error

	requests, forwarded, rejected, acceptFailures atomic.Uint64
	link                                          *vnetLink // nil without offload

	prober  *prober               // Probe (probe.go)
	readErr atomic.Pointer[error] // why the link's read loop ended, if not by Close
}

// New builds the stack over the device and starts serving it.
func New(opts Options) (*Stack, error) {
	if opts.Handler == nil {
		return nil, errors.New("netstack: Options.Handler is nil")
	}
	if opts.MaxInFlight == 0 {
		opts.MaxInFlight = DefaultMaxInFlight
	}
	if opts.ReceiveWindow == 0 {
		opts.ReceiveWindow = DefaultReceiveWindow
	}
	if opts.MaxInFlight < 0 || opts.ReceiveWindow < 0 {
		return nil, fmt.Errorf("netstack: negative MaxInFlight (%d) or ReceiveWindow (%d)", opts.MaxInFlight, opts.ReceiveWindow)
	}
	log := opts.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}

	s := &Stack{log: log, handler: opts.Handler, fd: opts.FD, prober: newProber()}
	mtu := opts.MTU
	switch {
	case opts.Device != nil && opts.Link != nil:
		opts.Link.Close()
		return nil, errors.New("netstack: both Options.Device and Options.Link are set")
	case opts.Device != nil:
		fd, err := opts.Device.FD()
		if err != nil {
			return nil, fmt.Errorf("netstack: %w", err)
		}
		s.fd, s.ownFD, mtu = fd, true, opts.Device.MTU()
	case opts.Link != nil:
		s.fd, mtu = -1, int(opts.Link.MTU())
	}
	if mtu <= 0 {
		s.closeFD()
		if opts.Link != nil {
			opts.Link.Close()
		}
		return nil, fmt.Errorf("netstack: MTU %d: set Options.Device, Link, or FD and MTU", mtu)
	}

	offload := opts.Device != nil && opts.Device.Offload()
	link := "fdbased"
	switch {
	case offload:
		link = "vnet"
	case opts.Link != nil:
		link = "injected"
	}
	if err := s.build(opts, mtu, offload); err != nil {
		if s.stack != nil {
			s.stack.Destroy()
		}
		s.closeFD()
		return nil, err
	}
	log.Info("stack up", "link", link, "mtu", mtu, "max_in_flight", opts.MaxInFlight,
		"receive_window", opts.ReceiveWindow, "gro", opts.GRO || offload, "offload", offload)
	return s, nil
}

// build performs the setup order of the package doc.
func (s *Stack) build(opts Options, mtu int, offload bool) (err error) {
	// An injected endpoint is ours to close until the NIC holds it (then
	// the stack's Destroy in New closes it).
	pending := opts.Link
	defer func() {
		if err != nil && pending != nil {
			pending.Close()
		}
	}()

	s.stack = stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, ipv6.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol},
	})

	// SACK is on by default in this gVisor; set it anyway so a version that
	// changes the default doesn't silently cost recovery speed.
	sack := tcpip.TCPSACKEnabled(true)
	if err := s.stack.SetTransportProtocolOption(tcp.ProtocolNumber, &sack); err != nil {
		return fmt.Errorf("netstack: enable SACK: %w", toError(err))
	}

	// RACK off: loss is detected by SACK and duplicate ACKs, as before
	// RACK. With it, downloads at a 1460-byte MSS ran at 2.5 Gbit/s and
	// 4.7 CPU-s/GiB for both gateways; without, 3.1 and 4.2, the other
	// bulk figures unchanged (docs/field-notes.md, "gVisor setup").
	// tailscale turned it off too, for spurious retransmissions.
	recovery := tcpip.TCPRecovery(0)
	if err := s.stack.SetTransportProtocolOption(tcp.ProtocolNumber, &recovery); err != nil {
		return fmt.Errorf("netstack: turn RACK off: %w", toError(err))
	}

	// TIME_WAIT: see timeWait.
	tw := tcpip.TCPTimeWaitTimeoutOption(timeWait)
	if err := s.stack.SetTransportProtocolOption(tcp.ProtocolNumber, &tw); err != nil {
		return fmt.Errorf("netstack: set TIME_WAIT: %w", toError(err))
	}

	fwd := tcp.NewForwarder(s.stack, opts.ReceiveWindow, opts.MaxInFlight, s.forward)
	s.stack.SetTransportProtocolHandler(tcp.ProtocolNumber, fwd.HandlePacket)

	// Called when the read loop ends: on Close (a stop reads as an error
	// too with fdbased), or because the TUN failed (e.g. the device was
	// deleted under the stack).
	closed := func(e tcpip.Error) {
		if s.isClosed() {
			return
		}
		err := toError(e)
		s.readErr.Store(&err)
		s.log.Error("TUN read failed; no more packets will be received", "error", err)
	}
	var ep stack.LinkEndpoint
	switch {
	case opts.Link != nil:
		ep = opts.Link
	case offload:
		// The device carries virtio_net_hdr: our own endpoint (vnet.go),
		// which owns the fd from here on and always runs GRO.
		s.ownFD = false
		vl, err := newVnetLink(s.fd, mtu, closed)
		if err != nil {
			return err
		}
		ep, s.link = vl, vl
	default:
		fep, err := fdbased.New(&fdbased.Options{
			FDs:            []int{s.fd},
			MTU:            uint32(mtu),
			EthernetHeader: false,
			// Never TXChecksumOffload: the kernel drops the checksum-less
			// SYN-ACKs of a TUN without vnet headers
			// (docs/field-notes.md, "gVisor setup").
			RXChecksumOffload: opts.GRO,
			GRO:               opts.GRO,
			ClosedFunc:        closed,
		})
		if err != nil {
			return fmt.Errorf("netstack: link endpoint: %w", err)
		}
		ep = fep
	}
	pending = nil
	nic := &loopbackLink{LinkEndpoint: ep, probe: s.prober, syn: newSynWriter(ep, s.settleSYN)}
	if err := s.stack.CreateNICWithOptions(nicID, nic, stack.NICOptions{Name: "tun"}); err != nil {
		nic.Close()
		return fmt.Errorf("netstack: create NIC: %w", toError(err))
	}
	// With the loopback capability, this /0 makes every IPv4 destination
	// match at once (loopback.go).
	if err := s.stack.AddProtocolAddress(nicID, catchAllV4, stack.AddressProperties{}); err != nil {
		return fmt.Errorf("netstack: add catch-all address: %w", toError(err))
	}
	// Promiscuous: accept packets for any destination address.
	// Spoofing: reply from that address.
	if err := s.stack.SetPromiscuousMode(nicID, true); err != nil {
		return fmt.Errorf("netstack: promiscuous mode: %w", toError(err))
	}
	if err := s.stack.SetSpoofing(nicID, true); err != nil {
		return fmt.Errorf("netstack: spoofing: %w", toError(err))
	}
	s.stack.SetRouteTable([]tcpip.Route{
		{Destination: header.IPv4EmptySubnet, NIC: nicID},
		{Destination: header.IPv6EmptySubnet, NIC: nicID},
	})
	// The probe's listener (probe.go), on the address just added.
	return s.prober.listen(s.stack)
}

// forward runs in the goroutine gVisor's forwarder starts for each SYN.
func (s *Stack) forward(fr *tcp.ForwarderRequest) {
	r := newRequest(s, fr)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		r.Reject()
		return
	}
	s.handlers.Add(1)
	s.mu.Unlock()
	defer s.handlers.Done()

	s.requests.Add(1)
	// A Handler that returns (or panics) without deciding has rejected:
	// the forwarder's slot must be released exactly once either way.
	defer r.Reject()
	s.handler(r)
}

func (s *Stack) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Stats returns the counters.
func (s *Stack) Stats() Stats {
	st := Stats{
		Requests:       s.requests.Load(),
		Forwarded:      s.forwarded.Load(),
		Rejected:       s.rejected.Load(),
		AcceptFailures: s.acceptFailures.Load(),
		InFlightDrops:  s.stack.Stats().TCP.ForwardMaxInFlightDrop.Value(),
	}
	if s.link != nil {
		st.BadChecksums += s.link.badChecksums.Load()
	}
	return st
}

// deliveredPoll is how often WaitDelivered looks at the connections:
// gVisor signals no event when a client acknowledges the last bytes; it
// runs only at shutdown, and an acknowledgement takes one round trip on
// this host, far below it.
const deliveredPoll = 10 * time.Millisecond

// WaitDelivered waits until no connection that our side has closed still
// waits for its client to acknowledge data or our FIN (TCP states
// FIN-WAIT-1, CLOSING, LAST-ACK). A flow that has ended in the gateway has
// handed its last bytes to its Conn, not yet to the client: Close aborts
// every connection, so a shutdown calls this first, or those bytes are
// lost and the client reads a RST where its data should end. It returns
// ctx's error when ctx ends first (a client that stopped acknowledging),
// with the count still waiting.
func (s *Stack) WaitDelivered(ctx context.Context) error {
	tick := time.NewTicker(deliveredPoll)
	defer tick.Stop()
	for {
		n := s.undelivered()
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("netstack: %d closed connections still unacknowledged: %w", n, ctx.Err())
		case <-tick.C:
		}
	}
}

// undelivered counts the connections WaitDelivered waits for.
func (s *Stack) undelivered() int {
	n := 0
	for _, ep := range s.stack.RegisteredEndpoints() {
		st, ok := ep.(interface{ State() uint32 })
		if !ok {
			continue // not TCP
		}
		switch tcp.EndpointState(st.State()) {
		case tcp.StateFinWait1, tcp.StateClosing, tcp.StateLastAck:
			n++
		}
	}
	return n
}

// Close stops the stack: new requests are rejected, every connection is
// aborted (the client gets a RST, and I/O on its Conn fails), the TUN is no
// longer read, and Close waits for running Handlers to return and for the
// stack's goroutines to end. Handlers must return once their Conn fails.
// Close is idempotent; later calls return the first call's result.
func (s *Stack) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()

		// Abort all endpoints while the NIC can still send their RSTs,
		// and stop TCP processing.
		s.stack.Close()
		// Stop reading the TUN; this waits for the link's dispatch loop.
		if err := s.stack.RemoveNIC(nicID); err != nil {
			s.log.Debug("remove NIC", "error", toError(err))
		}
		// An Accept that passed its closed check just before Close may
		// have registered its endpoint after the aborts above: abort
		// again. With the NIC gone no new endpoint can find a route.
		for _, ep := range s.stack.RegisteredEndpoints() {
			ep.Abort()
		}
		s.handlers.Wait()
		s.stack.Wait()
		s.closeErr = s.closeFD()
		st := s.Stats()
		s.log.Info("stack closed", "requests", st.Requests, "forwarded", st.Forwarded,
			"rejected", st.Rejected, "accept_failures", st.AcceptFailures, "in_flight_drops", st.InFlightDrops,
			"bad_checksums", st.BadChecksums)
	})
	return s.closeErr
}

func (s *Stack) closeFD() error {
	if !s.ownFD {
		return nil
	}
	s.ownFD = false
	if err := unix.Close(s.fd); err != nil {
		return fmt.Errorf("netstack: close TUN fd: %w", err)
	}
	return nil
}
