package hbone

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"net/url"
	"sync"
	"sync/atomic"

	"golang.org/x/net/http2"
)

// ConnectRequest describes one flow to carry over HBONE.
type ConnectRequest struct {
	// Address is the peer's HBONE address, e.g. 192.0.2.2:15008.
	Address netip.AddrPort
	// Authority is the final target, sent as :authority (IPv6 as
	// [addr]:port, without a zone).
	Authority netip.AddrPort
	// Identities are the SPIFFE IDs the server may present (any one).
	Identities []string
	// Source is the original client, sent as forwarded: for="ip:port".
	// The zero value omits the header.
	Source netip.AddrPort
	// SourceIP is the local address to bind (zero: any). Part of the pool
	// key.
	SourceIP netip.Addr
	// Host, if set, is the destination service's hostname, added to the
	// forwarded header as ;host=<Host>.
	Host string
	// Baggage, if set, is sent as the baggage header.
	Baggage string
}

// check refuses requests the pool cannot key or the server cannot parse.
func (r *ConnectRequest) check() error {
	switch {
	case !r.Address.IsValid():
		return errors.New("hbone: connect: no HBONE address")
	case !r.Authority.IsValid():
		return errors.New("hbone: connect: no target authority")
	case len(r.Identities) == 0:
		return fmt.Errorf("hbone: connect %s: no expected server identity", r.Address)
	}
	for _, c := range []byte(r.Host) {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '-' || c == '_'
		if !ok {
			return fmt.Errorf("hbone: connect %s: host %q is not a hostname", r.Address, r.Host)
		}
	}
	return nil
}

// header builds the CONNECT request's headers (hbone-wire.md, "The CONNECT
// request").
func (r *ConnectRequest) header() http.Header {
	h := http.Header{
		"Traceparent": {clientTraceparent()},
		// An empty User-Agent makes Go send none; ztunnel sends none.
		"User-Agent": {""},
	}
	if r.Source.IsValid() {
		fwd := `for="` + r.Source.String() + `"`
		if r.Host != "" {
			fwd += ";host=" + r.Host
		}
		h["Forwarded"] = []string{fwd}
	}
	if r.Baggage != "" {
		h["Baggage"] = []string{r.Baggage}
	}
	return h
}

// clientTraceparent is a fresh W3C traceparent: version 00, random trace
// and parent IDs (never all zero, which the format forbids), not sampled.
func clientTraceparent() string {
	var hi, lo, span uint64
	for hi|lo == 0 {
		hi, lo = rand.Uint64(), rand.Uint64()
	}
	for span == 0 {
		span = rand.Uint64()
	}
	b := make([]byte, 0, 55)
	b = append(b, "00-"...)
	b = clientHex64(b, hi)
	b = clientHex64(b, lo)
	b = append(b, '-')
	b = clientHex64(b, span)
	b = append(b, "-00"...)
	return string(b)
}

// clientHex64 appends v as 16 lowercase hex digits.
func clientHex64(b []byte, v uint64) []byte {
	const digits = "0123456789abcdef"
	for shift := 60; shift >= 0; shift -= 4 {
		b = append(b, digits[v>>shift&0xf])
	}
	return b
}

// Connect opens a CONNECT stream to req.Authority through the HBONE peer
// at req.Address, on a pooled connection. It returns once the peer
// answered 200; any other answer is a *StatusError. TLS refusals wrap the
// sentinels of tls.go (ErrWrongIdentity, ErrUntrusted…). ctx bounds the
// wait for a connection and for the answer, not the stream's life.
func (p *Pool) Connect(ctx context.Context, req ConnectRequest) (*ClientStream, error) {
	if err := req.check(); err != nil {
		return nil, err
	}
	key := p.keyFor(&req)
	for attempt := 1; ; attempt++ {
		pc, err := p.acquire(ctx, key, req.Identities)
		if err != nil {
			return nil, err
		}
		if p.opts.beforeOpen != nil {
			p.opts.beforeOpen(pc)
		}
		s, retry, err := p.open(ctx, pc, &req)
		if err == nil {
			return s, nil
		}
		p.release(pc)
		// A request the peer never processed (a GOAWAY or a failure came
		// between taking the slot and sending, or the GOAWAY's last stream
		// is below ours) is safe to send again, once: the going-away
		// connection refuses new slots, so acquire finds another.
		if !retry || attempt == connectAttempts {
			return nil, err
		}
		p.log.Debug("CONNECT not processed by the peer, retrying on another connection", "addr", key.addr, "error", err)
	}
}

// connectAttempts bounds Connect's tries of one request: the first, and
// one retry on another connection if the peer did not process it.
const connectAttempts = 2

// open sends the CONNECT on pc, whose slot the caller holds, and waits for
// the answer. When it fails, retry says whether the peer certainly did
// not process the request (RFC 9113 §8.7), so that it may be sent again.
func (p *Pool) open(ctx context.Context, pc *poolConn, req *ConnectRequest) (s *ClientStream, retry bool, err error) {
	target := netip.AddrPortFrom(req.Authority.Addr().WithZone(""), req.Authority.Port()).String()
	// The stream's context must outlive ctx (the transport resets the
	// stream when it ends), so ctx only cancels until the answer is in.
	sctx, cancel := context.WithCancel(context.Background())
	// The transport says when it wrote this request's HEADERS; the frame
	// walker under it knows which stream ID they carried.
	var id atomic.Uint32
	wrote := make(chan struct{})
	var wroteOnce sync.Once
	sctx = httptrace.WithClientTrace(sctx, &httptrace.ClientTrace{
		WroteHeaders: func() {
			wroteOnce.Do(func() {
				id.Store(pc.nc.headersID())
				close(wrote)
			})
		},
	})
	body := newClientBody()
	hreq := (&http.Request{
		Method:        http.MethodConnect,
		URL:           &url.URL{Scheme: "https", Host: target},
		Host:          target,
		Header:        req.header(),
		Body:          body,
		ContentLength: -1,
	}).WithContext(sctx)
	stop := context.AfterFunc(ctx, cancel)
	resp, err := pc.cc.RoundTrip(hreq)
	if !stop() {
		err = ctx.Err()
		if resp != nil {
			resp.Body.Close()
		}
	}
	if err != nil {
		cancel()
		body.Close()
		retry = ctx.Err() == nil && unprocessed(pc, &id, wrote, err)
		return nil, retry, fmt.Errorf("hbone: connect %s via %s: %w", target, req.Address, err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		cancel()
		body.Close()
		return nil, false, &StatusError{Code: resp.StatusCode}
	}
	// A response means the HEADERS went out, and WroteHeaders runs right
	// after they did, without blocking: this wait is short.
	select {
	case <-wrote:
	case <-ctx.Done():
		resp.Body.Close()
		cancel()
		body.Close()
		return nil, false, fmt.Errorf("hbone: connect %s via %s: %w", target, req.Address, ctx.Err())
	}
	return &ClientStream{pool: p, pc: pc, id: id.Load(), resp: resp, body: body, cancel: cancel}, false, nil
}

// unprocessed reports whether a request that failed with err was
// certainly not processed by the peer: its HEADERS never went out, the
// peer refused the stream (REFUSED_STREAM), or the peer's GOAWAY named a
// last stream below it.
func unprocessed(pc *poolConn, id *atomic.Uint32, wrote <-chan struct{}, err error) bool {
	select {
	case <-wrote:
	default:
		// WroteHeaders runs after every write of HEADERS, failed ones
		// included, and RoundTrip returns an aborted request's error only
		// once the request's writer has finished: no hook yet means no
		// HEADERS were written.
		return true
	}
	var se http2.StreamError
	if errors.As(err, &se) && se.Code == http2.ErrCodeRefusedStream {
		return true
	}
	return id.Load() > pc.nc.goAwayLast.Load()
}

// ClientStream is one CONNECT stream: the proxied TCP connection's bytes.
// Read and Write may be called concurrently with each other; Close may be
// called at any time, from any goroutine.
type ClientStream struct {
	pool   *Pool
	pc     *poolConn
	id     uint32 // HTTP/2 stream ID
	resp   *http.Response
	body   *clientBody
	cancel context.CancelFunc

	closeOnce sync.Once

	mu        sync.Mutex
	readDone  bool // Read returned a final error
	writeDone bool // CloseWrite was called or the body was closed
	released  bool // the pool slot was given back
}

// Read reads response DATA. It returns io.EOF at END_STREAM and on
// RST_STREAM with NO_ERROR or CANCEL; other reset codes return an error
// wrapping ErrStreamReset.
func (s *ClientStream) Read(b []byte) (int, error) {
	n, err := s.resp.Body.Read(b)
	if err != nil {
		err = clientReadErr(err)
		s.ended(true, false)
	}
	return n, err
}

// clientReadErr maps what the transport's body returns to Read's contract.
func clientReadErr(err error) error {
	if err == io.EOF {
		return io.EOF
	}
	var se http2.StreamError
	if errors.As(err, &se) {
		if se.Code == http2.ErrCodeNo || se.Code == http2.ErrCodeCancel {
			return io.EOF
		}
		return fmt.Errorf("%w (%v)", ErrStreamReset, se.Code)
	}
	return fmt.Errorf("hbone: read: %w", err)
}

// Write sends b as request DATA. It returns once the transport took all
// of b, which it copies once, straight into its frame buffer.
func (s *ClientStream) Write(b []byte) (int, error) {
	return s.body.write(b)
}

// ReadFrom sends what r yields until r returns io.EOF, letting the
// transport read r directly into its frame buffer (large reads, no
// intermediate copy: io.Copy(stream, conn) uses it). It does not end the
// stream; call CloseWrite for that. A Close of the stream while r.Read
// blocks returns at once, but the transport's reader stays in r.Read
// until r yields or is closed.
func (s *ClientStream) ReadFrom(r io.Reader) (int64, error) {
	return s.body.readFrom(r)
}

// CloseWrite ends our side of the stream (END_STREAM) once the data
// written so far is sent; Read keeps working.
func (s *ClientStream) CloseWrite() error {
	s.body.closeWrite()
	s.ended(false, true)
	return nil
}

// Close aborts the stream (RST_STREAM CANCEL unless both sides had
// finished) and gives its slot back to the pool. Blocked Reads and Writes
// return. Close may be called more than once.
func (s *ClientStream) Close() error {
	s.closeOnce.Do(func() {
		s.body.Close()
		s.resp.Body.Close()
		s.cancel()
		s.ended(true, true)
	})
	return nil
}

// Reset ends the stream abnormally: RST_STREAM(CONNECT_ERROR), which the
// peer reads as a reset of the proxied connection (its target gets a
// RST), not as the clean end that Close's CANCEL is. Use it when the
// local side of the flow failed. It then closes the stream as Close does
// (the transport's own RST_STREAM(CANCEL) follows, and peers ignore a
// reset of a stream they already saw reset). A stream already ended both
// ways is only closed.
func (s *ClientStream) Reset() error {
	s.mu.Lock()
	ended := s.readDone && s.writeDone
	s.mu.Unlock()
	var err error
	if !ended {
		err = s.pc.nc.resetStream(s.id, http2.ErrCodeConnect)
	}
	s.Close()
	if err != nil {
		return fmt.Errorf("hbone: reset stream %d: %w", s.id, err)
	}
	return nil
}

// PeerIdentity is the server's SPIFFE ID.
func (s *ClientStream) PeerIdentity() string {
	return s.pc.peerID
}

// ended records the end of a direction and gives the pool slot back once
// both ended.
func (s *ClientStream) ended(read, write bool) {
	s.mu.Lock()
	s.readDone = s.readDone || read
	s.writeDone = s.writeDone || write
	release := s.readDone && s.writeDone && !s.released
	s.released = s.released || release
	s.mu.Unlock()
	if release {
		s.pool.release(s.pc)
	}
}

var _ io.ReadWriteCloser = (*ClientStream)(nil)
var _ io.ReaderFrom = (*ClientStream)(nil)

// errClientStreamClosed is what writes to a closed stream return.
var errClientStreamClosed = fmt.Errorf("hbone: stream closed: %w", net.ErrClosed)

// errClientWriteAfterCloseWrite is what Write after CloseWrite returns.
var errClientWriteAfterCloseWrite = errors.New("hbone: write after CloseWrite")

// clientBody is the request body: the transport's body-writing goroutine
// Reads it, and Write, ReadFrom and CloseWrite feed it by hand-off, not
// through a buffer of its own. A Write parks its slice until the
// transport copied all of it into its frame buffer; a ReadFrom parks its
// reader, which the transport then reads directly.
type clientBody struct {
	wmu sync.Mutex // one Write, ReadFrom or CloseWrite at a time

	mu     sync.Mutex
	cond   sync.Cond
	buf    []byte    // parked by Write, drained by Read
	src    io.Reader // parked by ReadFrom
	srcN   int64     // bytes read from src
	srcErr error     // src's error other than io.EOF
	eof    bool      // CloseWrite: Read returns io.EOF when drained
	err    error     // closed: everything fails with it
}

func newClientBody() *clientBody {
	b := &clientBody{}
	b.cond.L = &b.mu
	return b
}

// Read is called by the transport only.
func (b *clientBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		switch {
		case b.err != nil:
			return 0, b.err
		case len(b.buf) > 0:
			n := copy(p, b.buf)
			b.buf = b.buf[n:]
			if len(b.buf) == 0 {
				b.cond.Broadcast()
			}
			return n, nil
		case b.src != nil:
			src := b.src
			b.mu.Unlock()
			n, err := src.Read(p)
			b.mu.Lock()
			b.srcN += int64(n)
			if err != nil {
				if err != io.EOF {
					b.srcErr = err
				}
				b.src = nil
				b.cond.Broadcast()
			}
			if b.err != nil {
				return 0, b.err
			}
			if n > 0 {
				return n, nil
			}
			continue
		case b.eof:
			return 0, io.EOF
		}
		b.cond.Wait()
	}
}

// Close is called by the transport when the request ends, and by
// ClientStream.Close.
func (b *clientBody) Close() error {
	b.mu.Lock()
	if b.err == nil {
		b.err = errClientStreamClosed
	}
	b.cond.Broadcast()
	b.mu.Unlock()
	return nil
}

func (b *clientBody) write(p []byte) (int, error) {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.err != nil:
		return 0, b.err
	case b.eof:
		return 0, errClientWriteAfterCloseWrite
	case len(p) == 0:
		return 0, nil
	}
	b.buf = p
	b.cond.Broadcast()
	for len(b.buf) > 0 && b.err == nil {
		b.cond.Wait()
	}
	n := len(p) - len(b.buf)
	b.buf = nil
	if n < len(p) {
		return n, b.err
	}
	return n, nil
}

func (b *clientBody) readFrom(r io.Reader) (int64, error) {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.err != nil:
		return 0, b.err
	case b.eof:
		return 0, errClientWriteAfterCloseWrite
	}
	b.src, b.srcN, b.srcErr = r, 0, nil
	b.cond.Broadcast()
	for b.src != nil && b.err == nil {
		b.cond.Wait()
	}
	if b.src != nil { // closed while the transport may still read r
		b.src = nil
		return b.srcN, b.err
	}
	return b.srcN, b.srcErr
}

func (b *clientBody) closeWrite() {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	b.mu.Lock()
	b.eof = true
	b.cond.Broadcast()
	b.mu.Unlock()
}
