// Package hbone speaks HBONE, Istio ambient's tunnel protocol: one HTTP/2
// CONNECT stream per proxied TCP connection, over mutual TLS 1.3 whose peers
// are named by SPIFFE IDs in their certificates' URI SANs.
//
// It owns the TLS identity rules (tls.go, identity.go), the client side (a
// Pool of HTTP/2 connections, one ClientStream per flow) and the server
// side (Server: accept, parse and check the CONNECT, hand the Request to a
// handler). It knows nothing of meshtun's config, TUN or gateway: callers
// pass their own Options. The wire contract it keeps is
// shared/design/hbone-wire.md, summarized in ARCHITECTURE.md, "HBONE on
// the wire"; each rule has a test (tls_test.go, client_*_test.go,
// pool_test.go, server_*_test.go) and the interop package checks both
// sides against Node.js's nghttp2.
//
// Ending a stream, both sides alike:
//
//   - CloseWrite sends END_STREAM (the proxied connection's FIN); Read
//     keeps working.
//   - Read returns io.EOF at the peer's END_STREAM and at RST_STREAM
//     NO_ERROR or CANCEL; any other reset code returns an error wrapping
//     ErrStreamReset.
//   - Reset sends RST_STREAM(CONNECT_ERROR): the local side failed and
//     the peer should reset its end. Close releases the stream, sending
//     RST_STREAM(CANCEL) if it was still open, which the peer reads as a
//     clean end.
//
// Both sides are our own HTTP/2 on x/net/http2's Framer and hpack, with
// one frame-reading loop (h2read.go). The client (client_conn.go,
// client_stream.go) has one reader goroutine per connection and nothing
// per stream: HEADERS, DATA, RST_STREAM, WINDOW_UPDATE and ACKs are
// written by the goroutine that causes them, under the connection's write
// lock; Write sends DATA straight from the caller's buffer, blocking on
// the peer's windows; a PING timer replaces a keepalive goroutine.
//
// Throughput: both sides put a batchConn under crypto/tls (h2batch.go),
// so the TLS records of one HTTP/2 flush leave in one write(2); both keep
// received DATA in pooled chunks (server_recvbuf.go) that an idle stream
// does not hold, and credit it back as it is read; a server stream's
// Write writes its DATA itself when the connection's writer is idle. PoolOptions.ConnsPerKey spreads busy flows over a few connections
// (pool.go, invariant 7). Benchmarks: pool_bench_test.go.
//
// A Request exposes what the server logs: PeerIdentity, TraceID (from
// traceparent) and ForwardedFor (from forwarded: for=).
package hbone
