package rawsock

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/meshtun/meshtun/internal/tcptest"
)

// pair returns both ends of a loopback TCP connection, the dialled one
// wrapped.
func pair(t *testing.T) (*Conn, *net.TCPConn) {
	t.Helper()
	d, peer := tcptest.Pair(t)
	c, ok := Wrap(d).(*Conn)
	if !ok {
		t.Fatalf("Wrap(%T) = %T, want *Conn", d, Wrap(d))
	}
	t.Cleanup(func() { c.Close() })
	return c, peer
}

func TestWrapLeavesOthers(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if w := Wrap(a); w != a {
		t.Errorf("Wrap(pipe) = %T, want the pipe itself", w)
	}
}

// TestLargeWriteParks writes far more than the socket buffers hold while
// the peer reads slowly: Write must park on EAGAIN and resume, and every
// byte arrive in order.
func TestLargeWriteParks(t *testing.T) {
	c, peer := pair(t)
	if err := peer.SetReadBuffer(64 << 10); err != nil {
		t.Fatal(err)
	}
	if err := c.SetWriteBuffer(64 << 10); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 4<<20)
	for i := range want {
		want[i] = byte(i*7 + i>>11)
	}
	got := make(chan []byte, 1)
	go func() {
		var buf bytes.Buffer
		io.Copy(&buf, peer)
		got <- buf.Bytes()
	}()
	n, err := c.Write(want)
	if n != len(want) || err != nil {
		t.Fatalf("Write = %d, %v; want %d, nil", n, err, len(want))
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	select {
	case b := <-got:
		if !bytes.Equal(b, want) {
			t.Fatalf("peer got %d bytes, not the %d written (or out of order)", len(b), len(want))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("peer did not get the bytes within 30 s")
	}
}

func TestReadDataThenEOF(t *testing.T) {
	c, peer := pair(t)
	if _, err := peer.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	peer.CloseWrite()
	b, err := io.ReadAll(c)
	if err != nil || string(b) != "hello" {
		t.Fatalf("ReadAll = %q, %v; want hello, nil", b, err)
	}
	if n, err := c.Read(make([]byte, 8)); n != 0 || err != io.EOF {
		t.Fatalf("Read after FIN = %d, %v; want 0, io.EOF", n, err)
	}
	if n, err := c.Read(nil); n != 0 || err != nil {
		t.Fatalf("Read(nil) = %d, %v; want 0, nil", n, err)
	}
}

// TestReadDeadline: a deadline wakes a parked Read with net's own timeout
// error.
func TestReadDeadline(t *testing.T) {
	c, _ := pair(t)
	c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	_, err := c.Read(make([]byte, 8))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read past its deadline = %v, want a timeout (os.ErrDeadlineExceeded)", err)
	}
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "read" {
		t.Fatalf("error %v is not a *net.OpError of read", err)
	}
}

// TestCloseWakesRead: Close from another goroutine ends a parked Read
// with net.ErrClosed.
func TestCloseWakesRead(t *testing.T) {
	c, _ := pair(t)
	done := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 8))
		done <- err
	}()
	// The Read is parked or about to be; either way Close must end it.
	c.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Read after Close = %v, want net.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not wake the Read")
	}
}

// TestWriteAfterPeerReset: the system call's error comes back, wrapped as
// net wraps it.
func TestWriteAfterPeerReset(t *testing.T) {
	c, peer := pair(t)
	peer.SetLinger(0)
	peer.Close() // RST
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		_, err = c.Write(make([]byte, 64<<10))
	}
	var se *os.SyscallError
	if !errors.As(err, &se) || se.Syscall != "write" {
		t.Fatalf("Write to a reset peer = %v, want a write *os.SyscallError", err)
	}
}
