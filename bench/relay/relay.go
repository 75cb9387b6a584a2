// Package relay is the plain TCP relay of the bench's peer paths: a
// listener whose every connection is joined to a new outgoing one, the
// bytes copied both ways with io.Copy and each direction's end passed on
// as a half-close (CloseWrite). Two of them, one per node, are the plain
// relay pair (the floor any two-proxy design pays, no TLS); the Istio
// HBONE pair (interop/istiod/cmd/hbone-pair) runs the same Pipe between
// its client and the connection Istio's HBONE dialer returns, so that the
// two peers differ only in the leg between the nodes.
package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"
)

// halfCloser is a connection that can end its write direction alone
// (*net.TCPConn, *tls.Conn).
type halfCloser interface{ CloseWrite() error }

// Pipe copies a → b and b → a until both directions have ended, then
// closes both. A direction that ends with EOF is passed on as a
// half-close of the other side (CloseWrite) and the other direction goes
// on; if that side cannot half-close (a net.Pipe), or a direction ends
// with an error, both connections are closed at once, which ends the
// other direction too. It returns the bytes copied each way and the first
// error other than EOF and the closing it caused itself.
func Pipe(a, b net.Conn) (ab, ba int64, err error) {
	var (
		wg      sync.WaitGroup
		once    sync.Once
		closing = make(chan struct{})
		errs    [2]error
	)
	closeBoth := func() {
		once.Do(func() {
			close(closing)
			a.Close()
			b.Close()
		})
	}
	half := func(dst, src net.Conn, n *int64, e *error) {
		defer wg.Done()
		// io.Copy: between two *net.TCPConn the Go runtime splices
		// (splice(2), no copy through user space), as it would for any
		// plain Go relay.
		*n, *e = io.Copy(dst, src)
		if *e == nil {
			if hc, ok := dst.(halfCloser); ok {
				if cerr := hc.CloseWrite(); cerr == nil {
					return
				} else {
					*e = cerr
				}
			}
		}
		closeBoth()
	}
	wg.Add(2)
	go half(b, a, &ab, &errs[0])
	go half(a, b, &ba, &errs[1])
	wg.Wait()
	closeBoth()
	for _, e := range errs {
		if e == nil {
			continue
		}
		select {
		case <-closing:
			// A direction cut short by the close is not an error of its
			// own; the one that caused the close is.
			if errors.Is(e, net.ErrClosed) || errors.Is(e, io.ErrClosedPipe) {
				continue
			}
		default:
		}
		if err == nil {
			err = e
		}
	}
	return ab, ba, err
}

// Forward is one listener of a relay and where its connections go.
type Forward struct {
	Listen string // host:port to listen on
	Dial   string // host:port each accepted connection is relayed to
}

// ParseForwards reads "LISTEN=DIAL,LISTEN=DIAL,…".
func ParseForwards(s string) ([]Forward, error) {
	var out []Forward
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		l, d, ok := strings.Cut(part, "=")
		if !ok || l == "" || d == "" {
			return nil, fmt.Errorf("relay: %q: want LISTEN=DIAL", part)
		}
		for _, hp := range []string{l, d} {
			if _, _, err := net.SplitHostPort(hp); err != nil {
				return nil, fmt.Errorf("relay: %q: %w", part, err)
			}
		}
		out = append(out, Forward{Listen: l, Dial: d})
	}
	if len(out) == 0 {
		return nil, errors.New("relay: no forwards")
	}
	return out, nil
}

// DialFunc opens the outgoing connection of one relayed connection.
type DialFunc func(ctx context.Context) (net.Conn, error)

// DialTCP is a DialFunc to addr over kernel TCP.
func DialTCP(addr string, timeout time.Duration) DialFunc {
	d := net.Dialer{Timeout: timeout}
	return func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }
}

// ConnSet is the connections a server holds, so that its Close can end
// them (and the goroutines blocked on them). The zero value is empty and
// open. bench's load server uses it too.
type ConnSet struct {
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// Add holds c, unless the set was closed (then the caller closes c).
func (s *ConnSet) Add(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.conns == nil {
		s.conns = map[net.Conn]struct{}{}
	}
	s.conns[c] = struct{}{}
	return true
}

// Done closes c and lets it go.
func (s *ConnSet) Done(c net.Conn) {
	c.Close()
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// Len is the number of connections held.
func (s *ConnSet) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// Serve accepts connections on l until it fails, holds each and runs
// serve on it in a goroutine that wg counts, letting it go when serve
// returns. A connection accepted after Close is closed, and ends Serve.
// wg counts Serve's own goroutine only if the caller added it.
func (s *ConnSet) Serve(l net.Listener, wg *sync.WaitGroup, serve func(net.Conn)) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		if !s.Add(c) {
			c.Close()
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer s.Done(c)
			serve(c)
		}()
	}
}

// Close closes every connection held, and every one Add is given later.
func (s *ConnSet) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
}

// Server relays every connection its listeners accept until Close.
type Server struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	conns  ConnSet

	mu     sync.Mutex
	ls     []net.Listener
	closed bool
	errs   []error // dial and relay failures, the first few
}

// maxErrs is how many failures a Server keeps for Errors.
const maxErrs = 16

// NewServer makes a Server with no listeners yet.
func NewServer() *Server {
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{ctx: ctx, cancel: cancel}
}

// Serve relays the connections of l, each to a connection from dial,
// until Close. It returns at once.
func (s *Server) Serve(l net.Listener, dial DialFunc) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		l.Close()
		return
	}
	s.ls = append(s.ls, l)
	s.wg.Add(1)
	s.mu.Unlock()
	go s.accept(l, dial)
}

func (s *Server) accept(l net.Listener, dial DialFunc) {
	defer s.wg.Done()
	s.conns.Serve(l, &s.wg, func(c net.Conn) {
		out, err := dial(s.ctx)
		if err != nil {
			s.fail(fmt.Errorf("relay: dial for %s: %w", c.RemoteAddr(), err))
			return
		}
		if !s.conns.Add(out) {
			out.Close()
			return
		}
		defer s.conns.Done(out)
		if _, _, err := Pipe(c, out); err != nil {
			s.fail(fmt.Errorf("relay: %s: %w", c.RemoteAddr(), err))
		}
	})
}

func (s *Server) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed && len(s.errs) < maxErrs {
		s.errs = append(s.errs, err)
	}
}

// Errors is the failures so far (at most the first 16): dials that failed
// and connections that ended with an error other than EOF.
func (s *Server) Errors() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]error(nil), s.errs...)
}

// Addrs is the addresses of the server's listeners, in the order Serve
// was given them.
func (s *Server) Addrs() []net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []net.Addr
	for _, l := range s.ls {
		out = append(out, l.Addr())
	}
	return out
}

// Open is the number of connections the server holds (both ends of each
// relayed connection count).
func (s *Server) Open() int { return s.conns.Len() }

// Close stops the listeners, closes every connection and waits for every
// goroutine. It may be called more than once.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	ls := s.ls
	s.mu.Unlock()
	s.conns.Close()
	s.cancel()
	for _, l := range ls {
		l.Close()
	}
	s.wg.Wait()
	return nil
}
