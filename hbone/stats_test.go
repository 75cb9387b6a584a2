package hbone

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/meshtun/meshtun/hbone/devca"
)

// The pool's counters move with real dials and CONNECTs over mutual TLS:
// a 200, a refusal, a CONNECT given up without an answer, a dial that
// TLS refuses and one that TCP refuses.
func TestPoolStatsCount(t *testing.T) {
	started := make(chan struct{}, 1)
	e := newSrvTest(t, func(r *Request) {
		switch r.Target().Port() {
		case 1:
			r.Reject(503)
		case 2: // never answers
			started <- struct{}{}
			<-r.Context().Done()
		default:
			st, err := r.Accept()
			if err != nil {
				return
			}
			defer st.Close()
			io.Copy(io.Discard, st)
		}
	}, nil)
	pool := newSrvPool(t, e)
	want := func(what string, opened, failed, dials uint64) {
		t.Helper()
		if st := pool.Stats(); st.StreamsOpened != opened || st.StreamsFailed != failed || st.DialsFailed != dials {
			t.Fatalf("after %s: %+v, want StreamsOpened %d, StreamsFailed %d, DialsFailed %d", what, st, opened, failed, dials)
		}
	}
	want("nothing", 0, 0, 0)

	s, err := pool.Connect(clientCtx(t), srvRequest(e, "10.0.0.1:80"))
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	want("a 200", 1, 0, 0)

	var se *StatusError
	if _, err := pool.Connect(clientCtx(t), srvRequest(e, "10.0.0.1:1")); !errors.As(err, &se) || se.Code != 503 {
		t.Fatalf("Connect to a rejecting handler: %v, want a 503 StatusError", err)
	}
	want("a 503", 1, 1, 0)

	ctx, cancel := context.WithCancel(clientCtx(t))
	errc := make(chan error, 1)
	go func() {
		_, err := pool.Connect(ctx, srvRequest(e, "10.0.0.1:2"))
		errc <- err
	}()
	clientRecv(t, started, "the handler that never answers")
	cancel()
	if err := clientRecv(t, errc, "the abandoned Connect"); !errors.Is(err, context.Canceled) {
		t.Fatalf("abandoned Connect: %v, want context.Canceled", err)
	}
	want("a CONNECT without an answer", 1, 2, 0)

	wrongID := srvRequest(e, "10.0.0.1:80")
	wrongID.Identities = []string{"spiffe://cluster.local/ns/other/sa/other"}
	if _, err := pool.Connect(clientCtx(t), wrongID); !errors.Is(err, ErrWrongIdentity) {
		t.Fatalf("Connect expecting another identity: %v, want ErrWrongIdentity", err)
	}
	want("a TLS refusal", 1, 2, 1)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := ln.Addr().(*net.TCPAddr).AddrPort()
	ln.Close()
	noListener := srvRequest(e, "10.0.0.1:80")
	noListener.Address = netip.AddrPortFrom(closedAddr.Addr(), closedAddr.Port())
	if _, err := pool.Connect(clientCtx(t), noListener); err == nil {
		t.Fatal("Connect to a closed port worked")
	}
	want("a TCP refusal", 1, 2, 2)
}

// The server's counters move with real handshakes and streams: a TLS
// handshake refused, a TLS connection that never speaks HTTP/2, a stream
// over MaxConcurrentStreams and one after GOAWAY.
func TestServerStatsCount(t *testing.T) {
	release := make(chan struct{})
	e := newSrvTest(t, func(r *Request) {
		st, err := r.Accept()
		if err != nil {
			return
		}
		defer st.Close()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}, func(o *ServerOptions) { o.MaxConcurrentStreams = 1 })

	other, err := devca.New(srvTestDomain)
	if err != nil {
		t.Fatal(err)
	}
	if tc, err := e.dialTLS(other, srvTestClientID); err == nil {
		// TLS 1.3: the server refuses the certificate after the client
		// finished; the refusal shows on read.
		tc.SetDeadline(time.Now().Add(srvTestWait))
		tc.Write([]byte(http2.ClientPreface))
		tc.Read(make([]byte, 1))
	}
	poolWaitFor(t, func() bool { return e.srv.Stats().HandshakeFailures == 1 })

	tc, err := e.dialTLS(e.ca, srvTestClientID)
	if err != nil {
		t.Fatal(err)
	}
	tc.SetDeadline(time.Now().Add(srvTestWait))
	if _, err := io.WriteString(tc, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, tc); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatal("the server kept a connection that sent no HTTP/2 preface")
		}
	}
	poolWaitFor(t, func() bool { return e.srv.Stats().HandshakeFailures == 2 })
	if st := e.srv.Stats(); st.StreamsRefused != 0 {
		t.Fatalf("StreamsRefused %d before any stream", st.StreamsRefused)
	}

	r := e.dialRaw()
	r.connect(1, srvTestTarget)
	if status, _ := r.awaitStatus(1); status != 200 {
		t.Fatalf("first stream: status %d", status)
	}
	r.connect(3, srvTestTarget)
	if code := r.awaitRST(3); code != http2.ErrCodeRefusedStream {
		t.Fatalf("stream over the limit: RST_STREAM %v, want REFUSED_STREAM", code)
	}
	if st := e.srv.Stats(); st.StreamsRefused != 1 {
		t.Fatalf("after a stream over the limit: StreamsRefused %d, want 1", st.StreamsRefused)
	}

	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), srvTestWait)
		defer cancel()
		shut <- e.srv.Shutdown(ctx)
	}()
	r.awaitGoAway()
	r.connect(5, srvTestTarget)
	if code := r.awaitRST(5); code != http2.ErrCodeRefusedStream {
		t.Fatalf("stream after GOAWAY: RST_STREAM %v, want REFUSED_STREAM", code)
	}
	st := e.srv.Stats()
	close(release)
	if err := clientRecv(t, shut, "Shutdown"); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if st.StreamsRefused != 2 || st.HandshakeFailures != 2 {
		t.Fatalf("after a stream while draining: %+v, want StreamsRefused 2, HandshakeFailures 2", st)
	}
}
