package hbone

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// srvRaw is a hand-driven HTTP/2 client for protocol edge cases: every
// frame is written and read by the test itself.
type srvRaw struct {
	t    testing.TB
	tc   *tls.Conn
	fr   *http2.Framer
	henc *hpack.Encoder
	hbuf bytes.Buffer
}

// dialRaw connects, sends the preface and settings, and reads the
// server's SETTINGS.
func (e *srvTestEnv) dialRaw(settings ...http2.Setting) *srvRaw {
	e.t.Helper()
	tc, err := e.dialTLS(e.ca, srvTestClientID)
	if err != nil {
		e.t.Fatal(err)
	}
	tc.SetDeadline(time.Now().Add(srvTestWait))
	r := &srvRaw{t: e.t, tc: tc, fr: http2.NewFramer(tc, tc)}
	r.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	r.fr.SetMaxReadFrameSize(16 << 20)
	r.henc = hpack.NewEncoder(&r.hbuf)
	if _, err := io.WriteString(tc, http2.ClientPreface); err != nil {
		e.t.Fatal(err)
	}
	if err := r.fr.WriteSettings(settings...); err != nil {
		e.t.Fatal(err)
	}
	f := r.next()
	if sf, ok := f.(*http2.SettingsFrame); !ok || sf.IsAck() {
		e.t.Fatalf("first frame from the server: %v", f)
	}
	r.fr.WriteSettingsAck()
	return r
}

// next reads a frame; the test fails on error.
func (r *srvRaw) next() http2.Frame {
	r.t.Helper()
	f, err := r.fr.ReadFrame()
	if err != nil {
		r.t.Fatalf("reading a frame: %v", err)
	}
	return f
}

// await reads frames until match returns true, skipping the others (at
// most 1000 of them).
func (r *srvRaw) await(what string, match func(http2.Frame) bool) http2.Frame {
	r.t.Helper()
	for range 1000 {
		f, err := r.fr.ReadFrame()
		if err != nil {
			r.t.Fatalf("waiting for %s: %v", what, err)
		}
		if match(f) {
			return f
		}
	}
	r.t.Fatalf("no %s in 1000 frames", what)
	return nil
}

// awaitStatus waits for the response HEADERS of stream id and returns
// its :status and END_STREAM flag.
func (r *srvRaw) awaitStatus(id uint32) (int, bool) {
	r.t.Helper()
	f := r.await("HEADERS", func(f http2.Frame) bool {
		mh, ok := f.(*http2.MetaHeadersFrame)
		return ok && mh.StreamID == id
	}).(*http2.MetaHeadersFrame)
	status, _ := strconv.Atoi(f.PseudoValue("status"))
	return status, f.StreamEnded()
}

// awaitRST waits for RST_STREAM on stream id and returns its code.
func (r *srvRaw) awaitRST(id uint32) http2.ErrCode {
	r.t.Helper()
	return r.await("RST_STREAM", func(f http2.Frame) bool {
		rf, ok := f.(*http2.RSTStreamFrame)
		return ok && rf.StreamID == id
	}).(*http2.RSTStreamFrame).ErrCode
}

// awaitGoAway waits for GOAWAY.
func (r *srvRaw) awaitGoAway() *http2.GoAwayFrame {
	r.t.Helper()
	return r.await("GOAWAY", func(f http2.Frame) bool {
		_, ok := f.(*http2.GoAwayFrame)
		return ok
	}).(*http2.GoAwayFrame)
}

// headers sends a HEADERS frame with fields (name, value pairs).
func (r *srvRaw) headers(id uint32, endStream bool, fields ...string) {
	r.t.Helper()
	r.hbuf.Reset()
	for i := 0; i+1 < len(fields); i += 2 {
		r.henc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	err := r.fr.WriteHeaders(http2.HeadersFrameParam{
		StreamID: id, BlockFragment: r.hbuf.Bytes(), EndStream: endStream, EndHeaders: true,
	})
	if err != nil {
		r.t.Fatal(err)
	}
}

func (r *srvRaw) connect(id uint32, authority string) {
	r.headers(id, false, ":method", "CONNECT", ":authority", authority)
}

func TestServerBadRequests(t *testing.T) {
	tests := []struct {
		name   string
		fields []string
	}{
		{"hostname", []string{":method", "CONNECT", ":authority", "example.com:80"}},
		{"no port", []string{":method", "CONNECT", ":authority", "10.0.0.1"}},
		{"port 0", []string{":method", "CONNECT", ":authority", "10.0.0.1:0"}},
		{"IPv6 without port", []string{":method", "CONNECT", ":authority", "[::1]"}},
		{"IPv6 with zone", []string{":method", "CONNECT", ":authority", "[fe80::1%eth0]:80"}},
		{"no authority", []string{":method", "CONNECT"}},
		{"path", []string{":method", "CONNECT", ":authority", "10.0.0.1:80", ":path", "/"}},
		{"scheme", []string{":method", "CONNECT", ":authority", "10.0.0.1:80", ":scheme", "https"}},
		{"GET", []string{":method", "GET", ":authority", "10.0.0.1:80", ":scheme", "https", ":path", "/"}},
		{"connection header", []string{":method", "CONNECT", ":authority", "10.0.0.1:80", "connection", "close"}},
	}
	e := newSrvTest(t, srvEcho, nil)
	r := e.dialRaw()
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r.t = t
			id := uint32(2*i + 1)
			r.headers(id, false, tt.fields...)
			status, end := r.awaitStatus(id)
			if status != 400 || !end {
				t.Errorf("got %d (END_STREAM %v), want 400 with END_STREAM", status, end)
			}
			if code := r.awaitRST(id); code != http2.ErrCodeNo {
				t.Errorf("RST_STREAM %v after the answer, want NO_ERROR", code)
			}
		})
	}
	if n := e.handled.Load(); n != 0 {
		t.Errorf("Handler called %d times for bad requests", n)
	}
	if st := e.srv.Stats(); st.StreamsRejected != uint64(len(tests)) {
		t.Errorf("stats %+v", st)
	}
}

func TestServerRefusesStreamsOverLimit(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	e := newSrvTest(t, func(r *Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}, func(o *ServerOptions) { o.MaxConcurrentStreams = 2 })
	r := e.dialRaw()
	r.connect(1, srvTestTarget)
	r.connect(3, srvTestTarget)
	r.connect(5, srvTestTarget)
	if code := r.awaitRST(5); code != http2.ErrCodeRefusedStream {
		t.Fatalf("third stream: RST_STREAM %v, want REFUSED_STREAM", code)
	}
}

// srvAcceptOne starts a server whose handler accepts and hands the stream
// to the test.
func srvAcceptOne(t *testing.T, mod func(*ServerOptions)) (*srvTestEnv, chan *ServerStream) {
	streams := make(chan *ServerStream, 4)
	e := newSrvTest(t, func(r *Request) {
		st, err := r.Accept()
		if err != nil {
			return
		}
		t.Cleanup(func() { st.Close() })
		streams <- st
	}, mod)
	return e, streams
}

func srvTake(t *testing.T, ch chan *ServerStream) *ServerStream {
	t.Helper()
	select {
	case st := <-ch:
		return st
	case <-time.After(srvTestWait):
		t.Fatal("handler did not accept")
		return nil
	}
}

func TestServerPeerResets(t *testing.T) {
	tests := []struct {
		code    http2.ErrCode
		wantEOF bool
	}{
		{http2.ErrCodeNo, true},
		{http2.ErrCodeCancel, true},
		{http2.ErrCodeConnect, false},
		{http2.ErrCodeInternal, false},
	}
	for _, tt := range tests {
		t.Run(tt.code.String(), func(t *testing.T) {
			e, streams := srvAcceptOne(t, nil)
			r := e.dialRaw()
			r.connect(1, srvTestTarget)
			st := srvTake(t, streams)
			if status, _ := r.awaitStatus(1); status != 200 {
				t.Fatalf("status %d", status)
			}
			r.fr.WriteData(1, false, []byte("abc"))
			r.fr.WriteRSTStream(1, tt.code)
			b, err := io.ReadAll(st)
			if tt.wantEOF {
				// Data that arrived before a clean reset is still read.
				if err != nil || string(b) != "abc" {
					t.Fatalf("read %q, %v; want \"abc\", EOF", b, err)
				}
			} else if !errors.Is(err, ErrStreamReset) {
				t.Fatalf("read error %v, want ErrStreamReset", err)
			}
			if _, err := st.Write([]byte("x")); err == nil {
				t.Error("Write on a reset stream succeeded")
			}
		})
	}
}

// A peer that sends more than the stream window gets
// RST_STREAM(FLOW_CONTROL_ERROR); the connection survives.
func TestServerStreamWindowOverrun(t *testing.T) {
	e, streams := srvAcceptOne(t, nil)
	r := e.dialRaw()
	r.connect(1, srvTestTarget)
	srvTake(t, streams) // accepted, never read
	chunk := make([]byte, 16<<10)
	for sent := 0; sent <= h2StreamWindow; sent += len(chunk) {
		if err := r.fr.WriteData(1, false, chunk); err != nil {
			t.Fatal(err)
		}
	}
	if code := r.awaitRST(1); code != http2.ErrCodeFlowControl {
		t.Fatalf("RST_STREAM %v, want FLOW_CONTROL_ERROR", code)
	}
	// The connection still works.
	r.fr.WritePing(false, [8]byte{1})
	r.await("PING ACK", func(f http2.Frame) bool { p, ok := f.(*http2.PingFrame); return ok && p.IsAck() })
}

// The handler's Write waits for the peer's window, and sends exactly the
// window's worth until WINDOW_UPDATE.
func TestServerSendFlowControl(t *testing.T) {
	e, streams := srvAcceptOne(t, nil)
	r := e.dialRaw(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1000})
	r.connect(1, srvTestTarget)
	st := srvTake(t, streams)
	payload := bytes.Repeat([]byte("0123456789"), 500) // 5000 bytes
	wrote := make(chan error, 1)
	go func() {
		_, err := st.Write(payload)
		wrote <- err
	}()
	var got []byte
	readData := func(limit int) {
		for len(got) < limit {
			f := r.await("DATA", func(f http2.Frame) bool { _, ok := f.(*http2.DataFrame); return ok })
			got = append(got, f.(*http2.DataFrame).Data()...)
		}
	}
	readData(1000)
	if len(got) != 1000 {
		t.Fatalf("got %d bytes with a 1000-byte window", len(got))
	}
	select {
	case err := <-wrote:
		t.Fatalf("Write returned (%v) with the window exhausted", err)
	default:
	}
	r.fr.WriteWindowUpdate(1, 4000)
	readData(5000)
	if !bytes.Equal(got, payload) {
		t.Fatal("data mismatch")
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	// A peer that stops reading its window must not be able to hang
	// Close: Reset unblocks a waiting Write.
	go func() {
		_, err := st.Write(payload)
		wrote <- err
	}()
	st.Reset()
	if err := <-wrote; err == nil {
		t.Fatal("Write blocked on flow control succeeded after Reset")
	}
	if code := r.awaitRST(1); code != http2.ErrCodeConnect {
		t.Fatalf("RST_STREAM %v, want CONNECT_ERROR", code)
	}
}

func TestServerProtocolErrors(t *testing.T) {
	tests := []struct {
		name string
		send func(r *srvRaw)
		want http2.ErrCode
	}{
		{"even stream", func(r *srvRaw) { r.connect(2, srvTestTarget) }, http2.ErrCodeProtocol},
		{"DATA on idle stream", func(r *srvRaw) { r.fr.WriteData(9, false, []byte("x")) }, http2.ErrCodeProtocol},
		{"PUSH_PROMISE", func(r *srvRaw) {
			r.fr.WritePushPromise(http2.PushPromiseParam{StreamID: 1, PromiseID: 2, EndHeaders: true})
		}, http2.ErrCodeProtocol},
		{"window overflow", func(r *srvRaw) { r.fr.WriteWindowUpdate(0, 1<<31-1) }, http2.ErrCodeFlowControl},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newSrvTest(t, srvEcho, nil)
			r := e.dialRaw()
			tt.send(r)
			if ga := r.awaitGoAway(); ga.ErrCode != tt.want {
				t.Fatalf("GOAWAY %v, want %v", ga.ErrCode, tt.want)
			}
			if _, err := r.fr.ReadFrame(); err == nil {
				t.Fatal("connection still open after GOAWAY")
			}
		})
	}
}

func TestServerPingAndUnknownFrames(t *testing.T) {
	e := newSrvTest(t, srvEcho, nil)
	r := e.dialRaw()
	r.fr.WritePriority(1, http2.PriorityParam{Weight: 3})
	r.fr.WriteRawFrame(0x42, 0, 0, []byte("unknown extension"))
	r.fr.WritePing(false, [8]byte{'h', 'i'})
	f := r.await("PING ACK", func(f http2.Frame) bool { p, ok := f.(*http2.PingFrame); return ok && p.IsAck() })
	if got := f.(*http2.PingFrame).Data; got != [8]byte{'h', 'i'} {
		t.Fatalf("PING ACK data %q", got[:])
	}
}

// A peer that answers nothing is dropped after the keepalive timeout.
func TestServerKeepalive(t *testing.T) {
	e := newSrvTest(t, srvEcho, func(o *ServerOptions) {
		o.pingAfter = 50 * time.Millisecond
		o.pingTimeout = 100 * time.Millisecond
	})
	r := e.dialRaw()
	// Answer the first PING: the connection stays.
	p := r.await("PING", func(f http2.Frame) bool { p, ok := f.(*http2.PingFrame); return ok && !p.IsAck() })
	r.fr.WritePing(true, p.(*http2.PingFrame).Data)
	r.await("second PING", func(f http2.Frame) bool { p, ok := f.(*http2.PingFrame); return ok && !p.IsAck() })
	// Now stay silent: the server must close.
	start := time.Now()
	for range 1000 {
		if _, err := r.fr.ReadFrame(); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatal("server did not close a silent connection")
			}
			t.Logf("closed after %v: %v", time.Since(start), err)
			return
		}
	}
	t.Fatal("server kept sending frames to a silent peer")
}

// Shutdown sends GOAWAY, refuses new streams, waits for the open one and
// then closes the connection.
func TestServerShutdown(t *testing.T) {
	e, streams := srvAcceptOne(t, nil)
	r := e.dialRaw()
	r.connect(1, srvTestTarget)
	st := srvTake(t, streams)
	r.awaitStatus(1)

	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), srvTestWait)
		defer cancel()
		shut <- e.srv.Shutdown(ctx)
	}()
	ga := r.awaitGoAway()
	if ga.ErrCode != http2.ErrCodeNo || ga.LastStreamID != 1 {
		t.Fatalf("GOAWAY %v last %d, want NO_ERROR last 1", ga.ErrCode, ga.LastStreamID)
	}
	r.connect(3, srvTestTarget)
	if code := r.awaitRST(3); code != http2.ErrCodeRefusedStream {
		t.Fatalf("stream after GOAWAY: %v, want REFUSED_STREAM", code)
	}
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned (%v) with a stream open", err)
	default:
	}
	// The open stream still works both ways, then ends.
	r.fr.WriteData(1, true, []byte("last words"))
	if b, err := io.ReadAll(st); err != nil || string(b) != "last words" {
		t.Fatalf("read %q, %v", b, err)
	}
	st.Write([]byte("bye"))
	st.CloseWrite()
	f := r.await("DATA", func(f http2.Frame) bool { _, ok := f.(*http2.DataFrame); return ok })
	if string(f.(*http2.DataFrame).Data()) != "bye" {
		t.Fatalf("got %q", f.(*http2.DataFrame).Data())
	}
	select {
	case err := <-shut:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(srvTestWait):
		t.Fatal("Shutdown did not return after the last stream ended")
	}
	if _, err := e.dialTLS(e.ca, srvTestClientID); err == nil {
		t.Error("dial after Shutdown worked")
	}
}

// Shutdown gives up when its context ends, and closes what is left.
func TestServerShutdownDeadline(t *testing.T) {
	e, streams := srvAcceptOne(t, nil)
	r := e.dialRaw()
	r.connect(1, srvTestTarget)
	st := srvTake(t, streams)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := e.srv.Shutdown(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Shutdown: %v, want context.Canceled", err)
	}
	if _, err := st.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Read after Close: %v, want net.ErrClosed", err)
	}
}

// The server's HTTP/2 settings on the wire (docs/hbone.md, "HTTP/2
// settings"): 4 MiB stream window, 16 MiB connection window, 1 MiB max
// frame, 200 concurrent streams, 64 KiB header list, no push.
func TestServerSettingsWire(t *testing.T) {
	e := newSrvTest(t, srvEcho, nil)
	tc, err := e.dialTLS(e.ca, srvTestClientID)
	if err != nil {
		t.Fatal(err)
	}
	tc.SetDeadline(time.Now().Add(srvTestWait))
	if _, err := io.WriteString(tc, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(tc, tc)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	f, err := fr.ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	sf, ok := f.(*http2.SettingsFrame)
	if !ok || sf.IsAck() {
		t.Fatalf("first frame %v, want SETTINGS", f)
	}
	got := map[http2.SettingID]uint32{}
	sf.ForeachSetting(func(s http2.Setting) error { got[s.ID] = s.Val; return nil })
	want := map[http2.SettingID]uint32{
		http2.SettingInitialWindowSize:    4 << 20,
		http2.SettingMaxFrameSize:         1 << 20,
		http2.SettingMaxConcurrentStreams: 200,
		http2.SettingMaxHeaderListSize:    64 << 10,
	}
	for id, v := range want {
		if got[id] != v {
			t.Errorf("%v = %d, want %d", id, got[id], v)
		}
	}
	if v, ok := got[http2.SettingEnablePush]; ok && v != 0 {
		t.Errorf("ENABLE_PUSH = %d", v)
	}
	// The connection window is raised from the protocol's 64 KiB - 1 to
	// 16 MiB at once.
	for range 10 {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if wu, ok := f.(*http2.WindowUpdateFrame); ok && wu.StreamID == 0 {
			if total := wu.Increment + 65535; total != 16<<20 {
				t.Fatalf("connection window %d, want %d", total, 16<<20)
			}
			return
		}
	}
	t.Fatal("no connection WINDOW_UPDATE among the first frames")
}

// A peer that floods PINGs and never reads our answers is cut off once
// h2MaxQueuedControl answers wait behind the blocked writer: the server's
// reader never writes, so the queue is all that grows, and it is bounded
// (docs/hbone.md, "HTTP/2 settings").
func TestServerPingFloodWithoutReading(t *testing.T) {
	floodWithoutReading(t, newHostile(t, nil), "PINGs", func(fr *http2.Framer, i int) {
		fr.WritePing(false, [8]byte{byte(i)})
	})
}
