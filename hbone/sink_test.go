package hbone

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"testing"
	"time"
)

// recordingSink is a TryWriter that records which path each byte took:
// TryWrite (the connection's reader, run to completion) or Write (the
// stream's own goroutine). take bounds what one TryWrite accepts (0: all
// of it); fail, if set, is TryWrite's error. got signals every write.
type recordingSink struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	tries  int // TryWrite calls
	tried  int // bytes TryWrite took
	writes int // Write calls
	take   int
	fail   error
	got    chan struct{}
}

func newRecordingSink(take int) *recordingSink {
	return &recordingSink{take: take, got: make(chan struct{}, 1)}
}

func (s *recordingSink) signal() {
	select {
	case s.got <- struct{}{}:
	default:
	}
}

func (s *recordingSink) TryWrite(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.signal()
	s.tries++
	if s.fail != nil {
		return 0, s.fail
	}
	n := len(p)
	if s.take > 0 {
		n = min(n, s.take)
	}
	s.buf.Write(p[:n])
	s.tried += n
	return n, nil
}

func (s *recordingSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.signal()
	s.writes++
	s.buf.Write(p)
	return len(p), nil
}

func (s *recordingSink) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Len()
}

// waitFor waits until the sink holds n bytes.
func (s *recordingSink) waitFor(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for s.len() < n {
		select {
		case <-s.got:
		case <-deadline:
			t.Fatalf("sink holds %d bytes after 10 s, want %d", s.len(), n)
		}
	}
}

// waitParked waits until the stream's WriteBufferedTo waits with its sink
// set: from then on the reader hands it DATA itself.
func waitParked(t *testing.T, s *ClientStream) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.c.mu.Lock()
		parked := s.sink != nil && !s.sinking
		s.c.mu.Unlock()
		if parked {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("WriteBufferedTo did not start waiting within 10 s")
		}
		runtime.Gosched() // the drain goroutine is about to wait
	}
}

// drainTo runs WriteBufferedTo into w until it fails; the result comes
// back on the channel.
func drainTo(s *ClientStream, w io.Writer) <-chan drainResult {
	ch := make(chan drainResult, 1)
	go func() {
		n, err := drainBuffered(s, w)
		ch <- drainResult{n, err}
	}()
	return ch
}

type drainResult struct {
	n   int64
	err error
}

// Run to completion: with a destination that takes everything, every
// small DATA frame of a ping-pong goes into it from the reader and
// WriteBufferedTo never wakes until the end; what it returns then counts
// every byte, and the bytes are in order.
func TestWriteBufferedToSinkRunsToCompletion(t *testing.T) {
	s := srvStream(t, srvEcho)
	sk := newRecordingSink(0)
	done := drainTo(s, sk)
	waitParked(t, s)
	var want bytes.Buffer
	const rounds = 200
	for i := range rounds {
		msg := fmt.Appendf(nil, "message %03d of a ping-pong through the sink", i)
		want.Write(msg)
		if _, err := s.Write(msg); err != nil {
			t.Fatal(err)
		}
		sk.waitFor(t, want.Len())
	}
	s.CloseWrite()
	r := clientRecv(t, done, "WriteBufferedTo to end")
	if r.err != io.EOF || r.n != int64(want.Len()) {
		t.Fatalf("WriteBufferedTo ended with %d bytes and %v, want %d and io.EOF", r.n, r.err, want.Len())
	}
	sk.mu.Lock()
	defer sk.mu.Unlock()
	if !bytes.Equal(sk.buf.Bytes(), want.Bytes()) {
		t.Fatal("the sink's bytes are not the echo, in order")
	}
	if sk.writes != 0 || sk.tries != rounds || sk.tried != want.Len() {
		t.Fatalf("%d TryWrites took %d bytes and %d Writes ran; want %d TryWrites of all %d bytes and no Write",
			sk.tries, sk.tried, sk.writes, rounds, want.Len())
	}
}

// A destination that takes only part of a frame gets the rest from the
// stream's goroutine (woken for it), in order; a frame above sinkMax is
// never handed to TryWrite.
func TestWriteBufferedToSinkPartialAndLarge(t *testing.T) {
	s := srvStream(t, srvEcho)
	sk := newRecordingSink(7)
	done := drainTo(s, sk)
	waitParked(t, s)
	msg := []byte("a reply longer than the seven bytes the destination takes at once")
	if _, err := s.Write(msg); err != nil {
		t.Fatal(err)
	}
	sk.waitFor(t, len(msg))
	sk.mu.Lock()
	tries, tried, writes := sk.tries, sk.tried, sk.writes
	sk.mu.Unlock()
	if tries != 1 || tried != 7 || writes == 0 {
		t.Fatalf("partial take: %d TryWrites took %d bytes, %d Writes; want 1 of 7 bytes, then Writes", tries, tried, writes)
	}

	waitParked(t, s)
	large := bytes.Repeat([]byte{'x'}, sinkMax+1)
	if _, err := s.Write(large); err != nil {
		t.Fatal(err)
	}
	sk.waitFor(t, len(msg)+len(large))
	s.CloseWrite()
	r := clientRecv(t, done, "WriteBufferedTo to end")
	if r.err != io.EOF || r.n != int64(len(msg)+len(large)) {
		t.Fatalf("WriteBufferedTo ended with %d bytes and %v, want %d and io.EOF", r.n, r.err, len(msg)+len(large))
	}
	sk.mu.Lock()
	defer sk.mu.Unlock()
	if sk.tries != 1 {
		t.Fatalf("%d TryWrites after a frame above sinkMax, want still 1", sk.tries)
	}
	if !bytes.Equal(sk.buf.Bytes(), append(msg, large...)) {
		t.Fatal("bytes out of order or corrupted")
	}
}

// A destination whose TryWrite fails wakes WriteBufferedTo with that
// error, as a failing Write would.
func TestWriteBufferedToSinkError(t *testing.T) {
	s := srvStream(t, srvEcho)
	boom := errors.New("destination reset")
	sk := newRecordingSink(0)
	sk.fail = boom
	done := drainTo(s, sk)
	waitParked(t, s)
	if _, err := s.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if r := clientRecv(t, done, "WriteBufferedTo to fail"); r.err != boom {
		t.Fatalf("WriteBufferedTo ended with %v, want the destination's error", r.err)
	}
}
