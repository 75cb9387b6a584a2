package hbone

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/netip"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Idle streams cost no goroutine and no receive buffer: 1,000 streams
// that each received and read a few bytes hold no chunk, and the client
// started no goroutine for them.
func TestClientIdleStreamsHoldNothing(t *testing.T) {
	const n = 1000
	pki := newClientTestPKI(t)
	peer := newClientFramePeer(t, pki, nil)
	pool := newClientTestPool(t, pki, func(o *PoolOptions) { o.MaxStreamsPerConn = n + 1 })
	// The first stream brings up the connection and its reader.
	clientConnect(t, pool, peer.addr)
	c := peer.nextConn(t)
	clientRecv(t, c.streams, "the first stream")
	runtime.GC()
	before := runtime.NumGoroutine()

	streams := make([]*ClientStream, 0, n)
	for range n {
		s := clientConnect(t, pool, peer.addr)
		streams = append(streams, s)
		id := clientRecv(t, c.streams, "a stream")
		if id != s.id {
			t.Fatalf("peer saw stream %d, client opened %d", id, s.id)
		}
		if err := c.data(id, false, []byte("hello")); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Write([]byte("hi")); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 5)
		if _, err := io.ReadFull(s, got); err != nil || string(got) != "hello" {
			t.Fatalf("read %q, %v", got, err)
		}
	}
	if st := pool.Stats(); st.ConnsOpened != 1 || st.StreamsOpen != n+1 {
		t.Fatalf("stats %+v, want 1 connection carrying %d streams", st, n+1)
	}
	// No goroutine per stream (a few may come and go: timers, GC).
	if after := runtime.NumGoroutine(); after-before >= 10 {
		t.Errorf("%d goroutines before the %d streams, %d with them", before, n, after)
	}
	cc := streams[0].c
	cc.mu.Lock()
	for _, s := range streams {
		if s.buf.chunks != nil || s.buf.n != 0 {
			t.Errorf("idle stream %d holds %d receive chunks", s.id, len(s.buf.chunks))
			break
		}
	}
	open := len(cc.streams)
	cc.mu.Unlock()
	if open != n+1 {
		t.Errorf("connection tracks %d streams, want %d", open, n+1)
	}
}

// Received data is credited back as it is read: the peer gets
// WINDOW_UPDATEs on the stream and can send far more than one window.
func TestClientWindowUpdates(t *testing.T) {
	_, _, s, c, id := clientFrameStream(t)
	const frame = 1 << 20
	const total = 3 * h2StreamWindow // three stream windows
	readErr := make(chan error, 1)
	go func() {
		n, err := io.Copy(io.Discard, s)
		if err == nil && n != total {
			err = errors.New("short read")
		}
		readErr <- err
	}()
	// Send within the stream window as the peer sees it, waiting for
	// the client's WINDOW_UPDATEs to send more.
	window := int64(h2StreamWindow)
	payload := make([]byte, frame)
	for sent := int64(0); sent < total; {
		for window < frame {
			wu := clientRecv(t, c.winUpdates, "a stream WINDOW_UPDATE")
			if wu.StreamID != id {
				t.Fatalf("WINDOW_UPDATE on stream %d, want %d", wu.StreamID, id)
			}
			window += int64(wu.Increment)
		}
		sent += frame
		window -= frame
		if err := c.data(id, sent == total, payload); err != nil {
			t.Fatal(err)
		}
	}
	if err := clientRecv(t, readErr, "the reader"); err != nil {
		t.Fatal(err)
	}
}

// A later, lower SETTINGS_MAX_CONCURRENT_STREAMS is respected: at the new
// limit the next flow gets a new connection.
func TestClientPeerLowersStreamLimit(t *testing.T) {
	pki := newClientTestPKI(t)
	peer := newClientFramePeer(t, pki, nil)
	pool := newClientTestPool(t, pki, nil)
	clientConnect(t, pool, peer.addr)
	c1 := peer.nextConn(t)
	clientRecv(t, c1.streams, "the first stream")
	clientRecv(t, c1.settingsAck, "the ACK of the peer's first SETTINGS")
	c1.write(func() error {
		return c1.fr.WriteSettings(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 1})
	})
	clientRecv(t, c1.settingsAck, "the ACK of the lower limit")
	clientConnect(t, pool, peer.addr)
	c2 := peer.nextConn(t)
	clientRecv(t, c2.streams, "the second stream, on a new connection")
	if st := pool.Stats(); st.ConnsOpened != 2 {
		t.Errorf("ConnsOpened %d, want 2", st.ConnsOpened)
	}
}

// When stream IDs run out, the connection takes no more streams and the
// next flow gets a new connection.
func TestClientStreamIDsRunOut(t *testing.T) {
	pki := newClientTestPKI(t)
	peer := newClientFramePeer(t, pki, nil)
	pool := newClientTestPool(t, pki, nil)
	s1 := clientConnect(t, pool, peer.addr)
	c1 := peer.nextConn(t)
	clientRecv(t, c1.streams, "the first stream")
	cc := s1.c
	cc.mu.Lock()
	cc.nextID = h2MaxStreamID // the last odd ID
	cc.mu.Unlock()
	clientConnect(t, pool, peer.addr)
	if id := clientRecv(t, c1.streams, "the last stream ID"); id != h2MaxStreamID {
		t.Fatalf("stream %d, want %d", id, h2MaxStreamID)
	}
	clientConnect(t, pool, peer.addr)
	c2 := peer.nextConn(t)
	if id := clientRecv(t, c2.streams, "a stream on a new connection"); id != 1 {
		t.Fatalf("stream %d on the new connection, want 1", id)
	}
}

// A peer that breaks the protocol gets GOAWAY with the right code, the
// connection is closed and its streams fail; the pool dials anew.
func TestClientHostileFrames(t *testing.T) {
	mib := make([]byte, 1<<20)
	tests := []struct {
		name string
		send func(c *clientFrameConn, ids []uint32) error
		code http2.ErrCode
	}{
		{"DATA on an idle stream", func(c *clientFrameConn, ids []uint32) error {
			return c.fr.WriteData(ids[len(ids)-1]+2, false, []byte("x"))
		}, http2.ErrCodeProtocol},
		{"HEADERS on a server stream", func(c *clientFrameConn, ids []uint32) error {
			return c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 2, BlockFragment: []byte{0x88}, EndHeaders: true})
		}, http2.ErrCodeProtocol},
		{"PUSH_PROMISE", func(c *clientFrameConn, ids []uint32) error {
			return c.fr.WritePushPromise(http2.PushPromiseParam{StreamID: ids[0], PromiseID: 2, BlockFragment: []byte{0x88}, EndHeaders: true})
		}, http2.ErrCodeProtocol},
		{"connection window overflow", func(c *clientFrameConn, ids []uint32) error {
			return c.fr.WriteWindowUpdate(0, 1<<31-1)
		}, http2.ErrCodeFlowControl},
		{"connection window overrun", func(c *clientFrameConn, ids []uint32) error {
			// Four full stream windows fill the 16 MiB connection window
			// (nothing is read), then one byte more.
			for _, id := range ids[:4] {
				for range 4 {
					if err := c.fr.WriteData(id, false, mib); err != nil {
						return err
					}
				}
			}
			return c.fr.WriteData(ids[4], false, []byte("x"))
		}, http2.ErrCodeFlowControl},
		{"frame too large", func(c *clientFrameConn, ids []uint32) error {
			return c.fr.WriteData(ids[0], false, make([]byte, 2<<20))
		}, http2.ErrCodeFrameSize},
		{"bad SETTINGS", func(c *clientFrameConn, ids []uint32) error {
			return c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 31})
		}, http2.ErrCodeFlowControl},
		{"garbage HPACK", func(c *clientFrameConn, ids []uint32) error {
			return c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: ids[0], BlockFragment: []byte{0xff, 0xff, 0xff, 0xff}, EndHeaders: true})
		}, http2.ErrCodeCompression},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pki := newClientTestPKI(t)
			peer := newClientFramePeer(t, pki, nil)
			pool := newClientTestPool(t, pki, nil)
			var c *clientFrameConn
			var streams []*ClientStream
			var ids []uint32
			for range 5 {
				s := clientConnect(t, pool, peer.addr)
				if c == nil {
					c = peer.nextConn(t)
				}
				streams = append(streams, s)
				ids = append(ids, clientRecv(t, c.streams, "a stream"))
			}
			// In the background: the write may block once the client
			// stopped reading; the peer's cleanup ends it.
			go c.write(func() error {
				c.fr.AllowIllegalWrites = true
				return tt.send(c, ids)
			})
			ga := clientRecv(t, c.goAways, "GOAWAY")
			if ga.ErrCode != tt.code {
				t.Errorf("GOAWAY %v, want %v", ga.ErrCode, tt.code)
			}
			clientRecv(t, c.done, "the client to close the connection")
			if _, err := io.ReadAll(streams[0]); err == nil {
				t.Error("stream of the broken connection ended cleanly")
			}
			clientConnect(t, pool, peer.addr).Close()
			if st := pool.Stats(); st.ConnsOpened != 2 {
				t.Errorf("ConnsOpened %d, want 2", st.ConnsOpened)
			}
		})
	}
}

// A stream's own errors reset only that stream: the connection carries on.
func TestClientStreamErrors(t *testing.T) {
	tests := []struct {
		name string
		send func(c *clientFrameConn, id uint32) error
		code http2.ErrCode
	}{
		{"stream window overrun", func(c *clientFrameConn, id uint32) error {
			for i := 0; i < 5; i++ { // 5 MiB on a 4 MiB stream window
				if err := c.fr.WriteData(id, false, make([]byte, 1<<20)); err != nil {
					return err
				}
			}
			return nil
		}, http2.ErrCodeFlowControl},
		{"DATA after END_STREAM", func(c *clientFrameConn, id uint32) error {
			if err := c.fr.WriteData(id, true, []byte("end")); err != nil {
				return err
			}
			return c.fr.WriteData(id, false, []byte("more"))
		}, http2.ErrCodeStreamClosed},
		{"HEADERS mid-stream", func(c *clientFrameConn, id uint32) error {
			c.encBuf.Reset()
			c.enc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
			return c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.encBuf.Bytes(), EndHeaders: true})
		}, http2.ErrCodeProtocol},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool, peer, s, c, id := clientFrameStream(t)
			if err := c.write(func() error { return tt.send(c, id) }); err != nil {
				t.Fatal(err)
			}
			rst := clientRecv(t, c.resets, "RST_STREAM")
			if rst.StreamID != id || rst.ErrCode != tt.code {
				t.Errorf("RST_STREAM stream %d %v, want stream %d %v", rst.StreamID, rst.ErrCode, id, tt.code)
			}
			if _, err := s.Write([]byte("x")); err == nil {
				t.Error("Write on the reset stream succeeded")
			}
			// The connection is fine: the next stream goes on it.
			clientConnect(t, pool, peer.addr).Close()
			clientRecv(t, c.streams, "the next stream on the same connection")
			select {
			case ga := <-c.goAways:
				t.Errorf("GOAWAY %v after a stream error", ga.ErrCode)
			default:
			}
		})
	}
}

// A peer whose first frame is not SETTINGS is not HTTP/2: the dial fails.
func TestClientFirstFrameNotSettings(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	c := newClientConn(a, newBatchConn(a), hclog.NewNullLogger(), func() {}, time.Hour, time.Hour)
	go io.Copy(io.Discard, b)
	errc := make(chan error, 1)
	c.start()
	go func() { c.serve(); errc <- nil }()
	fr := http2.NewFramer(b, nil)
	fr.WritePing(false, [8]byte{})
	clientRecv(t, c.settingsDone, "the client to give up on SETTINGS")
	c.mu.Lock()
	settingsErr := c.settingsErr
	c.mu.Unlock()
	if settingsErr == nil {
		t.Fatal("a PING as the first frame was accepted")
	}
	clientRecv(t, c.done, "the reader to stop")
	clientRecv(t, errc, "serve")
}

// FuzzClientFrames feeds arbitrary frames, after a valid SETTINGS, to a
// client connection with one open stream: no panic, no hang, and the
// stream's Read returns once the peer is gone.
func FuzzClientFrames(f *testing.F) {
	seed := func(write func(fr *http2.Framer)) []byte {
		var buf bytes.Buffer
		fr := http2.NewFramer(&buf, nil)
		fr.AllowIllegalWrites = true
		write(fr)
		return buf.Bytes()
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	enc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
	status := hb.Bytes()
	f.Add(seed(func(fr *http2.Framer) {
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: status, EndHeaders: true})
		fr.WriteData(1, true, []byte("hello"))
	}))
	f.Add(seed(func(fr *http2.Framer) {
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: status[:1], EndHeaders: false})
		fr.WriteContinuation(1, true, status[1:])
		fr.WriteWindowUpdate(1, 100)
		fr.WriteRSTStream(1, http2.ErrCodeConnect)
	}))
	f.Add(seed(func(fr *http2.Framer) {
		fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0}, http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1 << 14})
		fr.WritePing(false, [8]byte{1})
		fr.WriteGoAway(0, http2.ErrCodeNo, []byte("bye"))
	}))
	f.Add(seed(func(fr *http2.Framer) {
		fr.WriteData(1, false, []byte("early"))
		fr.WriteDataPadded(3, true, []byte("x"), make([]byte, 10))
	}))
	f.Fuzz(func(t *testing.T, frames []byte) {
		a, b := net.Pipe()
		defer b.Close()
		c := newClientConn(a, newBatchConn(a), hclog.NewNullLogger(), func() {}, time.Hour, time.Hour)
		drained := make(chan struct{})
		go func() {
			defer close(drained)
			io.Copy(io.Discard, b)
		}()
		c.start()
		go c.serve()
		var first bytes.Buffer
		http2.NewFramer(&first, nil).WriteSettings()
		if _, err := b.Write(first.Bytes()); err != nil {
			t.Fatal(err)
		}
		clientRecv(t, c.settingsDone, "SETTINGS applied")
		if err := c.reserve(); err != nil {
			t.Fatal(err)
		}
		s := &ClientStream{pc: &poolConn{cc: c}} // no onRelease: the stream is only read
		if err := c.openStream(&s.h2Stream, []hpack.HeaderField{{Name: ":method", Value: "CONNECT"}, {Name: ":authority", Value: "10.0.0.1:80"}}); err != nil {
			t.Fatal(err)
		}
		b.Write(frames) // fails once the client gave up on the connection
		b.Close()
		clientRecv(t, c.done, "the reader to stop")
		readDone := make(chan struct{})
		go func() {
			defer close(readDone)
			buf := make([]byte, 4<<10)
			for {
				if _, err := s.Read(buf); err != nil {
					return
				}
			}
		}()
		clientRecv(t, readDone, "the stream's Read to end")
		c.close()
		clientRecv(t, drained, "the connection to close")
	})
}

// clientConnect opens a stream through pool to the peer at addr, closed
// at cleanup.
// clientFrameStream opens one stream of a new pool on a new frame peer
// and returns the pool, the peer, the stream, the peer's end of the
// connection and the stream's ID.
func clientFrameStream(t testing.TB) (*Pool, *clientFramePeer, *ClientStream, *clientFrameConn, uint32) {
	t.Helper()
	pki := newClientTestPKI(t)
	peer := newClientFramePeer(t, pki, nil)
	pool := newClientTestPool(t, pki, nil)
	s := clientConnect(t, pool, peer.addr)
	c := peer.nextConn(t)
	return pool, peer, s, c, clientRecv(t, c.streams, "the stream")
}

func clientConnect(t testing.TB, pool *Pool, addr netip.AddrPort) *ClientStream {
	t.Helper()
	s, err := pool.Connect(clientCtx(t), clientTestRequest(addr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// A server that floods PINGs and never reads our answers is cut off like
// a client that does (TestServerPingFloodWithoutReading): the client's
// reader never writes either, its queue of answers is bounded, and the
// stream on the connection fails instead of hanging.
func TestClientPingFloodWithoutReading(t *testing.T) {
	pki := newClientTestPKI(t)
	// A small receive buffer, so the client's writes back up soon.
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<10)
		})
		return errors.Join(err, serr)
	}}
	ln, err := lc.Listen(clientCtx(t), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pool := newClientTestPool(t, pki, nil)
	type result struct {
		s   *ClientStream
		err error
	}
	connected := make(chan result, 1)
	go func() {
		s, err := pool.Connect(clientCtx(t), clientTestRequest(ln.Addr().(*net.TCPAddr).AddrPort()))
		connected <- result{s, err}
	}()
	raw, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.SetDeadline(time.Now().Add(clientTestWait))
	tc := tls.Server(raw, ServerConfig(pki.server, pki.ca.Pool(), clientTestDomain))
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(tc, preface); err != nil || string(preface) != http2.ClientPreface {
		t.Fatalf("preface %q, %v", preface, err)
	}
	fr := http2.NewFramer(tc, tc)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.SetMaxReadFrameSize(1 << 20)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var id uint32
	for range 100 {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if h, ok := f.(*http2.MetaHeadersFrame); ok {
			id = h.StreamID
			break
		}
	}
	var hb bytes.Buffer
	hpack.NewEncoder(&hb).WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	r := clientRecv(t, connected, "the CONNECT")
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.s.Close()
	readErr := make(chan error, 1)
	go func() {
		_, err := r.s.Read(make([]byte, 1))
		readErr <- err
	}()

	var batch bytes.Buffer
	pings := http2.NewFramer(&batch, nil)
	for i := range 100 { // well below the cap: the writer keeps up with a burst
		pings.WritePing(false, [8]byte{byte(i)})
	}
	for round := range 20000 { // 34 MB of PINGs, never read back
		if _, err := tc.Write(batch.Bytes()); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("round %d: the client stopped reading instead of cutting the flood off: %v", round, err)
			}
			t.Logf("cut off after %d rounds of 100 PINGs: %v", round, err)
			if err := clientRecv(t, readErr, "the stream's Read"); err == nil || err == io.EOF {
				t.Fatalf("Read on the flooded connection = %v, want an error", err)
			}
			return
		}
	}
	t.Fatal("the client answered 2 million PINGs that were never read")
}
