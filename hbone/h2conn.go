package hbone

// The HTTP/2 engine, one for both sides: h2conn.go (this file: one
// connection, its frame handling, SETTINGS, GOAWAY and teardown),
// h2stream.go (a stream: Read, WriteBufferedTo, Write, flow control,
// ending), h2write.go (the write model and the keepalive), h2read.go
// (reading and sorting frames), h2recvbuf.go (pooled receive chunks),
// h2batch.go (TLS records gathered per flush). The client (client*.go,
// pool*.go) and the server (server*.go) add only what differs: who opens
// streams, the CONNECT request and its answer, the pool, the server's
// request checks and accept loop.

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// HTTP/2 tuning, both sides (docs/hbone.md, "HTTP/2 settings"; the
// measurements are in docs/field-notes.md, "Go HTTP/2 over mutual TLS").
const (
	// h2StreamWindow and h2ConnWindow are the receive windows we
	// announce: 4 MiB / 16 MiB took one stream from 3.8 to 4.5 Gbit/s
	// over x/net's defaults. The connection window must exceed the stream
	// window (equal values can deadlock several streams, one holding all
	// of it); it also bounds the bytes buffered per connection.
	h2StreamWindow = 4 << 20
	h2ConnWindow   = 16 << 20
	// h2MaxFrame is the largest frame we accept: 16 KiB frames measured
	// 2.9 Gbit/s against 4.5 with 1 MiB.
	h2MaxFrame = 1 << 20
	// h2SendFrameMax caps the DATA frames we send, whatever larger size
	// the peer allows: a frame is written under the connection's write
	// lock, so its size bounds how long other streams wait behind it.
	h2SendFrameMax = 256 << 10
	// h2MaxStreamID is the last stream ID of either side (2^31-1).
	h2MaxStreamID = 1<<31 - 1
	// h2WriteTimeout bounds one flush (at most a few DATA frames' worth):
	// a peer that stops reading must not pin the write lock, and every
	// stream behind it, for longer.
	h2WriteTimeout = 30 * time.Second
	// h2DrainTimeout bounds writing the last frames (GOAWAY) of a
	// connection that is being torn down, and the wait for the peer's
	// close after our graceful one.
	h2DrainTimeout = time.Second
	// h2MaxQueuedControl bounds the frames the peer provokes (PING and
	// SETTINGS ACKs, RST_STREAMs, refusals) waiting for the write lock: a
	// peer that floods PINGs without reading our answers gets
	// ENHANCE_YOUR_CALM instead of growing our queue.
	h2MaxQueuedControl = 1000
	// h2PingAfter is the read silence after which either side sends a
	// PING, and h2PingTimeout how long after it a connection that read
	// nothing at all is dropped (docs/hbone.md, "Keepalive"): ztunnel's
	// values.
	h2PingAfter   = 10 * time.Second
	h2PingTimeout = 20 * time.Second
	// h2DefaultWindow is HTTP/2's initial window before SETTINGS (RFC
	// 9113 §6.9.2), and h2MaxWindow the largest legal window.
	h2DefaultWindow = 65535
	h2MaxWindow     = 1<<31 - 1
)

// h2Config is what differs between the two sides of the engine.
type h2Config struct {
	// client: we send the preface, open odd-numbered streams and accept
	// none; otherwise we read the preface and the peer opens the
	// (odd-numbered) streams.
	client bool
	// maxHeaderList is the SETTINGS_MAX_HEADER_LIST_SIZE we announce and
	// enforce on the peer's header blocks.
	maxHeaderList uint32
	// maxStreams, if not 0, is announced as SETTINGS_MAX_CONCURRENT_STREAMS.
	maxStreams uint32
	// pingAfter is the read silence after which we send a PING, and
	// pingTimeout how long its answer may take before the connection is
	// dropped.
	pingAfter, pingTimeout time.Duration
	// handshakeDeadline (server) is when the client must have sent its
	// preface, its SETTINGS and its first request: a connection that
	// opens no stream by then is closed.
	handshakeDeadline time.Time
	log               hclog.Logger
	// onRequestLocked handles HEADERS that open a stream of the peer
	// (server only; c.mu held). A returned error ends the connection.
	onRequestLocked func(f *http2.MetaHeadersFrame) error
	// onState, if set, is called (without locks) when the connection
	// stops taking new streams: GOAWAY, failure, close.
	onState func()
	// streamsOpen, if set, counts the streams in the table.
	streamsOpen *atomic.Int64
}

// h2Conn is one HTTP/2 connection, either side.
//
// Goroutines: the reader (serve, the caller's or one of its own), which
// never writes to the socket, and the writer (writeLoop), which writes
// the queued frames when nobody else does and runs the keepalive. Nothing
// runs per stream. DATA leaves from the goroutine of the stream's Write,
// straight from its buffer, under wmu; every other frame is queued (wq)
// and written by whoever holds wmu next: each holder writes the queue
// before its own frame and flushes once, so the frames keep their order
// and their records leave in one write(2) (see h2write.go).
//
// Lock order: h2Stream.wmu → h2Conn.wmu → h2Conn.mu; Pool.mu → h2Conn.mu.
// Nobody takes wmu while holding mu (TryLock aside).
type h2Conn struct {
	cfg h2Config
	tc  net.Conn   // the TLS connection (a plain one in tests)
	bc  *batchConn // under tc: gathers the records of one flush
	log hclog.Logger

	// onRelease, if set, is called (without the connection's locks) once
	// per stream, when both its directions ended for its user: the pool
	// takes its slot back.
	onRelease func()

	done       chan struct{} // closed when serve returned: reader and writer ended
	writerDone chan struct{} // closed when writeLoop returned
	stop       chan struct{} // teardown: the writer flushes what is left and returns
	wake       chan struct{} // writer: frames are queued (cap 1)
	// handshakeExpired is set by the reader when the server's handshake
	// deadline passed before the client's first request.
	handshakeExpired atomic.Bool
	settingsDone     chan struct{} // closed once the peer's first SETTINGS are applied, or the reader failed
	lastRead         atomic.Int64  // unix nanos of the last frame read
	wqLen            atomic.Int32  // len(wq), read without mu
	tearing          atomic.Bool   // teardown started: writes get h2DrainTimeout

	wmu   sync.Mutex // owns out and spare
	out   h2out
	spare []h2frame // the last batch's array, reused for the queue

	mu              sync.Mutex
	sendCond        sync.Cond // L = &mu: send windows grew or a writer must give up
	streams         map[uint32]*h2Stream
	wq              []h2frame // frames waiting for wmu's holder
	wqControl       int       // frames queued since the last flush (h2MaxQueuedControl)
	nextID          uint32    // the next stream ID we open; above h2MaxStreamID when exhausted
	lastPeerID      uint32    // the highest stream ID the peer opened
	reserved        int       // slots taken (reserve) whose stream is not open yet
	peerMaxStreams  uint32    // peer's SETTINGS_MAX_CONCURRENT_STREAMS (MaxUint32: none)
	firstMaxStreams int       // in the first SETTINGS; -1: not announced
	settingsApplied bool
	settingsErr     error  // why the first SETTINGS never came
	goAwayRecv      bool   // the peer sent GOAWAY: we open no more streams
	goAwayLast      uint32 // lowest last-stream-ID of the peer's GOAWAYs
	goAwaySent      bool   // we sent GOAWAY(NO_ERROR): the connection ends with its last stream
	closeWrite      bool   // close our side (close_notify) once the queue is written
	connSendWin     int64  // what we may still send on the connection
	connRecvWin     int64  // what the peer may still send on the connection
	connUnacked     int64  // consumed or discarded, not yet credited back
	peerInitWin     int64  // peer's SETTINGS_INITIAL_WINDOW_SIZE
	peerMaxFrame    uint32 // peer's SETTINGS_MAX_FRAME_SIZE
	closing         bool   // close was called
	closed          bool   // torn down: nothing more is queued
	err             error  // the connection ended: why, for the streams and openers
}

// Errors of the engine.
var (
	// errUnprocessed: the peer certainly did not process the request
	// (GOAWAY named a lower stream, REFUSED_STREAM, or it was never
	// sent); it may be sent again on another connection.
	errUnprocessed = errors.New("request not processed by the peer")
	errNoStreams   = errors.New("hbone: connection takes no new streams")
)

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

func newH2Conn(tc net.Conn, bc *batchConn, cfg h2Config) *h2Conn {
	c := &h2Conn{
		cfg:             cfg,
		tc:              tc,
		bc:              bc,
		log:             cfg.log,
		done:            make(chan struct{}),
		writerDone:      make(chan struct{}),
		stop:            make(chan struct{}),
		wake:            make(chan struct{}, 1),
		settingsDone:    make(chan struct{}),
		streams:         make(map[uint32]*h2Stream),
		nextID:          2,
		peerMaxStreams:  math.MaxUint32,
		firstMaxStreams: -1,
		goAwayLast:      math.MaxUint32,
		connSendWin:     h2DefaultWindow,
		connRecvWin:     h2ConnWindow,
		peerInitWin:     h2DefaultWindow,
		peerMaxFrame:    16 << 10,
	}
	if cfg.client {
		c.nextID = 1
	}
	c.sendCond.L = &c.mu
	c.out.init(tc)
	return c
}

// start queues our preface (the client's magic string, our SETTINGS and
// the connection window) and starts the writer.
func (c *h2Conn) start() {
	c.lastRead.Store(time.Now().UnixNano())
	c.mu.Lock()
	c.queueLocked(h2frame{kind: h2Settings})
	c.mu.Unlock()
	c.kick()
	go c.writeLoop()
}

// settings are the SETTINGS we announce (docs/hbone.md, "HTTP/2 settings").
func (c *h2Conn) settings() []http2.Setting {
	s := []http2.Setting{
		{ID: http2.SettingEnablePush, Val: 0},
		{ID: http2.SettingInitialWindowSize, Val: h2StreamWindow},
		{ID: http2.SettingMaxFrameSize, Val: h2MaxFrame},
		{ID: http2.SettingMaxHeaderListSize, Val: c.cfg.maxHeaderList},
	}
	if c.cfg.maxStreams > 0 {
		s = append(s, http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: c.cfg.maxStreams})
	}
	return s
}

// serve reads frames until the connection ends, then tears it down; it
// returns when the writer has ended too. start must have been called.
func (c *h2Conn) serve() {
	defer close(c.done)
	c.teardown(c.readLoop())
}

// reserve takes a slot for one new stream of ours, or fails if the
// connection takes no new streams: it failed, is closing, got GOAWAY,
// ran out of stream IDs or is at the peer's current
// SETTINGS_MAX_CONCURRENT_STREAMS.
func (c *h2Conn) reserve() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.drainingLocked() || uint64(len(c.streams)+c.reserved) >= uint64(c.peerMaxStreams) {
		return errNoStreams
	}
	c.reserved++
	return nil
}

// openStream opens st as our next stream and queues its HEADERS: the ID
// is taken under mu with the frame queued, so that IDs reach the wire in
// order. It gives back the slot reserve took, as a stream or not at all.
func (c *h2Conn) openStream(st *h2Stream, fields []hpack.HeaderField) error {
	c.mu.Lock()
	c.reserved--
	if c.drainingLocked() {
		err := c.err
		if err == nil {
			err = errNoStreams
		}
		c.mu.Unlock()
		// Nothing was sent: safe to send elsewhere.
		return fmt.Errorf("%w: %w", err, errUnprocessed)
	}
	c.initStreamLocked(st, c.nextID)
	st.resp = make(chan struct{})
	c.nextID += 2
	c.queueLocked(h2frame{kind: h2Headers, streamID: st.id, fields: fields})
	c.mu.Unlock()
	c.writeQueued()
	return nil
}

// initStreamLocked sets st up as stream id and enters it in the table.
func (c *h2Conn) initStreamLocked(st *h2Stream, id uint32) {
	st.c = c
	st.id = id
	st.recvWin = h2StreamWindow
	st.sendWin = c.peerInitWin
	st.readCond.L = &c.mu
	st.respDone = !c.ours(id) // the peer's streams open with their header block
	c.streams[id] = st
	if c.cfg.streamsOpen != nil {
		c.cfg.streamsOpen.Add(1)
	}
}

// draining reports whether the connection will never take another
// stream of ours: its open streams finish, then it is closed.
func (c *h2Conn) draining() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.drainingLocked()
}

func (c *h2Conn) drainingLocked() bool {
	return c.err != nil || c.closing || c.goAwayRecv || c.nextID > h2MaxStreamID
}

// Err is non-nil once the connection failed or was closed.
func (c *h2Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// close closes the connection at once; streams still on it fail, and
// the reader tears down soon after (done).
func (c *h2Conn) close() {
	c.mu.Lock()
	c.closing = true
	c.mu.Unlock()
	// Closing the socket, not the TLS conn: a close_notify would wait for
	// the write lock of a writer blocked on a peer that does not read.
	c.bc.Close()
}

// shutdown starts a graceful close: GOAWAY(NO_ERROR) with the last stream
// the peer opened; streams it opens after are refused, and the connection
// closes when the last stream ends.
func (c *h2Conn) shutdown() {
	c.mu.Lock()
	if c.closed || c.goAwaySent {
		c.mu.Unlock()
		return
	}
	c.goAwaySent = true
	c.queueLocked(h2frame{kind: h2GoAway, n: c.lastPeerID, code: http2.ErrCodeNo})
	c.maybeCloseLocked()
	c.mu.Unlock()
	c.writeQueued()
}

// maybeCloseLocked asks the writer for the graceful end once GOAWAY was
// sent and no stream is left.
func (c *h2Conn) maybeCloseLocked() {
	if c.goAwaySent && len(c.streams) == 0 && !c.closeWrite {
		c.closeWrite = true
		c.kick()
	}
}

// ours reports whether id is of the side we are (we open it).
func (c *h2Conn) ours(id uint32) bool {
	return (id%2 == 1) == c.cfg.client
}

// idleLocked reports whether id names a stream that was never opened:
// frames on it are a connection error (RFC 9113 §5.1).
func (c *h2Conn) idleLocked(id uint32) bool {
	if c.ours(id) {
		return id >= c.nextID
	}
	return id > c.lastPeerID
}

// goneLocked is the answer to a frame of what on stream id, which is not
// in the table: a connection error if it was never opened, nothing if it
// ended (frames may cross our RST_STREAM or END_STREAM).
func (c *h2Conn) goneLocked(id uint32, what string) error {
	if c.idleLocked(id) {
		return h2connErr(http2.ErrCodeProtocol, what+" on an idle stream")
	}
	return nil
}

// handle dispatches one frame the reader read. A returned error ends the
// connection.
func (c *h2Conn) handle(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.DataFrame:
		return c.onData(f)
	case *http2.MetaHeadersFrame:
		return c.onHeaders(f)
	case *http2.WindowUpdateFrame:
		return c.onWindowUpdate(f)
	case *http2.RSTStreamFrame:
		return c.onRSTStream(f)
	case *http2.SettingsFrame:
		return c.onSettings(f)
	case *http2.PingFrame:
		if f.IsAck() { // lastRead already says the peer is alive
			return nil
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.queueControlLocked(h2frame{kind: h2Ping, end: true, ping: f.Data})
	case *http2.GoAwayFrame:
		return c.onGoAway(f)
	case *http2.PushPromiseFrame:
		// Push is disabled in our SETTINGS, and clients never push.
		return h2connErr(http2.ErrCodeProtocol, "PUSH_PROMISE (push is disabled)")
	}
	return nil // PRIORITY, PRIORITY_UPDATE, unknown types: ignored
}

func (c *h2Conn) onSettings(f *http2.SettingsFrame) error {
	if f.IsAck() {
		return nil
	}
	if err := f.ForeachSetting(func(s http2.Setting) error { return s.Valid() }); err != nil {
		code := http2.ErrCodeProtocol
		var ce http2.ConnectionError
		if errors.As(err, &ce) {
			code = http2.ErrCode(ce)
		}
		return h2connErr(code, "invalid SETTINGS value")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	first := !c.settingsApplied
	ack := h2frame{kind: h2SettingsAck}
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
				if st.sendWin > h2MaxWindow {
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
	if first {
		c.settingsApplied = true
		close(c.settingsDone)
	}
	return c.queueControlLocked(ack)
}

func (c *h2Conn) onWindowUpdate(f *http2.WindowUpdateFrame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	inc := int64(f.Increment)
	if f.StreamID == 0 {
		c.connSendWin += inc
		if c.connSendWin > h2MaxWindow {
			return h2connErr(http2.ErrCodeFlowControl, "connection window above 2^31-1")
		}
		c.sendCond.Broadcast()
		return nil
	}
	st := c.streams[f.StreamID]
	if st == nil {
		return c.goneLocked(f.StreamID, "WINDOW_UPDATE")
	}
	st.sendWin += inc
	if st.sendWin > h2MaxWindow {
		c.resetLocked(st, http2.ErrCodeFlowControl, errors.New("hbone: peer overflowed the stream window"))
	}
	c.sendCond.Broadcast()
	return nil
}

func (c *h2Conn) onRSTStream(f *http2.RSTStreamFrame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.streams[f.StreamID]
	if st == nil {
		return c.goneLocked(f.StreamID, "RST_STREAM")
	}
	switch {
	case !st.respDone && f.ErrCode == http2.ErrCodeRefusedStream:
		c.failLocked(st, fmt.Errorf("hbone: stream refused: %w", errUnprocessed))
	case f.ErrCode == http2.ErrCodeNo || f.ErrCode == http2.ErrCodeCancel:
		// A clean end: data received so far is still read, then io.EOF.
		if st.rerr == nil && st.respDone {
			st.rerr = io.EOF
		}
		c.failLocked(st, errPeerCanceled)
	default:
		c.failLocked(st, fmt.Errorf("%w (%v)", ErrStreamReset, f.ErrCode))
	}
	return nil
}

func (c *h2Conn) onGoAway(f *http2.GoAwayFrame) error {
	if f.ErrCode != http2.ErrCodeNo {
		c.log.Debug("peer sent GOAWAY", "code", f.ErrCode, "debug", string(f.DebugData()))
	}
	c.mu.Lock()
	c.goAwayRecv = true
	c.goAwayLast = min(c.goAwayLast, f.LastStreamID)
	for id, st := range c.streams {
		if c.ours(id) && id > c.goAwayLast {
			c.failLocked(st, fmt.Errorf("hbone: GOAWAY before stream %d: %w", id, errUnprocessed))
		}
	}
	c.mu.Unlock()
	if c.cfg.onState != nil {
		c.cfg.onState()
	}
	return nil
}

// onHeaders handles a header block: a stream the peer opens (the
// server's requests), the response to one of ours, or trailers.
func (c *h2Conn) onHeaders(f *http2.MetaHeadersFrame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	id := f.StreamID
	st := c.streams[id]
	switch {
	case st == nil && !c.ours(id) && id > c.lastPeerID:
		if c.cfg.onRequestLocked == nil {
			return h2connErr(http2.ErrCodeProtocol, "HEADERS on a stream we did not open")
		}
		c.lastPeerID = id
		return c.cfg.onRequestLocked(f)
	case st == nil && c.idleLocked(id):
		return h2connErr(http2.ErrCodeProtocol, "HEADERS on a stream we did not open")
	case st == nil:
		return c.queueControlLocked(h2frame{kind: h2RST, streamID: id, code: http2.ErrCodeStreamClosed})
	case !st.respDone:
		c.onResponseLocked(st, f)
		return nil
	case !f.StreamEnded() || st.recvClosed:
		// Trailers must end the stream.
		c.resetLocked(st, http2.ErrCodeProtocol, errors.New("hbone: peer sent HEADERS in the middle of a stream"))
		return nil
	default:
		// Trailers: their fields mean nothing to a tunnel and are dropped.
		c.endRecvLocked(st)
		return nil
	}
}

// onResponseLocked handles the first header block on a stream we opened.
func (c *h2Conn) onResponseLocked(st *h2Stream, f *http2.MetaHeadersFrame) {
	if f.Truncated {
		c.resetLocked(st, http2.ErrCodeProtocol, errors.New("hbone: response header list above our limit"))
		return
	}
	status, ok := parseStatus(f.PseudoValue("status"))
	if !ok {
		c.resetLocked(st, http2.ErrCodeProtocol, errors.New("hbone: response without a valid :status"))
		return
	}
	if status < 200 {
		if f.StreamEnded() {
			c.resetLocked(st, http2.ErrCodeProtocol, errors.New("hbone: informational response ends the stream"))
		}
		return // 1xx: the final answer follows
	}
	st.status = status
	st.respDone = true
	close(st.resp)
	if f.StreamEnded() {
		c.endRecvLocked(st)
	}
}

// parseStatus reads a :status value: three decimal digits.
func parseStatus(v string) (int, bool) {
	if len(v) != 3 {
		return 0, false
	}
	n := 0
	for i := range 3 {
		d := v[i]
		if d < '0' || d > '9' {
			return 0, false
		}
		n = 10*n + int(d-'0')
	}
	return n, n >= 100
}

func (c *h2Conn) onData(f *http2.DataFrame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	// Flow control counts the whole payload, padding included.
	n := int64(f.Length)
	if n > c.connRecvWin {
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
		c.connCreditLocked(n)
		return c.goneLocked(f.StreamID, "DATA")
	case !st.respDone:
		streamErr = errors.New("hbone: DATA before the response HEADERS")
	case st.recvClosed:
		code, streamErr = http2.ErrCodeStreamClosed, errors.New("hbone: peer sent DATA after END_STREAM")
	case n > st.recvWin:
		code, streamErr = http2.ErrCodeFlowControl, errors.New("hbone: peer overran the stream window")
	}
	if streamErr != nil {
		c.connCreditLocked(n)
		c.resetLocked(st, code, streamErr)
		return nil
	}
	st.recvWin -= n
	data := f.Data()
	if pad := n - int64(len(data)); pad > 0 {
		st.creditLocked(pad)
	}
	wake := true
	if len(data) > 0 && len(data) <= sinkMax && st.sink != nil && st.buf.n == 0 && !st.sinking {
		data, wake = c.sinkLocked(st, data)
	}
	if len(data) > 0 {
		st.buf.write(data)
	}
	if f.StreamEnded() {
		c.endRecvLocked(st)
		wake = true
	}
	if wake {
		st.readCond.Broadcast()
	}
	return nil
}

// sinkLocked writes data straight into the destination of st's waiting
// WriteBufferedTo (run to completion), without c.mu for the write, and
// returns what the destination did not take, to be buffered, and whether
// WriteBufferedTo must be woken. A stream that failed meanwhile has its
// rest dropped and credited, as failLocked does with buffered data.
func (c *h2Conn) sinkLocked(st *h2Stream, data []byte) ([]byte, bool) {
	sink := st.sink
	st.sinking = true
	c.mu.Unlock()
	k, err := sink.TryWrite(data)
	c.mu.Lock()
	st.sinking = false
	st.sunk += int64(k)
	st.creditLocked(int64(k))
	data = data[k:]
	if err != nil {
		st.sinkErr = err
	}
	if st.reset {
		c.connCreditLocked(int64(len(data)))
		return nil, true
	}
	// Woken only when something is left for it: a rest to write, or an
	// error to return. What the reader wrote is reported later.
	return data, len(data) > 0 || err != nil
}

// onStreamError handles a frame the Framer found malformed for one stream
// only (bad header fields, zero WINDOW_UPDATE increment).
func (c *h2Conn) onStreamError(se http2.StreamError) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.ours(se.StreamID) && se.StreamID > c.lastPeerID {
		c.lastPeerID = se.StreamID // a HEADERS that opened (and killed) a stream
	}
	if st := c.streams[se.StreamID]; st != nil {
		c.resetLocked(st, se.Code, fmt.Errorf("hbone: stream error %v", se.Code))
		return nil
	}
	return c.queueControlLocked(h2frame{kind: h2RST, streamID: se.StreamID, code: se.Code})
}

// connCreditLocked adds n consumed or discarded bytes to what the peer is
// owed on the connection, and queues a WINDOW_UPDATE once a quarter of
// the window is owed.
func (c *h2Conn) connCreditLocked(n int64) {
	c.connUnacked += n
	if c.connUnacked >= h2ConnWindow/4 && c.queueLocked(h2frame{kind: h2WindowUpdate, n: uint32(c.connUnacked)}) {
		c.connRecvWin += c.connUnacked
		c.connUnacked = 0
	}
}

// resetLocked resets st from our side: RST_STREAM(code) unless a reset
// already went either way, both directions closed, unread data dropped,
// Read and Write fail with err.
func (c *h2Conn) resetLocked(st *h2Stream, code http2.ErrCode, err error) {
	if !st.reset {
		c.queueLocked(h2frame{kind: h2RST, streamID: st.id, code: code})
	}
	c.failLocked(st, err)
}

// teardown ends the connection after the reader stopped: GOAWAY if a
// protocol error caused it, every stream failed, the writer stopped after
// a bounded flush, the socket closed.
func (c *h2Conn) teardown(cause error) {
	var ce *h2connError
	c.mu.Lock()
	if errors.As(cause, &ce) {
		c.log.Debug("HTTP/2 protocol error, closing", "error", cause)
		c.queueLocked(h2frame{kind: h2GoAway, n: c.lastPeerID, code: ce.code})
	} else if cause != nil && !errors.Is(cause, io.EOF) && !errors.Is(cause, net.ErrClosed) {
		c.log.Debug("connection ended", "error", cause)
	}
	if cause == nil || errors.Is(cause, io.EOF) || errors.Is(cause, net.ErrClosed) {
		c.err = fmt.Errorf("hbone: HBONE connection closed: %w", net.ErrClosed)
	} else {
		c.err = fmt.Errorf("hbone: HBONE connection closed (%v): %w", cause, net.ErrClosed)
	}
	c.closed = true
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
	c.mu.Unlock()

	// Bounded: a writer stuck on a peer that does not read must not hold
	// the GOAWAY (or the teardown) for long.
	c.tearing.Store(true)
	c.tc.SetWriteDeadline(time.Now().Add(h2DrainTimeout))
	close(c.stop)
	<-c.writerDone
	c.bc.Close()
	if c.cfg.onState != nil {
		c.cfg.onState()
	}
}
