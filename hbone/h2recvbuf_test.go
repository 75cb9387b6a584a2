package hbone

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

func TestH2RecvBuf(t *testing.T) {
	tests := []struct {
		name   string
		writes []int // payload sizes, in order
		reads  []int // read buffer sizes, repeated until drained
	}{
		{"small payloads share a chunk", []int{64, 64, 64}, []int{100}},
		{"a 1 MiB frame spans chunks", []int{1 << 20}, []int{256 << 10}},
		{"reads across chunk ends", []int{h2ChunkSize - 1, 3, h2ChunkSize + 7}, []int{1000, 1}},
		{"one byte at a time", []int{5, 1, 2}, []int{1}},
		{"empty payloads", []int{0, 10, 0}, []int{4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rng := rand.NewChaCha8([32]byte{7})
			var b h2RecvBuf
			var want []byte
			for _, n := range tt.writes {
				p := make([]byte, n)
				rng.Read(p)
				want = append(want, p...)
				b.write(p)
				clear(p) // the buffer must have copied it
			}
			if b.n != len(want) {
				t.Fatalf("n = %d after writes, want %d", b.n, len(want))
			}
			var got []byte
			for i := 0; b.n > 0; i++ {
				if i > len(want) {
					t.Fatal("read makes no progress")
				}
				p := make([]byte, tt.reads[i%len(tt.reads)])
				k := b.read(p)
				got = append(got, p[:k]...)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("read back %d bytes that differ from the %d written", len(got), len(want))
			}
			if b.chunks != nil {
				t.Errorf("%d chunks held after draining, want none", len(b.chunks))
			}
		})
	}
	t.Run("reset drops and counts", func(t *testing.T) {
		var b h2RecvBuf
		b.write(make([]byte, 3*h2ChunkSize/2))
		b.read(make([]byte, 10))
		if n := b.reset(); n != 3*h2ChunkSize/2-10 {
			t.Errorf("reset = %d, want %d", n, 3*h2ChunkSize/2-10)
		}
		if b.chunks != nil || b.n != 0 {
			t.Errorf("after reset: %d chunks, n %d", len(b.chunks), b.n)
		}
	})
}
