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
// The client is net/http's HTTP/2 client, which can reset a stream only
// with CANCEL; ClientStream.Reset therefore writes its RST_STREAM itself,
// between two of the transport's frames (pool_frames.go).
//
// Throughput: both sides put a batchConn under crypto/tls (h2batch.go),
// so the TLS records of one HTTP/2 flush leave in one write(2); the
// server keeps received DATA in pooled chunks (server_recvbuf.go) and a
// stream's Write writes its DATA itself when the connection's writer is
// idle. PoolOptions.ConnsPerKey spreads busy flows over a few connections
// (pool.go, invariant 7). Benchmarks: pool_bench_test.go.
//
// A Request exposes what the server logs: PeerIdentity, TraceID (from
// traceparent) and ForwardedFor (from forwarded: for=).
package hbone
