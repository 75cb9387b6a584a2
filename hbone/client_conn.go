package hbone

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// clientConn is one HTTP/2 connection of the pool: our own client side,
// built like the server's on x/net/http2's Framer and hpack.
//
// Goroutines: one reader (readLoop) per connection, and nothing per
// stream. Frames go out from the goroutine that causes them (a stream's
// Write, Read's WINDOW_UPDATE, the reader's ACKs), under wmu, straight
// through a bufio.Writer and a corked batchConn, so each call costs one
// write(2). The keepalive is a timer, not a goroutine.
//
// Lock order: ClientStream.wmu → clientConn.wmu → clientConn.mu;
// Pool.mu → clientConn.mu. Nobody takes wmu while holding mu.
type clientConn struct {
	tc      net.Conn   // the TLS connection (a plain one in tests)
	bc      *batchConn // under tc: gathers the records of one flush
	log     hclog.Logger
	onState func() // the connection can take no more streams; called without locks

	pingAfter, pingTimeout time.Duration
	pingTimer              *time.Timer

	readerDone   chan struct{} // closed when readLoop returned
	settingsDone chan struct{} // closed once the peer's first SETTINGS are applied, or the reader failed
	lastRead     atomic.Int64  // unix nanos of the last frame read

	wmu sync.Mutex // owns out
	out h2out

	mu              sync.Mutex
	sendCond        sync.Cond // L = &mu: send windows grew or a writer must give up
	streams         map[uint32]*ClientStream
	nextID          uint32 // the next stream ID to use; above clientMaxStreamID when exhausted
	reserved        int    // slots taken (Reserve) whose stream is not open yet
	peerMaxStreams  uint32 // peer's SETTINGS_MAX_CONCURRENT_STREAMS (MaxUint32: none)
	firstMaxStreams int    // in the first SETTINGS; -1: not announced
	settingsApplied bool
	settingsErr     error // why the first SETTINGS never came
	goAway          bool
	goAwayLast      uint32 // lowest last-stream-ID of the peer's GOAWAYs
	pingSent        time.Time
	connSendWin     int64 // what we may still send on the connection
	connRecvWin     int64 // what the peer may still send on the connection
	connUnacked     int64 // consumed or discarded, not yet credited back
	peerInitWin     int64
	peerMaxFrame    uint32
	peerTableSize   uint32 // peer's SETTINGS_HEADER_TABLE_SIZE, to apply to the encoder
	peerTableNew    bool
	closing         bool  // Close was called
	err             error // the connection ended: why, for Reserve and the streams
}

// HTTP/2 settings of the client side (hbone-wire.md, "HTTP/2 settings";
// measurements in field-notes.md).
const (
	// poolStreamWindow and poolConnWindow: 4 MiB / 16 MiB windows took one
	// stream from 3.8 to 4.5 Gbit/s. The connection window must exceed the
	// stream window: equal values can deadlock several streams.
	poolStreamWindow = 4 << 20
	poolConnWindow   = 16 << 20
	// poolMaxFrame is the largest frame we accept: 16 KiB frames measured
	// 2.9 Gbit/s against 4.5 with 1 MiB.
	poolMaxFrame = 1 << 20
	// poolMaxHeaderList is the SETTINGS_MAX_HEADER_LIST_SIZE we announce
	// and enforce on responses.
	poolMaxHeaderList = 16 << 10
	// poolSendFrameMax caps the DATA frames we send, whatever larger size
	// the peer allows: a frame is written under the connection's write
	// lock, so its size bounds how long other streams wait behind it.
	poolSendFrameMax = 256 << 10
	// clientMaxStreamID is the last stream ID a client may use (2^31-1).
	clientMaxStreamID = 1<<31 - 1
	// clientReadFromBuf is ReadFrom's buffer.
	clientReadFromBuf = 256 << 10
)

// Errors of the client connection.
var (
	// errClientUnprocessed: the peer certainly did not process the
	// request (GOAWAY named a lower stream, REFUSED_STREAM, or it was never
	// sent); Connect may send it again on another connection.
	errClientUnprocessed = errors.New("request not processed by the peer")
	errClientNoStreams   = errors.New("hbone: connection takes no new streams")
)

func newClientConn(tc net.Conn, bc *batchConn, log hclog.Logger, onState func(), pingAfter, pingTimeout time.Duration) *clientConn {
	c := &clientConn{
		tc:              tc,
		bc:              bc,
		log:             log,
		onState:         onState,
		pingAfter:       pingAfter,
		pingTimeout:     pingTimeout,
		readerDone:      make(chan struct{}),
		settingsDone:    make(chan struct{}),
		streams:         make(map[uint32]*ClientStream),
		nextID:          1,
		peerMaxStreams:  math.MaxUint32,
		firstMaxStreams: -1,
		goAwayLast:      math.MaxUint32,
		connSendWin:     h2defaultWindow,
		connRecvWin:     poolConnWindow,
		peerInitWin:     h2defaultWindow,
		peerMaxFrame:    16 << 10,
	}
	c.sendCond.L = &c.mu
	o := &c.out
	o.bw = bufio.NewWriterSize(tc, h2bufSize)
	o.fr = http2.NewFramer(o.bw, nil)
	o.henc = hpack.NewEncoder(&o.hbuf)
	return c
}

// start sends the preface, our SETTINGS and the connection window, and
// starts the reader and the keepalive.
func (c *clientConn) start() error {
	c.lastRead.Store(time.Now().UnixNano())
	err := c.write(func(o *h2out) error {
		if _, err := o.bw.WriteString(http2.ClientPreface); err != nil {
			return err
		}
		err := o.fr.WriteSettings(
			http2.Setting{ID: http2.SettingEnablePush, Val: 0},
			http2.Setting{ID: http2.SettingInitialWindowSize, Val: poolStreamWindow},
			http2.Setting{ID: http2.SettingMaxFrameSize, Val: poolMaxFrame},
			http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: poolMaxHeaderList},
		)
		if err != nil {
			return err
		}
		return o.fr.WriteWindowUpdate(0, poolConnWindow-h2defaultWindow)
	})
	c.mu.Lock() // keepalive reads pingTimer under mu
	c.pingTimer = time.AfterFunc(c.pingAfter, c.keepalive)
	c.mu.Unlock()
	go c.readLoop()
	return err
}

// write runs fn on the output under the write lock and flushes: the
// records of what fn wrote leave in one write(2). After a write error
// the connection is closed and every later write fails.
func (c *clientConn) write(fn func(o *h2out) error) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.writeLocked(fn)
}

func (c *clientConn) writeLocked(fn func(o *h2out) error) error {
	o := &c.out
	if o.werr != nil {
		return o.werr
	}
	c.bc.cork()
	err := fn(o)
	if err == nil {
		err = o.bw.Flush()
	}
	if uerr := c.bc.uncork(); err == nil {
		err = uerr
	}
	if err != nil {
		o.werr = fmt.Errorf("hbone: HBONE connection write: %w", err)
		c.bc.Close() // the TLS state is unusable; the reader tears down
		return o.werr
	}
	return nil
}

// Reserve takes a slot for one new stream, or fails if the connection
// takes no new streams: it failed, is closing, got GOAWAY, ran out of
// stream IDs or is at the peer's current SETTINGS_MAX_CONCURRENT_STREAMS.
func (c *clientConn) Reserve() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.drainingLocked() || uint64(len(c.streams)+c.reserved) >= uint64(c.peerMaxStreams) {
		return errClientNoStreams
	}
	c.reserved++
	return nil
}

// draining reports whether the connection will never take another
// stream: its open streams finish, then it is closed.
func (c *clientConn) draining() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.drainingLocked()
}

func (c *clientConn) drainingLocked() bool {
	return c.err != nil || c.closing || c.goAway || c.nextID > clientMaxStreamID
}

// Err is non-nil once the connection failed or was closed.
func (c *clientConn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close closes the connection; streams still on it fail. The reader ends
// soon after (readerDone).
func (c *clientConn) Close() error {
	c.mu.Lock()
	c.closing = true
	c.mu.Unlock()
	// Closing the socket, not the TLS conn: a close_notify would wait for
	// the write lock of a writer blocked on a peer that does not read.
	return c.bc.Close()
}

// maxDataLocked is the largest DATA payload we send in one frame.
func (c *clientConn) maxDataLocked() int64 {
	return int64(min(c.peerMaxFrame, poolSendFrameMax))
}

// readLoop reads frames until the connection ends, then tears it down.
func (c *clientConn) readLoop() {
	defer close(c.readerDone)
	c.teardown(h2readFrames(newH2ReadFramer(c.tc, poolMaxHeaderList, poolMaxFrame), c, &c.lastRead))
}

func (c *clientConn) onPing(f *http2.PingFrame) error {
	c.write(func(o *h2out) error { return o.fr.WritePing(true, f.Data) })
	return nil
}

// idleLocked reports whether id is a stream we never opened: a server
// may not open streams (push is off), nor touch one we did not open yet.
func (c *clientConn) idleLocked(id uint32) bool {
	return id%2 == 0 || id >= c.nextID
}

// unknownLocked is the answer to a frame of what on stream id, which is
// not in the table: a connection error if we never opened it, nothing if
// it ended (frames may cross our RST_STREAM or END_STREAM).
func (c *clientConn) unknownLocked(id uint32, what string) error {
	if c.idleLocked(id) {
		return h2connErr(http2.ErrCodeProtocol, what+" on a stream we did not open")
	}
	return nil
}

func (c *clientConn) onSettings(f *http2.SettingsFrame) error {
	if f.IsAck() {
		return nil
	}
	if err := f.ForeachSetting(func(s http2.Setting) error { return s.Valid() }); err != nil {
		code := http2.ErrCodeProtocol
		if ce, ok := err.(http2.ConnectionError); ok {
			code = http2.ErrCode(ce)
		}
		return h2connErr(code, "invalid SETTINGS value")
	}
	c.mu.Lock()
	first := !c.settingsApplied
	for i := range f.NumSettings() {
		s := f.Setting(i)
		switch s.ID {
		case http2.SettingMaxConcurrentStreams:
			c.peerMaxStreams = s.Val
			if first {
				c.firstMaxStreams = int(min(s.Val, math.MaxInt32))
			}
		case http2.SettingInitialWindowSize:
			// RFC 9113 §6.9.2: the change applies to every open stream's
			// send window, which may go negative.
			delta := int64(s.Val) - c.peerInitWin
			c.peerInitWin = int64(s.Val)
			for _, st := range c.streams {
				st.sendWin += delta
				if st.sendWin > h2maxWindow {
					c.mu.Unlock()
					return h2connErr(http2.ErrCodeFlowControl, "SETTINGS_INITIAL_WINDOW_SIZE overflows a stream window")
				}
			}
		case http2.SettingMaxFrameSize:
			c.peerMaxFrame = s.Val
		case http2.SettingHeaderTableSize:
			c.peerTableSize, c.peerTableNew = s.Val, true
		}
	}
	c.settingsApplied = true
	c.sendCond.Broadcast()
	table, tableNew := c.peerTableSize, c.peerTableNew
	c.peerTableNew = false
	c.mu.Unlock()
	c.write(func(o *h2out) error {
		if tableNew {
			o.henc.SetMaxDynamicTableSizeLimit(table)
		}
		return o.fr.WriteSettingsAck()
	})
	if first {
		close(c.settingsDone)
	}
	return nil
}

func (c *clientConn) onWindowUpdate(f *http2.WindowUpdateFrame) error {
	c.mu.Lock()
	inc := int64(f.Increment)
	if f.StreamID == 0 {
		c.connSendWin += inc
		c.sendCond.Broadcast()
		over := c.connSendWin > h2maxWindow
		c.mu.Unlock()
		if over {
			return h2connErr(http2.ErrCodeFlowControl, "connection window above 2^31-1")
		}
		return nil
	}
	st := c.streams[f.StreamID]
	if st == nil {
		err := c.unknownLocked(f.StreamID, "WINDOW_UPDATE")
		c.mu.Unlock()
		return err
	}
	st.sendWin += inc
	c.sendCond.Broadcast()
	if st.sendWin > h2maxWindow {
		c.mu.Unlock()
		c.resetStream(st, http2.ErrCodeFlowControl, errors.New("hbone: peer overflowed the stream window"))
		return nil
	}
	c.mu.Unlock()
	return nil
}

func (c *clientConn) onRSTStream(f *http2.RSTStreamFrame) error {
	c.mu.Lock()
	st := c.streams[f.StreamID]
	if st == nil {
		err := c.unknownLocked(f.StreamID, "RST_STREAM")
		c.mu.Unlock()
		return err
	}
	var credit int64
	switch {
	case !st.respDone && f.ErrCode == http2.ErrCodeRefusedStream:
		credit = c.failLocked(st, fmt.Errorf("hbone: stream refused: %w", errClientUnprocessed))
	case f.ErrCode == http2.ErrCodeNo || f.ErrCode == http2.ErrCodeCancel:
		// A clean end: data received so far is still read, then io.EOF.
		if st.rerr == nil && st.respDone {
			st.rerr = io.EOF
		}
		credit = c.failLocked(st, errClientPeerCanceled)
	default:
		credit = c.failLocked(st, fmt.Errorf("%w (%v)", ErrStreamReset, f.ErrCode))
	}
	conn := c.connCreditLocked(credit)
	c.mu.Unlock()
	c.sendWindowUpdates(0, 0, conn)
	return nil
}

func (c *clientConn) onGoAway(f *http2.GoAwayFrame) error {
	if f.ErrCode != http2.ErrCodeNo {
		c.log.Debug("peer sent GOAWAY", "code", f.ErrCode, "debug", string(f.DebugData()))
	}
	c.mu.Lock()
	c.goAway = true
	c.goAwayLast = min(c.goAwayLast, f.LastStreamID)
	var credit int64
	for id, st := range c.streams {
		if id > c.goAwayLast {
			credit += c.failLocked(st, fmt.Errorf("hbone: GOAWAY before stream %d: %w", id, errClientUnprocessed))
		}
	}
	conn := c.connCreditLocked(credit)
	c.mu.Unlock()
	c.sendWindowUpdates(0, 0, conn)
	c.onState()
	return nil
}

func (c *clientConn) onHeaders(f *http2.MetaHeadersFrame) error {
	c.mu.Lock()
	st := c.streams[f.StreamID]
	if st == nil {
		err := c.unknownLocked(f.StreamID, "HEADERS")
		c.mu.Unlock()
		return err
	}
	if f.Truncated {
		c.mu.Unlock()
		c.resetStream(st, http2.ErrCodeProtocol, errors.New("hbone: response header list above 16 KiB"))
		return nil
	}
	if st.respDone {
		// Trailers: only as the stream's end.
		if !f.StreamEnded() || st.recvClosed {
			c.mu.Unlock()
			c.resetStream(st, http2.ErrCodeProtocol, errors.New("hbone: HEADERS in the middle of the response"))
			return nil
		}
		c.endRecvLocked(st)
		c.mu.Unlock()
		return nil
	}
	status, err := strconv.Atoi(f.PseudoValue("status"))
	if err != nil || status < 100 || status > 999 {
		c.mu.Unlock()
		c.resetStream(st, http2.ErrCodeProtocol, errors.New("hbone: response without a valid :status"))
		return nil
	}
	if status < 200 {
		c.mu.Unlock()
		if f.StreamEnded() {
			c.resetStream(st, http2.ErrCodeProtocol, errors.New("hbone: informational response ends the stream"))
		}
		return nil // 1xx: the final answer follows
	}
	st.status = status
	st.respDone = true
	close(st.resp)
	if f.StreamEnded() {
		c.endRecvLocked(st)
	}
	c.mu.Unlock()
	return nil
}

func (c *clientConn) onData(f *http2.DataFrame) error {
	c.mu.Lock()
	// Flow control counts the whole payload, padding included.
	n := int64(f.Length)
	if n > c.connRecvWin {
		c.mu.Unlock()
		return h2connErr(http2.ErrCodeFlowControl, "peer overran the connection window")
	}
	c.connRecvWin -= n
	st := c.streams[f.StreamID]
	var streamErr error
	code := http2.ErrCodeProtocol
	switch {
	case st == nil:
		// A stream we reset or closed: in-flight DATA is dropped and its
		// connection credit given back.
		err := c.unknownLocked(f.StreamID, "DATA")
		conn := c.connCreditLocked(n)
		c.mu.Unlock()
		c.sendWindowUpdates(0, 0, conn)
		return err
	case !st.respDone:
		streamErr = errors.New("hbone: DATA before the response HEADERS")
	case st.recvClosed:
		code, streamErr = http2.ErrCodeStreamClosed, errors.New("hbone: peer sent DATA after END_STREAM")
	case n > st.recvWin:
		code, streamErr = http2.ErrCodeFlowControl, errors.New("hbone: peer overran the stream window")
	}
	if streamErr != nil {
		conn := c.connCreditLocked(n)
		c.mu.Unlock()
		c.sendWindowUpdates(0, 0, conn)
		c.resetStream(st, code, streamErr)
		return nil
	}
	st.recvWin -= n
	if data := f.Data(); len(data) > 0 {
		st.buf.write(data)
	}
	var sinc, cinc uint32
	if pad := n - int64(len(f.Data())); pad > 0 {
		sinc, cinc = st.creditLocked(pad)
	}
	if f.StreamEnded() {
		c.endRecvLocked(st)
	}
	st.readCond.Broadcast()
	c.mu.Unlock()
	c.sendWindowUpdates(st.id, sinc, cinc)
	return nil
}

// onStreamError handles a frame the Framer found malformed for one stream
// only (bad header fields, zero WINDOW_UPDATE increment).
func (c *clientConn) onStreamError(se http2.StreamError) error {
	c.mu.Lock()
	st := c.streams[se.StreamID]
	c.mu.Unlock()
	if st != nil {
		c.resetStream(st, se.Code, fmt.Errorf("hbone: stream error %v", se.Code))
		return nil
	}
	c.write(func(o *h2out) error { return o.fr.WriteRSTStream(se.StreamID, se.Code) })
	return nil
}

// connCreditLocked adds n consumed or discarded bytes to what the peer is
// owed on the connection and returns the WINDOW_UPDATE increment to send
// now (0: not yet): one once a quarter of the window is owed.
func (c *clientConn) connCreditLocked(n int64) uint32 {
	c.connUnacked += n
	if c.connUnacked < poolConnWindow/4 || c.err != nil {
		return 0
	}
	inc := c.connUnacked
	c.connRecvWin += inc
	c.connUnacked = 0
	return uint32(inc)
}

// sendWindowUpdates writes the WINDOW_UPDATEs a credit computed (zero
// increments are skipped).
func (c *clientConn) sendWindowUpdates(id, stream, conn uint32) {
	if stream == 0 && conn == 0 {
		return
	}
	c.write(func(o *h2out) error {
		if conn > 0 {
			if err := o.fr.WriteWindowUpdate(0, conn); err != nil {
				return err
			}
		}
		if stream > 0 {
			return o.fr.WriteWindowUpdate(id, stream)
		}
		return nil
	})
}

// resetStream resets st from our side: RST_STREAM(code) unless it is
// already closed both ways, both directions closed, unread data dropped,
// Read and Write fail with err.
func (c *clientConn) resetStream(st *ClientStream, code http2.ErrCode, err error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	send := !st.reset && !(st.sendClosed && st.recvClosed) && c.err == nil
	conn := c.connCreditLocked(c.failLocked(st, err))
	c.mu.Unlock()
	c.writeResetLocked(st.id, send, code, conn)
}

// writeResetLocked writes RST_STREAM(code) on id if send, and the
// connection WINDOW_UPDATE for what the reset dropped if conn > 0. The
// caller holds wmu.
func (c *clientConn) writeResetLocked(id uint32, send bool, code http2.ErrCode, conn uint32) error {
	if !send && conn == 0 {
		return nil
	}
	return c.writeLocked(func(o *h2out) error {
		if send {
			if err := o.fr.WriteRSTStream(id, code); err != nil {
				return err
			}
		}
		if conn > 0 {
			return o.fr.WriteWindowUpdate(0, conn)
		}
		return nil
	})
}

// failLocked ends st without telling the peer (it was told, or will be by
// the caller, or the connection is gone), and returns how many unread
// bytes it dropped (connection credit owed to the peer).
func (c *clientConn) failLocked(st *ClientStream, err error) int64 {
	var dropped int64
	st.reset, st.recvClosed, st.sendClosed = true, true, true
	if st.rerr != io.EOF || st.closed {
		dropped = int64(st.buf.reset())
		st.rerr = err
	}
	if st.werr == nil || st.werr == errClientWriteAfterCloseWrite {
		st.werr = err
	}
	if !st.respDone {
		st.respDone = true
		st.respErr = err
		close(st.resp)
	}
	st.readCond.Broadcast()
	c.sendCond.Broadcast()
	c.forgetLocked(st)
	return dropped
}

// endRecvLocked records the peer's END_STREAM.
func (c *clientConn) endRecvLocked(st *ClientStream) {
	st.recvClosed = true
	if st.rerr == nil {
		st.rerr = io.EOF
	}
	st.readCond.Broadcast()
	if st.sendClosed {
		c.forgetLocked(st)
	}
}

// forgetLocked drops st from the table once it is closed both ways: it no
// longer counts against the peer's limit. Its unread data stays readable.
func (c *clientConn) forgetLocked(st *ClientStream) {
	if st.forgotten {
		return
	}
	st.forgotten = true
	delete(c.streams, st.id)
}

// keepalive runs on the ping timer: a PING after pingAfter of read
// silence, and the connection dropped if nothing at all is read within
// pingTimeout of it.
func (c *clientConn) keepalive() {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	now := time.Now()
	last := time.Unix(0, c.lastRead.Load())
	if !c.pingSent.IsZero() {
		if !last.After(c.pingSent) {
			if wait := c.pingSent.Add(c.pingTimeout).Sub(now); wait > 0 {
				c.pingTimer.Reset(wait)
				c.mu.Unlock()
				return
			}
			c.mu.Unlock()
			c.log.Warn("HBONE peer did not answer PING, closing the connection", "timeout", c.pingTimeout)
			c.bc.Close()
			return
		}
		c.pingSent = time.Time{}
	}
	if idle := now.Sub(last); idle < c.pingAfter {
		c.pingTimer.Reset(c.pingAfter - idle)
		c.mu.Unlock()
		return
	}
	c.pingSent = now
	c.pingTimer.Reset(c.pingTimeout)
	c.mu.Unlock()
	// A write blocked on a peer that does not read ends when the next
	// tick closes the socket.
	c.write(func(o *h2out) error {
		return o.fr.WritePing(false, [8]byte{'m', 'e', 's', 'h', 't', 'u', 'n', 0})
	})
}

// teardown ends the connection after the reader stopped: GOAWAY if a
// protocol error caused it, every stream failed, the socket closed.
func (c *clientConn) teardown(cause error) {
	var ce *h2connError
	if errors.As(cause, &ce) {
		c.log.Debug("HTTP/2 protocol error, closing", "error", cause)
		// Bounded: a writer stuck on a peer that does not read must not
		// hold the GOAWAY (or the teardown) forever.
		c.tc.SetWriteDeadline(time.Now().Add(h2drainTimeout))
		c.write(func(o *h2out) error { return o.fr.WriteGoAway(0, ce.code, nil) })
	} else if cause != nil && !errors.Is(cause, io.EOF) && !errors.Is(cause, net.ErrClosed) {
		c.log.Debug("connection ended", "error", cause)
	}
	c.mu.Lock()
	if cause == nil || errors.Is(cause, io.EOF) || errors.Is(cause, net.ErrClosed) {
		c.err = fmt.Errorf("hbone: HBONE connection closed: %w", net.ErrClosed)
	} else {
		c.err = fmt.Errorf("hbone: HBONE connection closed (%v): %w", cause, net.ErrClosed)
	}
	for _, st := range c.streams {
		c.failLocked(st, c.err)
	}
	if !c.settingsApplied {
		c.settingsErr = fmt.Errorf("before the peer's SETTINGS: %w", cause)
		if ce != nil {
			c.settingsErr = errors.New(ce.reason)
		}
		c.settingsApplied = true
		close(c.settingsDone)
	}
	c.sendCond.Broadcast()
	if c.pingTimer != nil {
		c.pingTimer.Stop()
	}
	c.mu.Unlock()
	c.bc.Close()
	c.onState()
}
