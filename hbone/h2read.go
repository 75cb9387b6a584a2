package hbone

import (
	"errors"
	"io"
	"sync/atomic"
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

// h2peer is one side's handling of the frames it reads. A returned error
// ends the connection (an *h2connError with GOAWAY).
type h2peer interface {
	onData(*http2.DataFrame) error
	onHeaders(*http2.MetaHeadersFrame) error
	onWindowUpdate(*http2.WindowUpdateFrame) error
	onRSTStream(*http2.RSTStreamFrame) error
	onSettings(*http2.SettingsFrame) error
	onPing(*http2.PingFrame) error // not an ACK
	onGoAway(*http2.GoAwayFrame) error
	onStreamError(http2.StreamError) error
}

// h2readFrames reads frames and hands them to p until the connection
// ends, and returns why. lastRead gets the time of each frame read (the
// keepalive's measure of the peer's silence).
func h2readFrames(fr *http2.Framer, p h2peer, lastRead *atomic.Int64) error {
	for first := true; ; first = false {
		f, err := h2readFrame(fr, first)
		if se, ok := err.(http2.StreamError); ok {
			if err := p.onStreamError(se); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		lastRead.Store(time.Now().UnixNano())
		switch f := f.(type) {
		case *http2.DataFrame:
			err = p.onData(f)
		case *http2.MetaHeadersFrame:
			err = p.onHeaders(f)
		case *http2.WindowUpdateFrame:
			err = p.onWindowUpdate(f)
		case *http2.RSTStreamFrame:
			err = p.onRSTStream(f)
		case *http2.SettingsFrame:
			err = p.onSettings(f)
		case *http2.PingFrame:
			if !f.IsAck() { // an ACK: lastRead already says the peer is alive
				err = p.onPing(f)
			}
		case *http2.GoAwayFrame:
			err = p.onGoAway(f)
		case *http2.PushPromiseFrame:
			// Clients never push, and our client disables push.
			err = h2connErr(http2.ErrCodeProtocol, "PUSH_PROMISE (push is disabled)")
		default:
			// PRIORITY, PRIORITY_UPDATE, unknown types: ignored.
		}
		if err != nil {
			return err
		}
	}
}
