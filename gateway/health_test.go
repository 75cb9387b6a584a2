package gateway

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

// TestProbedListener: the check's connection is taken by the accept loop
// and never handed on; other connections are; without an accept loop the
// check fails although the kernel completed the connection, and with the
// listener closed it fails to connect.
func TestProbedListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pl, err := newProbedListener(ln, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// No accept loop yet: the kernel completes the connection into the
	// backlog, nobody takes it. (The connect shares the deadline: 2 s
	// leave it ample time on a busy machine.)
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	err = pl.probe(short)
	cancelShort()
	if err == nil || !strings.Contains(err.Error(), "accept loop did not") {
		t.Fatalf("probe without an accept loop: %v", err)
	}

	handed := make(chan net.Conn, 4)
	loop := make(chan error, 1)
	go func() {
		for {
			c, err := pl.Accept()
			if err != nil {
				loop <- err
				return
			}
			handed <- c
		}
	}()
	// The backlog's leftover from the failed check is handed on (its
	// check gave up on it); the client sees it closed, nothing more.
	for i := range 3 {
		if err := pl.probe(ctx); err != nil {
			t.Fatalf("probe %d: %v", i, err)
		}
	}
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	var got []net.Conn
	for len(got) < 2 {
		select {
		case c := <-handed:
			got = append(got, c)
			defer c.Close()
		case <-ctx.Done():
			t.Fatalf("handed on %d connections, want the leftover and the client's", len(got))
		}
	}
	if got[1].RemoteAddr().String() != client.LocalAddr().String() {
		t.Errorf("handed on %s, want the client %s", got[1].RemoteAddr(), client.LocalAddr())
	}
	select {
	case c := <-handed:
		t.Errorf("a check's connection was handed on: %s", c.RemoteAddr())
	default:
	}

	pl.Close()
	if err := <-loop; !errors.Is(err, net.ErrClosed) {
		t.Errorf("accept after close: %v", err)
	}
	if err := pl.probe(ctx); err == nil || !strings.Contains(err.Error(), "does not accept") {
		t.Fatalf("probe of a closed listener: %v", err)
	}
}

// TestProbedListenerUnspecified: a listener on all IPv4 addresses is
// checked on 127.0.0.1, even if Go's socket is a dual-stack [::].
func TestProbedListenerUnspecified(t *testing.T) {
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	pl, err := newProbedListener(ln, "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	if a := pl.target.Addr().String(); a != "127.0.0.1" {
		t.Fatalf("target %s, want 127.0.0.1", a)
	}
	go func() {
		for {
			c, err := pl.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pl.probe(ctx); err != nil {
		t.Fatal(err)
	}
}
