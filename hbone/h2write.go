package hbone

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"strconv"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2kind is what the writer goroutine is asked to send.
type h2kind uint8

const (
	h2Data         h2kind = iota // DATA (maybe empty, with END_STREAM)
	h2Headers                    // HEADERS :status
	h2RST                        // RST_STREAM
	h2Preface                    // our SETTINGS, then WINDOW_UPDATE on stream 0
	h2SettingsAck                // SETTINGS ACK (and a new HPACK table size)
	h2Ping                       // PING or PING ACK
	h2GoAway                     // GOAWAY
	h2WindowUpdate               // WINDOW_UPDATE
)

// h2frame is one frame queued to the writer. DATA frames point into the
// caller's buffer: the writer signals done once the frame is in the
// bufio.Writer, and only then does Write return and release the buffer.
type h2frame struct {
	kind     h2kind
	streamID uint32
	st       *ServerStream // DATA only: skipped once the stream is reset
	data     []byte
	end      bool // END_STREAM (DATA, HEADERS) or ACK (PING)
	status   int
	code     http2.ErrCode
	n        uint32 // WINDOW_UPDATE increment, GOAWAY last stream, HPACK table size
	hasN     bool   // SETTINGS ACK: n is the peer's new HEADER_TABLE_SIZE
	ping     [8]byte
	done     chan<- error // DATA: result, exactly once
}

// h2bufSize is the bufio.Writer in front of the TLS conn: crypto/tls
// writes one record (and one syscall) per Write, so small frames queued
// together (WINDOW_UPDATEs, HEADERS, short DATA) leave in one flush.
const h2bufSize = 64 << 10

// h2drainTimeout bounds writing the last frames (GOAWAY) of a connection
// that is being torn down.
const h2drainTimeout = time.Second

// queueLocked hands f to the writer; false if the connection is closed
// (then f.done is not signalled). The caller holds c.mu.
func (c *srvConn) queueLocked(f h2frame) bool {
	if c.closed {
		return false
	}
	c.wq = append(c.wq, f)
	if f.kind != h2Data {
		c.wqControl++
	}
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return true
}

// queueControlLocked queues a frame the peer provoked (ACKs, refusals). A
// peer that provokes more than srvMaxQueuedControl of them without reading
// our side gets a connection error.
func (c *srvConn) queueControlLocked(f h2frame) error {
	if err := c.controlBudgetLocked(); err != nil {
		return err
	}
	c.queueLocked(f)
	return nil
}

func (c *srvConn) controlBudgetLocked() error {
	if c.wqControl >= srvMaxQueuedControl {
		return h2connErr(http2.ErrCodeEnhanceYourCalm, "too many control frames queued; peer is not reading")
	}
	return nil
}

// h2out is the connection's output: the bufio.Writer and Framer in front
// of TLS and the HPACK encoder. One goroutine at a time uses it: the one
// that set srvConn.writing (the writer loop, or a stream's Write taking
// the direct path).
type h2out struct {
	bw     *bufio.Writer
	fr     *http2.Framer
	hbuf   bytes.Buffer
	henc   *hpack.Encoder
	werr   error // the first write error; every later frame fails with it
	corked bool  // c.bc gathers records until the next flush
}

// writeData writes a DATA frame straight into bw: the Framer would first
// copy the whole payload (up to 1 MiB) into a buffer of its own, while
// bw copies at most its free space and passes the rest through.
func (o *h2out) writeData(streamID uint32, end bool, data []byte) error {
	var hdr [frameHeaderLen]byte
	n := len(data)
	hdr[0], hdr[1], hdr[2] = byte(n>>16), byte(n>>8), byte(n)
	hdr[3] = 0x0 // DATA
	if end {
		hdr[4] = 0x1 // END_STREAM
	}
	binary.BigEndian.PutUint32(hdr[5:], streamID&(1<<31-1))
	if _, err := o.bw.Write(hdr[:]); err != nil {
		return err
	}
	_, err := o.bw.Write(data)
	return err
}

func (c *srvConn) initOut() {
	o := &c.out
	o.bw = bufio.NewWriterSize(c.tc, h2bufSize)
	o.fr = http2.NewFramer(o.bw, nil)
	o.henc = hpack.NewEncoder(&o.hbuf)
}

// h2writeLoop writes what is queued. It takes the whole queue at once,
// writes it through a bufio.Writer and flushes when the queue is empty.
// After a write error it keeps failing DATA frames until the connection
// is torn down. It returns when draining and the queue is empty.
//
// It shares the output with ServerStream.Write's direct path: whoever
// sets c.writing (under c.mu) owns c.out until it clears it, and the
// direct path is taken only when the queue is empty and nobody writes,
// so frames keep their order.
func (c *srvConn) h2writeLoop() {
	defer close(c.writerDone)
	var batch []h2frame
	holding := false // we set c.writing
	for {
		c.mu.Lock()
		if c.writing && !holding {
			// A direct write is in progress; it wakes us when it is done
			// if anything was queued meanwhile or the connection drains.
			c.mu.Unlock()
			<-c.wake
			continue
		}
		batch, c.wq = c.wq, batch[:0]
		c.wqControl = 0
		draining, closeWrite := c.draining, c.closeWhenFlushed
		c.writing, holding = true, true
		c.mu.Unlock()

		if len(batch) == 0 {
			c.h2flush()
			c.mu.Lock()
			more := len(c.wq) > 0
			if !more {
				c.writing, holding = false, false
			}
			c.mu.Unlock()
			if more {
				continue
			}
			if draining {
				return
			}
			if closeWrite && c.out.werr == nil {
				c.h2closeWrite()
			}
			select {
			case <-c.wake:
			case <-c.drain:
			}
			continue
		}
		for i := range batch {
			f := &batch[i]
			err := c.h2writeFrame(f)
			if f.done != nil {
				f.done <- err
			}
			batch[i] = h2frame{} // drop the reference to the caller's buffer
		}
	}
}

// h2writeFrame writes f into c.out (not flushed) and returns f's result.
// The caller owns c.out.
func (c *srvConn) h2writeFrame(f *h2frame) error {
	o := &c.out
	if o.werr != nil {
		return o.werr
	}
	if !o.corked && c.bc != nil {
		// The records of what is written until the flush leave together.
		o.corked = true
		c.bc.cork()
	}
	err := c.h2write(o.fr, o.henc, &o.hbuf, f)
	if se, ok := err.(*h2streamErr); ok {
		return se.err // only this frame's stream is done
	}
	o.werr = err
	return err
}

// h2flush sends what c.out holds. The caller owns c.out.
func (c *srvConn) h2flush() error {
	o := &c.out
	if o.werr == nil && o.bw.Buffered() > 0 {
		c.h2deadline()
		o.werr = o.bw.Flush()
		c.h2writeFailed(o.werr)
	}
	if o.corked {
		o.corked = false
		if err := c.bc.uncork(); o.werr == nil && err != nil {
			o.werr = err
			c.h2writeFailed(err)
		}
	}
	return o.werr
}

// h2writeDirect writes and flushes f from the calling goroutine, which
// set c.writing, then gives the output back and wakes the writer loop if
// frames were queued meanwhile. It saves a hand-off to the writer and
// back per DATA frame: on a 64 B request/response, two of the few
// goroutine switches of a round trip.
func (c *srvConn) h2writeDirect(f *h2frame) error {
	err := c.h2writeFrame(f)
	if ferr := c.h2flush(); err == nil {
		err = ferr
	}
	c.mu.Lock()
	c.writing = false
	if len(c.wq) > 0 || c.draining {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
	c.mu.Unlock()
	return err
}

// h2write writes one frame. A DATA frame of a stream the peer reset is
// not sent: its error is the stream's and the connection stays healthy.
// (DATA queued before our own RST_STREAM is sent: it precedes the RST,
// and an END_STREAM queued by CloseWrite must not be lost to a Close.)
func (c *srvConn) h2write(fr *http2.Framer, henc *hpack.Encoder, hbuf *bytes.Buffer, f *h2frame) error {
	if f.kind == h2Data {
		c.mu.Lock()
		skip, serr := f.st.noSend, f.st.werr
		c.mu.Unlock()
		if skip {
			if serr == nil {
				serr = errSrvStreamClosed
			}
			return &h2streamErr{serr}
		}
	}
	c.h2deadline()
	var err error
	switch f.kind {
	case h2Data:
		err = c.out.writeData(f.streamID, f.end, f.data)
	case h2Headers:
		hbuf.Reset()
		henc.WriteField(hpack.HeaderField{Name: ":status", Value: strconv.Itoa(f.status)})
		err = fr.WriteHeaders(http2.HeadersFrameParam{
			StreamID:      f.streamID,
			BlockFragment: hbuf.Bytes(),
			EndStream:     f.end,
			EndHeaders:    true,
		})
	case h2RST:
		err = fr.WriteRSTStream(f.streamID, f.code)
	case h2Preface:
		err = fr.WriteSettings(c.srv.h2settings()...)
		if err == nil {
			err = fr.WriteWindowUpdate(0, srvConnWindow-h2defaultWindow)
		}
	case h2SettingsAck:
		if f.hasN {
			henc.SetMaxDynamicTableSizeLimit(f.n)
		}
		err = fr.WriteSettingsAck()
	case h2Ping:
		err = fr.WritePing(f.end, f.ping)
	case h2GoAway:
		err = fr.WriteGoAway(f.n, f.code, nil)
	case h2WindowUpdate:
		err = fr.WriteWindowUpdate(f.streamID, f.n)
	}
	if err != nil {
		c.h2writeFailed(err)
	}
	return err
}

// h2streamErr is a DATA frame that was not written because its stream
// ended; it does not break the connection.
type h2streamErr struct{ err error }

func (e *h2streamErr) Error() string { return e.err.Error() }
func (e *h2streamErr) Unwrap() error { return e.err }

// h2deadline bounds the next write; shorter once the connection is being
// torn down, so a peer that stopped reading cannot delay the end.
func (c *srvConn) h2deadline() {
	d := srvWriteTimeout
	select {
	case <-c.drain:
		d = h2drainTimeout
	default:
	}
	c.tc.SetWriteDeadline(time.Now().Add(d))
}

// h2writeFailed closes the connection after a write error: the TLS state
// is unusable, and the read loop must notice and tear everything down.
func (c *srvConn) h2writeFailed(err error) {
	if err == nil {
		return
	}
	if _, ok := err.(*h2streamErr); ok {
		return
	}
	c.log.Debug("write failed, closing", "error", err)
	c.raw.Close()
}

// h2closeWrite ends a connection gracefully after GOAWAY once no stream is
// left: close_notify and FIN, then the reader gets a little time to see
// the peer close its side.
func (c *srvConn) h2closeWrite() {
	c.mu.Lock()
	done := c.closeWriteDone
	c.closeWriteDone = true
	c.mu.Unlock()
	if done {
		return
	}
	c.tc.CloseWrite()
	c.tc.SetReadDeadline(time.Now().Add(h2drainTimeout))
}

// h2defaultWindow is HTTP/2's initial window before SETTINGS (RFC 9113 §6.9.2).
const h2defaultWindow = 65535

// h2maxWindow is the largest legal flow-control window.
const h2maxWindow = 1<<31 - 1

// h2settings are the settings we announce (hbone-wire.md).
func (s *Server) h2settings() []http2.Setting {
	return []http2.Setting{
		{ID: http2.SettingEnablePush, Val: 0},
		{ID: http2.SettingMaxConcurrentStreams, Val: s.opts.MaxConcurrentStreams},
		{ID: http2.SettingInitialWindowSize, Val: srvStreamWindow},
		{ID: http2.SettingMaxFrameSize, Val: srvMaxFrameSize},
		{ID: http2.SettingMaxHeaderListSize, Val: srvMaxHeaderList},
	}
}

// frameHeaderLen is the size of an HTTP/2 frame header (RFC 9113 §4.1).
const frameHeaderLen = 9
