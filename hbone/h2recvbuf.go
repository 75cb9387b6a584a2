package hbone

import (
	"io"
	"net"
	"sync"
)

// h2RecvBuf holds a stream's received DATA until the handler reads it, in
// pooled chunks: the read loop copies each payload out of the Framer's
// buffer into the free end of the last chunk, and Read gives a chunk back
// to the pool as soon as it is drained. It replaced one allocation per
// DATA frame (up to 1 MiB each, and the GC cycles they caused) with
// reused memory; a stream holds chunks only while unread bytes are in
// them. Guarded by h2Conn.mu.
type h2RecvBuf struct {
	chunks []*[]byte // each from h2Chunks, len = bytes written into it
	off    int       // bytes of chunks[0] already read
	n      int       // unread bytes
}

// h2ChunkSize is the pooled chunk: large enough that a 1 MiB frame takes
// 16 of them, small enough that a stream with a few bytes waiting does
// not pin much.
const h2ChunkSize = 64 << 10

var h2Chunks = sync.Pool{New: func() any {
	b := make([]byte, 0, h2ChunkSize)
	return &b
}}

// write appends p.
func (b *h2RecvBuf) write(p []byte) {
	b.n += len(p)
	for len(p) > 0 {
		if len(b.chunks) > 0 {
			last := b.chunks[len(b.chunks)-1]
			if free := cap(*last) - len(*last); free > 0 {
				k := min(free, len(p))
				*last = append(*last, p[:k]...)
				p = p[k:]
				continue
			}
		}
		b.chunks = append(b.chunks, h2Chunks.Get().(*[]byte))
	}
}

// read moves up to len(p) unread bytes into p.
func (b *h2RecvBuf) read(p []byte) int {
	n := 0
	for n < len(p) && len(b.chunks) > 0 {
		c := b.chunks[0]
		k := copy(p[n:], (*c)[b.off:])
		n += k
		b.off += k
		if b.off == len(*c) {
			// Drained; the last chunk too, even if not full, so that an
			// idle stream holds nothing.
			b.putFirst()
		}
	}
	b.n -= n
	return n
}

func (b *h2RecvBuf) putFirst() {
	c := b.chunks[0]
	*c = (*c)[:0]
	h2Chunks.Put(c)
	b.chunks[0] = nil
	b.chunks = b.chunks[1:]
	b.off = 0
	if len(b.chunks) == 0 {
		b.chunks = nil // let the backing array go
	}
}

// reset drops every unread byte and returns how many there were.
func (b *h2RecvBuf) reset() int {
	n := b.n
	for len(b.chunks) > 0 {
		b.putFirst()
	}
	b.n = 0
	return n
}

// h2TakeChunks is how many chunks one take hands out at most (256 KiB,
// the relay's copy buffer): what a stream's reader holds outside the
// buffer while it writes them.
const h2TakeChunks = 4

// recvTake is chunks taken out of a h2RecvBuf: written out by the reader
// without the connection's lock, then given back to the pool.
type recvTake struct {
	chunks [h2TakeChunks]*[]byte
	k      int // chunks in use
	off    int // bytes of chunks[0] already read before the take
}

// take moves up to h2TakeChunks whole chunks from the front into t and
// returns the unread bytes they hold. The last chunk goes too even if the
// read loop is still filling it: it starts a fresh one for the next
// payload, so an idle stream holds nothing.
func (b *h2RecvBuf) take(t *recvTake) int {
	n := 0
	t.off = b.off
	for t.k < h2TakeChunks && len(b.chunks) > 0 {
		c := b.chunks[0]
		n += len(*c) - b.off
		b.off = 0
		t.chunks[t.k] = c
		t.k++
		b.chunks[0] = nil
		b.chunks = b.chunks[1:]
	}
	if len(b.chunks) == 0 {
		b.chunks = nil
	}
	b.n -= n
	return n
}

// writeTo writes the taken bytes to w in order, one Write per chunk (a
// writev where w takes net.Buffers), and gives every chunk back to the pool
// whatever the outcome. An io.EOF from w is reported as
// io.ErrUnexpectedEOF, so that callers can tell it from the stream's end.
func (t *recvTake) writeTo(w io.Writer) (int64, error) {
	var arr [h2TakeChunks][]byte
	bufs := arr[:0]
	for i, c := range t.chunks[:t.k] {
		p := *c
		if i == 0 {
			p = p[t.off:]
		}
		if len(p) > 0 {
			bufs = append(bufs, p)
		}
	}
	var (
		n   int64
		err error
	)
	if len(bufs) == 1 {
		var k int
		k, err = w.Write(bufs[0])
		n = int64(k)
	} else if len(bufs) > 1 {
		nb := net.Buffers(bufs)
		n, err = nb.WriteTo(w)
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	for i, c := range t.chunks[:t.k] {
		*c = (*c)[:0]
		h2Chunks.Put(c)
		t.chunks[i] = nil
	}
	t.k, t.off = 0, 0
	return n, err
}
