package hbone

import (
	"errors"
	"io"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/net/http2"
)

// newSrvPool is a pool whose client certificate comes from the server
// test CA, to dial newSrvTest servers.
func newSrvPool(t *testing.T, e *srvTestEnv) *Pool {
	t.Helper()
	pki := &clientTestPKI{ca: e.ca}
	var err error
	if pki.client, err = e.ca.KeyPair(srvTestClientID); err != nil {
		t.Fatal(err)
	}
	return newClientTestPool(t, pki, nil)
}

func srvRequest(e *srvTestEnv, authority string) ConnectRequest {
	return ConnectRequest{
		Address:    netip.MustParseAddrPort(e.addr),
		Authority:  netip.MustParseAddrPort(authority),
		Identities: []string{srvTestServerID},
	}
}

// srvDrain accepts, reads until the stream ends and reports how.
func srvDrain(got chan<- error, received *atomic.Int64, started chan<- struct{}) func(*Request) {
	return func(r *Request) {
		st, err := r.Accept()
		if err != nil {
			got <- err
			return
		}
		defer st.Close()
		buf := make([]byte, 64<<10)
		once := sync.Once{}
		for {
			n, err := st.Read(buf)
			if received != nil {
				received.Add(int64(n))
			}
			if n > 0 && started != nil {
				once.Do(func() { close(started) })
			}
			if err != nil {
				got <- err
				return
			}
		}
	}
}

// Our client's Reset reaches our server as a reset (ErrStreamReset), and
// Close as a clean end (io.EOF): the difference between an application's
// RST and its FIN-less goodbye. The server's WriteBufferedTo ends exactly
// as its Read does.
func TestClientResetReachesServer(t *testing.T) {
	ends := []struct {
		name  string
		end   func(*ClientStream) error
		reset bool
	}{
		{"Reset", (*ClientStream).Reset, true},
		{"Close", (*ClientStream).Close, false},
	}
	readers := []struct {
		name    string
		handler func(got chan<- error, started chan struct{}) func(*Request)
	}{
		{"Read", func(got chan<- error, started chan struct{}) func(*Request) {
			return srvDrain(got, nil, started)
		}},
		{"WriteBufferedTo", func(got chan<- error, started chan struct{}) func(*Request) {
			return func(r *Request) {
				st, err := r.Accept()
				if err != nil {
					got <- err
					return
				}
				defer st.Close()
				_, err = drainBuffered(st, startedWriter{started})
				got <- err
			}
		}},
	}
	for _, rd := range readers {
		for _, tt := range ends {
			t.Run(rd.name+"/"+tt.name, func(t *testing.T) {
				got := make(chan error, 1)
				started := make(chan struct{})
				e := newSrvTest(t, rd.handler(got, started), nil)
				pool := newSrvPool(t, e)
				s, err := pool.Connect(clientCtx(t), srvRequest(e, srvTestTarget))
				if err != nil {
					t.Fatal(err)
				}
				if _, err := s.Write([]byte("hello")); err != nil {
					t.Fatal(err)
				}
				clientRecv(t, started, "the server to read")
				if err := tt.end(s); err != nil {
					t.Fatal(err)
				}
				err = clientRecv(t, got, "the server's "+rd.name+" to end")
				if tt.reset && !errors.Is(err, ErrStreamReset) {
					t.Fatalf("server %s ended with %v, want ErrStreamReset", rd.name, err)
				}
				if !tt.reset && err != io.EOF {
					t.Fatalf("server %s ended with %v, want io.EOF", rd.name, err)
				}
				if st := pool.Stats(); st.StreamsOpen != 0 {
					t.Errorf("StreamsOpen %d after the end, want 0", st.StreamsOpen)
				}
			})
		}
	}
}

// Reset while the transport is busy writing large DATA frames: our
// RST_STREAM goes in between two frames, so the connection survives and
// carries the next stream.
func TestClientResetMidWrite(t *testing.T) {
	got := make(chan error, 1)
	var received atomic.Int64
	drain := srvDrain(got, &received, nil)
	e := newSrvTest(t, func(r *Request) {
		if r.Target().Port() == 1 {
			drain(r)
			return
		}
		srvEcho(r)
	}, nil)
	pool := newSrvPool(t, e)
	for i := range 5 {
		received.Store(0)
		s, err := pool.Connect(clientCtx(t), srvRequest(e, "10.0.0.1:1"))
		if err != nil {
			t.Fatal(err)
		}
		wrote := make(chan error, 1)
		go func() {
			_, err := io.Copy(s, io.LimitReader(clientRandom(uint64(i)), 256<<20))
			wrote <- err
		}()
		poolWaitFor(t, func() bool { return received.Load() > int64(i+1)<<20 })
		if err := s.Reset(); err != nil {
			t.Fatal(err)
		}
		if err := clientRecv(t, got, "the server's Read to end"); !errors.Is(err, ErrStreamReset) {
			t.Fatalf("round %d: server Read ended with %v, want ErrStreamReset", i, err)
		}
		if err := clientRecv(t, wrote, "the writer to stop"); err == nil {
			t.Errorf("round %d: write of a reset stream succeeded", i)
		}
		// The connection is intact: an echo on it works.
		s2, err := pool.Connect(clientCtx(t), srvRequest(e, srvTestTarget))
		if err != nil {
			t.Fatal(err)
		}
		s2.Write([]byte("still framed"))
		s2.CloseWrite()
		if b, err := io.ReadAll(s2); err != nil || string(b) != "still framed" {
			t.Fatalf("round %d: echo after Reset: %q, %v", i, b, err)
		}
		s2.Close()
	}
	if st := pool.Stats(); st.ConnsOpened != 1 {
		t.Errorf("ConnsOpened %d, want 1 (Reset must not break the connection)", st.ConnsOpened)
	}
}

// On the wire, Reset's RST_STREAM carries CONNECT_ERROR, and a second
// Reset is harmless.
func TestClientResetWire(t *testing.T) {
	_, _, s, c, id := clientFrameStream(t)
	if err := s.Reset(); err != nil {
		t.Fatal(err)
	}
	rst := clientRecv(t, c.resets, "RST_STREAM")
	if rst.StreamID != id || rst.ErrCode != http2.ErrCodeConnect {
		t.Fatalf("first RST_STREAM: stream %d code %v, want stream %d CONNECT_ERROR", rst.StreamID, rst.ErrCode, id)
	}
	if err := s.Reset(); err != nil {
		t.Fatal("second Reset:", err)
	}
}

// A stream that ended both ways is only closed by Reset: no RST_STREAM
// on a closed stream.
func TestClientResetAfterCleanEnd(t *testing.T) {
	pool, peer, s, c, id := clientFrameStream(t)
	s.CloseWrite()
	c.data(id, true, []byte("bye"))
	if b, err := io.ReadAll(s); err != nil || string(b) != "bye" {
		t.Fatalf("read %q, %v", b, err)
	}
	s.Reset()
	// A stream after it shows the peer's view of the connection so far.
	s2, err := pool.Connect(clientCtx(t), clientTestRequest(peer.addr))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	clientRecv(t, c.streams, "the second stream")
	select {
	case rst := <-c.resets:
		if rst.StreamID == id && rst.ErrCode == http2.ErrCodeConnect {
			t.Fatalf("Reset of a closed stream sent RST_STREAM(CONNECT_ERROR)")
		}
	default:
	}
}
