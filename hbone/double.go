package hbone

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"time"
)

// Double HBONE (docs/hbone.md, "Double HBONE"), as ztunnel sends a flow
// to a destination in another network (its proxy/outbound.rs,
// proxy_to_double_hbone): an outer CONNECT to the network gateway, on a
// pooled connection keyed on the gateway (address, identities), whose
// stream carries an inner connection made for this flow alone, mutual
// TLS with the destination's identity and HTTP/2 with one CONNECT. The
// gateway sees the inner TLS as ciphertext. Both CONNECTs carry the same
// :authority, forwarded, baggage and traceparent; the inner one adds
// x-forwarded-network.
//
// The inner connection is not pooled, as in ztunnel: the gateway picks
// the destination's instance for each outer stream, so an inner
// connection could not be shared by flows anyway. It ends with its one
// stream: once the stream was released (both directions ended, Reset or
// Close), what the inner connection still holds (an END_STREAM, a
// RST_STREAM) is written into the outer stream, then the outer stream
// is closed (RST_STREAM(CANCEL) unless it ended both ways).

// connectDouble is Connect for a request with a Gateway.
func (p *Pool) connectDouble(ctx context.Context, req ConnectRequest) (*ClientStream, error) {
	gw := req.Gateway
	tp := clientTraceparent()
	outerReq := req
	outerReq.Address, outerReq.Identities = gw.Address, gw.Identities
	outerReq.Gateway, outerReq.traceparent = nil, tp
	outer, err := p.Connect(ctx, outerReq)
	if err != nil {
		return nil, fmt.Errorf("hbone: network gateway %s: %w", gw.Address, err)
	}
	req.traceparent, req.inner = tp, true
	s, err := p.connectInner(ctx, outer, &req)
	if err != nil {
		outer.Close()
		return nil, fmt.Errorf("hbone: connect %s through network gateway %s (%s): %w",
			req.target(), gw.Address, outer.PeerIdentity(), err)
	}
	return s, nil
}

// connectInner makes the inner connection of req inside outer and opens
// its one CONNECT stream.
func (p *Pool) connectInner(ctx context.Context, outer *ClientStream, req *ConnectRequest) (*ClientStream, error) {
	cert, roots, err := inForce(p.src, time.Now())
	if err != nil {
		return nil, err
	}
	bc := newBatchConn(&streamConn{s: outer})
	tc := tls.Client(bc, ClientConfig(*cert, roots, req.Identities))
	if err := tc.HandshakeContext(ctx); err != nil {
		bc.Close()
		return nil, fmt.Errorf("inner tls: %w", err)
	}
	c := newClientConn(tc, bc, p.log, nil, p.opts.pingAfter, p.opts.pingTimeout)
	c.start()
	if !p.track(c.serve) {
		bc.Close()
		c.teardown(ErrPoolClosed) // serve will not run: stop the writer here
		return nil, ErrPoolClosed
	}
	fail := func(err error) (*ClientStream, error) {
		c.close()
		<-c.done
		return nil, err
	}
	select {
	case <-c.settingsDone:
	case <-ctx.Done():
		return fail(fmt.Errorf("inner connection: waiting for the destination's HTTP/2 SETTINGS: %w", ctx.Err()))
	}
	c.mu.Lock()
	settingsErr := c.settingsErr
	c.mu.Unlock()
	if settingsErr != nil {
		return fail(fmt.Errorf("inner connection: %w", settingsErr))
	}
	pc := &poolConn{
		key:        poolKey{addr: req.Address},
		cc:         c,
		peerID:     PeerIdentity(tc.ConnectionState()),
		maxStreams: 1,
		readerDone: c.done,
	}
	c.onRelease = func() { p.endInner(c, outer) }
	if err := c.reserve(); err != nil {
		return fail(fmt.Errorf("inner connection: %w", err))
	}
	s, _, err := p.open(ctx, pc, req)
	if err != nil {
		return fail(err)
	}
	s.outer = outer
	return s, nil
}

// endInner ends an inner connection whose stream was released: what it
// queued is written into the outer stream (bounded: a gateway that stops
// reading gets the outer stream reset), then both are closed.
func (p *Pool) endInner(c *h2Conn, outer *ClientStream) {
	end := func() {
		t := time.AfterFunc(h2DrainTimeout, func() { outer.Reset() })
		c.wmu.Lock()
		c.flushLocked(nil)
		c.wmu.Unlock()
		t.Stop()
		c.close() // closes outer through streamConn
		<-c.done
	}
	if !p.track(end) {
		c.close() // Close closes the outer connections; the reader ends with them
	}
}

// track runs f on a goroutine Close waits for, unless the pool is
// closed.
func (p *Pool) track(f func()) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		f()
	}()
	return true
}

// streamConn is an outer stream as the net.Conn the inner TLS runs on.
// Deadlines are not kept (the inner connection's keepalive, the outer
// connection's and ctx bound what waits on it); Close closes the outer
// stream.
type streamConn struct{ s *ClientStream }

func (c *streamConn) Read(b []byte) (int, error)  { return c.s.Read(b) }
func (c *streamConn) Write(b []byte) (int, error) { return c.s.Write(b) }
func (c *streamConn) Close() error                { return c.s.Close() }
func (c *streamConn) LocalAddr() net.Addr         { return streamAddr{} }
func (c *streamConn) RemoteAddr() net.Addr {
	return net.TCPAddrFromAddrPort(c.s.pc.key.addr)
}
func (c *streamConn) SetDeadline(time.Time) error      { return nil }
func (c *streamConn) SetReadDeadline(time.Time) error  { return nil }
func (c *streamConn) SetWriteDeadline(time.Time) error { return nil }

// streamAddr is the local address of a streamConn: a stream has none.
type streamAddr struct{}

func (streamAddr) Network() string { return "hbone" }
func (streamAddr) String() string  { return "hbone-stream" }
