package hbone

import (
	"crypto/sha256"
	"errors"
	"io"
	"sync"
	"testing"
)

// srvBufferedEcho echoes a stream with WriteBufferedTo into the stream
// itself, and half-closes on the client's END_STREAM.
func srvBufferedEcho(r *Request) {
	st, err := r.Accept()
	if err != nil {
		return
	}
	defer st.Close()
	for {
		_, err := st.WriteBufferedTo(st)
		if err == io.EOF {
			st.CloseWrite()
			return
		}
		if err != nil {
			return
		}
	}
}

// srvStream serves handler and opens one stream to it, from a pool of
// its own; the stream is closed when the test ends.
func srvStream(t *testing.T, handler func(*Request)) *ClientStream {
	t.Helper()
	e := newSrvTest(t, handler, nil)
	s, err := newSrvPool(t, e).Connect(clientCtx(t), srvRequest(e, srvTestTarget))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// drainBuffered calls WriteBufferedTo until it fails and returns the
// bytes written and the error.
func drainBuffered(src interface {
	WriteBufferedTo(io.Writer) (int64, error)
}, w io.Writer) (int64, error) {
	var total int64
	for {
		n, err := src.WriteBufferedTo(w)
		total += n
		if err != nil {
			return total, err
		}
		if n == 0 {
			return total, errors.New("WriteBufferedTo returned 0 bytes and no error")
		}
	}
}

// 12 MiB each way (three stream windows) through WriteBufferedTo on both
// the server and the client stream: the credit must come back as data is
// taken, END_STREAM must end both as io.EOF, and the bytes arrive intact.
// Afterwards neither stream holds a chunk.
func TestWriteBufferedToEcho(t *testing.T) {
	const size = 12 << 20
	s := srvStream(t, srvBufferedEcho)
	sent := make(chan [32]byte, 1)
	go func() {
		sum, err := srvSend(writeCloser{s}, size)
		if err != nil {
			t.Errorf("send: %v", err)
		}
		sent <- sum
	}()
	type result struct {
		n   int64
		sum [32]byte
		err error
	}
	got := make(chan result, 1)
	go func() {
		h := sha256.New()
		n, err := drainBuffered(s, h)
		var r result
		r.n, r.err = n, err
		copy(r.sum[:], h.Sum(nil))
		got <- r
	}()
	r := clientRecv(t, got, "the echo to end")
	if r.err != io.EOF || r.n != size {
		t.Fatalf("echo ended after %d bytes with %v, want %d and io.EOF", r.n, r.err, size)
	}
	if sum := clientRecv(t, sent, "the send to end"); sum != r.sum {
		t.Fatal("echo corrupted")
	}
	s.c.mu.Lock()
	n, chunks := s.buf.n, len(s.buf.chunks)
	s.c.mu.Unlock()
	if n != 0 || chunks != 0 {
		t.Fatalf("client stream holds %d bytes in %d chunks after the end", n, chunks)
	}
	// Once the end was returned, another call returns it again.
	if n, err := s.WriteBufferedTo(io.Discard); n != 0 || err != io.EOF {
		t.Fatalf("WriteBufferedTo after the end: %d, %v; want 0, io.EOF", n, err)
	}
}

// writeCloser makes srvSend end the stream with CloseWrite.
type writeCloser struct{ s *ClientStream }

func (w writeCloser) Write(p []byte) (int, error) { return w.s.Write(p) }
func (w writeCloser) Close() error                { return w.s.CloseWrite() }

// startedWriter closes its channel on the first write.
type startedWriter struct{ ch chan struct{} }

func (w startedWriter) Write(p []byte) (int, error) {
	select {
	case <-w.ch:
	default:
		close(w.ch)
	}
	return len(p), nil
}

// The client's WriteBufferedTo returns the server's reset as Read does,
// after the data that came before it.
func TestWriteBufferedToClientReset(t *testing.T) {
	s := srvStream(t, func(r *Request) {
		st, err := r.Accept()
		if err != nil {
			return
		}
		defer st.Close()
		buf := make([]byte, 5)
		if _, err := io.ReadFull(st, buf); err != nil {
			return
		}
		st.Write(buf)
		st.Reset()
	})
	if _, err := s.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := drainBuffered(s, io.Discard); done <- err }()
	if err := clientRecv(t, done, "WriteBufferedTo to end"); !errors.Is(err, ErrStreamReset) {
		t.Fatalf("client ended with %v, want ErrStreamReset", err)
	}
}

// errWriter fails every write.
type errWriter struct{ err error }

func (w errWriter) Write([]byte) (int, error) { return 0, w.err }

// A failing destination's error comes back (io.EOF as
// io.ErrUnexpectedEOF, so it is not taken for the stream's end), and the
// taken data is gone from the stream: it holds no chunk.
func TestWriteBufferedToWriteError(t *testing.T) {
	s := srvStream(t, srvEcho)
	boom := errors.New("boom")
	for _, tt := range []struct{ werr, want error }{{boom, boom}, {io.EOF, io.ErrUnexpectedEOF}} {
		if _, err := s.Write([]byte("abc")); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { _, err := s.WriteBufferedTo(errWriter{tt.werr}); done <- err }()
		if err := clientRecv(t, done, "WriteBufferedTo"); err != tt.want {
			t.Fatalf("destination error %v came back as %v, want %v", tt.werr, err, tt.want)
		}
		s.c.mu.Lock()
		n, chunks := s.buf.n, len(s.buf.chunks)
		s.c.mu.Unlock()
		if n != 0 || chunks != 0 {
			t.Fatalf("stream holds %d bytes in %d chunks after the taken data failed", n, chunks)
		}
	}
}

// A destination that blocks does not hold up the connection: WriteBufferedTo
// writes without the connection's lock, so another stream on the same
// connection keeps working while one is stuck in its write.
func TestWriteBufferedToSlowWriterDoesNotStall(t *testing.T) {
	e := newSrvTest(t, srvBufferedEcho, nil)
	pool := newSrvPool(t, e)
	s1, err := pool.Connect(clientCtx(t), srvRequest(e, srvTestTarget))
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close()
	if _, err := s1.Write(make([]byte, 100<<10)); err != nil {
		t.Fatal(err)
	}
	entered := make(chan struct{})
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	// On a failure, let the blocked write go before the streams close
	// (defers run last-in first-out), so the test ends instead of hanging.
	defer unblock()
	stuck := make(chan error, 1)
	go func() {
		_, err := s1.WriteBufferedTo(blockingWriter{entered, release})
		stuck <- err
	}()
	clientRecv(t, entered, "the first stream's write to start")
	// More data for the stuck stream, and a whole echo on a second one.
	if _, err := s1.Write([]byte("more")); err != nil {
		t.Fatal(err)
	}
	s2, err := pool.Connect(clientCtx(t), srvRequest(e, srvTestTarget))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	echoed := make(chan error, 1)
	go func() {
		if _, err := s2.Write([]byte("ping")); err != nil {
			echoed <- err
			return
		}
		s2.CloseWrite()
		b, err := io.ReadAll(s2)
		if err == nil && string(b) != "ping" {
			err = errors.New("echo is " + string(b))
		}
		echoed <- err
	}()
	if err := clientRecv(t, echoed, "an echo while the other stream's write blocks"); err != nil {
		t.Fatal(err)
	}
	if st := pool.Stats(); st.ConnsOpened != 1 {
		t.Fatalf("ConnsOpened %d, want 1 (both streams on one connection)", st.ConnsOpened)
	}
	unblock()
	if err := clientRecv(t, stuck, "the blocked write"); err != nil {
		t.Fatal(err)
	}
}

// blockingWriter signals its first write, then blocks until released.
type blockingWriter struct{ entered, release chan struct{} }

func (w blockingWriter) Write(p []byte) (int, error) {
	select {
	case <-w.entered:
	default:
		close(w.entered)
	}
	<-w.release
	return len(p), nil
}
