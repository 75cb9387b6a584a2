package hbone

import (
	"io"
	"net/http"
	"testing"
	"time"
)

// BenchmarkServerUpload pushes data through one CONNECT stream from the Go
// HTTP/2 client to a handler that discards it (loopback, mutual TLS).
func BenchmarkServerUpload(b *testing.B) {
	benchServerDirection(b, true)
}

// BenchmarkServerDownload: handler writes, the Go client reads.
func BenchmarkServerDownload(b *testing.B) { benchServerDirection(b, false) }

func benchServerDirection(b *testing.B, upload bool) {
	const chunk = 1 << 20
	done := make(chan int64, 1)
	st := srvBenchEnv(b, func(r *Request) {
		st, err := r.Accept()
		if err != nil {
			return
		}
		defer st.Close()
		if upload {
			n, _ := io.Copy(io.Discard, st)
			done <- n
			return
		}
		buf := make([]byte, chunk)
		for range b.N {
			if _, err := st.Write(buf); err != nil {
				return
			}
		}
		st.CloseWrite()
	})
	b.SetBytes(chunk)
	b.ResetTimer()
	start := time.Now()
	if upload {
		buf := make([]byte, chunk)
		for range b.N {
			if _, err := st.body.Write(buf); err != nil {
				b.Fatal(err)
			}
		}
		st.body.Close()
		<-done
	} else if _, err := io.CopyBuffer(io.Discard, st.resp.Body, make([]byte, chunk)); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)*chunk*8/time.Since(start).Seconds()/1e9, "Gbit/s")
}

func srvBenchEnv(b *testing.B, h func(*Request)) *srvTestConnect {
	e := newSrvTest(b, h, nil)
	cn, err := srvConnect(b, e.client(), srvTestTarget)
	if err != nil || cn.resp.StatusCode != http.StatusOK {
		b.Fatal(err)
	}
	return cn
}
