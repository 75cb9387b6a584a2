package hbone

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"testing"

	"github.com/meshtun/meshtun/internal/rawsock"
	"github.com/meshtun/meshtun/internal/tcptest"
)

// batchTestConn records the Writes and serves Reads from src in chunks of
// at most chunk bytes, counting the calls.
type batchTestConn struct {
	net.Conn
	writes [][]byte
	src    *bytes.Reader
	chunk  int
	reads  int
}

func (c *batchTestConn) Write(p []byte) (int, error) {
	c.writes = append(c.writes, bytes.Clone(p))
	return len(p), nil
}

func (c *batchTestConn) Read(p []byte) (int, error) {
	c.reads++
	return c.src.Read(p[:min(len(p), c.chunk)])
}

func TestBatchConnWrite(t *testing.T) {
	tests := []struct {
		name      string
		corked    bool
		sizes     []int
		wantCalls int // Writes reaching the conn below
	}{
		{"uncorked writes pass through", false, []int{100, 200, 300}, 3},
		{"corked small writes leave as one", true, []int{100, 200, 300}, 1},
		{"corked records of one large frame", true, []int{16 << 10, 16 << 10, 16 << 10, 5}, 1},
		{"corked past the bound writes every batchWriteMax", true, []int{batchWriteMax / 2, batchWriteMax / 4, batchWriteMax / 3}, 2},
		{"a write of batchWriteMax alone passes through", true, []int{batchWriteMax, 10}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tc := &batchTestConn{}
			c := newBatchConn(tc)
			var want []byte
			if tt.corked {
				c.cork()
			}
			for i, n := range tt.sizes {
				p := bytes.Repeat([]byte{byte(i + 1)}, n)
				want = append(want, p...)
				if k, err := c.Write(p); k != n || err != nil {
					t.Fatalf("Write(%d) = %d, %v", n, k, err)
				}
			}
			if tt.corked {
				if err := c.uncork(); err != nil {
					t.Fatal(err)
				}
			}
			if len(tc.writes) != tt.wantCalls {
				t.Errorf("%d writes below, want %d", len(tc.writes), tt.wantCalls)
			}
			if got := bytes.Join(tc.writes, nil); !bytes.Equal(got, want) {
				t.Errorf("bytes below differ from the bytes written (%d vs %d)", len(got), len(want))
			}
			if c.wbuf != nil {
				t.Error("write buffer held after uncork")
			}
		})
	}
}

func TestBatchConnRead(t *testing.T) {
	tests := []struct {
		name      string
		size      int
		bufSize   int // the reader's buffer
		chunk     int // what one read below yields at most
		wantReads int // reads below, the final EOF included
	}{
		{"small reads are served from one large read", 200 << 10, 17 << 10, 1 << 20, 2},
		{"large buffers are read into directly", 200 << 10, 100 << 10, 1 << 20, 3},
		{"short reads below", 10 << 10, 1 << 10, 3 << 10, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := make([]byte, tt.size)
			rand.NewChaCha8([32]byte{1}).Read(want)
			tc := &batchTestConn{src: bytes.NewReader(want), chunk: tt.chunk}
			c := newBatchConn(tc)
			var got []byte
			buf := make([]byte, tt.bufSize)
			for i := 0; ; i++ {
				if i > tt.size {
					t.Fatal("no EOF")
				}
				n, err := c.Read(buf)
				got = append(got, buf[:n]...)
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("read %d bytes, not the %d below", len(got), len(want))
			}
			if tc.reads != tt.wantReads {
				t.Errorf("%d reads below, want %d", tc.reads, tt.wantReads)
			}
			if c.rbuf != nil {
				t.Error("read buffer held after the data was drained")
			}
		})
	}
}

// TestBatchConnRawOverTCP: over kernel TCP, batchConn reads and writes
// with raw system calls (internal/rawsock), and a TLS-sized exchange
// crosses it intact both ways.
func TestBatchConnRawOverTCP(t *testing.T) {
	d, peer := tcptest.Pair(t)
	bc := newBatchConn(d)
	defer bc.Close()
	if _, ok := bc.Conn.(*rawsock.Conn); !ok {
		t.Fatalf("batchConn over %T holds %T, want *rawsock.Conn", d, bc.Conn)
	}
	want := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	go func() {
		bc.cork()
		bc.Write(want)
		bc.uncork()
	}()
	got := make([]byte, len(want))
	if _, err := io.ReadFull(peer, got); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("peer read %v; the bytes differ: %v", err, !bytes.Equal(got, want))
	}
	if _, err := peer.Write(want[:300]); err != nil {
		t.Fatal(err)
	}
	back := make([]byte, 300)
	if _, err := io.ReadFull(bc, back); err != nil || !bytes.Equal(back, want[:300]) {
		t.Fatalf("batchConn read %q, %v", back, err)
	}
}
