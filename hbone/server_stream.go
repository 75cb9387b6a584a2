package hbone

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"golang.org/x/net/http2"
)

// Errors of a ServerStream's Read and Write that callers do not branch on
// (a peer's abnormal reset wraps ErrStreamReset; a dead connection wraps
// net.ErrClosed).
var (
	errSrvStreamClosed = errors.New("hbone: stream closed")
	errSrvWriteClosed  = errors.New("hbone: write after CloseWrite")
	errSrvPeerCanceled = errors.New("hbone: stream canceled by peer")
	errSrvRejected     = errors.New("hbone: CONNECT was rejected")
	errSrvDecided      = errors.New("hbone: CONNECT already answered")
)

// ServerStream is an accepted CONNECT stream: the bytes of one proxied TCP
// connection. Read and Write may be used concurrently with each other;
// Reset and Close may be called at any time and unblock both.
type ServerStream struct {
	c      *srvConn
	id     uint32
	ctx    context.Context
	cancel context.CancelFunc

	readCond sync.Cond  // L = &c.mu; data, EOF or an error arrived
	wmu      sync.Mutex // serializes Write and CloseWrite
	wdone    chan error // the writer's answer to our one DATA frame in flight

	// Guarded by c.mu.
	decided    bool       // Accept or Reject was called (or the server answered)
	buf        srvRecvBuf // received DATA not yet read
	recvWin    int64      // what the peer may still send on this stream
	unacked    int64      // consumed, not yet credited back
	sendWin    int64      // what we may still send
	recvClosed bool       // END_STREAM or RST received, or we reset
	sendClosed bool       // END_STREAM or RST sent, or RST received
	reset      bool       // RST either way
	noSend     bool       // peer reset or connection gone: queued DATA is dropped
	forgotten  bool       // out of c.streams
	closed     bool       // Close was called
	rerr       error      // Read's error once buf is empty (io.EOF after END_STREAM)
	werr       error      // Write's error
}

func newServerStream(c *srvConn, id uint32) *ServerStream {
	ctx, cancel := context.WithCancel(c.ctx)
	st := &ServerStream{
		c:       c,
		id:      id,
		ctx:     ctx,
		cancel:  cancel,
		wdone:   make(chan error, 1),
		recvWin: srvStreamWindow,
		sendWin: c.peerInitWin,
	}
	st.readCond.L = &c.mu
	return st
}

// Read reads DATA payloads in order. It returns io.EOF after the client's
// END_STREAM, or after RST_STREAM with NO_ERROR or CANCEL (once buffered
// data is read); an error wrapping ErrStreamReset after any other reset
// code; an error wrapping net.ErrClosed if the connection ended.
func (s *ServerStream) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c := s.c
	c.mu.Lock()
	if err := s.awaitDataLocked(); err != nil {
		return 0, err
	}
	n := s.buf.read(p)
	s.creditLocked(int64(n))
	c.mu.Unlock()
	return n, nil
}

// awaitDataLocked waits, under c.mu, until received data, EOF or an
// error is there. With data it returns nil and c.mu still held; with none
// left it unlocks c.mu and returns what Read returns: io.EOF or the error.
func (s *ServerStream) awaitDataLocked() error {
	for s.buf.n == 0 && s.rerr == nil {
		s.readCond.Wait()
	}
	if s.buf.n > 0 {
		return nil
	}
	err := s.rerr
	s.c.mu.Unlock()
	return err
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
func (s *ServerStream) WriteBufferedTo(w io.Writer) (int64, error) {
	c := s.c
	c.mu.Lock()
	if err := s.awaitDataLocked(); err != nil {
		return 0, err
	}
	var t recvTake
	n := s.buf.take(&t)
	s.creditLocked(int64(n))
	c.mu.Unlock()
	return t.writeTo(w)
}

// creditLocked gives n consumed bytes back to the peer as window, batched
// per stream and per connection.
func (s *ServerStream) creditLocked(n int64) {
	c := s.c
	if !s.recvClosed {
		s.unacked += n
		if s.unacked >= srvStreamWindow/4 {
			if c.queueLocked(h2frame{kind: h2WindowUpdate, streamID: s.id, n: uint32(s.unacked)}) {
				s.recvWin += s.unacked
				s.unacked = 0
			}
		}
	}
	c.creditConnLocked(n)
}

// Write sends p as DATA frames no larger than the peer's max frame size
// (and 1 MiB), blocking on the stream and connection send windows. It
// returns once every byte is handed to the connection's writer.
func (s *ServerStream) Write(p []byte) (int, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	c := s.c
	written := 0
	for len(p) > 0 {
		c.mu.Lock()
		var n int64
		for {
			if s.werr != nil {
				err := s.werr
				c.mu.Unlock()
				return written, err
			}
			n = min(int64(len(p)), s.sendWin, c.connSendWin, int64(min(c.peerMaxFrame, srvMaxFrameSize)))
			if n > 0 {
				break
			}
			c.sendCond.Wait()
		}
		s.sendWin -= n
		c.connSendWin -= n
		if !c.writing && len(c.wq) == 0 && !c.closed {
			// Nobody writes and nothing waits: write it ourselves.
			c.writing = true
			c.mu.Unlock()
			f := h2frame{kind: h2Data, streamID: s.id, st: s, data: p[:n]}
			if err := c.h2writeDirect(&f); err != nil {
				return written, err
			}
			written += int(n)
			p = p[n:]
			continue
		}
		ok := c.queueLocked(h2frame{kind: h2Data, streamID: s.id, st: s, data: p[:n], done: s.wdone})
		c.mu.Unlock()
		if !ok {
			return written, c.connErr()
		}
		if err := <-s.wdone; err != nil {
			return written, err
		}
		written += int(n)
		p = p[n:]
	}
	return written, nil
}

func (c *srvConn) connErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return c.err
	}
	return errSrvStreamClosed
}

// CloseWrite sends END_STREAM (an empty DATA frame): the proxied
// connection's FIN. Read keeps working. A second call does nothing.
func (s *ServerStream) CloseWrite() error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.werr == errSrvWriteClosed {
		return nil
	}
	if s.werr != nil {
		return s.werr
	}
	c.queueLocked(h2frame{kind: h2Data, streamID: s.id, st: s, end: true})
	s.sendClosed = true
	s.werr = errSrvWriteClosed
	c.maybeForgetLocked(s)
	return nil
}

// Reset ends the stream abnormally with RST_STREAM(CONNECT_ERROR): the
// target reset or failed. Blocked Read and Write return.
func (s *ServerStream) Reset() error {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if !s.reset && !(s.sendClosed && s.recvClosed) {
		c.resetLocked(s, http2.ErrCodeConnect, errSrvStreamClosed)
	}
	return nil
}

// Close releases the stream. If it is not yet closed both ways it sends
// RST_STREAM(CANCEL) (after any DATA and END_STREAM already queued).
// Unread data is dropped; blocked Read and Write return; the Request's
// Context is released. Every accepted stream must be closed. Close may be
// called more than once.
func (s *ServerStream) Close() error {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if !s.reset && !(s.sendClosed && s.recvClosed) {
		c.resetLocked(s, http2.ErrCodeCancel, errSrvStreamClosed)
		return nil
	}
	c.discardLocked(s)
	if s.rerr == nil || s.rerr == io.EOF {
		s.rerr = errSrvStreamClosed
	}
	if s.werr == nil || s.werr == errSrvWriteClosed {
		s.werr = errSrvStreamClosed
	}
	c.wakeLocked(s)
	s.cancel()
	return nil
}

// discardLocked drops unread data and credits the connection for it.
func (c *srvConn) discardLocked(s *ServerStream) {
	n := s.buf.reset()
	if n > 0 {
		c.creditConnLocked(int64(n))
	}
}

func (c *srvConn) wakeLocked(s *ServerStream) {
	s.readCond.Broadcast()
	c.sendCond.Broadcast()
}

// resetLocked resets s from our side: RST_STREAM(code), both directions
// closed, unread data dropped, Read and Write fail with err.
func (c *srvConn) resetLocked(s *ServerStream, code http2.ErrCode, err error) {
	c.queueLocked(h2frame{kind: h2RST, streamID: s.id, code: code})
	c.failLocked(s, err)
}

// failLocked ends s without telling the peer (it was told, or the
// connection is gone).
func (c *srvConn) failLocked(s *ServerStream, err error) {
	s.reset, s.recvClosed, s.sendClosed = true, true, true
	s.decided = true
	if s.rerr != io.EOF || s.closed {
		c.discardLocked(s)
		s.rerr = err
	}
	if s.werr == nil || s.werr == errSrvWriteClosed {
		s.werr = err
	}
	c.wakeLocked(s)
	s.cancel()
	c.maybeForgetLocked(s)
}

// peerResetLocked handles the client's RST_STREAM. NO_ERROR and CANCEL
// are a clean end: data received so far is still read, then io.EOF.
func (c *srvConn) peerResetLocked(s *ServerStream, code http2.ErrCode) {
	s.noSend = true
	if code == http2.ErrCodeNo || code == http2.ErrCodeCancel {
		if s.rerr == nil {
			s.rerr = io.EOF
		}
		c.failLocked(s, errSrvPeerCanceled)
		return
	}
	c.failLocked(s, fmt.Errorf("%w (%v)", ErrStreamReset, code))
}

// endRecvLocked records the client's END_STREAM.
func (c *srvConn) endRecvLocked(s *ServerStream) {
	s.recvClosed = true
	if s.rerr == nil {
		s.rerr = io.EOF
	}
	s.readCond.Broadcast()
	c.maybeForgetLocked(s)
}

// maybeForgetLocked drops s from the connection's table once it is closed
// both ways: it no longer counts against MaxConcurrentStreams. Its unread
// data stays readable.
func (c *srvConn) maybeForgetLocked(s *ServerStream) {
	if s.forgotten || !s.recvClosed || !s.sendClosed {
		return
	}
	s.forgotten = true
	delete(c.streams, s.id)
	c.srv.streamsOpen.Add(-1)
	c.maybeIdleCloseLocked()
}
