package hbone

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"regexp"
	"sync/atomic"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/meshtun/meshtun/hbone/devca"
)

// clientRandom is a deterministic stream of pseudo-random bytes.
func clientRandom(seed uint64) io.Reader {
	var s [32]byte
	s[0] = byte(seed)
	return rand.NewChaCha8(s)
}

func TestClientEcho(t *testing.T) {
	pki := newClientTestPKI(t)
	peer := newClientGoPeer(t, pki, 0, clientEcho)
	pool := newClientTestPool(t, pki, nil)
	tests := []struct {
		name     string
		size     int64
		readFrom bool // send with io.Copy (ClientStream.ReadFrom) instead of Write
	}{
		{name: "0B", size: 0},
		{name: "1MiB", size: 1 << 20},
		{name: "1MiB-readfrom", size: 1 << 20, readFrom: true},
		{name: "64MiB", size: 64 << 20},
		{name: "64MiB-readfrom", size: 64 << 20, readFrom: true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := pool.Connect(clientCtx(t), clientTestRequest(peer.addr))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if got := s.PeerIdentity(); got != clientTestServerID {
				t.Errorf("PeerIdentity = %q, want %q", got, clientTestServerID)
			}
			sent := make(chan []byte, 1)
			go func() {
				h := sha256.New()
				src := io.TeeReader(io.LimitReader(clientRandom(uint64(i)), tt.size), h)
				var err error
				if tt.readFrom {
					_, err = io.Copy(s, src)
				} else {
					_, err = io.CopyBuffer(struct{ io.Writer }{s}, src, make([]byte, 64<<10))
				}
				if err != nil {
					t.Errorf("send: %v", err)
				}
				s.CloseWrite()
				sent <- h.Sum(nil)
			}()
			h := sha256.New()
			n, err := io.Copy(h, s)
			if err != nil {
				t.Fatalf("receive: %v", err)
			}
			if n != tt.size {
				t.Fatalf("received %d bytes, want %d", n, tt.size)
			}
			if want := clientRecv(t, sent, "the sender"); !bytes.Equal(h.Sum(nil), want) {
				t.Fatal("echo differs from what was sent")
			}
		})
	}
	if st := pool.Stats(); st.ConnsOpened != 1 || st.StreamsOpen != 0 {
		t.Errorf("stats after sequential streams = %+v, want 1 conn opened, 0 streams open", st)
	}
}

func TestClientHalfClose(t *testing.T) {
	pki := newClientTestPKI(t)
	peer := newClientGoPeer(t, pki, 0, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
		n, err := io.Copy(io.Discard, r.Body) // returns at our END_STREAM
		if err != nil {
			return
		}
		// Only now, after the client's EOF, answer.
		fmt.Fprintf(w, "got %d bytes", n)
	})
	pool := newClientTestPool(t, pki, nil)
	s, err := pool.Connect(clientCtx(t), clientTestRequest(peer.addr))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Write(make([]byte, 12345)); err != nil {
		t.Fatal(err)
	}
	if err := s.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write([]byte("x")); err == nil {
		t.Error("Write after CloseWrite succeeded")
	}
	reply, err := io.ReadAll(s)
	if err != nil {
		t.Fatal(err)
	}
	if string(reply) != "got 12345 bytes" {
		t.Fatalf("reply = %q", reply)
	}
	if st := pool.Stats(); st.StreamsOpen != 0 {
		t.Errorf("StreamsOpen = %d after both sides ended, want 0", st.StreamsOpen)
	}
}

// clientHeaderMap turns a header block into a map, and fails on repeats.
func clientHeaderMap(t *testing.T, fields []hpack.HeaderField) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, f := range fields {
		if _, dup := m[f.Name]; dup {
			t.Errorf("header %q sent twice", f.Name)
		}
		m[f.Name] = f.Value
	}
	return m
}

func TestClientWire(t *testing.T) {
	pki := newClientTestPKI(t)
	peer := newClientFramePeer(t, pki, nil)
	pool := newClientTestPool(t, pki, nil)
	traceparent := regexp.MustCompile(`^00-[0-9a-f]{32}-[0-9a-f]{16}-00$`)

	tests := []struct {
		name          string
		authority     string
		source        string
		host, baggage string
		want          map[string]string // headers that must be there, exactly
	}{
		{
			name: "v4", authority: "10.0.0.1:8080", source: "10.1.0.5:43210",
			want: map[string]string{":method": "CONNECT", ":authority": "10.0.0.1:8080", "forwarded": `for="10.1.0.5:43210"`},
		},
		{
			name: "v6 with host and baggage", authority: "[fd00::1]:443", source: "[2001:db8::7]:5000",
			host: "db.prod.svc.cluster.local", baggage: "k8s.cluster.name=c1,k8s.namespace.name=app",
			want: map[string]string{
				":method": "CONNECT", ":authority": "[fd00::1]:443",
				"forwarded": `for="[2001:db8::7]:5000";host=db.prod.svc.cluster.local`,
				"baggage":   "k8s.cluster.name=c1,k8s.namespace.name=app",
			},
		},
		{
			name: "no source", authority: "10.0.0.2:80",
			want: map[string]string{":method": "CONNECT", ":authority": "10.0.0.2:80"},
		},
	}
	var conn *clientFrameConn
	seen := map[string]bool{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := clientTestRequest(peer.addr)
			req.Authority = netip.MustParseAddrPort(tt.authority)
			req.Source = netip.AddrPort{}
			if tt.source != "" {
				req.Source = netip.MustParseAddrPort(tt.source)
			}
			req.Host, req.Baggage = tt.host, tt.baggage
			s, err := pool.Connect(clientCtx(t), req)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if conn == nil {
				conn = peer.nextConn(t)
			}
			got := clientHeaderMap(t, clientRecv(t, conn.headers, "request headers"))
			for k, v := range tt.want {
				if got[k] != v {
					t.Errorf("%s = %q, want %q", k, got[k], v)
				}
			}
			for _, k := range []string{":scheme", ":path", "user-agent", "accept-encoding", "content-length"} {
				if v, ok := got[k]; ok {
					t.Errorf("%s sent (%q), want none", k, v)
				}
			}
			if _, ok := tt.want["forwarded"]; !ok && got["forwarded"] != "" {
				t.Errorf("forwarded = %q, want none", got["forwarded"])
			}
			tp := got["traceparent"]
			if !traceparent.MatchString(tp) {
				t.Errorf("traceparent = %q, want 00-<32 hex>-<16 hex>-00", tp)
			}
			if seen[tp] {
				t.Errorf("traceparent %q reused", tp)
			}
			seen[tp] = true
		})
	}

	t.Run("settings", func(t *testing.T) {
		if conn == nil {
			t.Fatal("no CONNECT reached the peer above, so there are no settings to check")
		}
		got := map[http2.SettingID]uint32{}
		for _, s := range clientRecv(t, conn.settings, "the client's SETTINGS") {
			got[s.ID] = s.Val
		}
		want := map[http2.SettingID]uint32{
			http2.SettingInitialWindowSize: 4 << 20,
			http2.SettingMaxFrameSize:      1 << 20,
			http2.SettingMaxHeaderListSize: 16 << 10,
			http2.SettingEnablePush:        0,
		}
		for id, v := range want {
			if got[id] != v {
				t.Errorf("%v = %d, want %d", id, got[id], v)
			}
		}
		// The connection window starts at 64 KiB - 1 and is raised to
		// 16 MiB (+ the initial) by the first WINDOW_UPDATE.
		if inc := clientRecv(t, conn.connWindow, "connection WINDOW_UPDATE"); inc < 16<<20-65535 {
			t.Errorf("connection window raised by %d, want >= %d", inc, 16<<20-65535)
		}
	})
}

func TestClientStatusError(t *testing.T) {
	pki := newClientTestPKI(t)
	for _, code := range []int{http.StatusUnauthorized, http.StatusServiceUnavailable, http.StatusBadRequest} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			peer := newClientGoPeer(t, pki, 0, func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(code)
			})
			pool := newClientTestPool(t, pki, nil)
			s, err := pool.Connect(clientCtx(t), clientTestRequest(peer.addr))
			if err == nil {
				s.Close()
				t.Fatal("Connect succeeded")
			}
			var se *StatusError
			if !errors.As(err, &se) || se.Code != code {
				t.Fatalf("err = %v, want *StatusError{%d}", err, code)
			}
			if st := pool.Stats(); st.StreamsOpen != 0 {
				t.Errorf("StreamsOpen = %d after a refusal, want 0", st.StreamsOpen)
			}
		})
	}
}

func TestClientReset(t *testing.T) {
	pki := newClientTestPKI(t)
	peer := newClientFramePeer(t, pki, nil)
	pool := newClientTestPool(t, pki, nil)
	tests := []struct {
		name    string
		code    http2.ErrCode
		wantEOF bool
	}{
		{"no error", http2.ErrCodeNo, true},
		{"cancel", http2.ErrCodeCancel, true},
		{"connect error", http2.ErrCodeConnect, false},
		{"internal", http2.ErrCodeInternal, false},
	}
	var conn *clientFrameConn
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := pool.Connect(clientCtx(t), clientTestRequest(peer.addr))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if conn == nil {
				conn = peer.nextConn(t)
			}
			id := clientRecv(t, conn.streams, "a stream")
			conn.data(id, false, []byte("partial"))
			conn.reset(id, tt.code)
			got, err := io.ReadAll(s)
			if tt.wantEOF {
				if err != nil {
					t.Fatalf("Read error %v, want io.EOF", err)
				}
			} else if !errors.Is(err, ErrStreamReset) {
				t.Fatalf("Read error %v, want ErrStreamReset", err)
			}
			if string(got) != "partial" && len(got) != 0 {
				t.Errorf("read %q", got)
			}
		})
	}
}

func TestClientWrongIdentity(t *testing.T) {
	pki := newClientTestPKI(t)
	var reached atomic.Int32
	peer := newClientGoPeer(t, pki, 0, func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		clientEcho(w, r)
	})
	pool := newClientTestPool(t, pki, nil)
	req := clientTestRequest(peer.addr)
	req.Identities = []string{"spiffe://cluster.local/ns/db/sa/other"}
	_, err := pool.Connect(clientCtx(t), req)
	if !errors.Is(err, ErrWrongIdentity) {
		t.Fatalf("err = %v, want ErrWrongIdentity", err)
	}
	if n := reached.Load(); n != 0 {
		t.Fatalf("%d requests reached the server", n)
	}
	if st := pool.Stats(); st.ConnsOpen != 0 || st.ConnsOpened != 0 {
		t.Errorf("stats = %+v, want no connection", st)
	}
}

func TestClientUntrusted(t *testing.T) {
	pki := newClientTestPKI(t)
	// The server's certificate comes from another CA of the same domain.
	other, err := devca.New(clientTestDomain)
	if err != nil {
		t.Fatal(err)
	}
	rogue, err := other.KeyPair(clientTestServerID)
	if err != nil {
		t.Fatal(err)
	}
	var reached atomic.Int32
	peerPKI := &clientTestPKI{ca: pki.ca, client: pki.client, server: rogue}
	peer := newClientGoPeer(t, peerPKI, 0, func(w http.ResponseWriter, r *http.Request) { reached.Add(1) })
	pool := newClientTestPool(t, pki, nil)
	_, err = pool.Connect(clientCtx(t), clientTestRequest(peer.addr))
	if !errors.Is(err, ErrUntrusted) {
		t.Fatalf("err = %v, want ErrUntrusted", err)
	}
	if n := reached.Load(); n != 0 {
		t.Fatalf("%d requests reached the server", n)
	}
}

func TestClientBadRequest(t *testing.T) {
	pki := newClientTestPKI(t)
	pool := newClientTestPool(t, pki, nil)
	good := clientTestRequest(netip.MustParseAddrPort("127.0.0.1:15008"))
	tests := []struct {
		name string
		edit func(*ConnectRequest)
	}{
		{"no address", func(r *ConnectRequest) { r.Address = netip.AddrPort{} }},
		{"no authority", func(r *ConnectRequest) { r.Authority = netip.AddrPort{} }},
		{"no identities", func(r *ConnectRequest) { r.Identities = nil }},
		{"host injection", func(r *ConnectRequest) { r.Host = "a;for=evil" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := good
			tt.edit(&req)
			if _, err := pool.Connect(clientCtx(t), req); err == nil {
				t.Fatal("Connect accepted a bad request")
			}
		})
	}
}
