package hbone

// The inbound side of HBONE is the server side of our own HTTP/2 engine
// (h2conn.go, on golang.org/x/net/http2's Framer and hpack), rather than
// net/http or x/net/http2's Server.
//
// Why: Go's HTTP/2 server cannot half-close a stream. Returning from a
// handler ends both directions at once and sends RST_STREAM(NO_ERROR) (see
// the TODO at the top of $GOROOT/src/net/http/internal/http2/server.go; in
// Go 1.27 x/net/http2's Server wraps that same code). HBONE carries a TCP
// connection, and TCP half-close must survive the tunnel both ways: when the
// target sends FIN we send END_STREAM and keep reading the client's DATA,
// and when the client sends END_STREAM we FIN the target and keep sending.
//
// Only what HBONE needs is implemented: CONNECT streams opened by the client,
// flow control both ways, SETTINGS, PING, GOAWAY. No server push, no
// priorities, no trailers, no HTTP/1. The contract is docs/hbone.md.
//
// Layout: server.go (this file: options, listeners, accept loop,
// lifecycle, counters), server_conn.go (one connection: the engine plus
// the handlers' goroutines), server_request.go (Request, the CONNECT's
// checks, Accept and Reject), server_stream.go (ServerStream),
// server_authority.go (the :authority parser), server_headers.go
// (traceparent and forwarded).

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/time/rate"
)

// Tuning of the server; the HTTP/2 windows and frame sizes are the
// engine's (h2conn.go).
const (
	// srvMaxHeaderList bounds a request's decoded header list.
	srvMaxHeaderList = 64 << 10
	// srvDefaultMaxStreams is ztunnel's SETTINGS_MAX_CONCURRENT_STREAMS.
	srvDefaultMaxStreams = 200

	// srvRefusalLogRate and srvRefusalLogBurst bound the WARN lines about
	// refused handshakes and requests (a peer with a bad certificate, a
	// malformed CONNECT): each attempt gets its line while they are few,
	// and a flood of them cannot flood the journal; the lines skipped are
	// counted in the next one.
	srvRefusalLogRate  = 1 // per second, after the burst
	srvRefusalLogBurst = 20

	// srvHandshakeTimeout is HandshakeTimeout's default: it bounds the TLS
	// handshake, the client preface and SETTINGS and the first request,
	// so a peer that opens TCP and says nothing (or says it 1 byte at a
	// time) holds its goroutine and socket no longer. ztunnel gives the
	// TLS handshake 10 s too.
	srvHandshakeTimeout = 10 * time.Second
)

// ServerOptions configures a Server. Zero values take the documented
// defaults.
type ServerOptions struct {
	// Certificate is the server's certificate chain and key; its leaf
	// carries the gateway's SPIFFE ID. Required unless Source is set.
	Certificate tls.Certificate
	// Roots is the trust bundle client certificates must chain to.
	// Required unless Source is set.
	Roots *x509.CertPool
	// Source, if set, supplies the certificate and the trust bundle
	// instead of Certificate and Roots (set one or the other). Each TLS
	// handshake takes what it holds at that moment: connections accepted
	// after a swap present the new certificate and check clients against
	// the new roots; open connections keep what they were made with. While
	// it holds no usable certificate, handshakes fail (HandshakeFailures)
	// with an error wrapping ErrNoCertificate.
	Source CertSource
	// TrustDomain: clients must present a SPIFFE ID in it.
	TrustDomain string
	// Handler is called once per valid CONNECT, in its own goroutine. It
	// must call Request.Accept or Request.Reject; if it returns without
	// either, the server answers 503. After Accept the ServerStream stays
	// usable after Handler returns, until its Close. Server.Close waits
	// for handlers to return: they should watch Request.Context and stop
	// when the stream's I/O fails.
	Handler func(*Request)
	// NameAuthorities accepts a CONNECT whose :authority is
	// "hostname:port" (Request.TargetName), as ztunnel addresses a
	// service behind a network gateway; without it such a request is
	// refused with 400.
	NameAuthorities bool
	// MaxConcurrentStreams per connection; default 200. Streams beyond it
	// are refused with RST_STREAM(REFUSED_STREAM).
	MaxConcurrentStreams uint32
	// MaxConns bounds the connections open at once, those still in the
	// handshake included; 0 is no bound. A connection beyond it is closed
	// as soon as it is accepted, before any TLS (ConnsRefused).
	MaxConns int
	// HandshakeTimeout is how long after the TCP accept a client has for
	// the TLS handshake, the HTTP/2 preface and SETTINGS, and its first
	// CONNECT; a connection that has not opened a stream by then is
	// closed (HandshakeFailures). Default 10s.
	HandshakeTimeout time.Duration
	// Logger; default hclog.NewNullLogger().
	Logger hclog.Logger

	// Keepalive timers; zero means h2PingAfter and h2PingTimeout.
	// Unexported: only tests shorten them.
	pingAfter, pingTimeout time.Duration
}

// ServerStats are counters of a Server since it was made.
type ServerStats struct {
	ConnsAccepted     uint64 // HTTP/2 connections that completed the TLS handshake
	StreamsAccepted   uint64 // CONNECTs answered 200
	StreamsRejected   uint64 // CONNECTs answered with another status
	ConnsOpen         int64  // including connections still in the TLS handshake
	StreamsOpen       int64  // streams not yet closed both ways
	HandshakeFailures uint64 // TLS or HTTP/2 handshakes that failed: refused, broken, or no first request within HandshakeTimeout
	StreamsRefused    uint64 // streams refused with REFUSED_STREAM (over the concurrency limit, or while draining)
	ConnsRefused      uint64 // connections closed at accept, over MaxConns
}

// Server is an HBONE server: it accepts mutual-TLS HTTP/2 connections and
// hands each CONNECT stream to ServerOptions.Handler.
type Server struct {
	opts    ServerOptions
	tlsConf *tls.Config
	log     hclog.Logger

	// Timers, from the constants (tests shorten the keepalive).
	handshakeTimeout time.Duration
	pingAfter        time.Duration
	pingTimeout      time.Duration

	connsAccepted, streamsAccepted, streamsRejected atomic.Uint64
	handshakeFailures, streamsRefused, connsRefused atomic.Uint64
	connsOpen, streamsOpen                          atomic.Int64

	refusalLog    *rate.Limiter // WARN lines about refusals (logRefusal)
	refusalsQuiet atomic.Uint64 // refusals not logged since the last line

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*srvConn]struct{}
	closing   bool           // Close or Shutdown started: accept nothing new
	drained   chan struct{}  // closed when closing and conns is empty
	wg        sync.WaitGroup // Serve loops, ServeConn calls
}

// NewServer checks opts and makes a Server.
func NewServer(opts ServerOptions) (*Server, error) {
	var errs []error
	src := opts.Source
	switch {
	case src != nil && (len(opts.Certificate.Certificate) > 0 || opts.Roots != nil):
		errs = append(errs, errors.New("Source: set together with Certificate or Roots (use one or the other)"))
	case src == nil:
		static, err := newStaticSource(opts.Certificate, opts.Roots)
		if err != nil {
			errs = append(errs, err)
		} else {
			src = static
		}
	}
	if opts.TrustDomain == "" {
		errs = append(errs, errors.New("TrustDomain: missing"))
	}
	if opts.Handler == nil {
		errs = append(errs, errors.New("Handler: missing"))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("hbone: server options: %w", errors.Join(errs...))
	}
	if opts.MaxConcurrentStreams == 0 {
		opts.MaxConcurrentStreams = srvDefaultMaxStreams
	}
	if opts.HandshakeTimeout == 0 {
		opts.HandshakeTimeout = srvHandshakeTimeout
	}
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	if opts.pingAfter == 0 {
		opts.pingAfter = h2PingAfter
	}
	if opts.pingTimeout == 0 {
		opts.pingTimeout = h2PingTimeout
	}
	return &Server{
		opts:             opts,
		tlsConf:          sourceServerConfig(src, opts.TrustDomain),
		log:              opts.Logger,
		handshakeTimeout: opts.HandshakeTimeout,
		refusalLog:       rate.NewLimiter(srvRefusalLogRate, srvRefusalLogBurst),
		pingAfter:        opts.pingAfter,
		pingTimeout:      opts.pingTimeout,
		listeners:        make(map[net.Listener]struct{}),
		conns:            make(map[*srvConn]struct{}),
		drained:          make(chan struct{}),
	}, nil
}

// Stats returns the server's counters.
func (s *Server) Stats() ServerStats {
	return ServerStats{
		ConnsAccepted:     s.connsAccepted.Load(),
		StreamsAccepted:   s.streamsAccepted.Load(),
		StreamsRejected:   s.streamsRejected.Load(),
		ConnsOpen:         s.connsOpen.Load(),
		StreamsOpen:       s.streamsOpen.Load(),
		HandshakeFailures: s.handshakeFailures.Load(),
		StreamsRefused:    s.streamsRefused.Load(),
		ConnsRefused:      s.connsRefused.Load(),
	}
}

// errServerClosed is what Serve returns after Close or Shutdown.
var errServerClosed = fmt.Errorf("hbone: server closed: %w", net.ErrClosed)

// Serve accepts raw TCP connections from ln and serves each in its own
// goroutine (TLS handshake included). It returns an error wrapping
// net.ErrClosed after Close or Shutdown, or ln's Accept error. Serve closes
// ln when it returns.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		ln.Close()
		return errServerClosed
	}
	s.listeners[ln] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
		ln.Close()
	}()

	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if s.isClosing() {
				return errServerClosed
			}
			if isTimeout(err) || isTemporaryAccept(err) {
				// Out of file descriptors and the like: wait and retry, as
				// net/http does, rather than spin or give up.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.log.Warn("accept failed, retrying", "error", err, "delay", backoff)
				t := time.NewTimer(backoff)
				select {
				case <-t.C:
				case <-s.drained:
					t.Stop()
				}
				continue
			}
			return fmt.Errorf("hbone: accept: %w", err)
		}
		backoff = 0
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			c.Close()
			return errServerClosed
		}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			s.serveConn(c)
		}()
	}
}

// isTemporaryAccept reports accept errors worth retrying (EMFILE, ENFILE,
// ECONNABORTED...), which still report Temporary.
func isTemporaryAccept(err error) bool {
	var te interface{ Temporary() bool }
	return errors.As(err, &te) && te.Temporary()
}

func (s *Server) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

// ServeConn serves one accepted raw TCP connection: the TLS handshake, then
// HTTP/2 until the connection ends. It blocks until then, and until every
// goroutine of the connection (handlers included) has returned. c is
// closed when ServeConn returns.
func (s *Server) ServeConn(c net.Conn) {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		c.Close()
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	s.serveConn(c)
}

func (s *Server) serveConn(raw net.Conn) {
	log := s.log.With("peer", raw.RemoteAddr().String())
	deadline := time.Now().Add(s.handshakeTimeout)
	tc := tls.Server(newBatchConn(raw), s.tlsConf)
	sc := newSrvConn(s, tc, log, deadline)
	if !s.track(sc) {
		raw.Close()
		sc.cancel()
		return
	}
	defer s.untrack(sc)

	ctx, cancel := context.WithDeadline(sc.ctx, deadline)
	err := tc.HandshakeContext(ctx)
	cancel()
	if err != nil {
		switch {
		case errors.Is(err, ErrNoCertificate):
			log.Warn("TLS handshake refused: we hold no certificate", "error", err)
		case quietHandshakeError(err, sc.ctx):
			// The peer went away or never spoke (a port scan, a probe), or
			// we are closing: nothing an operator must read.
			log.Debug("TLS handshake failed", "error", err)
		default:
			s.logRefusal(log, "TLS handshake refused", "error", err)
		}
		if sc.ctx.Err() == nil { // not our own Close
			s.handshakeFailures.Add(1)
		}
		raw.Close()
		sc.cancel()
		return
	}
	s.connsAccepted.Add(1)
	if sc.serve() {
		s.handshakeFailures.Add(1)
	}
}

// track registers sc so Close can reach it; false if the server is
// closing or at MaxConns.
func (s *Server) track(sc *srvConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	if s.opts.MaxConns > 0 && len(s.conns) >= s.opts.MaxConns {
		s.connsRefused.Add(1)
		sc.log.Debug("connection refused: at the connection limit", "max_conns", s.opts.MaxConns)
		return false
	}
	s.conns[sc] = struct{}{}
	s.connsOpen.Add(1)
	return true
}

func (s *Server) untrack(sc *srvConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, sc)
	s.connsOpen.Add(-1)
	s.signalDrainedLocked()
}

func (s *Server) signalDrainedLocked() {
	if s.closing && len(s.conns) == 0 {
		select {
		case <-s.drained:
		default:
			close(s.drained)
		}
	}
}

// beginClose stops accepting: listeners close, new conns are refused. It
// returns the conns open at that moment.
func (s *Server) beginClose() []*srvConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closing = true
	for ln := range s.listeners {
		ln.Close()
	}
	conns := make([]*srvConn, 0, len(s.conns))
	for sc := range s.conns {
		conns = append(conns, sc)
	}
	s.signalDrainedLocked()
	return conns
}

// Shutdown stops accepting, sends GOAWAY(NO_ERROR) on every connection
// and waits until their streams have ended or ctx is done, then calls
// Close. It returns ctx's error if it gave up waiting.
func (s *Server) Shutdown(ctx context.Context) error {
	for _, sc := range s.beginClose() {
		sc.shutdown()
	}
	var err error
	select {
	case <-s.drained:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if cerr := s.Close(); err == nil {
		err = cerr
	}
	return err
}

// Close closes the listeners and every connection at once (open streams'
// Read and Write fail, Request contexts are cancelled), then waits for
// Serve, ServeConn and the handlers to return. It may be called more than
// once.
func (s *Server) Close() error {
	for _, sc := range s.beginClose() {
		sc.closeNow()
	}
	s.wg.Wait()
	return nil
}

// logRefusal writes a WARN line about a refused peer or request, within
// the refusal log's rate; a line after skipped ones says how many.
func (s *Server) logRefusal(log hclog.Logger, msg string, args ...any) {
	if !s.refusalLog.Allow() {
		s.refusalsQuiet.Add(1)
		return
	}
	if n := s.refusalsQuiet.Swap(0); n > 0 {
		args = append(args, "refusals_not_logged", n)
	}
	log.Warn(msg, args...)
}

// quietHandshakeError reports a handshake that ended without a refusal
// of ours: the peer closed or reset the connection or sent nothing before
// the deadline, or the server is closing (ctx done).
func quietHandshakeError(err error, ctx context.Context) bool {
	return ctx.Err() != nil || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, net.ErrClosed) || isTimeout(err)
}
