package gateway

import (
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/meshtun/meshtun/internal/rawsock"
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

// relayBufSize is the copy buffer of one direction while data flows.
// gVisor's segment size out of the stack follows the size of our writes
// (docs/field-notes.md, "The offload mode": 256 KiB buffers gave ≈ 48 KB
// segments, 32 KiB ≈ 16–28 KB), and HTTP/2 DATA frames are up to 1 MiB,
// so large buffers mean fewer, larger writes. They are pooled and held
// only for one read and its write, never while a direction waits for data
// (see copyHalf).
const relayBufSize = 256 << 10

// relaySmallSize is the buffer a direction holds while it waits on a
// source that can neither say when it is readable nor write its own
// buffers (no such source in the gateway today: HBONE streams write
// theirs, see bufferedWriterTo): what an idle flow would pay per such
// direction. 2 KiB takes a typical request or
// reply, or a 64 B ping-pong, in one read; a burst larger than that
// switches to the pooled buffer for as long as reads fill it.
const relaySmallSize = 2 << 10

var relayBufs = sync.Pool{New: func() any { b := make([]byte, relayBufSize); return &b }}

// relayBufsOut counts the pooled buffers taken and not yet given back;
// tests use it to check that idle relays hold none, and
// meshtun_relay_buffers_in_use exports it.
var relayBufsOut atomic.Int64

func getRelayBuf() *[]byte {
	relayBufsOut.Add(1)
	return relayBufs.Get().(*[]byte)
}

func putRelayBuf(bp *[]byte) {
	relayBufs.Put(bp)
	relayBufsOut.Add(-1)
}

// readWaiter is the optional ability of a source to block until a Read
// would not block, without a buffer (netstack.Conn has it; kernel TCP
// connections wait in the Go poller instead, see readTCPPooled).
type readWaiter interface {
	WaitRead() error
}

// relayResult is what one relay did.
type relayResult struct {
	// AToB and BToA count the bytes that were written to the other side.
	AToB, BToA int64
	// Err is the first abnormal end (a reset, a failed write); nil when both
	// directions ended with a clean EOF.
	Err error
}

// relayCounters, where set, are added each direction's bytes as they are
// written (the live byte counters of the metrics).
type relayCounters struct {
	aToB, bToA byteCounter
}

// byteCounter is what the relay adds written bytes to: a flow's
// prometheus.Counter, already resolved (metrics.go), so each write costs
// an atomic add.
type byteCounter interface{ Add(float64) }

// startRelay copies a → b and b → a until both directions are done, keeping
// TCP half-close intact: an EOF read from one side becomes CloseWrite on
// the other, and the opposite direction keeps flowing. An error in either
// direction resets both sides (so a RST on one end becomes a RST, or a
// stream reset, on the other) and ends the relay. When both directions are
// done, both sides are closed and done is called with the result. This is
// the only place half-close is handled; the inbound and the outbound paths
// both use it.
//
// startRelay returns at once: each direction runs in a goroutine of its
// own, started with a small stack, so the handler's goroutine (which grew
// its stack setting the flow up: routing, dialling, a TLS handshake) ends
// instead of waiting out the flow's life. An idle flow then costs two
// goroutines, not three.
func startRelay(a, b conn, ctr relayCounters, done func(relayResult)) {
	var (
		res  relayResult
		once sync.Once
		left atomic.Int32 // directions still running; the last one finishes
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
	finish := func() {
		if left.Add(-1) != 0 {
			return
		}
		a.Close()
		b.Close()
		done(res)
	}
	left.Store(2)
	go func() {
		n, err := copyHalf(b, a, ctr.aToB)
		res.AToB = n
		if err != nil {
			abort(err)
		}
		finish()
	}()
	go func() {
		n, err := copyHalf(a, b, ctr.bToA)
		res.BToA = n
		if err != nil {
			abort(err)
		}
		finish()
	}()
}

// relay is startRelay that waits for the result.
func relay(a, b conn) relayResult {
	ch := make(chan relayResult, 1)
	startRelay(a, b, relayCounters{}, func(r relayResult) { ch <- r })
	return <-ch
}

// copyHalf copies src to dst until src's EOF, then ends dst's write side.
//
// An idle direction holds no large buffer. When src can wait for
// readiness (netstack and kernel TCP, see pooledReaderOf), copyHalf waits
// first, then takes a pooled buffer for one read and its write. A source
// that writes its own received buffers to dst (HBONE streams, see
// bufferedWriterTo) needs no buffer from copyHalf at all. Otherwise it
// reads into a small buffer of its own, and only a read that fills it
// switches to pooled buffers, kept while reads keep filling them: a short
// read means src is drained, so the next read goes back to the small
// buffer. A read that exactly fills the pooled buffer just before src
// goes idle keeps it until the next data; that is the one case where an
// idle direction holds one.
//
// live, if not nil, is added the bytes as they are written.
func copyHalf(dst, src conn, live byteCounter) (int64, error) {
	if bw, ok := src.(bufferedWriterTo); ok {
		return copyBuffered(dst, bw, live)
	}
	pooled := pooledReaderOf(src)
	var (
		small []byte // allocated on first use: a waiting source never needs it
		hot   bool   // the last read filled its buffer: more data is likely queued
		n     int64
	)
	for {
		var (
			bp   *[]byte
			buf  []byte
			nr   int
			rerr error
		)
		switch {
		case pooled != nil:
			bp, nr, rerr = pooled()
			if bp != nil {
				buf = *bp
			}
		case hot:
			bp = getRelayBuf()
			buf = *bp
			nr, rerr = src.Read(buf)
		default:
			if small == nil {
				small = make([]byte, relaySmallSize)
			}
			buf = small
			nr, rerr = src.Read(buf)
		}
		hot = nr == len(buf)
		var werr error
		if nr > 0 {
			var nw int
			nw, werr = dst.Write(buf[:nr])
			n += int64(nw)
			if live != nil && nw > 0 {
				live.Add(float64(nw))
			}
		}
		if bp != nil {
			putRelayBuf(bp)
		}
		if werr != nil {
			return n, werr
		}
		if rerr == io.EOF {
			return n, dst.CloseWrite()
		}
		if rerr != nil {
			return n, rerr
		}
	}
}

// bufferedWriterTo is the optional ability of a source that buffers what
// it received (an HBONE stream) to write that data straight to dst: it
// blocks until data, EOF or an error, writes what it holds, and returns
// the bytes written, or 0 and the source's error (io.EOF at its end) when
// nothing is left. Errors from dst come back as they are, io.EOF excepted.
type bufferedWriterTo interface {
	WriteBufferedTo(dst io.Writer) (int64, error)
}

// copyBuffered is copyHalf for a bufferedWriterTo source: no copy buffer
// at all, so an idle direction holds none, and the received bytes are
// written from the source's own buffers. Where dst can take bytes without
// blocking (kernel TCP, netstack), the source's reader writes what
// arrives while this direction waits straight into dst (see
// hbone.TryWriter): the bytes it wrote are counted as it writes them.
func copyBuffered(dst conn, src bufferedWriterTo, live byteCounter) (int64, error) {
	var (
		n int64
		w io.Writer = dst
	)
	sk := sinkOf(dst, live)
	if sk != nil {
		w = sk
	}
	for {
		nw, err := src.WriteBufferedTo(w)
		n += nw
		if live != nil {
			if sk != nil {
				nw -= sk.takeTried() // counted by TryWrite
			}
			if nw > 0 {
				live.Add(float64(nw))
			}
		}
		if err == io.EOF {
			return n, dst.CloseWrite()
		}
		if err != nil {
			return n, err
		}
	}
}

// sink is a relay destination that can take bytes without blocking
// (hbone.TryWriter): TryWrite runs on the HBONE connection's reader
// goroutine and counts what it wrote as it writes it (sinkCount); the
// stream's own goroutine writes with Write.
type sink interface {
	io.Writer
	TryWrite(p []byte) (int, error)
	// takeTried returns the bytes TryWrite wrote since the last call:
	// WriteBufferedTo reports them too, and they are counted already.
	takeTried() int64
}

// sinkCount counts the bytes a sink's TryWrite wrote.
type sinkCount struct {
	live  byteCounter
	tried atomic.Int64
}

func (s *sinkCount) add(n int) {
	if n > 0 {
		s.tried.Add(int64(n))
		if s.live != nil {
			s.live.Add(float64(n))
		}
	}
}

func (s *sinkCount) takeTried() int64 { return s.tried.Swap(0) }

// sinkOf returns dst as a sink, or nil if it cannot write without
// blocking.
func sinkOf(dst conn, live byteCounter) sink {
	switch c := dst.(type) {
	case *net.TCPConn:
		rc, err := c.SyscallConn()
		if err != nil {
			return nil
		}
		return &tcpSink{TCPConn: c, rc: rc, sinkCount: sinkCount{live: live}}
	case tryConn: // netstack.Conn
		return &trySink{tryConn: c, sinkCount: sinkCount{live: live}}
	}
	return nil
}

// tryConn is a destination with a TryWrite of its own (netstack.Conn).
type tryConn interface {
	conn
	TryWrite(p []byte) (int, error)
}

// trySink is the sink of a tryConn.
type trySink struct {
	tryConn
	sinkCount
}

func (t *trySink) TryWrite(p []byte) (int, error) {
	n, err := t.tryConn.TryWrite(p)
	t.add(n)
	return n, err
}

// tcpSink is the sink of a kernel TCP socket: one write(2) that returns at
// EAGAIN instead of parking in the poller. The socket is embedded as
// itself, so the stream's goroutine keeps its writev (net.Buffers).
type tcpSink struct {
	*net.TCPConn
	rc syscall.RawConn
	sinkCount
}

func (t *tcpSink) TryWrite(p []byte) (int, error) {
	var (
		n    int
		werr error
	)
	err := t.rc.Write(func(fd uintptr) bool {
		m, errno := rawsock.Write(fd, p)
		switch errno {
		case 0:
			n = m
		case unix.EAGAIN:
		default:
			werr = os.NewSyscallError("write", errno)
		}
		return true
	})
	if err == nil {
		err = werr
	}
	t.add(n)
	return n, err
}

// pooledReaderOf returns, for a source that can wait for readiness
// without a buffer (netstack and kernel TCP), a read that waits first and
// then reads into a pooled buffer; it returns the buffer (nil if it took
// none) with the read's result. nil for other sources.
func pooledReaderOf(src conn) func() (*[]byte, int, error) {
	switch c := src.(type) {
	case readWaiter:
		return func() (*[]byte, int, error) {
			if err := c.WaitRead(); err != nil {
				return nil, 0, err
			}
			bp := getRelayBuf()
			n, err := src.Read(*bp)
			return bp, n, err
		}
	case *net.TCPConn:
		rc, err := c.SyscallConn()
		if err != nil {
			return nil
		}
		return func() (*[]byte, int, error) { return readTCPPooled(rc) }
	}
	return nil
}

// readTCPPooled reads a kernel TCP socket into a pooled buffer taken only
// for the read(2) itself: on EAGAIN the buffer goes back and the goroutine
// parks in the Go poller until the socket is readable, so a waiting
// direction holds none. One read(2) per chunk while data flows, two (EAGAIN,
// then the read) after a wait. A zero-byte read is the peer's FIN (io.EOF);
// a RST comes back as ECONNRESET.
func readTCPPooled(rc syscall.RawConn) (*[]byte, int, error) {
	var (
		bp   *[]byte
		n    int
		rerr error
	)
	err := rc.Read(func(fd uintptr) bool {
		if bp == nil {
			bp = getRelayBuf()
		}
		m, errno := rawsock.Read(fd, *bp)
		switch errno {
		case unix.EAGAIN:
			putRelayBuf(bp)
			bp = nil
			return false
		case 0:
			n = m
			if m == 0 {
				rerr = io.EOF
			}
		default:
			rerr = os.NewSyscallError("read", errno)
		}
		return true
	})
	if err != nil {
		if bp != nil {
			putRelayBuf(bp)
		}
		return nil, 0, err
	}
	return bp, n, rerr
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
