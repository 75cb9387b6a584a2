package hbone

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/net/http2"

	"github.com/meshtun/meshtun/hbone/devca"
)

const (
	srvTestDomain   = "cluster.local"
	srvTestServerID = "spiffe://cluster.local/ns/istio-system/sa/ztunnel"
	srvTestClientID = "spiffe://cluster.local/ns/default/sa/client"
	srvTestTarget   = "10.1.2.3:8080"
	// srvTestWait bounds every wait in these tests: far above what any
	// step needs, so a hang fails instead of blocking the test binary.
	srvTestWait = 20 * time.Second
)

// srvTestCA is shared by the tests: making keys is the slow part.
var srvTestCA = sync.OnceValues(func() (*devca.CA, error) { return devca.New(srvTestDomain) })

type srvTestEnv struct {
	t       testing.TB
	ca      *devca.CA
	srv     *Server
	addr    string
	handled atomic.Int64 // Handler calls
}

// srvTestLogger routes logs to t.Log.
func srvTestLogger(t testing.TB) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:   t.Name(),
		Level:  hclog.Debug,
		Output: srvTestWriter{t},
	})
}

type srvTestWriter struct{ t testing.TB }

func (w srvTestWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// newSrvTest starts a Server on 127.0.0.1 with handler; mod may adjust
// the options or the server before it serves. Everything is closed in
// t.Cleanup, and Serve must then return net.ErrClosed.
func newSrvTest(t testing.TB, handler func(*Request), mod func(*ServerOptions)) *srvTestEnv {
	t.Helper()
	ca, err := srvTestCA()
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.KeyPair(srvTestServerID)
	if err != nil {
		t.Fatal(err)
	}
	e := &srvTestEnv{t: t, ca: ca}
	opts := ServerOptions{
		Certificate: cert,
		Roots:       ca.Pool(),
		TrustDomain: srvTestDomain,
		Handler: func(r *Request) {
			e.handled.Add(1)
			handler(r)
		},
		Logger: srvTestLogger(t),
	}
	if mod != nil {
		mod(&opts)
	}
	e.srv, err = NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = ln.Addr().String()
	served := make(chan error, 1)
	go func() { served <- e.srv.Serve(ln) }()
	t.Cleanup(func() {
		e.srv.Close()
		select {
		case err := <-served:
			if !errors.Is(err, net.ErrClosed) {
				t.Errorf("Serve returned %v, want net.ErrClosed", err)
			}
		case <-time.After(srvTestWait):
			t.Errorf("Serve did not return after Close")
		}
	})
	return e
}

// dialTLS makes a TLS connection to the server as id (or with no client
// certificate if id is "").
func (e *srvTestEnv) dialTLS(ca *devca.CA, id string) (*tls.Conn, error) {
	var cert tls.Certificate
	if id != "" {
		var err error
		if cert, err = ca.KeyPair(id); err != nil {
			e.t.Fatal(err)
		}
	}
	conf := ClientConfig(cert, e.ca.Pool(), []string{srvTestServerID})
	d := &tls.Dialer{Config: conf, NetDialer: &net.Dialer{Timeout: srvTestWait}}
	ctx, cancel := context.WithTimeout(context.Background(), srvTestWait)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", e.addr)
	if err != nil {
		return nil, err
	}
	e.t.Cleanup(func() { c.Close() })
	return c.(*tls.Conn), nil
}

// client opens a Go HTTP/2 client connection to the server.
func (e *srvTestEnv) client() *http2.ClientConn {
	e.t.Helper()
	tc, err := e.dialTLS(e.ca, srvTestClientID)
	if err != nil {
		e.t.Fatal(err)
	}
	tr := &http2.Transport{MaxReadFrameSize: 1 << 20}
	cc, err := tr.NewClientConn(tc)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { cc.Close() })
	return cc
}

// srvTestConnect is a CONNECT in flight from the Go client: body is the
// request body's writer (Close sends END_STREAM).
type srvTestConnect struct {
	resp   *http.Response
	body   *io.PipeWriter
	cancel context.CancelFunc
}

// connect sends a CONNECT to target and waits for the response headers.
func srvConnect(t testing.TB, cc *http2.ClientConn, target string) (*srvTestConnect, error) {
	t.Helper()
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	t.Cleanup(func() { pw.Close() })
	req := (&http.Request{
		Method: http.MethodConnect,
		URL:    &url.URL{Host: target},
		Host:   target,
		Header: http.Header{"Traceparent": {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}},
		Body:   pr,
	}).WithContext(ctx)
	resp, err := cc.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { resp.Body.Close() })
	return &srvTestConnect{resp: resp, body: pw, cancel: cancel}, nil
}

// srvEcho accepts and copies the stream back to itself, then half-closes.
func srvEcho(r *Request) {
	st, err := r.Accept()
	if err != nil {
		return
	}
	defer st.Close()
	srvEchoStream(st)
}

// srvSend writes n random bytes to w (then closes it if it is a Closer)
// and returns their sha256.
func srvSend(w io.Writer, n int) ([32]byte, error) {
	h := sha256.New()
	buf := make([]byte, 256<<10)
	for n > 0 {
		m := min(n, len(buf))
		rand.Read(buf[:m])
		h.Write(buf[:m])
		if _, err := w.Write(buf[:m]); err != nil {
			return [32]byte{}, err
		}
		n -= m
	}
	if c, ok := w.(io.Closer); ok {
		if err := c.Close(); err != nil {
			return [32]byte{}, err
		}
	}
	return [32]byte(h.Sum(nil)), nil
}

// srvRecv reads r to EOF and returns the sha256 and length of what it read.
func srvRecv(r io.Reader) ([32]byte, int64, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	return [32]byte(h.Sum(nil)), n, err
}

func TestServerEcho(t *testing.T) {
	for _, size := range []int{0, 1, 1 << 20, 64 << 20} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			e := newSrvTest(t, srvEcho, nil)
			cc := e.client()
			cn, err := srvConnect(t, cc, srvTestTarget)
			if err != nil {
				t.Fatal(err)
			}
			if cn.resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d, want 200", cn.resp.StatusCode)
			}
			type result struct {
				sum [32]byte
				err error
			}
			sent := make(chan result, 1)
			go func() {
				sum, err := srvSend(cn.body, size)
				sent <- result{sum, err}
			}()
			got, n, err := srvRecv(cn.resp.Body)
			if err != nil {
				t.Fatalf("reading the echo: %v", err)
			}
			s := <-sent
			if s.err != nil {
				t.Fatalf("sending: %v", s.err)
			}
			if n != int64(size) || got != s.sum {
				t.Fatalf("echo: got %d bytes sha256 %x, sent %d bytes sha256 %x", n, got, size, s.sum)
			}
			st := e.srv.Stats()
			if st.ConnsAccepted != 1 || st.StreamsAccepted != 1 || st.StreamsRejected != 0 {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

func TestServerAcceptSends200OnlyAfterAccept(t *testing.T) {
	called := make(chan *Request, 1)
	accept := make(chan struct{})
	e := newSrvTest(t, func(r *Request) {
		called <- r
		select {
		case <-accept:
		case <-r.Context().Done():
			return
		}
		srvEcho(r)
	}, nil)
	cc := e.client()
	type result struct {
		cn  *srvTestConnect
		err error
	}
	done := make(chan result, 1)
	go func() {
		cn, err := srvConnect(t, cc, "[2001:db8::7]:443")
		done <- result{cn, err}
	}()
	var r *Request
	select {
	case r = <-called:
	case <-time.After(srvTestWait):
		t.Fatal("handler not called")
	}
	if got := r.Target().String(); got != "[2001:db8::7]:443" {
		t.Errorf("Target %s", got)
	}
	if got := r.PeerIdentity(); got != srvTestClientID {
		t.Errorf("PeerIdentity %q", got)
	}
	if got := r.Header().Get("traceparent"); !strings.HasPrefix(got, "00-0af7") {
		t.Errorf("traceparent %q", got)
	}
	if r.RemoteAddr() == nil || !strings.HasPrefix(r.RemoteAddr().String(), "127.0.0.1:") {
		t.Errorf("RemoteAddr %v", r.RemoteAddr())
	}
	// The server can answer only from Accept, which has not run yet.
	select {
	case res := <-done:
		t.Fatalf("response before Accept: %+v", res)
	default:
	}
	close(accept)
	var res result
	select {
	case res = <-done:
	case <-time.After(srvTestWait):
		t.Fatal("no response after Accept")
	}
	if res.err != nil || res.cn.resp.StatusCode != 200 {
		t.Fatalf("got %v, %v", res.cn, res.err)
	}
}

// Client half-close: the client ends its body, the handler reads to EOF and
// only then replies; the client still reads the whole reply.
func TestServerClientHalfClose(t *testing.T) {
	const reply = 3 << 20
	e := newSrvTest(t, func(r *Request) {
		st, err := r.Accept()
		if err != nil {
			return
		}
		defer st.Close()
		sum, n, err := srvRecv(st)
		if err != nil {
			st.Reset()
			return
		}
		fmt.Fprintf(st, "%x %d\n", sum, n)
		if _, err := srvSend(struct{ io.Writer }{st}, reply); err != nil { // hide Close
			return
		}
		st.CloseWrite()
	}, nil)
	cc := e.client()
	cn, err := srvConnect(t, cc, srvTestTarget)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := srvSend(cn.body, 5<<20+3) // closes the body: END_STREAM
	if err != nil {
		t.Fatal(err)
	}
	all, err := io.ReadAll(cn.resp.Body)
	if err != nil {
		t.Fatalf("reading the reply after our END_STREAM: %v", err)
	}
	line, rest, _ := bytes.Cut(all, []byte("\n"))
	if want := fmt.Sprintf("%x %d", sum, 5<<20+3); string(line) != want {
		t.Errorf("handler read %q, want %q", line, want)
	}
	if len(rest) != reply {
		t.Errorf("reply %d bytes, want %d", len(rest), reply)
	}
}

// Server half-close: the handler sends and CloseWrites first; the client
// sees EOF, then sends, and the handler reads all of it.
func TestServerHandlerHalfClose(t *testing.T) {
	const upload = 6 << 20
	got := make(chan string, 1)
	e := newSrvTest(t, func(r *Request) {
		st, err := r.Accept()
		if err != nil {
			return
		}
		defer st.Close()
		io.WriteString(st, "hello")
		st.CloseWrite()
		if _, err := st.Write([]byte("x")); err == nil {
			got <- "Write after CloseWrite succeeded"
			return
		}
		sum, n, err := srvRecv(st)
		got <- fmt.Sprintf("%x %d %v", sum, n, err)
	}, nil)
	cc := e.client()
	cn, err := srvConnect(t, cc, srvTestTarget)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(cn.resp.Body)
	if err != nil || string(b) != "hello" {
		t.Fatalf("read %q, %v", b, err)
	}
	sum, err := srvSend(cn.body, upload)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case g := <-got:
		if want := fmt.Sprintf("%x %d <nil>", sum, upload); g != want {
			t.Fatalf("handler read %s, want %s", g, want)
		}
	case <-time.After(srvTestWait):
		t.Fatal("handler did not finish reading")
	}
}

func TestServerConcurrentStreams(t *testing.T) {
	e := newSrvTest(t, srvEcho, nil)
	cc := e.client()
	const streams, size = 50, 256 << 10
	errs := make(chan error, streams)
	for range streams {
		go func() {
			cn, err := srvConnect(t, cc, srvTestTarget)
			if err != nil {
				errs <- err
				return
			}
			sent := make(chan [32]byte, 1)
			go func() {
				sum, _ := srvSend(cn.body, size)
				sent <- sum
			}()
			sum, n, err := srvRecv(cn.resp.Body)
			if err == nil && (n != size || sum != <-sent) {
				err = fmt.Errorf("echo mismatch: %d bytes", n)
			}
			errs <- err
		}()
	}
	for range streams {
		select {
		case err := <-errs:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(srvTestWait):
			t.Fatal("streams did not finish")
		}
	}
	if st := e.srv.Stats(); st.StreamsAccepted != streams || st.ConnsAccepted != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestServerRejections(t *testing.T) {
	tests := []struct {
		name    string
		handler func(*Request)
		method  string
		want    int
	}{
		{"reject 503", func(r *Request) { r.Reject(503) }, "CONNECT", 503},
		{"reject 401", func(r *Request) { r.Reject(401); r.Reject(500); r.Accept() }, "CONNECT", 401},
		{"no decision", func(r *Request) {}, "CONNECT", 503},
		{"not CONNECT", srvEcho, "GET", 400},
		{"POST", srvEcho, "POST", 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newSrvTest(t, tt.handler, nil)
			cc := e.client()
			req, _ := http.NewRequest(tt.method, "https://"+srvTestTarget+"/", nil)
			if tt.method == "CONNECT" {
				req.URL = &url.URL{Host: srvTestTarget}
				req.Host = srvTestTarget
			}
			resp, err := cc.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tt.want {
				t.Errorf("status %d, want %d", resp.StatusCode, tt.want)
			}
			if tt.method != "CONNECT" && e.handled.Load() != 0 {
				t.Error("Handler called for a non-CONNECT")
			}
			if st := e.srv.Stats(); st.StreamsRejected != 1 || st.StreamsAccepted != 0 {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

// A handler Reset reaches the Go client as a stream error.
func TestServerHandlerReset(t *testing.T) {
	e := newSrvTest(t, func(r *Request) {
		st, err := r.Accept()
		if err != nil {
			return
		}
		defer st.Close()
		io.WriteString(st, "partial")
		st.Reset()
		if _, err := st.Read(make([]byte, 1)); err == nil {
			t.Error("Read after Reset succeeded")
		}
	}, nil)
	cc := e.client()
	cn, err := srvConnect(t, cc, srvTestTarget)
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadAll(cn.resp.Body)
	var se http2.StreamError
	if !errors.As(err, &se) || se.Code != http2.ErrCodeConnect {
		t.Fatalf("read error %v, want a CONNECT_ERROR stream error", err)
	}
}

// The Go client cancelling its request sends RST_STREAM(CANCEL): the
// handler's Read ends with io.EOF.
func TestServerClientCancel(t *testing.T) {
	readErr := make(chan error, 1)
	e := newSrvTest(t, func(r *Request) {
		st, err := r.Accept()
		if err != nil {
			return
		}
		defer st.Close()
		_, err = io.Copy(io.Discard, st)
		if err == nil {
			err = io.EOF // io.Copy hides it
		}
		readErr <- err
	}, nil)
	cc := e.client()
	cn, err := srvConnect(t, cc, srvTestTarget)
	if err != nil {
		t.Fatal(err)
	}
	cn.body.Write([]byte("some bytes"))
	// The Go client notices a cancellation only between body reads; a
	// failing body or closing the response makes it send RST_STREAM(CANCEL).
	cn.cancel()
	cn.body.CloseWithError(context.Canceled)
	cn.resp.Body.Close()
	select {
	case err := <-readErr:
		if err != io.EOF {
			t.Fatalf("Read ended with %v, want io.EOF", err)
		}
	case <-time.After(srvTestWait):
		t.Fatal("handler's Read did not end")
	}
}

func TestServerTLSRefusals(t *testing.T) {
	other, err := devca.New(srvTestDomain)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := srvTestCA()
	tests := []struct {
		name string
		ca   *devca.CA
		id   string
	}{
		{"no client certificate", ca, ""},
		{"foreign trust domain", ca, "spiffe://evil.example/ns/default/sa/client"},
		{"untrusted CA", other, srvTestClientID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newSrvTest(t, srvEcho, nil)
			tc, err := e.dialTLS(tt.ca, tt.id)
			if err == nil {
				// In TLS 1.3 the server checks the client's certificate
				// after the client finished; the refusal shows on read.
				tc.SetDeadline(time.Now().Add(srvTestWait))
				tc.Write([]byte(http2.ClientPreface))
				_, err = tc.Read(make([]byte, 1))
			}
			if err == nil {
				t.Fatal("connection worked")
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("no refusal, timed out: %v", err)
			}
			if e.handled.Load() != 0 || e.srv.Stats().ConnsAccepted != 0 {
				t.Errorf("refused client was served: %+v", e.srv.Stats())
			}
		})
	}
}

// srvGoroutinesSettle waits (bounded) for the goroutine count to fall to
// at most want, and fails with a dump if it does not.
func srvGoroutinesSettle(t *testing.T, want int) {
	t.Helper()
	deadline := time.Now().Add(srvTestWait)
	for n := runtime.NumGoroutine(); n > want; n = runtime.NumGoroutine() {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, want ≤ %d:\n%s", n, want, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond) // polling, not synchronization
	}
}

func TestServerCloseLeaksNothing(t *testing.T) {
	before := runtime.NumGoroutine()
	e := newSrvTest(t, func(r *Request) {
		st, err := r.Accept()
		if err != nil {
			return
		}
		defer st.Close()
		io.Copy(io.Discard, st) // blocks until Close breaks it
	}, nil)
	var conns []*http2.ClientConn
	for range 3 {
		cc := e.client()
		conns = append(conns, cc)
		for range 4 {
			if _, err := srvConnect(t, cc, srvTestTarget); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A connection that never finishes its handshake.
	raw, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if got := e.srv.Stats().StreamsOpen; got != 12 {
		t.Errorf("StreamsOpen %d, want 12", got)
	}
	done := make(chan struct{})
	go func() { e.srv.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(srvTestWait):
		t.Fatal("Close hung")
	}
	if st := e.srv.Stats(); st.ConnsOpen != 0 || st.StreamsOpen != 0 {
		t.Errorf("after Close: %+v", st)
	}
	e.srv.Close() // idempotent
	raw.Close()
	for _, cc := range conns {
		cc.Close()
	}
	srvGoroutinesSettle(t, before)
}

// CloseWrite then Close at once (the target is gone, the client has not
// ended its side): every byte and the END_STREAM still reach the client
// before the RST_STREAM(CANCEL).
func TestServerCloseAfterCloseWriteKeepsData(t *testing.T) {
	const size = 2 << 20
	e := newSrvTest(t, func(r *Request) {
		st, err := r.Accept()
		if err != nil {
			return
		}
		srvSend(struct{ io.Writer }{st}, size)
		st.CloseWrite()
		st.Close()
	}, nil)
	cc := e.client()
	cn, err := srvConnect(t, cc, srvTestTarget)
	if err != nil {
		t.Fatal(err)
	}
	_, n, err := srvRecv(cn.resp.Body)
	if err != nil || n != size {
		t.Fatalf("read %d bytes, %v; want %d, EOF", n, err, size)
	}
}
