package hbone

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// open sends the CONNECT on pc, whose slot the caller holds, and waits for
// the answer. When it fails, retry says whether the peer certainly did
// not process the request (RFC 9113 §8.7), so that it may be sent again.
func (p *Pool) open(ctx context.Context, pc *poolConn, req *ConnectRequest) (s *ClientStream, retry bool, err error) {
	target := netip.AddrPortFrom(req.Authority.Addr().WithZone(""), req.Authority.Port()).String()
	fail := func(err error) (*ClientStream, bool, error) {
		return nil, errors.Is(err, errClientUnprocessed), fmt.Errorf("hbone: connect %s via %s: %w", target, req.Address, err)
	}
	s, err = pc.cc.startStream(p, pc, req.header(target))
	if err != nil {
		return fail(err)
	}
	select {
	case <-s.resp:
	case <-ctx.Done():
		s.abort()
		return fail(ctx.Err())
	}
	c := pc.cc
	c.mu.Lock()
	status, rerr := s.status, s.respErr
	c.mu.Unlock()
	switch {
	case status == http.StatusOK:
		return s, false, nil
	case status != 0:
		s.abort()
		return nil, false, &StatusError{Code: status}
	default:
		s.abort()
		return fail(rerr)
	}
}

// startStream opens a stream: the next stream ID and its HEADERS, under
// the write lock so that IDs reach the wire in order. It gives back the
// slot Reserve took, as a stream or not at all.
func (c *clientConn) startStream(p *Pool, pc *poolConn, fields []hpack.HeaderField) (*ClientStream, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	c.reserved--
	if c.drainingLocked() {
		err := c.err
		if err == nil {
			err = errClientNoStreams
		}
		c.mu.Unlock()
		// Nothing was sent: safe to send elsewhere.
		return nil, fmt.Errorf("%w: %w", err, errClientUnprocessed)
	}
	s := &ClientStream{
		pool:    p,
		pc:      pc,
		c:       c,
		id:      c.nextID,
		resp:    make(chan struct{}),
		recvWin: poolStreamWindow,
		sendWin: c.peerInitWin,
	}
	s.readCond.L = &c.mu
	c.nextID += 2
	c.streams[s.id] = s
	maxFrame := int(c.peerMaxFrame)
	c.mu.Unlock()
	err := c.writeLocked(func(o *h2out) error {
		o.hbuf.Reset()
		for _, f := range fields {
			o.henc.WriteField(f)
		}
		block := o.hbuf.Bytes()
		first := block[:min(len(block), maxFrame)]
		block = block[len(first):]
		err := o.fr.WriteHeaders(http2.HeadersFrameParam{
			StreamID: s.id, BlockFragment: first, EndHeaders: len(block) == 0,
		})
		for err == nil && len(block) > 0 {
			frag := block[:min(len(block), maxFrame)]
			block = block[len(frag):]
			err = o.fr.WriteContinuation(s.id, len(block) == 0, frag)
		}
		return err
	})
	if err != nil {
		c.mu.Lock()
		c.failLocked(s, err)
		c.mu.Unlock()
		return nil, err
	}
	return s, nil
}

// ClientStream is one CONNECT stream: the proxied TCP connection's bytes.
// Read and Write may be called concurrently with each other; Close may be
// called at any time, from any goroutine. An idle stream holds no buffer
// and no goroutine: received DATA waits in pooled chunks, given back as
// soon as it is read.
type ClientStream struct {
	pool *Pool
	pc   *poolConn
	c    *clientConn
	id   uint32        // HTTP/2 stream ID
	resp chan struct{} // closed when the response HEADERS came or the stream failed first

	readCond sync.Cond  // L = &c.mu; data, EOF or an error arrived
	wmu      sync.Mutex // serializes Write, ReadFrom and CloseWrite

	// Guarded by c.mu.
	status     int   // the response's :status, once respDone
	respDone   bool  // resp is closed
	respErr    error // why the stream failed before its response
	buf        srvRecvBuf
	recvWin    int64 // what the peer may still send on this stream
	unacked    int64 // consumed, not yet credited back
	sendWin    int64 // what we may still send
	recvClosed bool  // END_STREAM or RST received, or we reset
	sendClosed bool  // END_STREAM or RST sent, or RST received
	reset      bool  // RST either way, or the connection ended
	forgotten  bool  // out of c.streams
	closed     bool  // Close was called
	rerr       error // Read's error once buf is empty (io.EOF after END_STREAM)
	werr       error // Write's error

	// Pool slot accounting, guarded by c.mu.
	readDone bool // Read returned a final error
	writeEnd bool // CloseWrite was called
	released bool // the pool slot was given back
}

// errClientPeerCanceled is Write's error after the peer's RST_STREAM with
// NO_ERROR or CANCEL.
var errClientPeerCanceled = errors.New("hbone: stream canceled by peer")

// Read reads response DATA. It returns io.EOF at END_STREAM and on
// RST_STREAM with NO_ERROR or CANCEL; other reset codes return an error
// wrapping ErrStreamReset; a dead connection an error wrapping
// net.ErrClosed. It credits what it consumed back to the peer.
func (s *ClientStream) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	c := s.c
	c.mu.Lock()
	if err := s.awaitDataLocked(); err != nil {
		return 0, err
	}
	n := s.buf.read(b)
	sinc, cinc := s.creditLocked(int64(n))
	c.mu.Unlock()
	c.sendWindowUpdates(s.id, sinc, cinc)
	return n, nil
}

// WriteBufferedTo is Read without the copy into a caller's buffer: it
// blocks until data, EOF or an error arrived, then writes the received
// data it holds (up to 256 KiB) to w and returns how much it wrote. It
// returns 0 and exactly the error Read would (io.EOF at the end) once no
// data is left; an error from w is returned as is, except io.EOF, which
// becomes io.ErrUnexpectedEOF. The bytes are consumed (and credited back
// to the peer) when they are taken, before w is written; w is written
// without the connection's lock, so a slow w does not hold up the
// connection. It must not be called concurrently with itself or Read.
func (s *ClientStream) WriteBufferedTo(w io.Writer) (int64, error) {
	c := s.c
	c.mu.Lock()
	if err := s.awaitDataLocked(); err != nil {
		return 0, err
	}
	var t recvTake
	n := s.buf.take(&t)
	sinc, cinc := s.creditLocked(int64(n))
	c.mu.Unlock()
	c.sendWindowUpdates(s.id, sinc, cinc)
	return t.writeTo(w)
}

// awaitDataLocked waits, under c.mu, until received data, EOF or an
// error is there. With data it returns nil and c.mu still held. With none
// left it ends the read side (the stream's pool slot may go back), unlocks
// c.mu and returns what Read returns: io.EOF or the error.
func (s *ClientStream) awaitDataLocked() error {
	for s.buf.n == 0 && s.rerr == nil {
		s.readCond.Wait()
	}
	if s.buf.n > 0 {
		return nil
	}
	err := s.rerr
	s.readDone = true
	release := s.releaseLocked()
	s.c.mu.Unlock()
	if release {
		s.pool.release(s.pc)
	}
	return err
}

// creditLocked gives n consumed bytes back to the peer as window, batched
// per stream and per connection; it returns the increments to send now.
func (s *ClientStream) creditLocked(n int64) (stream, conn uint32) {
	c := s.c
	if !s.recvClosed && c.err == nil {
		s.unacked += n
		if s.unacked >= poolStreamWindow/4 {
			stream = uint32(s.unacked)
			s.recvWin += s.unacked
			s.unacked = 0
		}
	}
	return stream, c.connCreditLocked(n)
}

// Write sends b as DATA frames, straight from b, blocking on the stream
// and connection send windows. It returns once all of b is written to
// the connection.
func (s *ClientStream) Write(b []byte) (int, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return s.write(b)
}

func (s *ClientStream) write(b []byte) (int, error) {
	c := s.c
	written := 0
	for len(b) > 0 {
		c.mu.Lock()
		var n int64
		for {
			if s.werr != nil {
				err := s.werr
				c.mu.Unlock()
				return written, err
			}
			n = min(int64(len(b)), s.sendWin, c.connSendWin, c.maxDataLocked())
			if n > 0 {
				break
			}
			c.sendCond.Wait()
		}
		s.sendWin -= n
		c.connSendWin -= n
		c.mu.Unlock()
		if err := s.writeData(b[:n], false); err != nil {
			return written, err
		}
		written += int(n)
		b = b[n:]
	}
	return written, nil
}

// writeData writes one DATA frame unless the stream was reset meanwhile.
func (s *ClientStream) writeData(b []byte, end bool) error {
	c := s.c
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	if s.reset {
		err := s.werr
		c.mu.Unlock()
		return err
	}
	if end {
		s.sendClosed = true
		s.werr = errClientWriteAfterCloseWrite
		if s.recvClosed {
			c.forgetLocked(s)
		}
	}
	c.mu.Unlock()
	return c.writeLocked(func(o *h2out) error { return o.writeData(s.id, end, b) })
}

// ReadFrom sends what r yields until r returns io.EOF, through one
// buffer of clientReadFromBuf bytes held for the call. It does not end
// the stream; call CloseWrite for that.
func (s *ClientStream) ReadFrom(r io.Reader) (int64, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	bp := clientReadFromBufs.Get().(*[]byte)
	defer clientReadFromBufs.Put(bp)
	buf := *bp
	var total int64
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			k, err := s.write(buf[:n])
			total += int64(k)
			if err != nil {
				return total, err
			}
		}
		if rerr == io.EOF {
			return total, nil
		}
		if rerr != nil {
			return total, rerr
		}
	}
}

var clientReadFromBufs = sync.Pool{New: func() any {
	b := make([]byte, clientReadFromBuf)
	return &b
}}

// CloseWrite ends our side of the stream (END_STREAM, an empty DATA
// frame) after the data written so far; Read keeps working.
func (s *ClientStream) CloseWrite() error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	c := s.c
	c.mu.Lock()
	send := s.werr == nil
	s.writeEnd = true
	release := s.releaseLocked()
	c.mu.Unlock()
	if send {
		s.writeData(nil, true)
	}
	if release {
		s.pool.release(s.pc)
	}
	return nil
}

// Close aborts the stream (RST_STREAM CANCEL unless both sides had
// finished) and gives its slot back to the pool. Blocked Reads and Writes
// return. Close may be called more than once.
func (s *ClientStream) Close() error {
	s.end(http2.ErrCodeCancel)
	return nil
}

// Reset ends the stream abnormally: RST_STREAM(CONNECT_ERROR), which the
// peer reads as a reset of the proxied connection (its target gets a
// RST), not as the clean end that Close's CANCEL is. Use it when the
// local side of the flow failed. It then closes the stream as Close does.
// A stream already ended both ways is only closed.
func (s *ClientStream) Reset() error {
	if err := s.end(http2.ErrCodeConnect); err != nil {
		return fmt.Errorf("hbone: reset stream %d: %w", s.id, err)
	}
	return nil
}

// end closes the stream with RST_STREAM(code) if it is still open either
// way, and gives the slot back.
func (s *ClientStream) end(code http2.ErrCode) error {
	err := s.close(code)
	c := s.c
	c.mu.Lock()
	s.readDone, s.writeEnd = true, true
	release := s.releaseLocked()
	c.mu.Unlock()
	if release {
		s.pool.release(s.pc)
	}
	return err
}

// abort ends a stream that Connect gives up on; the caller gives its slot
// back.
func (s *ClientStream) abort() {
	c := s.c
	c.mu.Lock()
	s.released = true
	c.mu.Unlock()
	s.close(http2.ErrCodeCancel)
}

// close is Close without the pool slot.
func (s *ClientStream) close(code http2.ErrCode) error {
	c := s.c
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	if s.closed {
		c.mu.Unlock()
		return nil
	}
	send := !s.reset && !(s.sendClosed && s.recvClosed) && c.err == nil
	s.closed = true
	conn := c.connCreditLocked(c.failLocked(s, errClientStreamClosed))
	c.mu.Unlock()
	return c.writeResetLocked(s.id, send, code, conn)
}

// releaseLocked reports whether the pool slot is to be given back now:
// once both directions ended for the caller, exactly once.
func (s *ClientStream) releaseLocked() bool {
	if s.released || !s.readDone || !s.writeEnd {
		return false
	}
	s.released = true
	return true
}

// PeerIdentity is the server's SPIFFE ID.
func (s *ClientStream) PeerIdentity() string {
	return s.pc.peerID
}

var _ io.ReadWriteCloser = (*ClientStream)(nil)
var _ io.ReaderFrom = (*ClientStream)(nil)

// errClientStreamClosed is what a closed stream's Read and Write return.
var errClientStreamClosed = fmt.Errorf("hbone: stream closed: %w", net.ErrClosed)

// errClientWriteAfterCloseWrite is what Write after CloseWrite returns.
var errClientWriteAfterCloseWrite = errors.New("hbone: write after CloseWrite")
