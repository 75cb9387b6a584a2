package hbone

// Test peers for the client and pool tests: Go's own HTTP/2 server (a
// well-behaved HBONE server) and a raw Framer peer that shows and controls
// frames. The HBONE server of this package is not used, so these tests
// judge the client against an independent implementation.

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/meshtun/meshtun/hbone/devca"
)

const (
	clientTestDomain   = "cluster.local"
	clientTestClientID = "spiffe://cluster.local/ns/app/sa/client"
	clientTestServerID = "spiffe://cluster.local/ns/db/sa/server"
	clientTestWait     = 20 * time.Second // bound on every wait for an event
)

// clientTestPKI is a CA with a client and a server certificate.
type clientTestPKI struct {
	ca     *devca.CA
	client tls.Certificate
	server tls.Certificate
}

func newClientTestPKI(t testing.TB) *clientTestPKI {
	t.Helper()
	ca, err := devca.New(clientTestDomain)
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.KeyPair(clientTestClientID)
	if err != nil {
		t.Fatal(err)
	}
	server, err := ca.KeyPair(clientTestServerID)
	if err != nil {
		t.Fatal(err)
	}
	return &clientTestPKI{ca: ca, client: client, server: server}
}

// clientTestLogger routes logs to t.Log.
func clientTestLogger(t testing.TB) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Debug, Output: clientTestLogWriter{t}})
}

type clientTestLogWriter struct{ t testing.TB }

func (w clientTestLogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// newClientTestPool returns a pool with pki's client certificate; edit
// changes the options first. The pool is closed at cleanup.
func newClientTestPool(t testing.TB, pki *clientTestPKI, edit func(*PoolOptions)) *Pool {
	t.Helper()
	opts := PoolOptions{Certificate: pki.client, Roots: pki.ca.Pool(), Logger: clientTestLogger(t)}
	if edit != nil {
		edit(&opts)
	}
	p, err := NewPool(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// clientTestRequest is a CONNECT to 10.0.0.1:8080 through the peer at addr.
func clientTestRequest(addr netip.AddrPort) ConnectRequest {
	return ConnectRequest{
		Address:    addr,
		Authority:  netip.MustParseAddrPort("10.0.0.1:8080"),
		Identities: []string{clientTestServerID},
		Source:     netip.MustParseAddrPort("10.1.0.5:43210"),
	}
}

// clientGoPeer is Go's HTTP/2 server speaking HBONE's TLS.
type clientGoPeer struct {
	addr   netip.AddrPort
	srv    *http.Server
	closed chan net.Conn // connections the server saw close, buffered
}

// newClientGoPeer serves h on a loopback port with pki's server
// certificate; maxStreams 0 leaves Go's default. Closed at cleanup.
func newClientGoPeer(t testing.TB, pki *clientTestPKI, maxStreams int, h http.HandlerFunc) *clientGoPeer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var protocols http.Protocols
	protocols.SetHTTP2(true)
	peer := &clientGoPeer{
		addr:   ln.Addr().(*net.TCPAddr).AddrPort(),
		closed: make(chan net.Conn, 1024),
	}
	peer.srv = &http.Server{
		Handler:   h,
		TLSConfig: ServerConfig(pki.server, pki.ca.Pool(), clientTestDomain),
		Protocols: &protocols,
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams:          maxStreams,
			MaxReadFrameSize:              1 << 20,
			MaxReceiveBufferPerConnection: 16 << 20,
			MaxReceiveBufferPerStream:     4 << 20,
		},
		ConnState: func(c net.Conn, st http.ConnState) {
			if st == http.StateClosed {
				select {
				case peer.closed <- c:
				default:
				}
			}
		},
		ErrorLog: nil,
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		peer.srv.ServeTLS(ln, "", "")
	}()
	t.Cleanup(func() {
		peer.srv.Close()
		<-done
	})
	return peer
}

// clientEcho is a handler that answers 200 and echoes the body.
func clientEcho(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodConnect {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	rc.Flush()
	buf := make([]byte, 256<<10)
	for {
		n, err := r.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			rc.Flush()
		}
		if err != nil {
			return
		}
	}
}

// clientFramePeer is a raw HTTP/2 peer over HBONE TLS: it answers every
// CONNECT with 200 and keeps the stream open, and lets the test see the
// client's frames and send its own.
type clientFramePeer struct {
	t          testing.TB
	pki        *clientTestPKI
	ln         net.Listener
	addr       netip.AddrPort
	maxStreams uint32 // 0: not announced
	noPingAck  bool   // never answer PINGs
	// goAwayFrom, if set, makes the peer answer HEADERS on streams from
	// this ID on with GOAWAY(last = the stream before) and nothing else.
	goAwayFrom uint32
	// dropFrom, if set, makes the peer close the connection on HEADERS
	// of streams from this ID on, without GOAWAY.
	dropFrom uint32
	conns    chan *clientFrameConn
	hellos   chan *tls.ClientHelloInfo // each connection's ClientHello
	wg       sync.WaitGroup
}

// clientFrameConn is one connection accepted by a clientFramePeer.
type clientFrameConn struct {
	c           net.Conn
	wmu         sync.Mutex
	fr          *http2.Framer
	enc         *hpack.Encoder
	encBuf      bytes.Buffer
	settings    chan []http2.Setting         // the client's SETTINGS frames
	connWindow  chan uint32                  // WINDOW_UPDATEs on stream 0
	winUpdates  chan http2.WindowUpdateFrame // WINDOW_UPDATEs on streams
	goAways     chan http2.GoAwayFrame       // GOAWAY frames received
	settingsAck chan struct{}                // a SETTINGS ACK arrived
	headers     chan []hpack.HeaderField     // each request's header block
	streams     chan uint32                  // each request's stream ID
	resets      chan http2.RSTStreamFrame    // RST_STREAM frames received
	pings       chan struct{}                // a PING arrived
	done        chan struct{}                // the reader stopped
}

func newClientFramePeer(t testing.TB, pki *clientTestPKI, edit func(*clientFramePeer)) *clientFramePeer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &clientFramePeer{
		t: t, pki: pki, ln: ln,
		addr:   ln.Addr().(*net.TCPAddr).AddrPort(),
		conns:  make(chan *clientFrameConn, 64),
		hellos: make(chan *tls.ClientHelloInfo, 64),
	}
	if edit != nil {
		edit(p)
	}
	var mu sync.Mutex
	var all []*clientFrameConn
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			raw, err := ln.Accept()
			if err != nil {
				return
			}
			c := p.start(raw)
			mu.Lock()
			all = append(all, c)
			mu.Unlock()
			select {
			case p.conns <- c:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range all {
			c.c.Close()
		}
		mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *clientFramePeer) start(raw net.Conn) *clientFrameConn {
	conf := ServerConfig(p.pki.server, p.pki.ca.Pool(), clientTestDomain)
	conf.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		select {
		case p.hellos <- hello:
		default:
		}
		return nil, nil
	}
	tc := tls.Server(raw, conf)
	c := &clientFrameConn{
		c:           tc,
		settings:    make(chan []http2.Setting, 16),
		connWindow:  make(chan uint32, 1024),
		winUpdates:  make(chan http2.WindowUpdateFrame, 1024),
		goAways:     make(chan http2.GoAwayFrame, 16),
		settingsAck: make(chan struct{}, 16),
		headers:     make(chan []hpack.HeaderField, 1024),
		streams:     make(chan uint32, 1024),
		resets:      make(chan http2.RSTStreamFrame, 1024),
		pings:       make(chan struct{}, 1024),
		done:        make(chan struct{}),
	}
	c.fr = http2.NewFramer(tc, tc)
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.fr.SetMaxReadFrameSize(1 << 20)
	c.enc = hpack.NewEncoder(&c.encBuf)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer close(c.done)
		defer tc.Close()
		p.serve(c)
	}()
	return c
}

func (p *clientFramePeer) serve(c *clientFrameConn) {
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c.c, preface); err != nil || string(preface) != http2.ClientPreface {
		return
	}
	var settings []http2.Setting
	if p.maxStreams > 0 {
		settings = append(settings, http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: p.maxStreams})
	}
	c.write(func() error { return c.fr.WriteSettings(settings...) })
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				select {
				case c.settingsAck <- struct{}{}:
				default:
				}
				continue
			}
			var got []http2.Setting
			f.ForeachSetting(func(s http2.Setting) error { got = append(got, s); return nil })
			c.settings <- got
			c.write(func() error { return c.fr.WriteSettingsAck() })
		case *http2.PingFrame:
			if f.IsAck() {
				continue
			}
			c.pings <- struct{}{}
			if !p.noPingAck {
				c.write(func() error { return c.fr.WritePing(true, f.Data) })
			}
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				c.connWindow <- f.Increment
			} else {
				select {
				case c.winUpdates <- *f:
				default:
				}
			}
		case *http2.GoAwayFrame:
			select {
			case c.goAways <- http2.GoAwayFrame{FrameHeader: f.FrameHeader, LastStreamID: f.LastStreamID, ErrCode: f.ErrCode}:
			default:
			}
		case *http2.RSTStreamFrame:
			c.resets <- *f
		case *http2.MetaHeadersFrame:
			if p.dropFrom != 0 && f.StreamID >= p.dropFrom {
				return
			}
			if p.goAwayFrom != 0 && f.StreamID >= p.goAwayFrom {
				c.goAway(f.StreamID - 2)
				continue
			}
			c.headers <- f.Fields
			c.streams <- f.StreamID
			c.reply(f.StreamID, false, ":status", "200")
		}
	}
}

// write runs one framer write under the write lock.
func (c *clientFrameConn) write(f func() error) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return f()
}

// reply sends a HEADERS frame with the given name/value pairs.
func (c *clientFrameConn) reply(stream uint32, end bool, kv ...string) error {
	return c.write(func() error {
		c.encBuf.Reset()
		for i := 0; i < len(kv); i += 2 {
			c.enc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
		}
		return c.fr.WriteHeaders(http2.HeadersFrameParam{
			StreamID: stream, BlockFragment: c.encBuf.Bytes(), EndHeaders: true, EndStream: end,
		})
	})
}

func (c *clientFrameConn) data(stream uint32, end bool, b []byte) error {
	return c.write(func() error { return c.fr.WriteData(stream, end, b) })
}

func (c *clientFrameConn) goAway(last uint32) error {
	return c.write(func() error { return c.fr.WriteGoAway(last, http2.ErrCodeNo, nil) })
}

func (c *clientFrameConn) reset(stream uint32, code http2.ErrCode) error {
	return c.write(func() error { return c.fr.WriteRSTStream(stream, code) })
}

// clientRecv waits a bounded time for a value from ch.
func clientRecv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(clientTestWait):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// clientNextConn waits for the frame peer's next connection.
func (p *clientFramePeer) nextConn(t testing.TB) *clientFrameConn {
	return clientRecv(t, p.conns, "a connection to the frame peer")
}

// clientCtx is a context bounded by clientTestWait, cancelled at cleanup.
func clientCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), clientTestWait)
	t.Cleanup(cancel)
	return ctx
}

// clientLeakedGoroutines lists goroutines of the client side still
// running: the pool's, and its connections' readers and keepalives.
func clientLeakedGoroutines() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var leaked []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "hbone.(*Pool)") ||
			strings.Contains(g, "hbone.(*h2Conn)") {
			leaked = append(leaked, g)
		}
	}
	return leaked
}

// clientCheckNoLeak waits, bounded, for the client's goroutines to end.
func clientCheckNoLeak(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(clientTestWait)
	for {
		leaked := clientLeakedGoroutines()
		if len(leaked) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d client goroutines still running, first:\n%s", len(leaked), leaked[0])
		}
		runtime.Gosched()
		time.Sleep(10 * time.Millisecond) // polling an end state with a bound, not synchronizing
	}
}
