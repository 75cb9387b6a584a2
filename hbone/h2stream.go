package hbone

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"golang.org/x/net/http2"
)

// h2Stream is one HTTP/2 stream of either side: the bytes of one proxied
// TCP connection. ClientStream and ServerStream embed it, so its methods
// are theirs. Read and Write may be called concurrently with each other;
// Reset and Close may be called at any time, from any goroutine, and
// unblock both. An idle stream holds no buffer and no goroutine: received
// DATA waits in pooled chunks, given back as soon as it is read.
//
// Ending a stream (docs/hbone.md, "Ending a stream"): CloseWrite sends
// END_STREAM and Read keeps working; Read returns io.EOF at the peer's
// END_STREAM and at RST_STREAM NO_ERROR or CANCEL, an error wrapping
// ErrStreamReset at any other code, one wrapping net.ErrClosed when the
// connection died; Reset sends RST_STREAM(CONNECT_ERROR); Close sends
// RST_STREAM(CANCEL) if the stream is still open either way.
type h2Stream struct {
	c        *h2Conn
	id       uint32
	resp     chan struct{} // streams we open: closed when respDone
	cancel   func()        // if set, called (under c.mu) when the stream fails or closes
	readCond sync.Cond     // L = &c.mu; data, EOF or an error arrived
	wmu      sync.Mutex    // serializes Write, ReadFrom and CloseWrite

	// Guarded by c.mu.
	respDone   bool // the peer's header block came (a response to ours), or the stream failed first
	status     int  // the response's :status
	buf        h2RecvBuf
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
	readDone   bool  // Read returned a final error (for onRelease)
	// Run to completion (WriteBufferedTo with a TryWriter): sink is the
	// destination while WriteBufferedTo waits with nothing buffered,
	// sinking is set while the reader writes a DATA payload into it
	// without the lock, sunk counts those bytes until WriteBufferedTo
	// reports them, and sinkErr is the destination's error from such a
	// write, returned by the next WriteBufferedTo.
	sink     TryWriter
	sinking  bool
	sunk     int64
	sinkErr  error
	writeEnd bool // CloseWrite was called (for onRelease)
	released bool // onRelease was called, or is not to be
}

// Errors of a stream's Read and Write that callers do not branch on (a
// peer's abnormal reset wraps ErrStreamReset; a dead connection and a
// closed stream wrap net.ErrClosed).
var (
	errStreamClosed         = fmt.Errorf("hbone: stream closed: %w", net.ErrClosed)
	errWriteAfterCloseWrite = errors.New("hbone: write after CloseWrite")
	errPeerCanceled         = errors.New("hbone: stream canceled by peer")
)

var (
	_ io.ReadWriteCloser = (*h2Stream)(nil)
	_ io.ReaderFrom      = (*h2Stream)(nil)
)

// h2ReadFromBuf is ReadFrom's buffer: the relay's copy size.
const h2ReadFromBuf = 256 << 10

var h2ReadFromBufs = sync.Pool{New: func() any {
	b := make([]byte, h2ReadFromBuf)
	return &b
}}

// response is the answer to a stream we opened, once resp is closed: its
// :status, or why none came.
func (s *h2Stream) response() (int, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.status != 0 {
		return s.status, nil
	}
	return 0, s.werr
}

// Read reads the peer's DATA. It returns io.EOF at the peer's END_STREAM
// and on RST_STREAM with NO_ERROR or CANCEL (after the data received
// before it); other reset codes return an error wrapping ErrStreamReset;
// a dead connection an error wrapping net.ErrClosed. It credits what it
// consumed back to the peer.
func (s *h2Stream) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	c := s.c
	c.mu.Lock()
	if err := s.awaitDataLocked(); err != nil {
		return 0, err
	}
	n := s.buf.read(b)
	s.creditLocked(int64(n))
	c.mu.Unlock()
	c.writeQueued()
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
//
// When w is a TryWriter, the connection's reader writes DATA of up to
// sinkMax bytes that arrives while WriteBufferedTo waits with nothing
// buffered straight into w with TryWrite, on the reader's own goroutine,
// and WriteBufferedTo stays asleep: no goroutine hand-off per frame on a
// flow that keeps up (docs/field-notes.md, "Latency through the pair").
// What TryWrite does not take is buffered and wakes WriteBufferedTo as
// before. The bytes the reader wrote count in what WriteBufferedTo
// returns next, and an error of TryWrite comes back from it as an error
// of w.
func (s *h2Stream) WriteBufferedTo(w io.Writer) (int64, error) {
	c := s.c
	tw, _ := w.(TryWriter)
	c.mu.Lock()
	for s.sinking || (s.buf.n == 0 && s.rerr == nil && s.sinkErr == nil && s.sunk == 0) {
		s.sink = tw
		s.readCond.Wait()
	}
	s.sink = nil
	if sunk, err := s.sunk, s.sinkErr; sunk > 0 || err != nil {
		s.sunk, s.sinkErr = 0, nil
		c.mu.Unlock()
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return sunk, err
	}
	if err := s.awaitDataLocked(); err != nil {
		return 0, err
	}
	var t recvTake
	n := s.buf.take(&t)
	s.creditLocked(int64(n))
	c.mu.Unlock()
	c.writeQueued()
	return t.writeTo(w)
}

// TryWriter is a destination that can take bytes without blocking:
// TryWrite writes what fits now (possibly nothing) and returns at once,
// with an error only when the destination failed. The gateway's kernel
// sockets and netstack connections have it.
type TryWriter interface {
	io.Writer
	TryWrite(p []byte) (int, error)
}

// sinkMax is the largest DATA payload the reader writes into a waiting
// destination itself. Larger frames are bulk: they go to the stream's
// own goroutine, so that writing one out overlaps with reading and
// decrypting the next: with 64 KiB, bulk flows lost 10 % of their
// throughput (docs/field-notes.md, "Latency through the pair").
const sinkMax = 16 << 10

// awaitDataLocked waits, under c.mu, until received data, EOF or an
// error is there. With data it returns nil and c.mu still held. With none
// left it ends the read side (onRelease may run), unlocks c.mu and
// returns what Read returns: io.EOF or the error.
func (s *h2Stream) awaitDataLocked() error {
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
		s.c.onRelease()
	}
	return err
}

// creditLocked gives n consumed bytes back to the peer as window, batched
// per stream (a WINDOW_UPDATE once a quarter of the window is owed) and
// per connection.
func (s *h2Stream) creditLocked(n int64) {
	c := s.c
	if !s.recvClosed {
		s.unacked += n
		if s.unacked >= h2StreamWindow/4 && c.queueLocked(h2frame{kind: h2WindowUpdate, streamID: s.id, n: uint32(s.unacked)}) {
			s.recvWin += s.unacked
			s.unacked = 0
		}
	}
	c.connCreditLocked(n)
}

// Write sends b as DATA frames, straight from b, blocking on the stream
// and connection send windows. It returns once all of b is written to
// the connection.
func (s *h2Stream) Write(b []byte) (int, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return s.write(b)
}

func (s *h2Stream) write(b []byte) (int, error) {
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
			n = min(int64(len(b)), s.sendWin, c.connSendWin, int64(min(c.peerMaxFrame, h2SendFrameMax)))
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

// writeData writes one DATA frame, after the queued frames, unless the
// stream was reset meanwhile.
func (s *h2Stream) writeData(b []byte, end bool) error {
	c := s.c
	c.wmu.Lock()
	defer c.unlockWrite()
	c.mu.Lock()
	if s.reset {
		err := s.werr
		c.mu.Unlock()
		return err
	}
	if end {
		s.sendClosed = true
		s.werr = errWriteAfterCloseWrite
		c.maybeForgetLocked(s)
	}
	c.mu.Unlock()
	return c.flushLocked(func(o *h2out) error { return o.writeData(s.id, end, b) })
}

// ReadFrom sends what r yields until r returns io.EOF, through one
// pooled buffer of h2ReadFromBuf bytes held for the call. It does not end
// the stream; call CloseWrite for that.
func (s *h2Stream) ReadFrom(r io.Reader) (int64, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	bp := h2ReadFromBufs.Get().(*[]byte)
	defer h2ReadFromBufs.Put(bp)
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

// CloseWrite ends our side of the stream (END_STREAM, an empty DATA
// frame: the proxied connection's FIN) after the data written so far;
// Read keeps working. A second call does nothing.
func (s *h2Stream) CloseWrite() error {
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
		c.onRelease()
	}
	return nil
}

// Reset ends the stream abnormally: RST_STREAM(CONNECT_ERROR), which the
// peer reads as a reset of the proxied connection (its other end gets a
// RST), not as the clean end that Close's CANCEL is. Use it when the
// local side of the flow failed. Blocked Reads and Writes return. A
// stream already ended both ways sends nothing. Close is still due.
func (s *h2Stream) Reset() error {
	s.end(http2.ErrCodeConnect, false)
	return nil
}

// Close releases the stream: RST_STREAM(CANCEL) unless both sides had
// finished (after the DATA and END_STREAM already written), which the
// peer reads as a clean end. Unread data is dropped; blocked Reads and
// Writes return. Every stream must be closed; Close may be called more
// than once.
func (s *h2Stream) Close() error {
	s.end(http2.ErrCodeCancel, true)
	return nil
}

// end resets the stream with RST_STREAM(code) if it is still open either
// way, fails both directions and, with close, marks it closed.
func (s *h2Stream) end(code http2.ErrCode, close bool) {
	c := s.c
	c.mu.Lock()
	if s.closed {
		c.mu.Unlock()
		return
	}
	if !s.reset && !(s.sendClosed && s.recvClosed) && c.err == nil {
		c.queueLocked(h2frame{kind: h2RST, streamID: s.id, code: code})
	}
	s.closed = close
	c.failLocked(s, errStreamClosed)
	s.readDone, s.writeEnd = true, true
	release := s.releaseLocked()
	c.mu.Unlock()
	c.writeQueued()
	if release {
		c.onRelease()
	}
}

// abort closes a stream whose user never got it (the CONNECT was given
// up): onRelease is not called for it.
func (s *h2Stream) abort() {
	s.c.mu.Lock()
	s.released = true
	s.c.mu.Unlock()
	s.Close()
}

// releaseLocked reports whether onRelease is to be called now: once both
// directions ended for the user, exactly once.
func (s *h2Stream) releaseLocked() bool {
	if s.released || !s.readDone || !s.writeEnd || s.c.onRelease == nil {
		return false
	}
	s.released = true
	return true
}

// failLocked ends s without telling the peer (it was told, or will be by
// the caller, or the connection is gone): both directions closed, unread
// data dropped (and credited to the connection) unless it ended cleanly,
// Read and Write fail with err.
func (c *h2Conn) failLocked(s *h2Stream, err error) {
	s.reset, s.recvClosed, s.sendClosed = true, true, true
	if s.rerr != io.EOF || s.closed {
		if n := s.buf.reset(); n > 0 {
			c.connCreditLocked(int64(n))
		}
		s.rerr = err
	}
	if s.werr == nil || s.werr == errWriteAfterCloseWrite {
		s.werr = err
	}
	if !s.respDone {
		s.respDone = true
		close(s.resp)
	}
	if s.cancel != nil {
		s.cancel()
	}
	s.readCond.Broadcast()
	c.sendCond.Broadcast()
	c.maybeForgetLocked(s)
}

// endRecvLocked records the peer's END_STREAM.
func (c *h2Conn) endRecvLocked(s *h2Stream) {
	s.recvClosed = true
	if s.rerr == nil {
		s.rerr = io.EOF
	}
	s.readCond.Broadcast()
	c.maybeForgetLocked(s)
}

// maybeForgetLocked drops s from the table once it is closed both ways:
// it no longer counts against the concurrency limits. Its unread data
// stays readable.
func (c *h2Conn) maybeForgetLocked(s *h2Stream) {
	if s.forgotten || !s.recvClosed || !s.sendClosed {
		return
	}
	s.forgotten = true
	delete(c.streams, s.id)
	if c.cfg.streamsOpen != nil {
		c.cfg.streamsOpen.Add(-1)
	}
	c.maybeCloseLocked()
}
