package hbone

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/net/http2"
)

// srvConn is one HTTP/2 connection of the server. Its goroutines: the read
// loop (the caller of serve, which owns the others), the writer
// (h2writeLoop), the keepalive, and one per handler. All end before serve
// returns.
type srvConn struct {
	srv    *Server
	raw    net.Conn
	bc     *batchConn // raw, when it is one: the writer corks it per flush
	tc     *tls.Conn
	log    hclog.Logger
	ctx    context.Context // cancelled when the connection ends
	cancel context.CancelFunc

	writerDone chan struct{}  // closed when h2writeLoop returns
	wake       chan struct{}  // writer: the queue is not empty (cap 1)
	drain      chan struct{}  // writer: tear down after the queue
	wg         sync.WaitGroup // keepalive and handlers
	lastRead   atomic.Int64   // unix nanos of the last frame read

	mu               sync.Mutex
	sendCond         sync.Cond // L = &mu; send windows grew or a writer must give up
	streams          map[uint32]*ServerStream
	lastStreamID     uint32 // highest stream the client opened
	handlers         int    // handler goroutines running
	connSendWin      int64  // what we may still send on the connection
	connRecvWin      int64  // what the peer may still send on the connection
	connUnacked      int64  // bytes consumed or discarded, not yet credited back
	peerInitWin      int64  // peer's SETTINGS_INITIAL_WINDOW_SIZE
	peerMaxFrame     uint32 // peer's SETTINGS_MAX_FRAME_SIZE
	goawaySent       bool
	closeWhenFlushed bool // GOAWAY sent and no stream left
	closeWriteDone   bool
	closed           bool  // torn down: nothing more is queued
	err              error // why, for the streams' Read and Write
	draining         bool
	wq               []h2frame
	wqControl        int
	writing          bool  // c.out is in use (writer loop or a direct Write)
	out              h2out // owned by whoever set writing
}

func newSrvConn(s *Server, tc *tls.Conn, log hclog.Logger) *srvConn {
	ctx, cancel := context.WithCancel(context.Background())
	c := &srvConn{
		srv:          s,
		raw:          tc.NetConn(),
		tc:           tc,
		log:          log,
		ctx:          ctx,
		cancel:       cancel,
		writerDone:   make(chan struct{}),
		wake:         make(chan struct{}, 1),
		drain:        make(chan struct{}),
		streams:      make(map[uint32]*ServerStream),
		connSendWin:  h2defaultWindow,
		connRecvWin:  srvConnWindow,
		peerInitWin:  h2defaultWindow,
		peerMaxFrame: 16 << 10,
	}
	c.bc, _ = c.raw.(*batchConn)
	c.sendCond.L = &c.mu
	return c
}

// h2connError is a connection error: GOAWAY with code, then close.
type h2connError struct {
	code   http2.ErrCode
	reason string
}

func (e *h2connError) Error() string {
	return fmt.Sprintf("hbone: HTTP/2 connection error %v: %s", e.code, e.reason)
}

func h2connErr(code http2.ErrCode, reason string) error {
	return &h2connError{code, reason}
}

// closeNow closes the connection at once (Server.Close); the read loop
// then tears it down.
func (c *srvConn) closeNow() {
	c.cancel()
	c.raw.Close()
}

// goAway starts a graceful close (Server.Shutdown): GOAWAY(NO_ERROR) with
// the last stream we saw; streams opened after it are refused, and the
// connection closes when the last stream ends.
func (c *srvConn) goAway() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.goawaySent {
		return
	}
	c.goawaySent = true
	c.queueLocked(h2frame{kind: h2GoAway, n: c.lastStreamID, code: http2.ErrCodeNo})
	c.maybeIdleCloseLocked()
}

func (c *srvConn) maybeIdleCloseLocked() {
	if c.goawaySent && len(c.streams) == 0 && !c.closeWhenFlushed {
		c.closeWhenFlushed = true
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

// serve runs the connection after the TLS handshake, until it ends.
func (c *srvConn) serve() {
	c.lastRead.Store(time.Now().UnixNano())
	c.initOut()
	go c.h2writeLoop()
	c.wg.Add(1)
	go c.keepalive()
	c.mu.Lock()
	c.queueLocked(h2frame{kind: h2Preface})
	c.mu.Unlock()

	err := c.readLoop()
	c.teardown(err)
}

func (c *srvConn) readLoop() error {
	c.tc.SetReadDeadline(time.Now().Add(c.srv.handshakeTimeout))
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c.tc, preface); err != nil {
		return fmt.Errorf("hbone: reading the HTTP/2 preface: %w", err)
	}
	if !bytes.Equal(preface, []byte(http2.ClientPreface)) {
		return errors.New("hbone: peer did not send the HTTP/2 preface")
	}
	c.tc.SetReadDeadline(time.Time{})

	return h2readFrames(newH2ReadFramer(c.tc, srvMaxHeaderList, srvMaxFrameSize), c, &c.lastRead)
}

func (c *srvConn) onPing(f *http2.PingFrame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.queueControlLocked(h2frame{kind: h2Ping, end: true, ping: f.Data})
}

func (c *srvConn) onGoAway(f *http2.GoAwayFrame) error {
	if f.ErrCode != http2.ErrCodeNo {
		c.log.Debug("peer sent GOAWAY", "code", f.ErrCode, "debug", string(f.DebugData()))
	}
	return nil
}

// onStreamError handles a frame the Framer found malformed for one stream
// only (bad header fields, zero WINDOW_UPDATE increment).
func (c *srvConn) onStreamError(se http2.StreamError) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if se.StreamID%2 == 1 && se.StreamID > c.lastStreamID {
		c.lastStreamID = se.StreamID // a HEADERS that opened (and killed) a stream
	}
	if st := c.streams[se.StreamID]; st != nil {
		c.resetLocked(st, se.Code, fmt.Errorf("hbone: stream error %v", se.Code))
		return nil
	}
	return c.queueControlLocked(h2frame{kind: h2RST, streamID: se.StreamID, code: se.Code})
}

func (c *srvConn) onSettings(f *http2.SettingsFrame) error {
	if f.IsAck() {
		return nil
	}
	if err := f.ForeachSetting(func(s http2.Setting) error { return s.Valid() }); err != nil {
		return h2connErr(http2.ErrCode(err.(http2.ConnectionError)), "invalid SETTINGS value")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ack := h2frame{kind: h2SettingsAck}
	for i := range f.NumSettings() {
		s := f.Setting(i)
		switch s.ID {
		case http2.SettingInitialWindowSize:
			// RFC 9113 §6.9.2: the change applies to every open stream's
			// send window, which may go negative.
			delta := int64(s.Val) - c.peerInitWin
			c.peerInitWin = int64(s.Val)
			for _, st := range c.streams {
				st.sendWin += delta
				if st.sendWin > h2maxWindow {
					return h2connErr(http2.ErrCodeFlowControl, "SETTINGS_INITIAL_WINDOW_SIZE overflows a stream window")
				}
			}
		case http2.SettingMaxFrameSize:
			c.peerMaxFrame = s.Val
		case http2.SettingHeaderTableSize:
			ack.n, ack.hasN = s.Val, true
		}
	}
	c.sendCond.Broadcast()
	return c.queueControlLocked(ack)
}

func (c *srvConn) onWindowUpdate(f *http2.WindowUpdateFrame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	inc := int64(f.Increment)
	if f.StreamID == 0 {
		c.connSendWin += inc
		if c.connSendWin > h2maxWindow {
			return h2connErr(http2.ErrCodeFlowControl, "connection window above 2^31-1")
		}
		c.sendCond.Broadcast()
		return nil
	}
	st := c.streams[f.StreamID]
	if st == nil {
		if f.StreamID > c.lastStreamID {
			return h2connErr(http2.ErrCodeProtocol, "WINDOW_UPDATE on an idle stream")
		}
		return nil // a stream that ended; updates may cross our END_STREAM
	}
	st.sendWin += inc
	if st.sendWin > h2maxWindow {
		c.resetLocked(st, http2.ErrCodeFlowControl, errors.New("hbone: peer overflowed the stream window"))
	}
	c.sendCond.Broadcast()
	return nil
}

func (c *srvConn) onRSTStream(f *http2.RSTStreamFrame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.streams[f.StreamID]
	if st == nil {
		if f.StreamID > c.lastStreamID {
			return h2connErr(http2.ErrCodeProtocol, "RST_STREAM on an idle stream")
		}
		return nil
	}
	c.peerResetLocked(st, f.ErrCode)
	return nil
}

func (c *srvConn) onData(f *http2.DataFrame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	// Flow control counts the whole payload, padding included.
	n := int64(f.Length)
	if n > c.connRecvWin {
		return h2connErr(http2.ErrCodeFlowControl, "peer overran the connection window")
	}
	c.connRecvWin -= n
	st := c.streams[f.StreamID]
	if st == nil {
		if f.StreamID > c.lastStreamID {
			return h2connErr(http2.ErrCodeProtocol, "DATA on an idle stream")
		}
		// A stream we reset or rejected: in-flight DATA is dropped and its
		// connection credit given back.
		c.creditConnLocked(n)
		return nil
	}
	if st.recvClosed {
		c.creditConnLocked(n)
		c.resetLocked(st, http2.ErrCodeStreamClosed, errors.New("hbone: peer sent DATA after END_STREAM"))
		return nil
	}
	if n > st.recvWin {
		c.creditConnLocked(n)
		c.resetLocked(st, http2.ErrCodeFlowControl, errors.New("hbone: peer overran the stream window"))
		return nil
	}
	st.recvWin -= n
	data := f.Data()
	if len(data) > 0 {
		st.buf.write(data)
	}
	if pad := n - int64(len(data)); pad > 0 {
		st.creditLocked(pad)
	}
	if f.StreamEnded() {
		c.endRecvLocked(st)
	}
	st.readCond.Broadcast()
	return nil
}

// creditConnLocked gives n bytes of connection window back to the peer,
// batched: a WINDOW_UPDATE once a quarter of the window is owed.
func (c *srvConn) creditConnLocked(n int64) {
	c.connUnacked += n
	if c.connUnacked >= srvConnWindow/4 {
		if c.queueLocked(h2frame{kind: h2WindowUpdate, n: uint32(c.connUnacked)}) {
			c.connRecvWin += c.connUnacked
			c.connUnacked = 0
		}
	}
}

// keepalive sends a PING after pingInterval of read silence and closes the
// connection if nothing at all is read within pingTimeout of it.
func (c *srvConn) keepalive() {
	defer c.wg.Done()
	interval, timeout := c.srv.pingInterval, c.srv.pingTimeout
	t := time.NewTimer(interval)
	defer t.Stop()
	var pingSent time.Time
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		last := time.Unix(0, c.lastRead.Load())
		if !pingSent.IsZero() {
			if !last.After(pingSent) {
				if wait := pingSent.Add(timeout).Sub(now); wait > 0 {
					t.Reset(wait)
					continue
				}
				c.log.Warn("HBONE peer did not answer PING, closing the connection", "timeout", timeout)
				c.raw.Close()
				return
			}
			pingSent = time.Time{}
		}
		if idle := now.Sub(last); idle < interval {
			t.Reset(interval - idle)
			continue
		}
		c.mu.Lock()
		c.queueLocked(h2frame{kind: h2Ping, ping: [8]byte{'m', 'e', 's', 'h', 't', 'u', 'n', 0}})
		c.mu.Unlock()
		pingSent = now
		t.Reset(timeout)
	}
}

// teardown ends the connection after the read loop stopped: GOAWAY if a
// protocol error caused it, every stream failed, the writer drained, the
// socket closed, and every goroutine of the connection waited for.
func (c *srvConn) teardown(cause error) {
	c.mu.Lock()
	var ce *h2connError
	if errors.As(cause, &ce) {
		c.log.Debug("HTTP/2 protocol error, closing", "error", cause)
		c.queueLocked(h2frame{kind: h2GoAway, n: c.lastStreamID, code: ce.code})
	} else if cause != nil && !errors.Is(cause, io.EOF) && !errors.Is(cause, net.ErrClosed) {
		c.log.Debug("connection ended", "error", cause)
	}
	c.closed = true
	c.err = fmt.Errorf("hbone: HBONE connection closed: %w", net.ErrClosed)
	for _, st := range c.streams {
		st.noSend = true
		c.failLocked(st, c.err)
	}
	c.draining = true
	close(c.drain)
	c.sendCond.Broadcast()
	c.mu.Unlock()

	c.raw.SetWriteDeadline(time.Now().Add(h2drainTimeout))
	c.cancel()
	<-c.writerDone
	c.raw.Close()
	c.wg.Wait()
}
