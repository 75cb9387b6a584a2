package interop

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/meshtun/meshtun/hbone"
)

// Part (a): a Node HBONE client drives our hbone.Server.

// Targets the handler refuses, and with which status.
const (
	deniedTarget    = "127.0.0.1:1" // "denied by policy": 401
	notServedTarget = "127.0.0.2:9" // outside what we serve: 503
)

// testLogger routes logs to t.Log.
func testLogger(t *testing.T) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Debug, Output: logWriter{t}})
}

type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// listen serves each connection of a loopback listener with serve, in
// goroutines that end before the test does.
func listen(t *testing.T, serve func(*net.TCPConn)) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				serve(c.(*net.TCPConn))
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// echoTarget copies what it reads back, then FINs after the client's FIN.
func echoTarget(c *net.TCPConn) {
	io.Copy(c, c)
	c.CloseWrite()
}

// speakerResult is what a speaker target received after its own FIN.
type speakerResult struct {
	sha string
	n   int64
	err error
}

// speakerTarget talks first: it sends data and FINs, then reads until the
// client's FIN and reports what it got.
func speakerTarget(data []byte, got chan<- speakerResult) func(*net.TCPConn) {
	return func(c *net.TCPConn) {
		var r speakerResult
		if _, r.err = c.Write(data); r.err == nil {
			r.err = c.CloseWrite()
		}
		h := sha256.New()
		n, err := io.Copy(h, c)
		if r.err == nil {
			r.err = err
		}
		r.sha, r.n = hex.EncodeToString(h.Sum(nil)), n
		got <- r
	}
}

// relay copies both ways between an accepted stream and the target,
// carrying each side's end as the other's half-close.
func relay(st *hbone.ServerStream, c *net.TCPConn) {
	defer st.Close()
	defer c.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		io.Copy(c, st)
		c.CloseWrite()
	}()
	if _, err := io.Copy(st, c); err == nil {
		st.CloseWrite()
	} else {
		st.Reset()
	}
	<-done
}

// inboundServer is our hbone.Server with a handler that serves the
// targets in served, refuses deniedTarget with 401 and anything else with
// 503, and records the peer identities it saw.
type inboundServer struct {
	srv  *hbone.Server
	addr string
	mu   sync.Mutex
	ids  []string
}

func newInboundServer(t *testing.T, p *pki, served ...netip.AddrPort) *inboundServer {
	t.Helper()
	l := p.issue("go-server", goServerID)
	cert, id, err := hbone.LoadKeyPair(l.Cert, l.Key)
	if err != nil {
		t.Fatal(err)
	}
	if id != goServerID {
		t.Fatalf("openssl certificate identity %q, want %q", id, goServerID)
	}
	bundle, err := os.ReadFile(p.CA)
	if err != nil {
		t.Fatal(err)
	}
	roots, err := hbone.LoadRoots(bundle)
	if err != nil {
		t.Fatal(err)
	}
	s := &inboundServer{}
	s.srv, err = hbone.NewServer(hbone.ServerOptions{
		Certificate: cert,
		Roots:       roots,
		TrustDomain: trustDomain,
		Logger:      testLogger(t),
		Handler: func(r *hbone.Request) {
			s.mu.Lock()
			s.ids = append(s.ids, r.PeerIdentity())
			s.mu.Unlock()
			target := r.Target()
			if target.String() == deniedTarget {
				r.Reject(http.StatusUnauthorized)
				return
			}
			ok := false
			for _, a := range served {
				ok = ok || a == target
			}
			if !ok {
				r.Reject(http.StatusServiceUnavailable)
				return
			}
			var d net.Dialer
			c, err := d.DialContext(r.Context(), "tcp", target.String())
			if err != nil {
				r.Reject(http.StatusServiceUnavailable)
				return
			}
			st, err := r.Accept()
			if err != nil {
				c.Close()
				return
			}
			relay(st, c.(*net.TCPConn))
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = ln.Addr().String()
	served2 := make(chan error, 1)
	go func() { served2 <- s.srv.Serve(ln) }()
	t.Cleanup(func() {
		s.srv.Close()
		if err := <-served2; !errors.Is(err, net.ErrClosed) {
			t.Errorf("Serve returned %v", err)
		}
	})
	return s
}

// nodeClientConfig is client.js's configuration.
type nodeClientConfig struct {
	Addr     string       `json:"addr"`
	CA       string       `json:"ca"`
	Cert     *string      `json:"cert"`
	Key      *string      `json:"key"`
	ServerID string       `json:"serverID"`
	Streams  []nodeStream `json:"streams,omitempty"`
	Speaker  *nodeStream  `json:"speaker,omitempty"`
	Probes   []nodeProbe  `json:"probes,omitempty"`
	TLS      *nodeTLS     `json:"tls,omitempty"`
	// Headers are added to every CONNECT.
	Headers map[string]string `json:"headers,omitempty"`
}

// nodeTLS overrides client.js's TLS parameters, to break a rule.
type nodeTLS struct {
	Ciphers    string   `json:"ciphers,omitempty"`
	ALPN       []string `json:"alpn,omitempty"`
	MinVersion string   `json:"minVersion,omitempty"`
	MaxVersion string   `json:"maxVersion,omitempty"`
}

type nodeStream struct {
	Authority string `json:"authority"`
	Size      int    `json:"size"`
}

type nodeProbe struct {
	Method    string `json:"method,omitempty"`
	Authority string `json:"authority"`
	Status    int    `json:"status,omitempty"`
}

// nodeClientResult is what client.js prints.
type nodeClientResult struct {
	Error   string `json:"error"`
	ALPN    string `json:"alpn"`
	Version string `json:"version"`
	Cipher  string `json:"cipher"`
	Streams []struct {
		Sent, Received string
		Bytes          int
	} `json:"streams"`
	Speaker struct {
		Received      string `json:"received"`
		ReceivedBytes int    `json:"receivedBytes"`
		SentAfterEnd  string `json:"sentAfterEnd"`
	} `json:"speaker"`
	Probes []nodeProbe `json:"probes"`
}

func TestNodeClientToOurServer(t *testing.T) {
	p := newPKI(t)
	client := p.issue("node-client", nodeClientID)
	speakerData := make([]byte, 300<<10)
	rand.Read(speakerData)
	speakerGot := make(chan speakerResult, 1)
	echo := listen(t, echoTarget)
	speaker := listen(t, speakerTarget(speakerData, speakerGot))
	srv := newInboundServer(t, p, echo, speaker)

	sizes := []int{0, 1, 16 << 10, 100_000, 1 << 20, 3<<20 + 7, 65535, 5 << 20}
	cfg := nodeClientConfig{
		Addr: srv.addr, CA: p.CA, Cert: &client.Cert, Key: &client.Key, ServerID: goServerID,
		Speaker: &nodeStream{Authority: speaker.String(), Size: 200 << 10},
		Probes: []nodeProbe{
			{Authority: deniedTarget, Status: http.StatusUnauthorized},
			{Authority: notServedTarget, Status: http.StatusServiceUnavailable},
			{Authority: "example.com:80", Status: http.StatusBadRequest},
			{Authority: "127.0.0.1", Status: http.StatusBadRequest},
			{Method: "GET", Authority: echo.String(), Status: http.StatusBadRequest},
		},
	}
	for _, n := range sizes {
		cfg.Streams = append(cfg.Streams, nodeStream{Authority: echo.String(), Size: n})
	}
	want := slices.Clone(cfg.Probes)
	for i := range cfg.Probes {
		cfg.Probes[i].Status = 0
	}
	var res nodeClientResult
	if err := runNode(t, "client.js", cfg, &res); err != nil || res.Error != "" {
		t.Fatalf("node client failed: %v %s", err, res.Error)
	}

	if res.ALPN != "h2" || res.Version != "TLSv1.3" || !strings.Contains(res.Cipher, "GCM") {
		t.Errorf("negotiated %s %s ALPN %q, want TLS 1.3, AES-GCM, h2", res.Version, res.Cipher, res.ALPN)
	}
	if len(res.Streams) != len(sizes) {
		t.Fatalf("%d stream results, want %d", len(res.Streams), len(sizes))
	}
	for i, s := range res.Streams {
		if s.Sent != s.Received || s.Bytes != sizes[i] {
			t.Errorf("stream %d (%d bytes): echoed %d bytes, sha256 sent %s received %s", i, sizes[i], s.Bytes, s.Sent, s.Received)
		}
	}
	// The mirror half-close: the target's FIN reached Node as END_STREAM,
	// and what Node sent afterwards still reached the target.
	sum := sha256.Sum256(speakerData)
	if res.Speaker.Received != hex.EncodeToString(sum[:]) || res.Speaker.ReceivedBytes != len(speakerData) {
		t.Errorf("speaker: node received %d bytes (sha %s), want %d", res.Speaker.ReceivedBytes, res.Speaker.Received, len(speakerData))
	}
	select {
	case got := <-speakerGot:
		if got.err != nil || got.sha != res.Speaker.SentAfterEnd || got.n != 200<<10 {
			t.Errorf("speaker target got %d bytes (sha %s, %v) after its FIN; node sent sha %s", got.n, got.sha, got.err, res.Speaker.SentAfterEnd)
		}
	default:
		t.Error("the speaker target did not finish (Node's close came before it?)")
	}
	for i, pr := range res.Probes {
		if pr.Status != want[i].Status {
			t.Errorf("%s %s: status %d, want %d", pr.Method, pr.Authority, pr.Status, want[i].Status)
		}
	}
	st := srv.srv.Stats()
	if st.ConnsAccepted != 1 {
		t.Errorf("%d TLS connections accepted, want 1 (all streams on one)", st.ConnsAccepted)
	}
	if want := uint64(len(sizes) + 1); st.StreamsAccepted != want {
		t.Errorf("%d streams accepted, want %d", st.StreamsAccepted, want)
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	for _, id := range srv.ids {
		if id != nodeClientID {
			t.Errorf("handler saw peer %q, want %q", id, nodeClientID)
		}
	}
}

// Our server refuses Node clients that break the TLS rules; none of them
// reaches the handler.
func TestNodeClientRefused(t *testing.T) {
	p := newPKI(t)
	other := newPKI(t)
	echo := listen(t, echoTarget)
	srv := newInboundServer(t, p, echo)
	foreign := p.issue("foreign", "spiffe://evil.example/ns/node/sa/client")
	untrusted := other.issue("untrusted", nodeClientID)
	client := p.issue("node-client", nodeClientID)
	tests := []struct {
		name string
		leaf *leaf
		tls  *nodeTLS
	}{
		{"no client certificate", nil, nil},
		{"untrusted CA", &untrusted, nil},
		{"foreign trust domain", &foreign, nil},
		{"ChaCha20 only", &client, &nodeTLS{Ciphers: "TLS_CHACHA20_POLY1305_SHA256"}},
		{"TLS 1.2 only", &client, &nodeTLS{MinVersion: "TLSv1.2", MaxVersion: "TLSv1.2", Ciphers: "ECDHE-ECDSA-AES128-GCM-SHA256"}},
		{"http/1.1 only", &client, &nodeTLS{ALPN: []string{"http/1.1"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := nodeClientConfig{
				Addr: srv.addr, CA: p.CA, ServerID: goServerID,
				Streams: []nodeStream{{Authority: echo.String(), Size: 1000}},
			}
			if tt.leaf != nil {
				cfg.Cert, cfg.Key = &tt.leaf.Cert, &tt.leaf.Key
			}
			cfg.TLS = tt.tls
			var res nodeClientResult
			err := runNode(t, "client.js", cfg, &res)
			if err == nil || res.Error == "" {
				t.Fatalf("node client succeeded with %s %s ALPN %q", res.Version, res.Cipher, res.ALPN)
			}
			t.Logf("node: %s", res.Error)
		})
	}
	if st := srv.srv.Stats(); st.ConnsAccepted != 0 || st.StreamsAccepted+st.StreamsRejected != 0 {
		t.Errorf("refused clients were served: %+v", st)
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if len(srv.ids) != 0 {
		t.Errorf("handler called for %v", srv.ids)
	}
}
