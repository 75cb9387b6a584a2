package hbone

import (
	"net"
	"sync"

	"github.com/meshtun/meshtun/internal/rawsock"
)

// batchConn sits under crypto/tls on both sides (the pool's connections and
// the server's) and cuts the syscalls per byte:
//
//   - Writes: crypto/tls makes one record (at most 16 KiB of plaintext) per
//     Write to the conn under it, i.e. one write(2) per record. Between
//     cork and uncork, batchConn gathers the records and writes them at
//     once (every batchWriteMax bytes, and at uncork). The callers cork
//     around one write of their own: a flush of the HTTP/2 writer, which
//     then costs one syscall instead of one per 16 KiB.
//   - Reads: crypto/tls asks for a little more than one record at a time.
//     When the caller's buffer is small, batchConn reads up to
//     batchReadMax bytes into a pooled buffer and serves the next Reads
//     from it, giving the buffer back as soon as it is drained, so an idle
//     connection holds none.
//
// Syscalls cost ≈ 1.1 µs on these machines (docs/field-notes.md, "The machine"), ten times
// bare metal, and loopback TCP does a whole send path per write.
//
// A kernel TCP connection under it reads and writes with raw system calls
// (internal/rawsock): each Read here follows a wake-up from the poller,
// and the ordinary call would wake the runtime's monitor thread too.
type batchConn struct {
	net.Conn

	wmu    sync.Mutex
	corked bool
	wbuf   *[]byte // gathered records while corked; from batchBufs

	// Read side: crypto/tls reads from one goroutine at a time (its input
	// lock), so no lock here.
	rbuf   *[]byte // from batchBufs while it holds unread bytes
	rd, rn int     // unread bytes are (*rbuf)[rd:rn]
}

const (
	// batchWriteMax bounds what a corked batchConn gathers before writing.
	// 512 KiB takes one of our largest DATA frames (h2SendFrameMax, the
	// relay's 256 KiB copy buffer) with its records' overhead and the
	// frames queued before it (256 KiB split it in two) in one write(2).
	batchWriteMax = 512 << 10
	// batchReadMax is the most one read(2) asks for when crypto/tls
	// offers a small buffer.
	batchReadMax = 256 << 10
	// batchReadDirect: a caller's buffer this large is read into
	// directly, with no copy.
	batchReadDirect = 64 << 10
)

// batchBufs holds the write and read buffers of every batchConn; a
// buffer is taken only while bytes are in it.
var batchBufs = sync.Pool{New: func() any {
	b := make([]byte, 0, max(batchWriteMax+tlsRecordMax, batchReadMax))
	return &b
}}

// tlsRecordMax is the largest TLS 1.3 record on the wire: 16 KiB of
// plaintext, the content type, a 16-byte tag, 5 bytes of header, and up to
// 256 bytes of padding allowed by the RFC.
const tlsRecordMax = 16<<10 + 1 + 16 + 5 + 256

func newBatchConn(c net.Conn) *batchConn { return &batchConn{Conn: rawsock.Wrap(c)} }

// cork starts gathering writes; uncork writes what was gathered and
// stops gathering.
func (c *batchConn) cork() {
	c.wmu.Lock()
	c.corked = true
	c.wmu.Unlock()
}

func (c *batchConn) uncork() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.corked = false
	return c.flushLocked()
}

func (c *batchConn) flushLocked() error {
	if c.wbuf == nil {
		return nil
	}
	b := *c.wbuf
	_, err := c.Conn.Write(b)
	*c.wbuf = b[:0]
	batchBufs.Put(c.wbuf)
	c.wbuf = nil
	return err
}

func (c *batchConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if !c.corked {
		if err := c.flushLocked(); err != nil {
			return 0, err
		}
		return c.Conn.Write(p)
	}
	if c.wbuf != nil && len(*c.wbuf)+len(p) > batchWriteMax {
		if err := c.flushLocked(); err != nil {
			return 0, err
		}
	}
	if c.wbuf == nil {
		if len(p) >= batchWriteMax {
			return c.Conn.Write(p)
		}
		c.wbuf = batchBufs.Get().(*[]byte)
	}
	*c.wbuf = append(*c.wbuf, p...)
	return len(p), nil
}

func (c *batchConn) Read(p []byte) (int, error) {
	if c.rbuf == nil {
		if len(p) >= batchReadDirect {
			return c.Conn.Read(p)
		}
		c.rbuf = batchBufs.Get().(*[]byte)
		b := (*c.rbuf)[:cap(*c.rbuf)]
		n, err := c.Conn.Read(b[:min(len(b), batchReadMax)])
		if n == 0 {
			c.putRead()
			return 0, err
		}
		c.rd, c.rn = 0, n
		// err, if any, comes back on the Read after the buffer drained.
	}
	b := (*c.rbuf)[:cap(*c.rbuf)]
	n := copy(p, b[c.rd:c.rn])
	c.rd += n
	if c.rd == c.rn {
		c.putRead()
	}
	return n, nil
}

func (c *batchConn) putRead() {
	*c.rbuf = (*c.rbuf)[:0]
	batchBufs.Put(c.rbuf)
	c.rbuf = nil
}
