package hbone

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// The attacks of the HTTP/2 denial-of-service advisories, each made with
// x/net's Framer against a real Server over mutual TLS. Each passes when
// memory and goroutines stay bounded, the attacking connection is closed
// or throttled, and a healthy client on a connection of its own is served
// during and after the attack.

// hostileEnv is a server whose handler echoes, with the count of handlers
// running and the most seen at once.
type hostileEnv struct {
	*srvTestEnv
	running, most atomic.Int64
}

func newHostile(t *testing.T, mod func(*ServerOptions)) *hostileEnv {
	h := &hostileEnv{}
	h.srvTestEnv = newSrvTest(t, func(r *Request) {
		n := h.running.Add(1)
		defer h.running.Add(-1)
		for m := h.most.Load(); n > m && !h.most.CompareAndSwap(m, n); m = h.most.Load() {
		}
		srvEcho(r)
	}, mod)
	return h
}

// healthy opens a connection of its own and checks one echo through it.
func (h *hostileEnv) healthy(t *testing.T, when string) {
	t.Helper()
	cn, err := srvConnect(t, h.client(), srvTestTarget)
	if err != nil {
		t.Fatalf("%s: a healthy CONNECT failed: %v", when, err)
	}
	defer cn.cancel()
	if cn.resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: a healthy CONNECT got %d", when, cn.resp.StatusCode)
	}
	go func() { cn.body.Write([]byte("still served")); cn.body.Close() }()
	got, err := io.ReadAll(cn.resp.Body)
	if err != nil || string(got) != "still served" {
		t.Fatalf("%s: a healthy echo read %q, %v", when, got, err)
	}
}

// heapAfterGC is the live heap, measured after a collection.
func heapAfterGC() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// hostileHeapBound is how much more live heap than before an attack may
// be left: far above what one connection's state needs, far below what
// a leak of the attack's frames (tens to hundreds of MB) would keep.
const hostileHeapBound = 32 << 20

// drainFrames reads the attacker's connection until it fails (the server
// closed it, or the test's deadline), counting GOAWAYs; it returns when
// done is closed by the reader.
func drainFrames(r *srvRaw) (goaways *atomic.Int64, done chan struct{}) {
	goaways, done = new(atomic.Int64), make(chan struct{})
	go func() {
		defer close(done)
		for {
			f, err := r.fr.ReadFrame()
			if err != nil {
				var se http2.StreamError
				if errors.As(err, &se) {
					continue // a frame the Framer refused on one stream; keep reading
				}
				return
			}
			if _, ok := f.(*http2.GoAwayFrame); ok {
				goaways.Add(1)
			}
		}
	}()
	return goaways, done
}

// Rapid reset (CVE-2023-44487): 20,000 CONNECTs, each reset at once. The
// streams end as fast as they open, so the concurrency limit alone would
// not bound the handlers still running; at most twice the limit may run.
func TestHostileRapidReset(t *testing.T) {
	const streams = 20000
	h := newHostile(t, nil)
	before := runtime.NumGoroutine()
	heap0 := heapAfterGC()
	r := h.dialRaw()
	r.tc.SetDeadline(time.Now().Add(2 * srvTestWait))
	_, done := drainFrames(r)

	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	sent := 0
	for i := range streams {
		id := uint32(2*i + 1)
		block.Reset()
		enc.WriteField(hpack.HeaderField{Name: ":method", Value: "CONNECT"})
		enc.WriteField(hpack.HeaderField{Name: ":authority", Value: srvTestTarget})
		if err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block.Bytes(), EndHeaders: true}); err != nil {
			t.Logf("server closed the connection after %d streams: %v", sent, err)
			break
		}
		if err := r.fr.WriteRSTStream(id, http2.ErrCodeCancel); err != nil {
			t.Logf("server closed the connection after %d streams: %v", sent, err)
			break
		}
		sent++
		if i == 1000 { // early: the server may cut the attack off well before its end
			h.healthy(t, "during the rapid reset")
		}
	}
	if limit := 2 * int64(srvDefaultMaxStreams); h.most.Load() > limit {
		t.Errorf("%d handlers ran at once, want at most %d", h.most.Load(), limit)
	}
	h.healthy(t, "after the rapid reset")
	r.tc.Close()
	<-done
	srvGoroutinesSettle(t, before+8) // the healthy clients' connections may still be closing
	if grew := int64(heapAfterGC()) - int64(heap0); grew > hostileHeapBound {
		t.Errorf("live heap grew by %d bytes over the attack", grew)
	}
	st := h.srv.Stats()
	t.Logf("%d streams opened and reset; stats %+v; at most %d handlers at once", sent, st, h.most.Load())
}

// CONTINUATION flood (CVE-2023-45288): one header block that never ends,
// its CONTINUATION frames each a valid header field. The server must cut
// the connection off once the block passes its header-list limit,
// without buffering or decoding the rest.
func TestHostileContinuationFlood(t *testing.T) {
	for _, tc := range []struct {
		name  string
		field int // bytes of the value of each CONTINUATION's one header field; 0: empty frames
	}{{"1 KiB fields", 1 << 10}, {"empty frames", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHostile(t, nil)
			heap0 := heapAfterGC()
			r := h.dialRaw()
			goaways, done := drainFrames(r)
			var block bytes.Buffer
			enc := hpack.NewEncoder(&block)
			enc.WriteField(hpack.HeaderField{Name: ":method", Value: "CONNECT"})
			enc.WriteField(hpack.HeaderField{Name: ":authority", Value: srvTestTarget})
			if err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block.Bytes()}); err != nil {
				t.Fatal(err)
			}
			var frag []byte
			if tc.field > 0 {
				block.Reset()
				enc.WriteField(hpack.HeaderField{Name: "x-flood", Value: strings.Repeat("a", tc.field), Sensitive: true})
				frag = bytes.Clone(block.Bytes())
			}
			// 100,000 frames: 100 MB of header fields with 1 KiB each.
			const frames = 100000
			cut := false
			for i := range frames {
				if err := r.fr.WriteContinuation(1, false, frag); err != nil {
					var ne net.Error
					if errors.As(err, &ne) && ne.Timeout() {
						t.Fatalf("after %d CONTINUATIONs the server stopped reading instead of closing: %v", i, err)
					}
					t.Logf("cut off after %d CONTINUATION frames: %v (GOAWAYs read: %d)", i, err, goaways.Load())
					cut = true
					break
				}
			}
			if !cut && tc.field > 0 {
				t.Fatalf("the server read %d CONTINUATION frames (%d MB of header fields) and kept the connection", frames, frames*tc.field>>20)
			}
			// Empty CONTINUATIONs carry nothing to limit; the server may
			// read them all, but the block still must not succeed, and the
			// connection must end with it.
			r.tc.CloseWrite()
			select {
			case <-done:
			case <-time.After(srvTestWait):
				t.Fatal("the attacking connection was not closed")
			}
			if n := h.handled.Load(); n != 0 {
				t.Errorf("%d handlers ran for a header block that never ended", n)
			}
			h.healthy(t, "after the CONTINUATION flood")
			if grew := int64(heapAfterGC()) - int64(heap0); grew > hostileHeapBound {
				t.Errorf("live heap grew by %d bytes over the attack", grew)
			}
		})
	}
}

// floodWithoutReading sends batches of frames made by write on a
// connection whose receive buffer is small and never read: every frame
// that asks for an answer (PING, SETTINGS) queues one behind a blocked
// writer. The server must cut the connection off (the queued-control
// cap) rather than stop reading or grow without bound; a healthy client
// is served meanwhile.
func floodWithoutReading(t *testing.T, h *hostileEnv, what string, write func(fr *http2.Framer, i int)) {
	t.Helper()
	tc := dialSmallRcvbuf(t, h.srvTestEnv)
	var batch bytes.Buffer
	fr := http2.NewFramer(&batch, nil)
	batch.WriteString(http2.ClientPreface)
	fr.WriteSettings()
	first := bytes.Clone(batch.Bytes())
	batch.Reset()
	for i := range 100 { // well below the cap: the writer keeps up with a burst
		write(fr, i)
	}
	frames := bytes.Clone(batch.Bytes())
	if _, err := tc.Write(first); err != nil {
		t.Fatal(err)
	}
	// 20,000 rounds of 100: far more answers than the socket buffers
	// between us hold.
	for round := range 20000 {
		if _, err := tc.Write(frames); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("round %d: the server stopped reading instead of cutting the %s flood off: %v", round, what, err)
			}
			t.Logf("cut off after %d rounds of 100 %s: %v", round, what, err)
			h.healthy(t, "after the "+what+" flood")
			return
		}
		if round == 100 {
			h.healthy(t, "during the "+what+" flood")
		}
	}
	t.Fatalf("the server answered 2 million %s that were never read", what)
}

// SETTINGS flood: each SETTINGS asks for an ACK.
func TestHostileSettingsFlood(t *testing.T) {
	h := newHostile(t, nil)
	floodWithoutReading(t, h, "SETTINGS", func(fr *http2.Framer, i int) {
		fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: uint32(65535 + i)})
	})
}

// WINDOW_UPDATE abuse: zero increments and overflows end the stream or
// the connection as RFC 9113 §6.9 says; a flood of one-byte increments
// (which provoke no answer) leaves the connection serving.
func TestHostileWindowUpdates(t *testing.T) {
	t.Run("zero increment on the connection", func(t *testing.T) {
		h := newHostile(t, nil)
		r := h.dialRaw()
		r.fr.AllowIllegalWrites = true // the Framer refuses to send a zero increment otherwise
		if err := r.fr.WriteWindowUpdate(0, 0); err != nil {
			t.Fatal(err)
		}
		if ga := r.awaitGoAway(); ga.ErrCode != http2.ErrCodeProtocol {
			t.Fatalf("GOAWAY %v, want PROTOCOL_ERROR", ga.ErrCode)
		}
		h.healthy(t, "after the zero WINDOW_UPDATE")
	})
	t.Run("zero increment on a stream", func(t *testing.T) {
		h := newHostile(t, nil)
		r := h.dialRaw()
		r.connect(1, srvTestTarget)
		if status, _ := r.awaitStatus(1); status != http.StatusOK {
			t.Fatalf("CONNECT status %d", status)
		}
		r.fr.AllowIllegalWrites = true
		if err := r.fr.WriteWindowUpdate(1, 0); err != nil {
			t.Fatal(err)
		}
		if code := r.awaitRST(1); code != http2.ErrCodeProtocol {
			t.Fatalf("RST_STREAM %v, want PROTOCOL_ERROR", code)
		}
		r.fr.WritePing(false, [8]byte{7}) // the connection still works
		r.await("PING ACK", func(f http2.Frame) bool { p, ok := f.(*http2.PingFrame); return ok && p.IsAck() })
	})
	t.Run("stream window overflow", func(t *testing.T) {
		h := newHostile(t, nil)
		r := h.dialRaw()
		r.connect(1, srvTestTarget)
		if status, _ := r.awaitStatus(1); status != http.StatusOK {
			t.Fatalf("CONNECT status %d", status)
		}
		r.fr.WriteWindowUpdate(1, 1<<31-1)
		if code := r.awaitRST(1); code != http2.ErrCodeFlowControl {
			t.Fatalf("RST_STREAM %v, want FLOW_CONTROL_ERROR", code)
		}
		r.connect(3, srvTestTarget) // and the connection serves on
		if status, _ := r.awaitStatus(3); status != http.StatusOK {
			t.Fatalf("CONNECT after the overflow: status %d", status)
		}
	})
	t.Run("one-byte flood", func(t *testing.T) {
		h := newHostile(t, nil)
		r := h.dialRaw()
		r.connect(1, srvTestTarget)
		if status, _ := r.awaitStatus(1); status != http.StatusOK {
			t.Fatalf("CONNECT status %d", status)
		}
		var batch bytes.Buffer
		fr := http2.NewFramer(&batch, nil)
		for range 1000 {
			fr.WriteWindowUpdate(0, 1)
			fr.WriteWindowUpdate(1, 1)
		}
		for range 100 { // 200,000 frames
			if _, err := r.tc.Write(batch.Bytes()); err != nil {
				t.Fatalf("the server stopped reading one-byte WINDOW_UPDATEs: %v", err)
			}
		}
		// The stream still echoes: 200,000 updates bought nothing.
		r.fr.WriteData(1, true, []byte("after the flood"))
		var got []byte
		for len(got) < len("after the flood") {
			f := r.await("DATA", func(f http2.Frame) bool { d, ok := f.(*http2.DataFrame); return ok && d.StreamID == 1 })
			got = append(got, f.(*http2.DataFrame).Data()...)
		}
		if string(got) != "after the flood" {
			t.Fatalf("echo after the flood: %q", got)
		}
	})
}

// A zero window that never opens: the client announces an initial window
// of 0 and never reads. The handler's write waits on credit, holding one
// stream; the keepalive ends the connection when the peer answers
// nothing, which frees the handler; healthy clients are served all along.
func TestHostileZeroWindow(t *testing.T) {
	wrote := make(chan error, 1)
	var once sync.Once
	e := newSrvTest(t, func(r *Request) {
		st, err := r.Accept()
		if err != nil {
			return
		}
		defer st.Close()
		if r.Target().Port() == 1 { // the healthy client's echo
			srvEchoStream(st)
			return
		}
		_, err = st.Write(make([]byte, 1<<20))
		once.Do(func() { wrote <- err })
	}, func(o *ServerOptions) {
		o.pingAfter = 100 * time.Millisecond
		o.pingTimeout = 300 * time.Millisecond
	})
	h := &hostileEnv{srvTestEnv: e}
	before := runtime.NumGoroutine()
	r := h.dialRaw(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	r.connect(1, "10.0.0.1:2")
	if status, _ := r.awaitStatus(1); status != http.StatusOK {
		t.Fatalf("CONNECT status %d", status)
	}
	// The attacker now reads nothing and sends nothing.
	select {
	case err := <-wrote:
		if err == nil {
			t.Fatal("1 MiB written into a zero window")
		}
		t.Logf("the stuck write ended: %v", err)
	case <-time.After(srvTestWait):
		t.Fatal("a write into a window that never opens was never ended")
	}
	cn, err := srvConnect(t, h.client(), "10.0.0.1:1")
	if err != nil || cn.resp.StatusCode != http.StatusOK {
		t.Fatalf("healthy CONNECT after the zero-window attack: %v", err)
	}
	cn.cancel()
	r.tc.Close()
	srvGoroutinesSettle(t, before+8)
}

// dialSmallRcvbuf opens a TLS connection to the server with a small
// receive buffer, so the server's writes to it back up soon.
func dialSmallRcvbuf(t *testing.T, e *srvTestEnv) *tls.Conn {
	t.Helper()
	ca, _ := srvTestCA()
	cert, err := ca.KeyPair(srvTestClientID)
	if err != nil {
		t.Fatal(err)
	}
	d := net.Dialer{Timeout: srvTestWait, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<10)
		})
		return errors.Join(err, serr)
	}}
	raw, err := d.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	raw.SetDeadline(time.Now().Add(srvTestWait))
	tc := tls.Client(raw, ClientConfig(cert, ca.Pool(), []string{srvTestServerID}))
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	return tc
}

// srvEchoStream copies st back to itself, then half-closes.
func srvEchoStream(st *ServerStream) {
	if _, err := io.Copy(st, st); err == nil {
		st.CloseWrite()
	}
}
