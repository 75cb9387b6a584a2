package hbone

// The write model, both sides. One lock, h2Conn.wmu, owns the output.
// A stream's Write takes it and writes its DATA straight from the
// caller's buffer; every other frame (HEADERS, RST_STREAM, WINDOW_UPDATE,
// SETTINGS and their ACKs, PING, GOAWAY) is queued under h2Conn.mu and
// written by the next holder of wmu, which writes the whole queue before
// its own frame and flushes once: the records leave in one write(2)
// (h2batch.go). Who takes wmu for the queue:
//
//   - a Write, Read, Close or CONNECT of a stream, right away if wmu is
//     free (TryLock; no goroutine hand-off on the request's path);
//   - else whoever holds wmu, before it lets go (unlockWrite);
//   - the writer goroutine (writeLoop), woken for the frames the reader
//     queues: the reader never writes, so it keeps reading (and crediting)
//     while a peer that does not read holds our writes up.
//
// A peer that provokes frames (PINGs, SETTINGS, bad streams) faster than
// it reads our answers fills the queue up to h2MaxQueuedControl and gets
// ENHANCE_YOUR_CALM. Every flush has a write deadline (h2WriteTimeout).

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"strconv"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2kind is a queued frame's type.
type h2kind uint8

const (
	h2Headers      h2kind = iota // HEADERS (+ CONTINUATION): a request's fields, or a response's :status
	h2RST                        // RST_STREAM
	h2Settings                   // our first frames: the client preface, SETTINGS, the connection window
	h2SettingsAck                // SETTINGS ACK (and a new HPACK table size)
	h2Ping                       // PING or PING ACK
	h2GoAway                     // GOAWAY
	h2WindowUpdate               // WINDOW_UPDATE
)

// h2frame is one queued frame.
type h2frame struct {
	kind     h2kind
	streamID uint32
	end      bool                // END_STREAM (HEADERS) or ACK (PING)
	status   int                 // HEADERS without fields: the response's :status
	fields   []hpack.HeaderField // HEADERS: a request's header list
	code     http2.ErrCode       // RST_STREAM, GOAWAY
	n        uint32              // WINDOW_UPDATE increment, GOAWAY last stream, HPACK table size
	hasN     bool                // SETTINGS ACK: n is the peer's new HEADER_TABLE_SIZE
	ping     [8]byte             // PING
}

// h2bufSize is the bufio.Writer in front of the TLS conn: crypto/tls
// writes one record per Write, so small frames written together
// (WINDOW_UPDATEs, HEADERS, short DATA) make one record.
const h2bufSize = 64 << 10

// frameHeaderLen is the size of an HTTP/2 frame header (RFC 9113 §4.1).
const frameHeaderLen = 9

// queueLocked queues f for the next holder of wmu; false if the
// connection is torn down. The caller holds c.mu, and after unlocking
// it calls writeQueued (or, on the reader, leaves it to the writer).
func (c *h2Conn) queueLocked(f h2frame) bool {
	if c.closed {
		return false
	}
	c.wq = append(c.wq, f)
	c.wqLen.Store(int32(len(c.wq)))
	c.wqControl++
	return true
}

// queueControlLocked queues a frame the peer provoked (ACKs, refusals).
// A peer that provokes one while h2MaxQueuedControl frames wait (its
// side is not reading ours) gets a connection error.
func (c *h2Conn) queueControlLocked(f h2frame) error {
	if err := c.controlBudgetLocked(); err != nil {
		return err
	}
	c.queueLocked(f)
	return nil
}

func (c *h2Conn) controlBudgetLocked() error {
	if c.wqControl >= h2MaxQueuedControl {
		return h2connErr(http2.ErrCodeEnhanceYourCalm, "too many control frames queued; peer is not reading")
	}
	return nil
}

// kick wakes the writer goroutine; it never blocks.
func (c *h2Conn) kick() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// writeQueued writes the queue now if nobody holds wmu; otherwise its
// holder does, before letting go.
func (c *h2Conn) writeQueued() {
	if c.wqLen.Load() > 0 && c.wmu.TryLock() {
		c.flushLocked(nil)
		c.unlockWrite()
	}
}

// unlockWrite lets go of wmu; frames queued after the holder took the
// queue go to the writer goroutine.
func (c *h2Conn) unlockWrite() {
	c.wmu.Unlock()
	if c.wqLen.Load() > 0 {
		c.kick()
	}
}

// h2out is the connection's output: the bufio.Writer and Framer in front
// of TLS and the HPACK encoder. Owned by the holder of h2Conn.wmu.
type h2out struct {
	bw             *bufio.Writer
	fr             *http2.Framer
	hbuf           bytes.Buffer
	henc           *hpack.Encoder
	werr           error // the first write error; every later write fails with it
	closeWriteDone bool  // close_notify sent
}

func (o *h2out) init(w interface{ Write([]byte) (int, error) }) {
	o.bw = bufio.NewWriterSize(w, h2bufSize)
	o.fr = http2.NewFramer(o.bw, nil)
	o.henc = hpack.NewEncoder(&o.hbuf)
}

// writeData writes a DATA frame straight into bw: the Framer would first
// copy the whole payload into a buffer of its own, while bw copies at
// most its free space and passes the rest through.
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

// flushLocked writes, under wmu, the queued frames and then what fn
// writes (fn may be nil), and flushes: their records leave in one
// write(2). After a write error the socket is closed (the reader then
// tears down) and every later call fails with that error.
func (c *h2Conn) flushLocked(fn func(o *h2out) error) error {
	o := &c.out
	c.mu.Lock()
	batch := c.wq
	c.wq = c.spare[:0]
	c.wqControl = 0
	c.wqLen.Store(0)
	closeWrite := c.closeWrite
	maxFrame := int(c.peerMaxFrame)
	c.mu.Unlock()
	if o.werr == nil && (len(batch) > 0 || fn != nil) {
		c.setWriteDeadline()
		c.bc.cork()
		var err error
		for i := range batch {
			if err = c.writeFrame(o, &batch[i], maxFrame); err != nil {
				break
			}
		}
		if err == nil && fn != nil {
			err = fn(o)
		}
		if err == nil {
			err = o.bw.Flush()
		}
		if uerr := c.bc.uncork(); err == nil {
			err = uerr
		}
		if err != nil {
			o.werr = fmt.Errorf("hbone: HBONE connection write: %w", err)
			c.log.Debug("write failed, closing", "error", err)
			c.bc.Close() // the TLS state is unusable; the reader tears down
		}
	}
	clear(batch)
	c.spare = batch[:0]
	if closeWrite && !o.closeWriteDone && o.werr == nil {
		// The graceful end after GOAWAY: close_notify, then the reader
		// gets a little time to see the peer close its side.
		o.closeWriteDone = true
		if cw, ok := c.tc.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
		c.tc.SetReadDeadline(time.Now().Add(h2DrainTimeout))
	}
	return o.werr
}

// setWriteDeadline bounds the next flush; shorter once the connection is
// being torn down, so a peer that stopped reading cannot delay the end.
func (c *h2Conn) setWriteDeadline() {
	c.tc.SetWriteDeadline(time.Now().Add(h2WriteTimeout))
	if c.tearing.Load() {
		// teardown may have set its deadline between our check and ours.
		c.tc.SetWriteDeadline(time.Now().Add(h2DrainTimeout))
	}
}

// writeFrame writes one queued frame into o (not flushed).
func (c *h2Conn) writeFrame(o *h2out, f *h2frame, maxFrame int) error {
	fr := o.fr
	switch f.kind {
	case h2Headers:
		o.hbuf.Reset()
		if f.fields == nil {
			o.henc.WriteField(hpack.HeaderField{Name: ":status", Value: strconv.Itoa(f.status)})
		}
		for _, hf := range f.fields {
			o.henc.WriteField(hf)
		}
		block := o.hbuf.Bytes()
		first := block[:min(len(block), maxFrame)]
		block = block[len(first):]
		err := fr.WriteHeaders(http2.HeadersFrameParam{
			StreamID: f.streamID, BlockFragment: first, EndStream: f.end, EndHeaders: len(block) == 0,
		})
		for err == nil && len(block) > 0 {
			frag := block[:min(len(block), maxFrame)]
			block = block[len(frag):]
			err = fr.WriteContinuation(f.streamID, len(block) == 0, frag)
		}
		return err
	case h2RST:
		return fr.WriteRSTStream(f.streamID, f.code)
	case h2Settings:
		if c.cfg.client {
			if _, err := o.bw.WriteString(http2.ClientPreface); err != nil {
				return err
			}
		}
		if err := fr.WriteSettings(c.settings()...); err != nil {
			return err
		}
		return fr.WriteWindowUpdate(0, h2ConnWindow-h2DefaultWindow)
	case h2SettingsAck:
		if f.hasN {
			o.henc.SetMaxDynamicTableSizeLimit(f.n)
		}
		return fr.WriteSettingsAck()
	case h2Ping:
		return fr.WritePing(f.end, f.ping)
	case h2GoAway:
		return fr.WriteGoAway(f.n, f.code, nil)
	case h2WindowUpdate:
		return fr.WriteWindowUpdate(f.streamID, f.n)
	}
	return nil
}

// h2pingData is what our keepalive PINGs carry.
var h2pingData = [8]byte{'m', 'e', 's', 'h', 't', 'u', 'n', 0}

// writeLoop is the connection's writer goroutine: it writes what the
// reader queued (and what was queued while wmu was taken), and runs the
// keepalive: a PING after cfg.pingAfter of read silence, the connection
// dropped if nothing at all is read within cfg.pingTimeout of it. At
// teardown (stop) it writes what is left, within the drain deadline, and
// returns.
func (c *h2Conn) writeLoop() {
	defer close(c.writerDone)
	t := time.NewTimer(c.cfg.pingAfter)
	defer t.Stop()
	var pingSent time.Time
	for {
		select {
		case <-c.stop:
			c.wmu.Lock()
			c.flushLocked(nil)
			c.wmu.Unlock()
			return
		case <-c.wake:
		case now := <-t.C:
			next, ping, dead := c.keepalive(&pingSent, now)
			if dead {
				c.log.Warn("HBONE peer did not answer PING, closing the connection", "timeout", c.cfg.pingTimeout)
				c.bc.Close()
				continue // the reader tears down and stops us
			}
			t.Reset(next)
			if !ping {
				continue
			}
			c.mu.Lock()
			c.queueLocked(h2frame{kind: h2Ping, ping: h2pingData})
			c.mu.Unlock()
		}
		c.wmu.Lock()
		c.flushLocked(nil)
		c.unlockWrite()
	}
}

// keepalive decides, at a tick, whether to PING now (ping), to give up on
// the peer (dead), and when to tick next. pingSent is the last PING not
// yet followed by a frame read.
func (c *h2Conn) keepalive(pingSent *time.Time, now time.Time) (next time.Duration, ping, dead bool) {
	last := time.Unix(0, c.lastRead.Load())
	if !pingSent.IsZero() {
		if !last.After(*pingSent) {
			if wait := pingSent.Add(c.cfg.pingTimeout).Sub(now); wait > 0 {
				return wait, false, false
			}
			return 0, false, true
		}
		*pingSent = time.Time{}
	}
	if idle := now.Sub(last); idle < c.cfg.pingAfter {
		return c.cfg.pingAfter - idle, false, false
	}
	*pingSent = now
	return c.cfg.pingTimeout, true, false
}
