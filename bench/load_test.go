package bench

import (
	"context"
	"net"
	"testing"
	"time"
)

// The load generator's protocols over loopback (no root needed): bulk both
// ways with exact byte counts, echo, short connections, ping-pong.
func TestLoadProtocols(t *testing.T) {
	s, err := newServer(net.Listen, "127.0.0.1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	bulkAddr, echoAddr := s.Addr(0).String(), s.Addr(1).String()
	dial := func(addr string) net.Conn {
		t.Helper()
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(30 * time.Second))
		return c
	}
	for _, tc := range []struct {
		name string
		op   byte
		size int64
	}{
		{"upload empty", 'U', 0},
		{"upload one byte", 'U', 1},
		{"upload several buffers and a bit", 'U', 3*bufSize + 17},
		{"download empty", 'D', 0},
		{"download several buffers and a bit", 'D', 3*bufSize + 17},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := bulk(dial(bulkAddr), tc.op, tc.size); err != nil {
				t.Fatal(err)
			}
		})
	}
	t.Run("unknown op", func(t *testing.T) {
		if err := bulk(dial(bulkAddr), 'X', 1); err == nil {
			t.Fatal("bulk accepted an unknown op")
		}
	})
	t.Run("short connections", func(t *testing.T) {
		d := net.Dialer{Timeout: 5 * time.Second}
		buf := make([]byte, MsgSize)
		for i := 0; i < 20; i++ {
			if err := shortConn(context.Background(), &d, echoAddr, buf); err != nil {
				t.Fatal(err)
			}
		}
	})
	t.Run("ping-pong", func(t *testing.T) {
		c := dial(echoAddr)
		defer c.Close()
		rtts, err := pingPong(c, 3, 50)
		if err != nil {
			t.Fatal(err)
		}
		if len(rtts) != 50 {
			t.Fatalf("%d round trips, want 50", len(rtts))
		}
		for i, d := range rtts {
			if d <= 0 {
				t.Fatalf("round trip %d: %v", i, d)
			}
		}
	})
	t.Run("close ends held connections", func(t *testing.T) {
		s2, err := newServer(net.Listen, "127.0.0.1", 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		c := dial(s2.Addr(1).String())
		defer c.Close()
		if err := echo(c, make([]byte, MsgSize)); err != nil {
			t.Fatal(err)
		}
		if n := s2.Open(); n != 1 {
			t.Fatalf("server holds %d connections, want 1", n)
		}
		s2.Close() // must not hang on the held flow
		s2.Close()
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatal("held flow still open after Close")
		}
	})
}
