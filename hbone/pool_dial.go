package hbone

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"

	"golang.org/x/net/http2"
)

// HTTP/2 settings of the client side (hbone-wire.md, "HTTP/2 settings";
// measurements in field-notes.md).
const (
	// poolStreamWindow and poolConnWindow: 4 MiB / 16 MiB windows took one
	// stream from 3.8 to 4.5 Gbit/s. The connection window must exceed the
	// stream window: equal values can deadlock several streams.
	poolStreamWindow = 4 << 20
	poolConnWindow   = 16 << 20
	// poolMaxFrame is set explicitly: Go clamps 0 to 16 KiB, and 16 KiB
	// frames measured 2.9 Gbit/s against 4.5 with 1 MiB.
	poolMaxFrame = 1 << 20
	// poolMaxHeaderList is the SETTINGS_MAX_HEADER_LIST_SIZE we announce.
	// net/http adds 320 bytes (10 fields of 32 bytes of HPACK overhead) to
	// MaxResponseHeaderBytes, so we ask for 320 less to put 16 KiB on the
	// wire.
	poolMaxHeaderList = 16 << 10
	poolHeaderPadding = 10 * 32
	// poolSendFrameMax caps the DATA frames we send, whatever larger size
	// the peer allows (we lower the peer's SETTINGS_MAX_FRAME_SIZE as the
	// transport sees it): net/http's client holds a body buffer of
	// min(peer's max frame size, 512 KiB) for as long as a stream lives,
	// idle or not. BenchmarkIdleStreams: 590 KiB of heap per idle stream
	// (both sides) against a 1 MiB peer, 140 with this cap. Uploads cost
	// about the same through Write (BenchmarkBulk/up/1, 1.95-2.39 vs
	// 2.19-2.28 CPU-s/GiB) and ≈ 10 % more through ReadFrom, now that
	// batchConn sends each frame's records in one write(2).
	poolSendFrameMax = 64 << 10
)

// dial sets up one connection for key: TCP, TLS (the server must present
// one of ids) and HTTP/2, and waits for the peer's first SETTINGS so the
// stream cap is known. ConnectTimeout bounds all of it.
func (p *Pool) dial(key poolKey, ids []string) (*poolConn, error) {
	ctx, cancel := context.WithTimeout(p.ctx, p.opts.ConnectTimeout)
	defer cancel()

	var nc *poolNetConn // set by DialTLSContext, which NewClientConn calls once
	var protocols http.Protocols
	protocols.SetHTTP2(true)
	tr := &http.Transport{
		DialTLSContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c, err := p.dialTLS(ctx, key, ids)
			nc = c
			return c, err
		},
		Protocols:              &protocols,
		DisableCompression:     true, // a tunnel: never ask for gzip
		MaxResponseHeaderBytes: poolMaxHeaderList - poolHeaderPadding,
		HTTP2: &http.HTTP2Config{
			MaxReadFrameSize:              poolMaxFrame,
			MaxReceiveBufferPerConnection: poolConnWindow,
			MaxReceiveBufferPerStream:     poolStreamWindow,
			SendPingTimeout:               p.opts.pingAfter,
			PingTimeout:                   p.opts.pingTimeout,
		},
	}
	cc, err := tr.NewClientConn(ctx, "https", key.addr.String())
	if err != nil {
		return nil, fmt.Errorf("hbone: connect %s: %w", key.addr, err)
	}
	fail := func(err error) (*poolConn, error) {
		cc.Close()
		<-nc.readerDone
		return nil, fmt.Errorf("hbone: connect %s: %w", key.addr, err)
	}
	select {
	case <-nc.settingsApplied:
	case <-ctx.Done():
		return fail(fmt.Errorf("waiting for the peer's HTTP/2 SETTINGS: %w", ctx.Err()))
	}
	if nc.settingsErr != nil {
		return fail(nc.settingsErr)
	}
	maxStreams := p.opts.MaxStreamsPerConn
	if nc.peerMaxStreams >= 0 {
		maxStreams = min(maxStreams, nc.peerMaxStreams)
	}
	if maxStreams == 0 {
		return fail(errors.New("peer allows no streams (SETTINGS_MAX_CONCURRENT_STREAMS 0)"))
	}
	// The hook runs on the transport's goroutines, maybe under its locks:
	// it only wakes the reaper.
	cc.SetStateHook(func(c *http.ClientConn) {
		if c.Err() != nil {
			p.wake()
		}
	})
	return &poolConn{
		key:        key,
		cc:         cc,
		peerID:     PeerIdentity(nc.ConnectionState()),
		maxStreams: maxStreams,
		readerDone: nc.readerDone,
		nc:         nc,
	}, nil
}

// dialTLS opens the TCP connection and completes the TLS handshake.
func (p *Pool) dialTLS(ctx context.Context, key poolKey, ids []string) (*poolNetConn, error) {
	addr := key.addr.String()
	var raw net.Conn
	var err error
	if p.opts.Dial != nil {
		raw, err = p.opts.Dial(ctx, "tcp", addr)
	} else {
		d := net.Dialer{Control: p.opts.Control}
		if key.srcIP.IsValid() {
			d.LocalAddr = &net.TCPAddr{IP: key.srcIP.AsSlice(), Zone: key.srcIP.Zone()}
		}
		raw, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, fmt.Errorf("tcp (is HBONE port %d reachable?): %w", key.addr.Port(), err)
	}
	bc := newBatchConn(raw)
	tc := tls.Client(bc, ClientConfig(p.opts.Certificate, p.opts.Roots, ids))
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, fmt.Errorf("tls: %w", err)
	}
	return newPoolNetConn(tc, bc), nil
}

// poolNetConn is the TLS connection under one HTTP/2 client connection.
// It watches the first frame the peer sends, which RFC 9113 §3.4 requires
// to be SETTINGS, to learn SETTINGS_MAX_CONCURRENT_STREAMS: net/http's
// ClientConn does not say when the peer's limit is known, and before that
// it assumes 100. It also lowers the frame's SETTINGS_MAX_FRAME_SIZE to
// poolSendFrameMax before the transport sees it. settingsApplied is
// closed on the Read after the one that passed the frame's last byte on:
// the HTTP/2 reader only reads again once it has processed every frame it
// holds, so by then the limit is in force.
type poolNetConn struct {
	*tls.Conn
	bc *batchConn // under Conn: gathers the records of one Write

	settingsApplied chan struct{}
	settingsOnce    sync.Once
	settingsErr     error // valid once settingsApplied is closed
	peerMaxStreams  int   // -1: not announced; valid if settingsErr is nil

	readerDone chan struct{} // closed when a Read failed: the reader stops
	readerOnce sync.Once

	// The outgoing frames (pool_frames.go), guarded by wmu: the
	// transport's writes and our injected RST_STREAMs.
	wmu         sync.Mutex
	out         frameWalker
	lastHeaders uint32 // stream ID of the last HEADERS frame written
	inject      []byte // frames to write at the next frame boundary

	// The incoming frames, walked by the reading goroutine; goAwayLast is
	// the lowest last-stream-ID of the peer's GOAWAYs (noGoAway: none).
	in         frameWalker
	goAwayLast atomic.Uint32

	// Owned by the reading goroutine.
	sniffing     bool   // the first frame is not read yet
	held         []byte // read from TLS, not yet passed to the transport
	firstLeft    int    // bytes of the first frame still in held
	applyPending bool   // the next Read publishes settingsApplied
}

// poolMaxSettingsFrame bounds what the sniffer buffers: a first SETTINGS
// frame longer than this (over 2,700 settings) is refused.
const poolMaxSettingsFrame = 16 << 10

// noGoAway is poolNetConn.goAwayLast before any GOAWAY: above every
// stream ID (they are 31 bits).
const noGoAway = math.MaxUint32

func newPoolNetConn(tc *tls.Conn, bc *batchConn) *poolNetConn {
	c := &poolNetConn{
		Conn:            tc,
		bc:              bc,
		settingsApplied: make(chan struct{}),
		peerMaxStreams:  -1,
		readerDone:      make(chan struct{}),
		sniffing:        true,
	}
	c.goAwayLast.Store(noGoAway)
	c.out.skip = len(http2.ClientPreface)
	c.out.onHeader = func(typ uint8, stream uint32, _ int) int {
		if typ == frameTypeHeaders {
			c.lastHeaders = stream
		}
		return 0
	}
	c.in.onHeader = func(typ uint8, stream uint32, _ int) int {
		if typ == frameTypeGoAway && stream == 0 {
			return 4
		}
		return 0
	}
	c.in.onPayload = func(_ uint8, _ uint32, p []byte) {
		last := binary.BigEndian.Uint32(p) & math.MaxInt32
		if last < c.goAwayLast.Load() {
			c.goAwayLast.Store(last) // only this goroutine stores
		}
	}
	return c
}

// Write passes the transport's bytes to TLS, following frame boundaries,
// and writes any RST_STREAM that resetStream queued as soon as a frame
// ends. The TLS records of one Write leave in one write(2) (or one per
// batchWriteMax bytes), and so do those of Writes that end mid-frame with
// the Write that completes the frame.
func (c *poolNetConn) Write(b []byte) (n int, err error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.bc != nil {
		c.bc.cork()
		defer func() {
			// A Write that ends inside a frame is followed at once by the
			// frame's rest: the transport's 4 KiB bufio.Writer passes a
			// large frame as its first 4 KiB, then the remainder, in one
			// call. Both leave in one write(2).
			if err == nil && !c.out.atBoundary() {
				return
			}
			if uerr := c.bc.uncork(); err == nil {
				err = uerr
			}
		}()
	}
	if err := c.flushInjectLocked(); err != nil {
		return 0, err
	}
	total := 0
	for len(b) > 0 {
		n := c.out.walk(b, len(c.inject) > 0)
		k, err := c.Conn.Write(b[:n])
		total += k
		if err != nil {
			return total, err
		}
		b = b[n:]
		if err := c.flushInjectLocked(); err != nil {
			return total, err
		}
	}
	return total, nil
}

// flushInjectLocked writes the queued frames if the stream is between
// frames.
func (c *poolNetConn) flushInjectLocked() error {
	if len(c.inject) == 0 || !c.out.atBoundary() {
		return nil
	}
	_, err := c.Conn.Write(c.inject)
	c.inject = nil
	return err
}

// headersID is the stream ID of the last HEADERS frame the transport
// wrote. Called from the WroteHeaders trace hook, which runs right after
// the transport flushed a request's HEADERS and before it writes anything
// else, it is that request's stream ID.
func (c *poolNetConn) headersID() uint32 {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.lastHeaders
}

// resetStream sends RST_STREAM(code) on stream id: now if the transport
// is between frames, else right after the frame it is writing (it always
// finishes a frame in the same flush).
func (c *poolNetConn) resetStream(id uint32, code http2.ErrCode) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.inject = append(c.inject, rstFrame(id, code)...)
	return c.flushInjectLocked()
}

func (c *poolNetConn) Read(b []byte) (int, error) {
	if c.applyPending {
		c.applyPending = false
		c.settingsDone(nil)
	}
	var n int
	var err error
	switch {
	case len(c.held) > 0:
		n = copy(b, c.held)
		c.held = c.held[n:]
		if len(c.held) == 0 {
			c.held = nil
		}
		if c.firstLeft > 0 {
			c.firstLeft -= min(n, c.firstLeft)
			c.applyPending = c.firstLeft == 0
		}
	case c.sniffing:
		if err = c.readFirstFrame(); err == nil {
			return c.Read(b)
		}
	default:
		n, err = c.Conn.Read(b)
	}
	c.in.walk(b[:n], false)
	if err != nil {
		c.settingsDone(fmt.Errorf("before the peer's SETTINGS: %w", err))
		c.readerOnce.Do(func() { close(c.readerDone) })
	}
	return n, err
}

// readFirstFrame reads until the peer's first frame, which must be
// SETTINGS, is whole, and keeps those bytes (and any after them) in
// c.held for Read to pass on. It learns SETTINGS_MAX_CONCURRENT_STREAMS
// and lowers SETTINGS_MAX_FRAME_SIZE to poolSendFrameMax in the copy the
// transport will see.
func (c *poolNetConn) readFirstFrame() error {
	buf := make([]byte, 0, 1<<10)
	for {
		if len(buf) >= frameHeaderLen {
			length := int(buf[0])<<16 | int(buf[1])<<8 | int(buf[2])
			typ, flags, stream := buf[3], buf[4], binary.BigEndian.Uint32(buf[5:])&(1<<31-1)
			const frameSettings, flagAck = 0x4, 0x1
			if typ != frameSettings || flags&flagAck != 0 || stream != 0 ||
				length%6 != 0 || length > poolMaxSettingsFrame {
				c.sniffing = false
				c.settingsDone(errors.New("peer did not start with a SETTINGS frame (not HTTP/2?)"))
				c.held = buf
				return nil
			}
			if len(buf) >= frameHeaderLen+length {
				c.applySettings(buf[frameHeaderLen : frameHeaderLen+length])
				c.sniffing = false
				c.held, c.firstLeft = buf, frameHeaderLen+length
				return nil
			}
		}
		if cap(buf)-len(buf) < 512 {
			buf = slices.Grow(buf, 4<<10)
		}
		n, err := c.Conn.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err != nil {
			c.sniffing = false
			return err
		}
	}
}

// applySettings reads the peer's first SETTINGS payload and rewrites it
// in place for the transport.
func (c *poolNetConn) applySettings(payload []byte) {
	const settingMaxConcurrentStreams, settingMaxFrameSize = 0x3, 0x5
	for s := payload; len(s) >= 6; s = s[6:] {
		switch binary.BigEndian.Uint16(s) {
		case settingMaxConcurrentStreams:
			c.peerMaxStreams = int(min(binary.BigEndian.Uint32(s[2:]), 1<<31-1))
		case settingMaxFrameSize:
			if binary.BigEndian.Uint32(s[2:]) > poolSendFrameMax {
				binary.BigEndian.PutUint32(s[2:], poolSendFrameMax)
			}
		}
	}
}

func (c *poolNetConn) Close() error {
	c.settingsDone(errors.New("connection closed before the peer's SETTINGS"))
	return c.Conn.Close()
}

// settingsDone publishes the sniffer's result once.
func (c *poolNetConn) settingsDone(err error) {
	c.settingsOnce.Do(func() {
		c.settingsErr = err
		close(c.settingsApplied)
	})
}
