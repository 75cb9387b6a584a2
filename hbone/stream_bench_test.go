package hbone

import (
	"io"
	"testing"
	"time"
)

// BenchmarkShortStream is the HBONE part of one short connection
// (docs/field-notes.md, "Short connections: the account"): on a pooled
// connection, open a stream (CONNECT, 200), 64 B each way, half-close,
// read the peer's END_STREAM, close. It reports the time and the whole
// process's CPU (client and server) per stream, and with -benchmem the
// allocations of both halves.
func BenchmarkShortStream(b *testing.B) {
	pool, req := benchEnv(b, nil)
	// One stream first, so the benchmark does not count the TLS handshake.
	warm, err := pool.Connect(clientCtx(b), req(benchEcho))
	if err != nil {
		b.Fatal(err)
	}
	warm.Close()
	msg := make([]byte, 64)
	got := make([]byte, 64)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0, t0 := benchCPU(), time.Now()
	for range b.N {
		s, err := pool.Connect(clientCtx(b), req(benchEcho))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := s.Write(msg); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(s, got); err != nil {
			b.Fatal(err)
		}
		if err := s.CloseWrite(); err != nil {
			b.Fatal(err)
		}
		if n, err := s.Read(got); n != 0 || err != io.EOF {
			b.Fatalf("after the half-close: %d bytes, %v; want the peer's END_STREAM", n, err)
		}
		s.Close()
	}
	elapsed, cpu := time.Since(t0), benchCPU()-cpu0
	b.ReportMetric(float64(elapsed.Microseconds())/float64(b.N), "µs/stream")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/stream")
}
