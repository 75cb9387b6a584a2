package hbone

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"
)

// dial sets up one connection for key: TCP, TLS (the server must present
// one of ids) and HTTP/2, and waits for the peer's first SETTINGS so the
// stream cap is known. ConnectTimeout bounds all of it.
func (p *Pool) dial(key poolKey, ids []string) (*poolConn, error) {
	ctx, cancel := context.WithTimeout(p.ctx, p.opts.ConnectTimeout)
	defer cancel()

	tc, bc, err := p.dialTLS(ctx, key, ids)
	if err != nil {
		return nil, fmt.Errorf("hbone: connect %s: %w", key.addr, err)
	}
	c := newClientConn(tc, bc, p.log, p.wake, p.opts.pingAfter, p.opts.pingTimeout)
	fail := func(err error) (*poolConn, error) {
		c.close()
		<-c.done
		return nil, fmt.Errorf("hbone: connect %s: %w", key.addr, err)
	}
	c.start()
	go c.serve()
	select {
	case <-c.settingsDone:
	case <-ctx.Done():
		return fail(fmt.Errorf("waiting for the peer's HTTP/2 SETTINGS: %w", ctx.Err()))
	}
	c.mu.Lock()
	settingsErr, peerMax := c.settingsErr, c.firstMaxStreams
	c.mu.Unlock()
	if settingsErr != nil {
		return fail(settingsErr)
	}
	maxStreams := p.opts.MaxStreamsPerConn
	if peerMax >= 0 {
		maxStreams = min(maxStreams, peerMax)
	}
	if maxStreams == 0 {
		return fail(errors.New("peer allows no streams (SETTINGS_MAX_CONCURRENT_STREAMS 0)"))
	}
	pc := &poolConn{
		key:        key,
		cc:         c,
		peerID:     PeerIdentity(tc.ConnectionState()),
		maxStreams: maxStreams,
		readerDone: c.done,
	}
	// Before any stream: pc is handed out under p.mu after this.
	c.onRelease = func() { p.release(pc) }
	return pc, nil
}

// dialTLS opens the TCP connection and completes the TLS handshake with
// the certificate in force, which must still be of key's source identity.
func (p *Pool) dialTLS(ctx context.Context, key poolKey, ids []string) (*tls.Conn, *batchConn, error) {
	cert, roots, err := inForce(p.src, time.Now())
	if err != nil {
		return nil, nil, err
	}
	src, err := p.sourceID(cert)
	if err != nil {
		return nil, nil, err
	}
	if src != key.src {
		// The identity changed between the flow's start and this dial.
		return nil, nil, fmt.Errorf("our identity changed to %s since the flow started as %q; try again", src, key.src)
	}
	addr := key.addr.String()
	var raw net.Conn
	if p.opts.Dial != nil {
		raw, err = p.opts.Dial(ctx, "tcp", addr)
	} else {
		d := net.Dialer{Control: p.opts.Control}
		if key.srcIP.IsValid() {
			d.LocalAddr = &net.TCPAddr{IP: key.srcIP.AsSlice(), Zone: key.srcIP.Zone()}
		}
		raw, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("tcp (is HBONE port %d reachable?): %w", key.addr.Port(), err)
	}
	bc := newBatchConn(raw)
	tc := tls.Client(bc, ClientConfig(*cert, roots, ids))
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, nil, fmt.Errorf("tls: %w", err)
	}
	return tc, bc, nil
}
