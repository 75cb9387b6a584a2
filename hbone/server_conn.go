package hbone

import (
	"context"
	"crypto/tls"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// srvConn is one connection of the server: the engine's server side
// (h2conn.go), whose peer opens the streams, plus the handlers of its
// CONNECTs. Its goroutines: the reader (the caller of serve, which owns
// the others), the engine's writer, and one per handler. All end before
// serve returns.
type srvConn struct {
	*h2Conn
	srv    *Server
	tls    *tls.Conn
	ctx    context.Context // cancelled when the connection ends
	cancel context.CancelFunc
	wg     sync.WaitGroup // handlers

	handlers int // handler goroutines running; guarded by h2Conn.mu
}

func newSrvConn(s *Server, tc *tls.Conn, log hclog.Logger, deadline time.Time) *srvConn {
	ctx, cancel := context.WithCancel(context.Background())
	c := &srvConn{srv: s, tls: tc, ctx: ctx, cancel: cancel}
	bc, _ := tc.NetConn().(*batchConn)
	if bc == nil {
		bc = newBatchConn(tc.NetConn())
	}
	c.h2Conn = newH2Conn(tc, bc, h2Config{
		maxHeaderList:     srvMaxHeaderList,
		maxStreams:        s.opts.MaxConcurrentStreams,
		pingAfter:         s.pingAfter,
		pingTimeout:       s.pingTimeout,
		handshakeDeadline: deadline,
		log:               log,
		onRequestLocked:   c.onRequestLocked,
		streamsOpen:       &s.streamsOpen,
	})
	return c
}

// closeNow closes the connection at once (Server.Close); the reader then
// tears it down.
func (c *srvConn) closeNow() {
	c.cancel()
	c.close()
}

// serve runs the connection after the TLS handshake, until it ends and
// every handler returned. It reports whether the HTTP/2 handshake failed:
// the connection ended before the peer's first SETTINGS, or opened no
// stream before the handshake deadline, and not because the server
// closed it.
func (c *srvConn) serve() (failed bool) {
	c.start()
	c.h2Conn.serve()
	c.mu.Lock()
	failed = (c.settingsErr != nil || c.handshakeExpired.Load()) && c.ctx.Err() == nil
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
	return failed
}
