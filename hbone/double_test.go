package hbone

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

// Double HBONE (double.go) through a gateway built from this package's
// Server, which terminates only the outer CONNECT and passes the inner
// TLS to the destination as bytes, over real sockets and TLS.

const (
	dblGatewayID = "spiffe://cluster.local/ns/istio-system/sa/istio-eastwestgateway"
	dblAuthority = "web.default.svc.cluster.local:80"
	dblSecret    = "the payload only the destination may read"
)

// dblSeen is what one side saw of a CONNECT.
type dblSeen struct {
	target string // TargetName, or Target
	header http.Header
	peerID string
}

func seenOf(r *Request) dblSeen {
	t := r.TargetName()
	if t == "" {
		t = r.Target().String()
	}
	return dblSeen{target: t, header: r.Header().Clone(), peerID: r.PeerIdentity()}
}

// dblEnv is a destination server and a gateway in front of it.
type dblEnv struct {
	dest, gw   *srvTestEnv
	destSeen   chan dblSeen
	gwSeen     chan dblSeen
	mu         sync.Mutex
	gwBytes    bytes.Buffer // every byte the gateway relayed, both ways
	gwFault    func(st *ServerStream) bool
	destStream chan *ServerStream
}

// newDblEnv starts the destination (destHandler, or an echo) and the
// gateway, which dials the destination for every outer CONNECT it takes
// and relays raw bytes with half-close.
func newDblEnv(t *testing.T, destHandler func(*Request)) *dblEnv {
	e := &dblEnv{destSeen: make(chan dblSeen, 16), gwSeen: make(chan dblSeen, 16), destStream: make(chan *ServerStream, 16)}
	if destHandler == nil {
		destHandler = srvEcho
	}
	e.dest = newSrvTest(t, func(r *Request) {
		e.destSeen <- seenOf(r)
		destHandler(r)
	}, func(o *ServerOptions) { o.NameAuthorities = true })
	e.gw = newSrvTest(t, e.gateway, func(o *ServerOptions) {
		o.NameAuthorities = true
		ca, _ := srvTestCA()
		cert, err := ca.KeyPair(dblGatewayID)
		if err != nil {
			t.Fatal(err)
		}
		o.Certificate = cert
	})
	return e
}

func (e *dblEnv) gateway(r *Request) {
	e.gwSeen <- seenOf(r)
	tc, err := net.DialTimeout("tcp", e.dest.addr, srvTestWait)
	if err != nil {
		r.Reject(http.StatusServiceUnavailable)
		return
	}
	defer tc.Close()
	st, err := r.Accept()
	if err != nil {
		return
	}
	defer st.Close()
	if e.gwFault != nil && e.gwFault(st) {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		io.Copy(io.MultiWriter(tc, e.recorder()), st)
		tc.(*net.TCPConn).CloseWrite()
	}()
	if _, err := io.Copy(io.MultiWriter(st, e.recorder()), tc); err != nil {
		st.Reset()
	} else {
		st.CloseWrite()
	}
	<-done
}

type dblRecorder struct{ e *dblEnv }

func (r dblRecorder) Write(p []byte) (int, error) {
	r.e.mu.Lock()
	defer r.e.mu.Unlock()
	return r.e.gwBytes.Write(p)
}

func (e *dblEnv) recorder() io.Writer { return dblRecorder{e} }

func (e *dblEnv) request() ConnectRequest {
	return ConnectRequest{
		Address:       netip.MustParseAddrPort(e.dest.addr),
		Authority:     netip.MustParseAddrPort("10.1.2.3:8080"),
		AuthorityName: dblAuthority,
		Identities:    []string{srvTestServerID},
		Source:        netip.MustParseAddrPort("10.9.0.5:40000"),
		Host:          "web.default.svc.cluster.local",
		Baggage:       "k8s.namespace.name=vm,k8s.pod.name=vm-1",
		Gateway:       &GatewayHop{Address: netip.MustParseAddrPort(e.gw.addr), Identities: []string{dblGatewayID}},
		Network:       "vm-net",
	}
}

func dblCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), srvTestWait)
	t.Cleanup(cancel)
	return ctx
}

func TestDoubleHBONE(t *testing.T) {
	e := newDblEnv(t, nil)
	pool := newSrvPool(t, e.dest)
	for i := range 2 {
		s, err := pool.Connect(dblCtx(t), e.request())
		if err != nil {
			t.Fatal(err)
		}
		if got := s.PeerIdentity(); got != srvTestServerID {
			t.Errorf("PeerIdentity = %s, want the destination's %s", got, srvTestServerID)
		}
		if addr, id, ok := s.Gateway(); !ok || addr.String() != e.gw.addr || id != dblGatewayID {
			t.Errorf("Gateway() = %v %q %v, want %s %s", addr, id, ok, e.gw.addr, dblGatewayID)
		}
		if _, err := io.WriteString(s, dblSecret); err != nil {
			t.Fatal(err)
		}
		s.CloseWrite() // half-close crosses both layers: the echo ends after it
		got, err := io.ReadAll(s)
		if err != nil || string(got) != dblSecret {
			t.Fatalf("flow %d: read %q, %v; want the echo and a clean end", i, got, err)
		}
		s.Close()

		outer, inner := clientRecv(t, e.gwSeen, "outer CONNECT"), clientRecv(t, e.destSeen, "inner CONNECT")
		for _, c := range []struct {
			what string
			seen dblSeen
		}{{"outer", outer}, {"inner", inner}} {
			if c.seen.target != dblAuthority {
				t.Errorf("%s :authority %q, want %q", c.what, c.seen.target, dblAuthority)
			}
			if c.seen.peerID != srvTestClientID {
				t.Errorf("%s CONNECT's client %q, want ours %q (end to end)", c.what, c.seen.peerID, srvTestClientID)
			}
			if got, want := c.seen.header.Get("Forwarded"), `for="10.9.0.5:40000";host=web.default.svc.cluster.local`; got != want {
				t.Errorf("%s forwarded %q, want %q", c.what, got, want)
			}
			if got := c.seen.header.Get("Baggage"); got != "k8s.namespace.name=vm,k8s.pod.name=vm-1" {
				t.Errorf("%s baggage %q", c.what, got)
			}
		}
		if got := inner.header.Get("X-Forwarded-Network"); got != "vm-net" {
			t.Errorf("inner x-forwarded-network %q, want vm-net", got)
		}
		if got := outer.header.Values("X-Forwarded-Network"); len(got) != 0 {
			t.Errorf("outer CONNECT carries x-forwarded-network %q; ztunnel sends it on the inner one only", got)
		}
		if a, b := outer.header.Get("Traceparent"), inner.header.Get("Traceparent"); a == "" || a != b {
			t.Errorf("traceparent outer %q inner %q, want one and the same", a, b)
		}
	}
	e.mu.Lock()
	relayed := e.gwBytes.String()
	e.mu.Unlock()
	if relayed == "" || strings.Contains(relayed, dblSecret) || strings.Contains(relayed, "vm-net") {
		t.Errorf("the gateway relayed %d bytes, and must see the inner connection only as ciphertext", len(relayed))
	}
	st := pool.Stats()
	if st.ConnsOpened != 1 || st.StreamsOpened != 2 {
		t.Errorf("stats %+v: want the two flows on one pooled connection to the gateway, each stream counted once", st)
	}
	peers := pool.Peers()
	if len(peers) != 1 || peers[0].Identity != dblGatewayID {
		t.Errorf("pool peers %+v, want the gateway only (inner connections are the flow's own)", peers)
	}
	pool.Close()
	clientCheckNoLeak(t)
}

func TestDoubleHBONEWrongInnerIdentity(t *testing.T) {
	e := newDblEnv(t, nil)
	pool := newSrvPool(t, e.dest)
	req := e.request()
	req.Identities = []string{"spiffe://cluster.local/ns/default/sa/someone-else"}
	_, err := pool.Connect(dblCtx(t), req)
	if !errors.Is(err, ErrWrongIdentity) {
		t.Fatalf("Connect = %v, want ErrWrongIdentity", err)
	}
	if !strings.Contains(err.Error(), "network gateway") {
		t.Errorf("error %q does not say the flow went through a network gateway", err)
	}
	if n := e.dest.handled.Load(); n != 0 {
		t.Errorf("the destination got %d CONNECTs, want none: nothing is sent past a wrong identity", n)
	}
	// The gateway's identity is checked too.
	req = e.request()
	req.Gateway.Identities = []string{srvTestServerID}
	if _, err := pool.Connect(dblCtx(t), req); !errors.Is(err, ErrWrongIdentity) {
		t.Fatalf("Connect with the wrong gateway identity = %v, want ErrWrongIdentity", err)
	}
	if n := e.gw.handled.Load(); n != 1 {
		t.Errorf("the gateway got %d CONNECTs, want 1 (the first attempt's)", n)
	}
}

func TestDoubleHBONEGatewayDown(t *testing.T) {
	e := newDblEnv(t, nil)
	pool := newSrvPool(t, e.dest)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := ln.Addr().(*net.TCPAddr).AddrPort()
	ln.Close()
	req := e.request()
	req.Gateway.Address = down
	_, err = pool.Connect(dblCtx(t), req)
	if err == nil || !strings.Contains(err.Error(), "network gateway "+down.String()) {
		t.Fatalf("Connect through a gateway that is down = %v, want an error naming it", err)
	}
	// And back: the same request through the live gateway.
	s, err := pool.Connect(dblCtx(t), e.request())
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
}

func TestDoubleHBONEGatewayResets(t *testing.T) {
	t.Run("right after its 200", func(t *testing.T) {
		e := newDblEnv(t, nil)
		e.gwFault = func(st *ServerStream) bool { st.Reset(); return true }
		pool := newSrvPool(t, e.dest)
		if _, err := pool.Connect(dblCtx(t), e.request()); err == nil {
			t.Fatal("Connect succeeded through a gateway that reset the outer stream")
		}
	})
	t.Run("mid-stream", func(t *testing.T) {
		hold := make(chan *ServerStream, 1)
		e := newDblEnv(t, func(r *Request) {
			st, err := r.Accept()
			if err != nil {
				return
			}
			hold <- st
		})
		var outer *ServerStream
		e.gwFault = func(st *ServerStream) bool { outer = st; return false }
		pool := newSrvPool(t, e.dest)
		s, err := pool.Connect(dblCtx(t), e.request())
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		dst := clientRecv(t, hold, "the destination's stream")
		defer dst.Close()
		outer.Reset() // the gateway gives up on the outer stream
		_, err = io.ReadAll(s)
		if err == nil {
			t.Fatal("the flow ended cleanly after the gateway reset it; want an error")
		}
		// The destination sees its inner connection end abnormally too.
		if _, err := io.ReadAll(dst); err == nil {
			t.Error("the destination saw a clean end after the gateway reset")
		}
	})
}

func TestDoubleHBONEResetReachesDestination(t *testing.T) {
	got := make(chan error, 1)
	e := newDblEnv(t, srvDrain(got, nil, nil))
	pool := newSrvPool(t, e.dest)
	s, err := pool.Connect(dblCtx(t), e.request())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	s.Reset()
	s.Close()
	if err := clientRecv(t, got, "the destination's read"); !errors.Is(err, ErrStreamReset) {
		t.Errorf("the destination read %v, want ErrStreamReset (RST_STREAM(CONNECT_ERROR) through both layers)", err)
	}
	pool.Close()
	clientCheckNoLeak(t)
}

func TestDoubleHBONEDestinationRefuses(t *testing.T) {
	e := newDblEnv(t, func(r *Request) { r.Reject(http.StatusUnauthorized) })
	pool := newSrvPool(t, e.dest)
	_, err := pool.Connect(dblCtx(t), e.request())
	var se *StatusError
	if !errors.As(err, &se) || se.Code != http.StatusUnauthorized {
		t.Fatalf("Connect = %v, want the destination's 401", err)
	}
}

func TestNameAuthorityRefusedByDefault(t *testing.T) {
	e := newSrvTest(t, srvEcho, nil)
	pool := newSrvPool(t, e)
	req := srvRequest(e, srvTestTarget)
	req.AuthorityName = dblAuthority
	_, err := pool.Connect(dblCtx(t), req)
	var se *StatusError
	if !errors.As(err, &se) || se.Code != http.StatusBadRequest {
		t.Fatalf("Connect = %v, want 400 from a server without NameAuthorities", err)
	}
}

func TestParseNameAuthority(t *testing.T) {
	for _, tt := range []struct {
		in   string
		host string
		port uint16
	}{
		{"web.default.svc.cluster.local:80", "web.default.svc.cluster.local", 80},
		{"a:65535", "a", 65535},
		{"10.0.0.1:80", "", 0},
		{"web:0", "", 0},
		{"web:080", "", 0},
		{"web:65536", "", 0},
		{"web", "", 0},
		{":80", "", 0},
		{"web:", "", 0},
		{"we b:80", "", 0},
		{"[::1]:80", "", 0},
		{"web:+80", "", 0},
	} {
		host, port, err := ParseNameAuthority(tt.in)
		if (err == nil) != (tt.host != "") || host != tt.host || port != tt.port {
			t.Errorf("ParseNameAuthority(%q) = %q %d %v, want %q %d", tt.in, host, port, err, tt.host, tt.port)
		}
	}
}

// A hostile gateway: it answers the outer CONNECT and then sends
// nothing, or bytes that are no TLS. Connect fails within its context,
// and nothing is left running.
func TestDoubleHBONEHostileGateway(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault func(st *ServerStream) bool
	}{
		{"silent after its 200", func(st *ServerStream) bool {
			<-st.ctx.Done() // holds the stream until the client gives up
			return true
		}},
		{"garbage instead of the destination's TLS", func(st *ServerStream) bool {
			st.Write(bytes.Repeat([]byte("not TLS\n"), 64))
			<-st.ctx.Done()
			return true
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newDblEnv(t, nil)
			e.gwFault = tc.fault
			pool := newSrvPool(t, e.dest)
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			if _, err := pool.Connect(ctx, e.request()); err == nil {
				t.Fatal("Connect succeeded through a hostile gateway")
			}
			if n := e.dest.handled.Load(); n != 0 {
				t.Errorf("the destination got %d CONNECTs", n)
			}
			pool.Close()
			clientCheckNoLeak(t)
		})
	}
}
