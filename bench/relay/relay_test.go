package relay

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"
)

// testTimeout bounds every blocking step of these tests.
const testTimeout = 10 * time.Second

func listen(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// chain starts two relays on loopback, client → A → B → target, the
// shape of the bench's relay pair, and returns A's address.
func chain(t *testing.T, target string) (string, *Server, *Server) {
	t.Helper()
	la, lb := listen(t), listen(t)
	a, b := NewServer(), NewServer()
	t.Cleanup(func() { a.Close(); b.Close() })
	b.Serve(lb, DialTCP(target, testTimeout))
	a.Serve(la, DialTCP(lb.Addr().String(), testTimeout))
	return la.Addr().String(), a, b
}

// accept1 runs serve on the next connection of l and reports its error.
func accept1(l net.Listener, serve func(c *net.TCPConn) error) <-chan error {
	done := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(testTimeout))
		done <- serve(c.(*net.TCPConn))
	}()
	return done
}

func dial(t *testing.T, addr string) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, testTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(testTimeout))
	return c.(*net.TCPConn)
}

func random(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// The client's half-close crosses both relays while the reply direction
// stays open: the server reads the upload to EOF, then answers and
// closes, and the client reads the answer and then EOF (the bench's
// upload and short connection).
func TestPipeClientHalfClose(t *testing.T) {
	srv := listen(t)
	up := random(t, 3<<20+17)
	reply := []byte("receipt")
	done := accept1(srv, func(c *net.TCPConn) error {
		got, err := io.ReadAll(c) // returns at the relayed FIN
		if err != nil {
			return err
		}
		if !bytes.Equal(got, up) {
			return fmt.Errorf("server read %d bytes, not the %d sent", len(got), len(up))
		}
		if _, err := c.Write(reply); err != nil {
			return err
		}
		return c.CloseWrite()
	})
	addr, a, b := chain(t, srv.Addr().String())
	c := dial(t, addr)
	if _, err := c.Write(up); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading the reply: %v", err)
	}
	if !bytes.Equal(got, reply) {
		t.Fatalf("client read %q, want %q then EOF", got, reply)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	checkNoErrors(t, a, b)
}

// The server's half-close crosses both relays while the client still
// sends: the client reads the download to EOF, then sends and closes,
// and the server reads that to EOF.
func TestPipeServerHalfClose(t *testing.T) {
	srv := listen(t)
	down := random(t, 2<<20+5)
	after := random(t, 100<<10)
	done := accept1(srv, func(c *net.TCPConn) error {
		if _, err := c.Write(down); err != nil {
			return err
		}
		if err := c.CloseWrite(); err != nil {
			return err
		}
		got, err := io.ReadAll(c)
		if err != nil {
			return err
		}
		if !bytes.Equal(got, after) {
			return fmt.Errorf("server read %d bytes after its FIN, not the %d sent", len(got), len(after))
		}
		return nil
	})
	addr, a, b := chain(t, srv.Addr().String())
	c := dial(t, addr)
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, down) {
		t.Fatalf("client read %d bytes, not the %d sent", len(got), len(down))
	}
	if _, err := c.Write(after); err != nil {
		t.Fatalf("writing after the server's FIN: %v", err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Both relays let go of both ends once both directions ended.
	waitClosed(t, a, b)
	checkNoErrors(t, a, b)
}

// Many exchanges on one relayed connection arrive whole and in order
// (the bench's round trips).
func TestPipeEcho(t *testing.T) {
	srv := listen(t)
	done := accept1(srv, func(c *net.TCPConn) error {
		_, err := io.Copy(c, c)
		return err
	})
	addr, a, b := chain(t, srv.Addr().String())
	c := dial(t, addr)
	buf := make([]byte, 64)
	for i := range 200 {
		msg := bytes.Repeat([]byte{byte(i)}, 64)
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatalf("exchange %d: %v", i, err)
		}
		if !bytes.Equal(buf, msg) {
			t.Fatalf("exchange %d: got %v", i, buf[:4])
		}
	}
	c.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	checkNoErrors(t, a, b)
}

// A side that cannot half-close (net.Pipe, what Istio's HBONE dialer
// returns) is closed whole at the other side's EOF, which ends the other
// direction too instead of leaving it waiting.
func TestPipeWithoutHalfClose(t *testing.T) {
	p1, p2 := net.Pipe()
	srv := listen(t)
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := srv.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	tc := dial(t, srv.Addr().String())
	var s net.Conn
	select {
	case s = <-accepted:
		defer s.Close()
	case <-time.After(testTimeout):
		t.Fatal("no connection accepted")
	}
	p2.SetDeadline(time.Now().Add(testTimeout))
	piped := make(chan error, 1)
	go func() { _, _, err := Pipe(s, p1); piped <- err }()

	if _, err := tc.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2)
	if _, err := io.ReadFull(p2, buf); err != nil || string(buf) != "hi" {
		t.Fatalf("through the pipe: %q, %v", buf, err)
	}
	if err := tc.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	// The FIN closes the pipe: its far end reads EOF…
	if n, err := p2.Read(buf); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("after the FIN the pipe read %d, %v; want EOF", n, err)
	}
	// …and the TCP side is closed too.
	if n, err := tc.Read(buf); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("after the FIN the client read %d, %v; want EOF", n, err)
	}
	select {
	case err := <-piped:
		if err != nil {
			t.Fatalf("Pipe: %v", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("Pipe did not return after the close")
	}
}

// A target that refuses is reported, and the client's connection is
// closed rather than left open.
func TestServerDialFailure(t *testing.T) {
	dead := listen(t)
	target := dead.Addr().String()
	dead.Close()
	l := listen(t)
	s := NewServer()
	defer s.Close()
	s.Serve(l, DialTCP(target, testTimeout))
	c := dial(t, l.Addr().String())
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("read %d, %v; want the connection closed", n, err)
	}
	deadline := time.Now().Add(testTimeout)
	for len(s.Errors()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the failed dial was not reported")
		}
		time.Sleep(time.Millisecond) // polling a counter; bounded above
	}
}

// Close ends connections in flight and returns.
func TestServerCloseEndsConnections(t *testing.T) {
	srv := listen(t)
	held := accept1(srv, func(c *net.TCPConn) error {
		_, err := io.Copy(io.Discard, c) // until the relay closes
		return err
	})
	addr, a, b := chain(t, srv.Addr().String())
	c := dial(t, addr)
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(testTimeout)
	for b.Open() < 2 { // B holds both ends once the flow reached the server
		if time.Now().After(deadline) {
			t.Fatalf("relay B holds %d connections, want 2", b.Open())
		}
		time.Sleep(time.Millisecond) // polling a counter; bounded above
	}
	closed := make(chan struct{})
	go func() { a.Close(); b.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(testTimeout):
		t.Fatal("Close did not return with a connection open")
	}
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("client read %d, %v after Close; want the connection ended", n, err)
	}
	if err := <-held; err != nil {
		t.Logf("server: %v", err) // a RST is as good as a FIN here
	}
}

func TestParseForwards(t *testing.T) {
	got, err := ParseForwards("127.0.0.1:7101=192.0.2.2:17101, 127.0.0.1:7102=192.0.2.2:17102")
	if err != nil {
		t.Fatal(err)
	}
	want := []Forward{{"127.0.0.1:7101", "192.0.2.2:17101"}, {"127.0.0.1:7102", "192.0.2.2:17102"}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("got %v, want %v", got, want)
	}
	for _, bad := range []string{"", "127.0.0.1:1", "127.0.0.1:1=", "=1.2.3.4:5", "x=1.2.3.4:5"} {
		if _, err := ParseForwards(bad); err == nil {
			t.Errorf("ParseForwards(%q) accepted", bad)
		}
	}
}

func waitClosed(t *testing.T, ss ...*Server) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for _, s := range ss {
		for s.Open() > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("a relay still holds %d connections after both directions ended", s.Open())
			}
			time.Sleep(time.Millisecond) // polling a counter; bounded above
		}
	}
}

func checkNoErrors(t *testing.T, ss ...*Server) {
	t.Helper()
	for _, s := range ss {
		for _, err := range s.Errors() {
			t.Errorf("relay: %v", err)
		}
	}
}
