package interop

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/meshtun/meshtun/hbone"
)

// Part (b): our hbone.Pool dials a Node HBONE server, which reports what
// it saw on the wire.

// nodeServer is a running testdata/server.js.
type nodeServer struct {
	*nodeProc
	addr netip.AddrPort
}

// nodeEvent is one line server.js printed.
type nodeEvent struct {
	Ev        string            `json:"ev"`
	Port      uint16            `json:"port"`
	N         int               `json:"n"`
	ALPN      string            `json:"alpn"`
	Version   string            `json:"version"`
	Cipher    string            `json:"cipher"`
	SNI       string            `json:"sni"`
	PeerSAN   string            `json:"peerSAN"`
	Authority string            `json:"authority"`
	Method    string            `json:"method"`
	Headers   map[string]string `json:"headers"`
	RSTCode   int               `json:"rstCode"`
}

func startNodeServer(t *testing.T, p *pki, maxStreams int) *nodeServer {
	t.Helper()
	l := p.issue(fmt.Sprintf("node-server-%d", maxStreams), nodeServerID)
	proc := startNode(t, "server.js", map[string]any{
		"ca": p.CA, "cert": l.Cert, "key": l.Key, "maxStreams": maxStreams,
	})
	var ev nodeEvent
	proc.next(&ev)
	if ev.Ev != "listening" {
		t.Fatalf("first event %+v, want listening", ev)
	}
	return &nodeServer{nodeProc: proc, addr: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), ev.Port)}
}

// nextEvent waits for the next event of kind ev, returning the others
// skipped on the way (at most 1000).
func (s *nodeServer) nextEvent(ev string) (nodeEvent, []nodeEvent) {
	s.t.Helper()
	var skipped []nodeEvent
	for range 1000 {
		var e nodeEvent
		s.next(&e)
		if e.Ev == ev {
			return e, skipped
		}
		skipped = append(skipped, e)
	}
	s.t.Fatalf("no %s event in 1000", ev)
	return nodeEvent{}, nil
}

// newGoPool is an hbone.Pool with an openssl-made client certificate.
func newGoPool(t *testing.T, p *pki) *hbone.Pool {
	t.Helper()
	l := p.issue("go-client", goClientID)
	cert, _, err := hbone.LoadKeyPair(l.Cert, l.Key)
	if err != nil {
		t.Fatal(err)
	}
	bundle, err := os.ReadFile(p.CA)
	if err != nil {
		t.Fatal(err)
	}
	roots, err := hbone.LoadRoots(bundle)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := hbone.NewPool(hbone.PoolOptions{Certificate: cert, Roots: roots, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	return pool
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), nodeWait)
	t.Cleanup(cancel)
	return ctx
}

// request is a CONNECT to authority through the Node server.
func (s *nodeServer) request(authority string, source netip.AddrPort) hbone.ConnectRequest {
	return hbone.ConnectRequest{
		Address:    s.addr,
		Authority:  netip.MustParseAddrPort(authority),
		Identities: []string{nodeServerID},
		Source:     source,
		Baggage:    interopBaggage.String(),
	}
}

// interopBaggage describes the Go client as a VM's gateway describes
// itself; interopBaggageWire is how ztunnel writes the same (its
// baggage_header_val, kind "pod" for a WorkloadEntry).
var interopBaggage = hbone.Baggage{Cluster: "interop", Namespace: "go", WorkloadName: "vm-1", Service: "vm", Revision: "v1"}

const interopBaggageWire = "k8s.cluster.name=interop,k8s.namespace.name=go,k8s.pod.name=vm-1,service.name=vm,service.version=v1"

var traceparentForm = regexp.MustCompile(`^00-[0-9a-f]{32}-[0-9a-f]{16}-00$`)

func TestOurPoolToNodeServer(t *testing.T) {
	p := newPKI(t)
	node := startNodeServer(t, p, 0)
	pool := newGoPool(t, p)
	const flows = 20
	streams := make([]*hbone.ClientStream, flows)
	errs := make([]error, flows)
	var wg sync.WaitGroup
	for i := range flows {
		wg.Go(func() {
			req := node.request(fmt.Sprintf("10.0.0.%d:8080", i+1), netip.AddrPortFrom(netip.MustParseAddr("10.1.0.5"), uint16(40000+i)))
			streams[i], errs[i] = pool.Connect(testCtx(t), req)
		})
	}
	wg.Wait()
	for _, s := range streams {
		if s != nil {
			defer s.Close()
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	// All 20 are open at once; now each echoes its own data.
	for i, s := range streams {
		wg.Go(func() {
			data := make([]byte, 64<<10+i*1000)
			rand.Read(data)
			go func() {
				s.Write(data)
				s.CloseWrite()
			}()
			got, err := io.ReadAll(s)
			if err != nil || !bytes.Equal(got, data) {
				errs[i] = fmt.Errorf("stream %d: echoed %d of %d bytes intact=%v, err %v", i, len(got), len(data), bytes.Equal(got, data), err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if st := pool.Stats(); st.ConnsOpened != 1 {
		t.Errorf("pool opened %d connections for %d flows, want 1", st.ConnsOpened, flows)
	}

	conn, _ := node.nextEvent("conn")
	if conn.ALPN != "h2" || conn.Version != "TLSv1.3" || !strings.Contains(conn.Cipher, "GCM") {
		t.Errorf("node negotiated %s %s ALPN %q, want TLS 1.3, AES-GCM, h2", conn.Version, conn.Cipher, conn.ALPN)
	}
	if conn.SNI != "" {
		t.Errorf("node got SNI %q, want none", conn.SNI)
	}
	if conn.PeerSAN != "URI:"+goClientID {
		t.Errorf("node saw client SAN %q, want URI:%s", conn.PeerSAN, goClientID)
	}
	traces := map[string]bool{}
	seen := map[string]bool{}
	closed := 0
	for range 2 * flows {
		var e nodeEvent
		node.next(&e)
		switch e.Ev {
		case "conn":
			t.Errorf("node accepted a second TLS connection (#%d)", e.N)
		case "close":
			closed++
			if e.RSTCode != 0 {
				t.Errorf("stream %s closed with RST code %d, want a clean close", e.Authority, e.RSTCode)
			}
		case "stream":
			var i int
			if _, err := fmt.Sscanf(e.Authority, "10.0.0.%d:8080", &i); err != nil || seen[e.Authority] {
				t.Errorf("unexpected :authority %q", e.Authority)
				continue
			}
			seen[e.Authority] = true
			h := e.Headers
			if e.Method != "CONNECT" {
				t.Errorf(":method %q", e.Method)
			}
			for _, k := range []string{":scheme", ":path", "user-agent"} {
				if v, ok := h[k]; ok {
					t.Errorf("%s sent (%q)", k, v)
				}
			}
			if want := fmt.Sprintf(`for="10.1.0.5:%d"`, 40000+i-1); h["forwarded"] != want {
				t.Errorf("forwarded %q, want %q", h["forwarded"], want)
			}
			if h["baggage"] != interopBaggageWire {
				t.Errorf("baggage %q, want %q", h["baggage"], interopBaggageWire)
			}
			if tp := h["traceparent"]; !traceparentForm.MatchString(tp) || traces[tp] {
				t.Errorf("traceparent %q malformed or reused", tp)
			} else {
				traces[tp] = true
			}
		}
	}
	if len(seen) != flows || closed != flows {
		t.Errorf("node saw %d streams and %d closes, want %d each", len(seen), closed, flows)
	}
}

// Statuses and resets from the Node server reach our client as the
// contract says.
func TestOurPoolNodeStatusesAndResets(t *testing.T) {
	p := newPKI(t)
	node := startNodeServer(t, p, 0)
	pool := newGoPool(t, p)
	for _, tt := range []struct {
		authority string
		status    int
	}{{"10.0.0.1:7002", 503}, {"10.0.0.1:7003", 401}} {
		_, err := pool.Connect(testCtx(t), node.request(tt.authority, netip.AddrPort{}))
		var se *hbone.StatusError
		if !errors.As(err, &se) || se.Code != tt.status {
			t.Errorf("%s: err %v, want status %d", tt.authority, err, tt.status)
		}
	}
	// Node's close(CONNECT_ERROR) sends END_STREAM before its RST_STREAM:
	// the END_STREAM is the target's FIN, a clean end.
	s, err := pool.Connect(testCtx(t), node.request("10.0.0.1:7001", netip.AddrPort{}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got, err := io.ReadAll(s); err != nil || string(got) != "partial" {
		t.Errorf("7001: read %q, %v; want \"partial\" and a clean end", got, err)
	}
	// destroy() sends RST_STREAM(INTERNAL_ERROR) alone: a reset.
	s, err = pool.Connect(testCtx(t), node.request("10.0.0.1:7004", netip.AddrPort{}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got, err := io.ReadAll(s); !errors.Is(err, hbone.ErrStreamReset) {
		t.Errorf("7004: read %q, %v; want ErrStreamReset", got, err)
	}
	if st := pool.Stats(); st.ConnsOpened != 1 {
		t.Errorf("ConnsOpened %d, want 1", st.ConnsOpened)
	}
}

// A Node server that presents another identity is refused before any
// request is sent.
func TestOurPoolRefusesWrongNodeIdentity(t *testing.T) {
	p := newPKI(t)
	node := startNodeServer(t, p, 0)
	pool := newGoPool(t, p)
	bad := node.request("10.0.0.66:80", netip.AddrPort{})
	bad.Identities = []string{"spiffe://cluster.local/ns/node/sa/someone-else"}
	if _, err := pool.Connect(testCtx(t), bad); !errors.Is(err, hbone.ErrWrongIdentity) {
		t.Fatalf("err %v, want ErrWrongIdentity", err)
	}
	// A good request afterwards must be the first stream Node sees.
	s, err := pool.Connect(testCtx(t), node.request("10.0.0.7:80", netip.AddrPort{}))
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	e, _ := node.nextEvent("stream")
	if e.Authority != "10.0.0.7:80" {
		t.Fatalf("first stream at node: %q, want the good one", e.Authority)
	}
}

// The pool honours nghttp2's SETTINGS_MAX_CONCURRENT_STREAMS: 12 flows at
// 5 per connection take 3 TLS connections.
func TestOurPoolNodeStreamLimit(t *testing.T) {
	p := newPKI(t)
	node := startNodeServer(t, p, 5)
	pool := newGoPool(t, p)
	var streams []*hbone.ClientStream
	for i := range 12 {
		s, err := pool.Connect(testCtx(t), node.request(fmt.Sprintf("10.0.0.%d:80", i+1), netip.AddrPort{}))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		streams = append(streams, s)
	}
	if st := pool.Stats(); st.ConnsOpened != 3 || st.StreamsOpen != 12 {
		t.Errorf("stats %+v, want 3 connections carrying 12 streams", st)
	}
	conns := 0
	for range 12 + 3 {
		var e nodeEvent
		node.next(&e)
		if e.Ev == "conn" {
			conns++
		}
	}
	if conns != 3 {
		t.Errorf("node accepted %d TLS connections, want 3", conns)
	}
}

// Our client's Reset reaches nghttp2 as RST_STREAM(CONNECT_ERROR), and
// the connection stays usable.
func TestOurPoolResetAtNode(t *testing.T) {
	p := newPKI(t)
	node := startNodeServer(t, p, 0)
	pool := newGoPool(t, p)
	s, err := pool.Connect(testCtx(t), node.request("10.0.0.9:9000", netip.AddrPort{}))
	if err != nil {
		t.Fatal(err)
	}
	s.Write([]byte("ping"))
	if _, err := io.ReadFull(s, make([]byte, 4)); err != nil {
		t.Fatal(err)
	}
	if err := s.Reset(); err != nil {
		t.Fatal(err)
	}
	e, _ := node.nextEvent("close")
	const connectError = 0xa // NGHTTP2_CONNECT_ERROR
	if e.Authority != "10.0.0.9:9000" || e.RSTCode != connectError {
		t.Fatalf("node saw %s close with RST code %d, want %d", e.Authority, e.RSTCode, connectError)
	}
	s2, err := pool.Connect(testCtx(t), node.request("10.0.0.9:9001", netip.AddrPort{}))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	s2.Write([]byte("after"))
	s2.CloseWrite()
	if b, err := io.ReadAll(s2); err != nil || string(b) != "after" {
		t.Fatalf("echo after Reset: %q, %v", b, err)
	}
	if st := pool.Stats(); st.ConnsOpened != 1 {
		t.Errorf("ConnsOpened %d, want 1", st.ConnsOpened)
	}
}
