package hbone

// Reading frames, both sides.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// newH2ReadFramer is the frame reader of one connection, either side:
// header blocks decoded (CONTINUATIONs joined) and bounded, frames
// bounded by what we announced.
func newH2ReadFramer(r io.Reader, maxHeaderList, maxFrame uint32) *http2.Framer {
	fr := http2.NewFramer(nil, r)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.MaxHeaderListSize = maxHeaderList
	fr.SetMaxReadFrameSize(maxFrame)
	return fr
}

// h2readFrame reads the next frame and sorts the Framer's errors: a frame
// malformed for one stream only comes back as an http2.StreamError (the
// stream is reset, the connection lives on), a breach of the protocol as
// an *h2connError (GOAWAY with its code, then close), anything else (the
// socket failed) as it is. The peer's first frame must be SETTINGS (RFC
// 9113 §3.4).
func h2readFrame(fr *http2.Framer, first bool) (http2.Frame, error) {
	f, err := fr.ReadFrame()
	if err != nil {
		var se http2.StreamError
		if errors.As(err, &se) && !first {
			return nil, se
		}
		var ce http2.ConnectionError
		if errors.As(err, &ce) {
			reason := "malformed frame"
			if d := fr.ErrorDetail(); d != nil {
				reason = d.Error()
			}
			return nil, h2connErr(http2.ErrCode(ce), reason)
		}
		if errors.Is(err, http2.ErrFrameTooLarge) {
			return nil, h2connErr(http2.ErrCodeFrameSize, "frame larger than our SETTINGS_MAX_FRAME_SIZE")
		}
		if errors.As(err, &se) {
			return nil, h2connErr(http2.ErrCodeProtocol, "first frame is not SETTINGS (not HTTP/2?)")
		}
		return nil, err
	}
	if sf, ok := f.(*http2.SettingsFrame); first && (!ok || sf.IsAck()) {
		return nil, h2connErr(http2.ErrCodeProtocol, "first frame is not SETTINGS (not HTTP/2?)")
	}
	return f, nil
}

// readLoop reads frames and handles them until the connection ends, and
// returns why. The server first reads the client preface; the preface,
// the client's SETTINGS and its first HEADERS must all come before
// cfg.handshakeDeadline (a read deadline until then). The reader never
// writes: what it queues goes to the writer goroutine.
func (c *h2Conn) readLoop() error {
	handshaking := !c.cfg.client && !c.cfg.handshakeDeadline.IsZero()
	if !c.cfg.client {
		c.tc.SetReadDeadline(c.cfg.handshakeDeadline)
		preface := make([]byte, len(http2.ClientPreface))
		if _, err := io.ReadFull(c.tc, preface); err != nil {
			return fmt.Errorf("hbone: reading the HTTP/2 preface: %w", err)
		}
		if !bytes.Equal(preface, []byte(http2.ClientPreface)) {
			return errors.New("hbone: peer did not send the HTTP/2 preface")
		}
	}
	fr := newH2ReadFramer(c.tc, c.cfg.maxHeaderList, h2MaxFrame)
	for first := true; ; first = false {
		f, err := h2readFrame(fr, first)
		if se, ok := err.(http2.StreamError); ok {
			err = c.onStreamError(se)
		} else if err == nil {
			c.lastRead.Store(time.Now().UnixNano())
			err = c.handle(f)
		}
		if handshaking && err != nil && isTimeout(err) {
			c.handshakeExpired.Store(true)
			return fmt.Errorf("hbone: no request within the handshake timeout: %w", errHandshakeTimeout)
		}
		if err != nil {
			return err
		}
		if handshaking && c.openedByPeer() {
			c.tc.SetReadDeadline(time.Time{})
			handshaking = false
		}
		if c.wqLen.Load() > 0 {
			c.kick()
		}
	}
}

// errHandshakeTimeout is why a server connection ends whose client did not
// send its preface, SETTINGS and first request in time.
var errHandshakeTimeout = errors.New("handshake timeout")

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// openedByPeer reports whether the peer has opened a stream (or tried to:
// a refused one counts).
func (c *h2Conn) openedByPeer() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastPeerID != 0
}
