package hbone

import (
	"crypto/tls"
	"encoding/binary"
	"io"
	"net"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"
)

// End-to-end benchmarks of our two halves: Pool and ClientStream against
// Server and ServerStream, over loopback mutual TLS in one process. CPU
// figures are the whole process (client and server together), from
// getrusage. Run, for example:
//
//	go test -run '^$' -bench 'PingPong|Bulk' -benchtime 2s ./hbone/
//
// Ports of the target select the handler's behaviour (benchHandler).

// Targets understood by benchHandler.
const (
	benchEcho   = "10.0.0.1:1" // copies the stream back, 64 KiB at a time
	benchSink   = "10.0.0.1:2" // reads until END_STREAM, answers the count
	benchSource = "10.0.0.1:3" // reads a count (8 bytes), writes that many bytes, ends
)

// benchChunk is the relay's copy-buffer size (gateway/relay.go): what the
// gateway hands each side per call while data flows.
const benchChunk = 256 << 10

var benchEchoBufs = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}

func benchHandler(r *Request) {
	st, err := r.Accept()
	if err != nil {
		return
	}
	defer st.Close()
	switch r.Target().Port() {
	case 1:
		// Pooled: BenchmarkShortStream opens a stream per iteration, and
		// a fresh 64 KiB each would be most of what it measures.
		bp := benchEchoBufs.Get().(*[]byte)
		defer benchEchoBufs.Put(bp)
		buf := *bp
		for {
			n, err := st.Read(buf)
			if n > 0 {
				if _, err := st.Write(buf[:n]); err != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	case 2:
		buf := make([]byte, benchChunk)
		var total uint64
		for {
			n, err := st.Read(buf)
			total += uint64(n)
			if err == io.EOF {
				binary.BigEndian.PutUint64(buf, total)
				st.Write(buf[:8])
				st.CloseWrite()
				return
			}
			if err != nil {
				return
			}
		}
	case 3:
		// A fixed amount, then END_STREAM: a stream that stopped reading
		// would keep 4 MiB of the connection's 16 MiB window.
		buf := make([]byte, benchChunk)
		if _, err := io.ReadFull(st, buf[:8]); err != nil {
			return
		}
		for left := binary.BigEndian.Uint64(buf); left > 0; {
			k := min(left, uint64(len(buf)))
			if _, err := st.Write(buf[:k]); err != nil {
				return
			}
			left -= k
		}
		st.CloseWrite()
	}
}

// benchCPU is the process's user+system CPU time so far.
func benchCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchEnv starts a server with benchHandler and a pool that reaches it;
// edit adjusts the pool's options.
func benchEnv(b *testing.B, edit func(*PoolOptions)) (*Pool, func(target string) ConnectRequest) {
	e := newSrvTest(b, benchHandler, nil)
	pki := &clientTestPKI{ca: e.ca}
	var err error
	if pki.client, err = e.ca.KeyPair(srvTestClientID); err != nil {
		b.Fatal(err)
	}
	pool := newClientTestPool(b, pki, edit)
	return pool, func(target string) ConnectRequest { return srvRequest(e, target) }
}

// BenchmarkPingPong: 64 B request, 64 B answer, on one established
// stream; the bench's request/response latency scenario without TCP and
// netstack around it.
func BenchmarkPingPong(b *testing.B) {
	pool, req := benchEnv(b, nil)
	s, err := pool.Connect(clientCtx(b), req(benchEcho))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	msg := make([]byte, 64)
	got := make([]byte, 64)
	b.ResetTimer()
	cpu0, t0 := benchCPU(), time.Now()
	for range b.N {
		if _, err := s.Write(msg); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(s, got); err != nil {
			b.Fatal(err)
		}
	}
	elapsed, cpu := time.Since(t0), benchCPU()-cpu0
	b.ReportMetric(float64(elapsed.Microseconds())/float64(b.N), "µs/rtt")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/rtt")
}

// benchBulk moves b.N chunks of benchChunk bytes over each of flows
// streams in direction dir and reports throughput and CPU per GiB.
func benchBulk(b *testing.B, flows int, dir string, edit func(*PoolOptions)) {
	pool, req := benchEnv(b, edit)
	target := benchSink
	if dir == "down" {
		target = benchSource
	}
	streams := make([]*ClientStream, flows)
	for i := range streams {
		s, err := pool.Connect(clientCtx(b), req(target))
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		streams[i] = s
	}
	b.SetBytes(int64(benchChunk * flows))
	b.ResetTimer()
	cpu0, t0 := benchCPU(), time.Now()
	var wg sync.WaitGroup
	errs := make([]error, flows)
	for i, s := range streams {
		wg.Go(func() { errs[i] = benchFlow(s, dir, b.N) })
	}
	wg.Wait()
	elapsed, cpu := time.Since(t0), benchCPU()-cpu0
	b.StopTimer()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	gib := float64(b.N) * benchChunk * float64(flows) / (1 << 30)
	b.ReportMetric(gib*(1<<30)*8/elapsed.Seconds()/1e9, "Gbit/s")
	b.ReportMetric(cpu.Seconds()/gib, "CPU-s/GiB")
	if st := pool.Stats(); flows > 1 {
		b.ReportMetric(float64(st.ConnsOpen), "conns")
	}
}

// benchFlow is one stream's share of benchBulk: "up" writes n chunks
// (Write, as the relay does), "upfrom" hands the stream a reader
// (ReadFrom), "down" reads n chunks.
func benchFlow(s *ClientStream, dir string, n int) error {
	buf := make([]byte, benchChunk)
	switch dir {
	case "up", "upfrom":
		if dir == "up" {
			for range n {
				if _, err := s.Write(buf); err != nil {
					return err
				}
			}
		} else if _, err := s.ReadFrom(io.LimitReader(benchZero{}, int64(n)*benchChunk)); err != nil {
			return err
		}
		s.CloseWrite()
		if _, err := io.ReadFull(s, buf[:8]); err != nil {
			return err
		}
		if got := binary.BigEndian.Uint64(buf); got != uint64(n)*benchChunk {
			return io.ErrShortWrite
		}
		return nil
	default:
		binary.BigEndian.PutUint64(buf, uint64(n)*benchChunk)
		if _, err := s.Write(buf[:8]); err != nil {
			return err
		}
		var total int64
		for {
			k, err := s.Read(buf)
			total += int64(k)
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
		}
		if total != int64(n)*benchChunk {
			return io.ErrUnexpectedEOF
		}
		return nil
	}
}

// benchZero yields zeros without copying anything.
type benchZero struct{}

func (benchZero) Read(p []byte) (int, error) { return len(p), nil }

func BenchmarkBulk(b *testing.B) {
	for _, dir := range []string{"up", "upfrom", "down"} {
		b.Run(dir+"/1", func(b *testing.B) { benchBulk(b, 1, dir, nil) })
		b.Run(dir+"/8", func(b *testing.B) { benchBulk(b, 8, dir, nil) })
		b.Run(dir+"/8/conns4", func(b *testing.B) {
			benchBulk(b, 8, dir, func(o *PoolOptions) { o.ConnsPerKey = 4 })
		})
	}
}

// BenchmarkPingPongBaseline is BenchmarkPingPong's 64 B round trip over
// plain loopback TCP and over mutual TLS alone (an echo goroutine, no
// HTTP/2): what the HBONE layers add is the difference.
func BenchmarkPingPongBaseline(b *testing.B) {
	for _, name := range []string{"tcp", "tls"} {
		b.Run(name, func(b *testing.B) {
			e := newSrvTest(b, benchHandler, nil)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				if name == "tls" {
					c = tls.Server(c, e.srv.tlsConf)
				}
				io.Copy(c, c)
			}()
			var c net.Conn
			if c, err = net.Dial("tcp", ln.Addr().String()); err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			if name == "tls" {
				cert, err := e.ca.KeyPair(srvTestClientID)
				if err != nil {
					b.Fatal(err)
				}
				c = tls.Client(c, ClientConfig(cert, e.ca.Pool(), []string{srvTestServerID}))
			}
			msg, got := make([]byte, 64), make([]byte, 64)
			b.ResetTimer()
			cpu0, t0 := benchCPU(), time.Now()
			for range b.N {
				if _, err := c.Write(msg); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, got); err != nil {
					b.Fatal(err)
				}
			}
			elapsed, cpu := time.Since(t0), benchCPU()-cpu0
			b.ReportMetric(float64(elapsed.Microseconds())/float64(b.N), "µs/rtt")
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/rtt")
		})
	}
}

// BenchmarkIdleStreams opens b.N streams, proves each with one 64 B echo
// and holds them: heap and stacks in use per idle stream, client and
// server together (the bench's idle scenario weighs each gateway's RSS).
func BenchmarkIdleStreams(b *testing.B) {
	pool, req := benchEnv(b, func(o *PoolOptions) { o.MaxStreamsPerConn = 1000 })
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	msg := make([]byte, 64)
	streams := make([]*ClientStream, 0, b.N)
	defer func() {
		for _, s := range streams {
			s.Close()
		}
	}()
	for range b.N {
		s, err := pool.Connect(clientCtx(b), req(benchEcho))
		if err != nil {
			b.Fatal(err)
		}
		streams = append(streams, s)
		if _, err := s.Write(msg); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(s, msg); err != nil {
			b.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := func(a, b uint64) float64 { return (float64(a) - float64(b)) / 1024 / float64(len(streams)) }
	b.ReportMetric(per(after.HeapInuse, before.HeapInuse), "heap-KiB/stream")
	b.ReportMetric(per(after.StackInuse, before.StackInuse), "stack-KiB/stream")
}
