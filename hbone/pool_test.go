package hbone

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// poolHolder is a handler that answers 200 and holds each stream until
// release is closed (or the client goes away); started counts arrivals.
type poolHolder struct {
	release chan struct{}
	started chan struct{}
}

func newPoolHolder(t *testing.T, n int) *poolHolder {
	h := &poolHolder{release: make(chan struct{}), started: make(chan struct{}, n)}
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(h.release) }) })
	return h
}

func (h *poolHolder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusOK)
	http.NewResponseController(w).Flush()
	h.started <- struct{}{}
	select {
	case <-h.release:
	case <-r.Context().Done():
	}
}

// poolConnectN opens n streams at once and returns them; it fails the
// test on any error.
func poolConnectN(t *testing.T, pool *Pool, req ConnectRequest, n int) []*ClientStream {
	t.Helper()
	streams := make([]*ClientStream, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	ctx := clientCtx(t)
	for i := range n {
		wg.Go(func() { streams[i], errs[i] = pool.Connect(ctx, req) })
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, s := range streams {
			if s != nil {
				s.Close()
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return streams
}

func TestPoolShares(t *testing.T) {
	pki := newClientTestPKI(t)
	h := newPoolHolder(t, 50)
	peer := newClientGoPeer(t, pki, 0, h.ServeHTTP)
	pool := newClientTestPool(t, pki, nil)
	poolConnectN(t, pool, clientTestRequest(peer.addr), 50)
	if st := pool.Stats(); st.ConnsOpened != 1 || st.ConnsOpen != 1 || st.StreamsOpen != 50 {
		t.Fatalf("stats = %+v, want 1 connection carrying 50 streams", st)
	}
}

func TestPoolPeerStreamLimit(t *testing.T) {
	pki := newClientTestPKI(t)
	h := newPoolHolder(t, 30)
	peer := newClientGoPeer(t, pki, 10, h.ServeHTTP) // SETTINGS_MAX_CONCURRENT_STREAMS 10
	pool := newClientTestPool(t, pki, nil)
	poolConnectN(t, pool, clientTestRequest(peer.addr), 30)
	for range 30 {
		clientRecv(t, h.started, "a stream at the server") // all 30 run at once
	}
	if st := pool.Stats(); st.ConnsOpened != 3 || st.StreamsOpen != 30 {
		t.Fatalf("stats = %+v, want 3 connections for 30 streams at 10 each", st)
	}
	want := []PeerStats{{Addr: peer.addr, Identity: clientTestServerID, Conns: 3, Streams: 30}}
	if got := pool.Peers(); !slices.Equal(got, want) {
		t.Fatalf("Peers = %+v, want %+v", got, want)
	}
}

func TestPoolDialSerialized(t *testing.T) {
	pki := newClientTestPKI(t)
	h := newPoolHolder(t, 1000)
	peer := newClientGoPeer(t, pki, 0, h.ServeHTTP)
	pool := newClientTestPool(t, pki, func(o *PoolOptions) { o.MaxStreamsPerConn = 100 })
	poolConnectN(t, pool, clientTestRequest(peer.addr), 1000)
	if st := pool.Stats(); st.ConnsOpened != 10 || st.StreamsOpen != 1000 {
		t.Fatalf("stats = %+v, want exactly 10 connections", st)
	}
}

func TestPoolDialErrorShared(t *testing.T) {
	pki := newClientTestPKI(t)
	release := make(chan struct{})
	var dials int
	var mu sync.Mutex
	pool := newClientTestPool(t, pki, func(o *PoolOptions) {
		o.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			mu.Lock()
			dials++
			mu.Unlock()
			<-release
			return nil, errors.New("no route to host")
		}
	})
	req := clientTestRequest(netip.MustParseAddrPort("192.0.2.1:15008"))
	const n = 20
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := pool.Connect(clientCtx(t), req)
			errs <- err
		}()
	}
	// Let every Connect queue behind the one dial, then fail it.
	key := pool.keyFor(&req)
	poolWaitFor(t, func() bool {
		pool.mu.Lock()
		defer pool.mu.Unlock()
		e := pool.keys[key]
		return e != nil && e.dialing != nil && e.dialing.waiters == n
	})
	close(release)
	for range n {
		err := clientRecv(t, errs, "a Connect")
		if err == nil || !strings.Contains(err.Error(), "no route to host") {
			t.Fatalf("Connect error = %v, want the dial's error", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if dials != 1 {
		t.Fatalf("%d dials for %d flows waiting on one, want 1", dials, n)
	}
}

func TestPoolKeys(t *testing.T) {
	pki := newClientTestPKI(t)
	h := newPoolHolder(t, 10)
	peer := newClientGoPeer(t, pki, 0, h.ServeHTTP)
	pool := newClientTestPool(t, pki, nil)
	ctx := clientCtx(t)
	connect := func(ids ...string) {
		t.Helper()
		req := clientTestRequest(peer.addr)
		req.Identities = ids
		s, err := pool.Connect(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
	}
	const other = "spiffe://cluster.local/ns/db/sa/alias"
	connect(clientTestServerID)
	connect(clientTestServerID, other) // another set of identities: another connection
	connect(other, clientTestServerID) // the same set in another order: shared
	if st := pool.Stats(); st.ConnsOpened != 2 {
		t.Fatalf("ConnsOpened = %d, want 2 (one per identity set)", st.ConnsOpened)
	}
}

func TestPoolGoAway(t *testing.T) {
	pki := newClientTestPKI(t)
	peer := newClientFramePeer(t, pki, nil)
	pool := newClientTestPool(t, pki, nil)
	ctx := clientCtx(t)
	req := clientTestRequest(peer.addr)

	old, err := pool.Connect(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	c1 := peer.nextConn(t)
	id := clientRecv(t, c1.streams, "the first stream")
	c1.goAway(id)
	// The GOAWAY is processed asynchronously: ping-pong a second stream
	// until the pool puts it on a new connection. Each attempt either
	// lands on c1 (GOAWAY not yet seen; the peer answers, as Go's client
	// may still send) or on a new connection. Bounded by clientTestWait.
	var c2 *clientFrameConn
	deadline := time.Now().Add(clientTestWait)
	for c2 == nil {
		if time.Now().After(deadline) {
			t.Fatal("no new connection after GOAWAY")
		}
		s, err := pool.Connect(ctx, req)
		if err != nil {
			continue // refused by the going-away connection
		}
		s.Close()
		select {
		case c2 = <-peer.conns:
		default:
		}
	}
	// The old stream still works and ends normally.
	c1.data(id, true, []byte("goodbye"))
	got, err := io.ReadAll(old)
	if err != nil || string(got) != "goodbye" {
		t.Fatalf("old stream read %q, %v", got, err)
	}
	old.Close()
	if st := pool.Stats(); st.ConnsOpened != 2 {
		t.Fatalf("ConnsOpened = %d, want 2", st.ConnsOpened)
	}
	// With its last stream gone, the old connection is closed.
	clientRecv(t, c1.done, "the old connection to close")
}

func TestPoolIdle(t *testing.T) {
	pki := newClientTestPKI(t)
	peer := newClientGoPeer(t, pki, 0, clientEcho)
	pool := newClientTestPool(t, pki, func(o *PoolOptions) { o.IdleTimeout = 100 * time.Millisecond })
	s, err := pool.Connect(clientCtx(t), clientTestRequest(peer.addr))
	if err != nil {
		t.Fatal(err)
	}
	s.CloseWrite()
	io.Copy(io.Discard, s)
	s.Close()
	clientRecv(t, peer.closed, "the idle connection to close")
	poolWaitFor(t, func() bool { return pool.Stats().ConnsOpen == 0 })
	// The next flow dials a new connection.
	s, err = pool.Connect(clientCtx(t), clientTestRequest(peer.addr))
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if st := pool.Stats(); st.ConnsOpened != 2 {
		t.Fatalf("ConnsOpened = %d, want 2", st.ConnsOpened)
	}
}

func TestPoolBusyNotIdle(t *testing.T) {
	pki := newClientTestPKI(t)
	h := newPoolHolder(t, 1)
	peer := newClientGoPeer(t, pki, 0, h.ServeHTTP)
	pool := newClientTestPool(t, pki, func(o *PoolOptions) { o.IdleTimeout = 20 * time.Millisecond })
	s, err := pool.Connect(clientCtx(t), clientTestRequest(peer.addr))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Several idle timeouts pass; a conn with a stream must stay.
	pool.reap(time.Now().Add(time.Hour))
	if st := pool.Stats(); st.ConnsOpen != 1 {
		t.Fatalf("ConnsOpen = %d with a stream open, want 1", st.ConnsOpen)
	}
}

func TestPoolPingTimeout(t *testing.T) {
	pki := newClientTestPKI(t)
	peer := newClientFramePeer(t, pki, func(p *clientFramePeer) { p.noPingAck = true })
	pool := newClientTestPool(t, pki, func(o *PoolOptions) {
		o.pingAfter = 50 * time.Millisecond
		o.pingTimeout = 100 * time.Millisecond
	})
	ctx := clientCtx(t)
	s, err := pool.Connect(ctx, clientTestRequest(peer.addr))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c1 := peer.nextConn(t)
	clientRecv(t, c1.pings, "a PING")
	clientRecv(t, c1.done, "the client to drop the silent connection")
	if _, err := io.ReadAll(s); err == nil {
		t.Error("stream on the dropped connection ended cleanly")
	}
	poolWaitFor(t, func() bool { return pool.Stats().ConnsOpen == 0 })
	s2, err := pool.Connect(ctx, clientTestRequest(peer.addr))
	if err != nil {
		t.Fatal(err)
	}
	s2.Close()
	peer.nextConn(t)
	if st := pool.Stats(); st.ConnsOpened != 2 {
		t.Fatalf("ConnsOpened = %d, want 2", st.ConnsOpened)
	}
}

func TestPoolClose(t *testing.T) {
	pki := newClientTestPKI(t)
	h := newPoolHolder(t, 20)
	peer := newClientGoPeer(t, pki, 5, h.ServeHTTP)
	pool := newClientTestPool(t, pki, nil)
	streams := poolConnectN(t, pool, clientTestRequest(peer.addr), 20)
	if err := pool.Close(); err != nil {
		t.Fatal(err)
	}
	if err := pool.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	for _, s := range streams {
		if _, err := s.Read(make([]byte, 1)); err == nil || err == io.EOF {
			t.Fatalf("Read on a closed pool's stream = %v, want an error", err)
		}
		if _, err := s.Write([]byte("x")); err == nil {
			t.Fatal("Write on a closed pool's stream succeeded")
		}
		s.Close()
	}
	if _, err := pool.Connect(clientCtx(t), clientTestRequest(peer.addr)); !errors.Is(err, ErrPoolClosed) {
		t.Fatalf("Connect after Close = %v, want ErrPoolClosed", err)
	}
	if st := pool.Stats(); st.ConnsOpen != 0 || st.StreamsOpen != 0 {
		t.Fatalf("stats after Close = %+v", st)
	}
	clientCheckNoLeak(t)
}

// poolWaitFor polls cond, bounded by clientTestWait, for a state that has
// no event to wait on (a pool counter).
func poolWaitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(clientTestWait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in time")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A CONNECT the peer did not process is sent again, once, on another
// connection: "GOAWAY sends new flows to a new connection" (docs/hbone.md,
// "Pooling") must hold even when the GOAWAY races the request.
func TestPoolRetriesUnprocessed(t *testing.T) {
	t.Run("GOAWAY names a lower stream", func(t *testing.T) {
		pki := newClientTestPKI(t)
		// Streams 3 and up get GOAWAY(last = the stream before) and no answer.
		peer := newClientFramePeer(t, pki, func(p *clientFramePeer) { p.goAwayFrom = 3 })
		pool := newClientTestPool(t, pki, nil)
		s1, err := pool.Connect(clientCtx(t), clientTestRequest(peer.addr))
		if err != nil {
			t.Fatal(err)
		}
		defer s1.Close()
		c1 := peer.nextConn(t)
		s2, err := pool.Connect(clientCtx(t), clientTestRequest(peer.addr))
		if err != nil {
			t.Fatalf("stream 3 went unprocessed (GOAWAY last 1) and was not retried: %v", err)
		}
		defer s2.Close()
		c2 := peer.nextConn(t)
		if id := clientRecv(t, c2.streams, "the retried stream"); id != 1 {
			t.Errorf("retried as stream %d, want 1 of a new connection", id)
		}
		if st := pool.Stats(); st.ConnsOpened != 2 {
			t.Errorf("ConnsOpened %d, want 2", st.ConnsOpened)
		}
		// The first stream, below the GOAWAY, finishes undisturbed.
		c1.data(clientRecv(t, c1.streams, "the first stream"), true, []byte("done"))
		if b, err := io.ReadAll(s1); err != nil || string(b) != "done" {
			t.Errorf("first stream read %q, %v", b, err)
		}
	})
	t.Run("GOAWAY between slot and send", func(t *testing.T) {
		pki := newClientTestPKI(t)
		peer := newClientFramePeer(t, pki, nil)
		var c1 *clientFrameConn
		calls := 0
		pool := newClientTestPool(t, pki, func(o *PoolOptions) {
			o.beforeOpen = func(pc *poolConn) {
				calls++ // Connects below are sequential
				if calls != 2 {
					return
				}
				// The slot is taken; now the GOAWAY lands before the send.
				c1.goAway(1)
				poolWaitFor(t, func() bool { return pc.cc.draining() })
			}
		})
		s1, err := pool.Connect(clientCtx(t), clientTestRequest(peer.addr))
		if err != nil {
			t.Fatal(err)
		}
		defer s1.Close()
		c1 = peer.nextConn(t)
		clientRecv(t, c1.streams, "the first stream")
		s2, err := pool.Connect(clientCtx(t), clientTestRequest(peer.addr))
		if err != nil {
			t.Fatalf("a CONNECT never sent was not retried: %v", err)
		}
		defer s2.Close()
		c2 := peer.nextConn(t)
		clientRecv(t, c2.streams, "the retried stream")
		select {
		case id := <-c1.streams:
			t.Errorf("stream %d reached the going-away connection", id)
		default:
		}
		if calls != 3 {
			t.Errorf("%d attempts, want 3 (one, then two for the retried flow)", calls)
		}
	})
	t.Run("processed requests are not retried", func(t *testing.T) {
		pki := newClientTestPKI(t)
		// The peer reads stream 1, then drops the connection: it may
		// have acted on it, so it must not be sent again.
		peer := newClientFramePeer(t, pki, func(p *clientFramePeer) { p.dropFrom = 1 })
		pool := newClientTestPool(t, pki, nil)
		if _, err := pool.Connect(clientCtx(t), clientTestRequest(peer.addr)); err == nil {
			t.Fatal("Connect succeeded on a dropped connection")
		}
		if st := pool.Stats(); st.ConnsOpened != 1 {
			t.Errorf("ConnsOpened %d, want 1 (no retry)", st.ConnsOpened)
		}
	})
}

// With ConnsPerKey, busy flows get their own connections up to the bound
// (dialled one at a time), then share the least-loaded one.
func TestPoolSpread(t *testing.T) {
	tests := []struct {
		name      string
		conns     int
		flows     int
		parallel  bool
		wantConns uint64
		wantMax   int // most streams on one connection
	}{
		{"sequential flows spread evenly", 4, 8, false, 4, 2},
		{"concurrent flows spread evenly", 4, 8, true, 4, 2},
		{"fewer flows than the bound", 4, 3, false, 3, 1},
		{"default packs onto one", 0, 8, true, 1, 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pki := newClientTestPKI(t)
			h := newPoolHolder(t, tt.flows)
			peer := newClientGoPeer(t, pki, 0, h.ServeHTTP)
			pool := newClientTestPool(t, pki, func(o *PoolOptions) { o.ConnsPerKey = tt.conns })
			req := clientTestRequest(peer.addr)
			if tt.parallel {
				poolConnectN(t, pool, req, tt.flows)
			} else {
				for range tt.flows {
					poolConnectN(t, pool, req, 1)
				}
			}
			if st := pool.Stats(); st.ConnsOpened != tt.wantConns || st.StreamsOpen != tt.flows {
				t.Fatalf("stats = %+v, want %d connections carrying %d streams", st, tt.wantConns, tt.flows)
			}
			pool.mu.Lock()
			defer pool.mu.Unlock()
			for _, e := range pool.keys {
				for _, pc := range e.conns {
					if pc.inflight > tt.wantMax {
						t.Errorf("a connection carries %d streams, want at most %d", pc.inflight, tt.wantMax)
					}
				}
			}
		})
	}
}

// A failed extra dial does not fail the flows that waited for it: they
// share the connection that works, and the key stops spreading for a
// while (one failed dial, not one per flow).
func TestPoolSpreadDialFails(t *testing.T) {
	pki := newClientTestPKI(t)
	h := newPoolHolder(t, 8)
	peer := newClientGoPeer(t, pki, 0, h.ServeHTTP)
	var dials atomic.Int32
	pool := newClientTestPool(t, pki, func(o *PoolOptions) {
		o.ConnsPerKey = 4
		o.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if dials.Add(1) > 1 {
				return nil, errors.New("refused by the test")
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}
	})
	req := clientTestRequest(peer.addr)
	for range 8 {
		poolConnectN(t, pool, req, 1)
	}
	if st := pool.Stats(); st.ConnsOpened != 1 || st.StreamsOpen != 8 {
		t.Fatalf("stats = %+v, want 1 connection carrying 8 streams", st)
	}
	if n := dials.Load(); n != 2 {
		t.Errorf("%d dials, want 2 (the first, one failed extra)", n)
	}
}

func TestPoolConnsPerKeyBound(t *testing.T) {
	pki := newClientTestPKI(t)
	_, err := NewPool(PoolOptions{Certificate: pki.client, Roots: pki.ca.Pool(), ConnsPerKey: MaxConnsPerKey + 1})
	if err == nil {
		t.Fatal("NewPool accepted ConnsPerKey above MaxConnsPerKey")
	}
}
