package gateway

import (
	"io"
	"net"
	"sync"
)

// conn is one side of a proxied connection: a TCP connection (kernel or
// netstack) or an HBONE stream.
type conn interface {
	io.Reader
	io.Writer
	// CloseWrite ends our write side: a FIN on TCP, END_STREAM on HBONE.
	CloseWrite() error
	// Close releases everything.
	Close() error
}

// resetter is the optional ability to end a connection abnormally: a RST on
// TCP, RST_STREAM on HBONE. Without it, Close is used.
type resetter interface {
	Reset() error
}

// relayBufSize is the copy buffer of one direction. gVisor's segment size
// out of the stack follows the size of our writes (field-notes.md: 256 KiB
// buffers gave ≈ 48 KB segments, 32 KiB ≈ 16–28 KB), and HTTP/2 DATA frames
// are up to 1 MiB, so large buffers mean fewer, larger writes. They are
// pooled and held only while a copy runs.
const relayBufSize = 256 << 10

var relayBufs = sync.Pool{New: func() any { b := make([]byte, relayBufSize); return &b }}

// relayResult is what one relay did.
type relayResult struct {
	// AToB and BToA count the bytes that were written to the other side.
	AToB, BToA int64
	// Err is the first abnormal end (a reset, a failed write); nil when both
	// directions ended with a clean EOF.
	Err error
}

// relay copies a → b and b → a until both directions are done, keeping TCP
// half-close intact: an EOF read from one side becomes CloseWrite on the
// other, and the opposite direction keeps flowing. An error in either
// direction resets both sides (so a RST on one end becomes a RST, or a
// stream reset, on the other) and ends the relay. Both sides are closed
// when relay returns. This is the only place half-close is handled; the
// inbound and the outbound paths both use it.
func relay(a, b conn) relayResult {
	var (
		res  relayResult
		once sync.Once
		wg   sync.WaitGroup
	)
	// The first error is the cause; the other direction then fails only
	// because abort closed its connections.
	abort := func(err error) {
		once.Do(func() {
			res.Err = err
			reset(a)
			reset(b)
		})
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		var err error
		if res.AToB, err = copyHalf(b, a); err != nil {
			abort(err)
		}
	}()
	var err error
	if res.BToA, err = copyHalf(a, b); err != nil {
		abort(err)
	}
	wg.Wait()
	a.Close()
	b.Close()
	return res
}

// copyHalf copies src to dst until src's EOF, then ends dst's write side.
func copyHalf(dst, src conn) (int64, error) {
	bp := relayBufs.Get().(*[]byte)
	defer relayBufs.Put(bp)
	buf := *bp
	var n int64
	for {
		nr, rerr := src.Read(buf)
		if nr > 0 {
			nw, werr := dst.Write(buf[:nr])
			n += int64(nw)
			if werr != nil {
				return n, werr
			}
		}
		if rerr == io.EOF {
			return n, dst.CloseWrite()
		}
		if rerr != nil {
			return n, rerr
		}
	}
}

func reset(c conn) {
	if r, ok := c.(resetter); ok {
		r.Reset()
		return
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0) // Close then sends a RST
	}
	c.Close()
}
