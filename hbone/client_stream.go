package hbone

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
)

// The client's side of the engine (h2conn.go): a connection of the pool
// opens odd-numbered streams, one CONNECT each, and accepts none.

// poolMaxHeaderList is the SETTINGS_MAX_HEADER_LIST_SIZE the client
// announces and enforces on responses: an answer to CONNECT is a status
// and a few fields.
const poolMaxHeaderList = 16 << 10

// newClientConn makes the engine's client side over tc (bc under it);
// onState is called when the connection stops taking streams. The caller
// calls start, then runs serve.
func newClientConn(tc net.Conn, bc *batchConn, log hclog.Logger, onState func(), pingAfter, pingTimeout time.Duration) *h2Conn {
	return newH2Conn(tc, bc, h2Config{
		client:        true,
		maxHeaderList: poolMaxHeaderList,
		pingAfter:     pingAfter,
		pingTimeout:   pingTimeout,
		log:           log,
		onState:       onState,
	})
}

// open sends the CONNECT on pc, whose slot the caller holds, and waits for
// the answer. When it fails, retry says whether the peer certainly did
// not process the request (RFC 9113 §8.7), so that it may be sent again.
func (p *Pool) open(ctx context.Context, pc *poolConn, req *ConnectRequest) (s *ClientStream, retry bool, err error) {
	target := req.target()
	fail := func(err error) (*ClientStream, bool, error) {
		return nil, errors.Is(err, errUnprocessed), fmt.Errorf("hbone: connect %s via %s: %w", target, req.Address, err)
	}
	s = &ClientStream{pc: pc}
	if err := pc.cc.openStream(&s.h2Stream, req.header(target)); err != nil {
		return fail(err)
	}
	count := func(c *atomic.Uint64) {
		if !req.inner {
			c.Add(1)
		}
	}
	select {
	case <-s.resp:
	case <-ctx.Done():
		s.abort()
		count(&p.streamsFailed)
		return fail(ctx.Err())
	}
	status, rerr := s.response()
	switch {
	case status == http.StatusOK:
		count(&p.streamsOpened)
		return s, false, nil
	case status != 0:
		s.abort()
		count(&p.streamsFailed)
		return nil, false, &StatusError{Code: status}
	default:
		s.abort()
		count(&p.streamsFailed)
		return fail(rerr)
	}
}

// ClientStream is one CONNECT stream: the proxied TCP connection's bytes.
// Its Read, WriteBufferedTo, Write, ReadFrom, CloseWrite, Reset and
// Close are the engine's (h2stream.go): Read and Write may be called
// concurrently with each other; Close may be called at any time, from
// any goroutine. An idle stream holds no buffer and no goroutine. The
// pool slot goes back once both directions ended (Read returned its end
// and CloseWrite was called) or at Reset or Close.
type ClientStream struct {
	h2Stream
	pc *poolConn
	// outer is the gateway's stream that carries this one (double
	// HBONE, double.go); nil for a direct stream.
	outer *ClientStream
}

// PeerIdentity is the server's SPIFFE ID: for a double-HBONE stream the
// destination's, proved by the inner TLS.
func (s *ClientStream) PeerIdentity() string {
	return s.pc.peerID
}

// Gateway is the network gateway a double-HBONE stream goes through:
// its HBONE address and the identity its certificate proved; ok is
// false for a direct stream.
func (s *ClientStream) Gateway() (addr netip.AddrPort, identity string, ok bool) {
	if s.outer == nil {
		return netip.AddrPort{}, "", false
	}
	return s.outer.pc.key.addr, s.outer.pc.peerID, true
}

var _ io.ReadWriteCloser = (*ClientStream)(nil)
var _ io.ReaderFrom = (*ClientStream)(nil)
