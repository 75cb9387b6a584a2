package netstack

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// Keepalive on accepted connections. gVisor leaves it off (and 2 h when
// on): a client that vanishes without a FIN or RST would pin its Conn, the
// Handler's goroutines and the upstream stream forever. 60 s idle + 3 × 10 s
// probes drops a dead peer within ≈ 90 s while costing an idle connection
// one small segment a minute.
const (
	keepaliveIdle     = 60 * time.Second
	keepaliveInterval = 10 * time.Second
	keepaliveCount    = 3
)

var (
	// ErrDecided is returned by Accept when the request was already
	// accepted or rejected (or rejected because its Handler returned).
	ErrDecided = errors.New("netstack: request already accepted or rejected")
	// ErrClosed is returned by Accept when the Stack is closing.
	ErrClosed = errors.New("netstack: stack closed")
)

// Request is one incoming TCP SYN, waiting for its Handler to Accept or
// Reject it. Its methods are safe for concurrent use.
type Request struct {
	s   *Stack
	fr  *tcp.ForwarderRequest
	src netip.AddrPort
	dst netip.AddrPort

	mu      sync.Mutex
	decided bool // guarded by mu; set by the first Accept or Reject
}

func newRequest(s *Stack, fr *tcp.ForwarderRequest) *Request {
	id := fr.ID()
	return &Request{
		s:   s,
		fr:  fr,
		src: netip.AddrPortFrom(toAddr(id.RemoteAddress), id.RemotePort),
		dst: netip.AddrPortFrom(toAddr(id.LocalAddress), id.LocalPort),
	}
}

// Src returns the client's address and port.
func (r *Request) Src() netip.AddrPort { return r.src }

// Dst returns the destination the client dialled (the original destination).
func (r *Request) Dst() netip.AddrPort { return r.dst }

// decide claims the decision; only its first caller gets true.
func (r *Request) decide() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.decided {
		return false
	}
	r.decided = true
	return true
}

// Accept completes the client's handshake and returns the connection. It
// blocks until the handshake is done. It returns ErrDecided if the request
// was already accepted or rejected, ErrClosed if the Stack is closing, and
// an error if the handshake fails (the client is then sent a RST).
func (r *Request) Accept() (*Conn, error) {
	if !r.decide() {
		return nil, ErrDecided
	}
	s := r.s
	if s.isClosed() {
		s.rejected.Add(1)
		r.fr.Complete(true)
		return nil, ErrClosed
	}
	var wq waiter.Queue
	ep, terr := r.fr.CreateEndpoint(&wq)
	if terr != nil {
		s.acceptFailures.Add(1)
		r.fr.Complete(true)
		return nil, fmt.Errorf("netstack: accept %s -> %s: %w", r.src, r.dst, toError(terr))
	}
	// The handshake is done: release the forwarder's in-flight slot.
	r.fr.Complete(false)
	if s.isClosed() {
		ep.Abort()
		return nil, ErrClosed
	}
	setOptions(ep)
	s.forwarded.Add(1)
	return &Conn{TCPConn: gonet.NewTCPConn(&wq, ep), ep: ep, wq: &wq}, nil
}

// Reject answers the client with a RST. It does nothing if the request was
// already accepted or rejected.
func (r *Request) Reject() {
	if !r.decide() {
		return
	}
	// Count before the RST goes out, so that a client that sees it also
	// sees the count.
	r.s.rejected.Add(1)
	r.fr.Complete(true)
}

func setOptions(ep tcpip.Endpoint) {
	ep.SocketOptions().SetKeepAlive(true)
	idle := tcpip.KeepaliveIdleOption(keepaliveIdle)
	interval := tcpip.KeepaliveIntervalOption(keepaliveInterval)
	// These cannot fail on a connected TCP endpoint; errors are ignored.
	_ = ep.SetSockOpt(&idle)
	_ = ep.SetSockOpt(&interval)
	_ = ep.SetSockOptInt(tcpip.KeepaliveCountOption, keepaliveCount)
}

// Conn is an accepted connection: a net.Conn with half-close. CloseWrite
// sends a FIN and keeps reading; CloseRead stops reading and keeps writing.
type Conn struct {
	*gonet.TCPConn
	ep tcpip.Endpoint
	wq *waiter.Queue
}

// WaitRead blocks until a Read would not block: data or the peer's FIN is
// pending, the connection failed, or it was closed (Close, Reset, or the
// Stack's Close). It reads nothing, so a copy loop can wait for an idle
// connection without holding a buffer. It ignores deadlines; it returns an
// error only for a Conn without an endpoint (never for one from Accept).
func (c *Conn) WaitRead() error {
	if c.ep == nil {
		return errors.New("netstack: WaitRead on a Conn not made by Accept")
	}
	if c.ep.Readiness(waiter.ReadableEvents) != 0 {
		return nil
	}
	// Readiness reports readable on data, on a FIN, and in the closed and
	// error states; each of those changes notifies ReadableEvents, which
	// is what gonet's own blocking Read waits for too.
	entry, ch := waiter.NewChannelEntry(waiter.ReadableEvents)
	c.wq.EventRegister(&entry)
	defer c.wq.EventUnregister(&entry)
	for c.ep.Readiness(waiter.ReadableEvents) == 0 {
		<-ch
	}
	return nil
}

// TryWrite writes what of p fits in the send buffer now, without
// waiting: 0 and no error when it is full. It goes out on the caller's
// goroutine, as Write does. Errors are those of Write (a reset or closed
// connection).
func (c *Conn) TryWrite(p []byte) (int, error) {
	if c.ep == nil {
		return 0, errors.New("netstack: TryWrite on a Conn not made by Accept")
	}
	var r bytes.Reader
	r.Reset(p)
	n, err := c.ep.Write(&r, tcpip.WriteOptions{})
	switch err.(type) {
	case nil, *tcpip.ErrWouldBlock:
		return int(n), nil
	}
	return int(n), &net.OpError{Op: "write", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: toError(err)}
}

// Reset aborts the connection with a RST (SO_LINGER 0, then Close), so a
// reset that ended the other side of a relay reaches the client as a reset
// rather than a FIN. Like Close, it unblocks Read, Write and WaitRead.
func (c *Conn) Reset() error {
	if c.ep != nil {
		c.ep.SocketOptions().SetLinger(tcpip.LingerOption{Enabled: true, Timeout: 0})
	}
	return c.Close()
}

func toAddr(a tcpip.Address) netip.Addr {
	ip, _ := netip.AddrFromSlice(a.AsSlice())
	return ip
}
