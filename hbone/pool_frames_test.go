package hbone

import (
	"bytes"
	"crypto/tls"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"testing"

	"golang.org/x/net/http2"
)

// poolTestFrames is a client's byte stream: the preface, then frames of
// every kind and size the walker must step over.
func poolTestFrames(t testing.TB) (stream []byte, headerIDs []uint32) {
	var b bytes.Buffer
	b.WriteString(http2.ClientPreface)
	fr := http2.NewFramer(&b, nil)
	fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 4 << 20})
	fr.WriteWindowUpdate(0, 1<<24)
	for id := uint32(1); id <= 9; id += 2 {
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: bytes.Repeat([]byte{byte(id)}, int(id)*7), EndHeaders: false})
		fr.WriteContinuation(id, true, []byte("more"))
		headerIDs = append(headerIDs, id)
		fr.WriteData(id, false, bytes.Repeat([]byte{0xAA}, int(id)*1000))
		fr.WriteData(id, true, nil)
		fr.WritePing(false, [8]byte{byte(id)})
	}
	fr.WriteGoAway(5, http2.ErrCodeNo, []byte("bye"))
	return b.Bytes(), headerIDs
}

// The walker finds the same frames whatever the chunking.
func TestPoolFrameWalker(t *testing.T) {
	stream, wantIDs := poolTestFrames(t)
	for seed := range uint64(50) {
		rng := rand.New(rand.NewPCG(seed, 1))
		var ids []uint32
		var goAway []uint32
		w := frameWalker{skip: len(http2.ClientPreface)}
		w.onHeader = func(typ uint8, stream uint32, _ int) int {
			switch typ {
			case frameTypeHeaders:
				ids = append(ids, stream)
			case frameTypeGoAway:
				return 4
			}
			return 0
		}
		w.onPayload = func(typ uint8, _ uint32, p []byte) {
			goAway = append(goAway, uint32(p[0])<<24|uint32(p[1])<<16|uint32(p[2])<<8|uint32(p[3]))
		}
		for b := stream; len(b) > 0; {
			n := min(len(b), 1+rng.IntN(40))
			if seed%2 == 0 {
				// Stop at boundaries: the walker must never take more than
				// a chunk, and each stop must be a real frame end.
				k := w.walk(b[:n], true)
				if k == 0 || k > n {
					t.Fatalf("seed %d: walk took %d of %d", seed, k, n)
				}
				if k < n && !w.atBoundary() {
					t.Fatalf("seed %d: stopped early, not at a boundary", seed)
				}
				n = k
			} else if k := w.walk(b[:n], false); k != n {
				t.Fatalf("seed %d: walk took %d of %d", seed, k, n)
			}
			b = b[n:]
		}
		if !w.atBoundary() {
			t.Fatalf("seed %d: not at a boundary at the end", seed)
		}
		if !slices.Equal(ids, wantIDs) || len(goAway) != 1 || goAway[0] != 5 {
			t.Fatalf("seed %d: HEADERS %v (want %v), GOAWAY last %v (want [5])", seed, ids, wantIDs, goAway)
		}
	}
}

// resetStream in the middle of a frame waits for its end: the peer reads
// a well-formed frame stream with our RST_STREAM right after the frame
// that was being written.
func TestPoolNetConnInjectsAtBoundary(t *testing.T) {
	pki := newClientTestPKI(t)
	stream, _ := poolTestFrames(t)
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	srv := tls.Server(b, ServerConfig(pki.server, pki.ca.Pool(), clientTestDomain))
	cli := tls.Client(a, ClientConfig(pki.client, pki.ca.Pool(), []string{clientTestServerID}))
	ctx := clientCtx(t)
	hs := make(chan error, 1)
	go func() { hs <- srv.HandshakeContext(ctx) }()
	if err := cli.HandshakeContext(ctx); err != nil {
		t.Fatal(err)
	}
	if err := clientRecv(t, hs, "the server handshake"); err != nil {
		t.Fatal(err)
	}
	// The reader collects every frame header it sees.
	type seen struct {
		typ    http2.FrameType
		stream uint32
		code   http2.ErrCode
	}
	frames := make(chan []seen, 1)
	go func() {
		pre := make([]byte, len(http2.ClientPreface))
		io.ReadFull(srv, pre)
		fr := http2.NewFramer(nil, srv)
		fr.AllowIllegalReads = true
		var got []seen
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				frames <- got
				return
			}
			s := seen{typ: f.Header().Type, stream: f.Header().StreamID}
			if r, ok := f.(*http2.RSTStreamFrame); ok {
				s.code = r.ErrCode
			}
			got = append(got, s)
		}
	}()
	c := newPoolNetConn(cli, nil)
	// Write the stream in 7-byte chunks; after the chunk that starts the
	// first DATA frame of stream 3, ask for a reset of stream 3.
	dataAt := bytes.Index(stream, []byte{0, 0x0b, 0xb8, byte(http2.FrameData), 0, 0, 0, 0, 3})
	if dataAt < 0 {
		t.Fatal("no DATA frame of stream 3 in the test stream")
	}
	reset := false
	for off := 0; off < len(stream); off += 7 {
		end := min(off+7, len(stream))
		if _, err := c.Write(stream[off:end]); err != nil {
			t.Fatal(err)
		}
		if !reset && end > dataAt+9 {
			if c.out.atBoundary() {
				t.Fatal("test setup: expected to be inside the DATA frame")
			}
			if err := c.resetStream(3, http2.ErrCodeConnect); err != nil {
				t.Fatal(err)
			}
			reset = true
		}
	}
	cli.Close()
	got := clientRecv(t, frames, "the frames")
	for i, f := range got {
		if f.typ == http2.FrameRSTStream {
			if f.stream != 3 || f.code != http2.ErrCodeConnect {
				t.Fatalf("RST_STREAM %+v, want stream 3 CONNECT_ERROR", f)
			}
			if i == 0 || got[i-1].typ != http2.FrameData || got[i-1].stream != 3 {
				t.Fatalf("RST_STREAM not right after stream 3's DATA: %+v", got[:i+1])
			}
			return
		}
	}
	t.Fatalf("no RST_STREAM among %d frames", len(got))
}

// The walker takes any bytes without panicking (it reads the peer's).
func FuzzPoolFrameWalker(f *testing.F) {
	stream, _ := poolTestFrames(f)
	f.Add(stream[len(http2.ClientPreface):], uint8(3))
	f.Add([]byte{0, 0, 4, 7, 0, 0, 0, 0, 0, 0xff, 0xff}, uint8(1))
	f.Fuzz(func(t *testing.T, b []byte, chunk uint8) {
		w := frameWalker{}
		w.onHeader = func(typ uint8, _ uint32, _ int) int { return 4 }
		w.onPayload = func(_ uint8, _ uint32, p []byte) {
			if len(p) > 4 {
				t.Fatalf("captured %d bytes", len(p))
			}
		}
		step := int(chunk%64) + 1
		for len(b) > 0 {
			n := w.walk(b[:min(step, len(b))], chunk%2 == 0)
			if n <= 0 {
				t.Fatal("walk made no progress")
			}
			b = b[n:]
		}
	})
}

// The peer's first SETTINGS reach the transport whole, however TLS splits
// them, with SETTINGS_MAX_FRAME_SIZE lowered to poolSendFrameMax (never
// raised), the stream limit learned, and the bytes after them intact.
func TestPoolNetConnFirstSettings(t *testing.T) {
	tests := []struct {
		name          string
		maxFrame      uint32
		wantMaxFrame  uint32
		chunk, readSz int // the peer's write size, the transport's read size
	}{
		{"1 MiB lowered, one write", 1 << 20, poolSendFrameMax, 1 << 10, 4 << 10},
		{"1 MiB lowered, byte by byte", 1 << 20, poolSendFrameMax, 1, 4 << 10},
		{"small reads", 1 << 20, poolSendFrameMax, 5, 3},
		{"16 KiB kept", 16 << 10, 16 << 10, 7, 4 << 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pki := newClientTestPKI(t)
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			srv := tls.Server(b, ServerConfig(pki.server, pki.ca.Pool(), clientTestDomain))
			cli := tls.Client(a, ClientConfig(pki.client, pki.ca.Pool(), []string{clientTestServerID}))
			ctx := clientCtx(t)
			hs := make(chan error, 1)
			go func() { hs <- srv.HandshakeContext(ctx) }()
			if err := cli.HandshakeContext(ctx); err != nil {
				t.Fatal(err)
			}
			if err := clientRecv(t, hs, "the server handshake"); err != nil {
				t.Fatal(err)
			}
			var wire bytes.Buffer
			fr := http2.NewFramer(&wire, nil)
			fr.WriteSettings(
				http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 7},
				http2.Setting{ID: http2.SettingMaxFrameSize, Val: tt.maxFrame},
				http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20},
			)
			fr.WritePing(false, [8]byte{1, 2, 3, 4, 5, 6, 7, 8})
			sent := wire.Bytes()
			go func() {
				for p := sent; len(p) > 0; p = p[min(len(p), tt.chunk):] {
					if _, err := srv.Write(p[:min(len(p), tt.chunk)]); err != nil {
						return
					}
				}
			}()
			c := newPoolNetConn(cli, nil)
			var got []byte
			buf := make([]byte, tt.readSz)
			for i := 0; len(got) < len(sent); i++ {
				if i > len(sent) {
					t.Fatal("reads make no progress")
				}
				select {
				case <-c.settingsApplied:
					if len(got) < frameHeaderLen+18 {
						t.Fatalf("settings applied after %d bytes, before the SETTINGS frame was passed on", len(got))
					}
				default:
				}
				n, err := c.Read(buf)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, buf[:n]...)
			}
			rd := http2.NewFramer(nil, bytes.NewReader(got))
			f, err := rd.ReadFrame()
			if err != nil {
				t.Fatal(err)
			}
			sf, ok := f.(*http2.SettingsFrame)
			if !ok {
				t.Fatalf("first frame %v, want SETTINGS", f.Header())
			}
			if v, _ := sf.Value(http2.SettingMaxFrameSize); v != tt.wantMaxFrame {
				t.Errorf("MAX_FRAME_SIZE passed on = %d, want %d", v, tt.wantMaxFrame)
			}
			if v, _ := sf.Value(http2.SettingMaxConcurrentStreams); v != 7 {
				t.Errorf("MAX_CONCURRENT_STREAMS passed on = %d, want 7", v)
			}
			if v, _ := sf.Value(http2.SettingInitialWindowSize); v != 1<<20 {
				t.Errorf("INITIAL_WINDOW_SIZE passed on = %d, want 1 MiB", v)
			}
			if f, err := rd.ReadFrame(); err != nil || f.(*http2.PingFrame).Data != [8]byte{1, 2, 3, 4, 5, 6, 7, 8} {
				t.Errorf("frame after SETTINGS: %v, %v; want the PING intact", f, err)
			}
			if c.peerMaxStreams != 7 {
				t.Errorf("peer stream limit %d, want 7", c.peerMaxStreams)
			}
			if c.held != nil {
				t.Errorf("%d bytes still held", len(c.held))
			}
		})
	}
}
