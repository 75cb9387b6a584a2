// Package hbone speaks HBONE, Istio ambient's tunnel protocol: one HTTP/2
// CONNECT stream per proxied TCP connection, over mutual TLS 1.3 whose peers
// are named by SPIFFE IDs in their certificates' URI SANs.
//
// It owns the TLS identity rules (tls.go), the client side (a
// Pool of HTTP/2 connections, one ClientStream per flow) and the server
// side (Server: accept, parse and check the CONNECT, hand the Request to a
// handler). It knows nothing of meshtun's config, TUN or gateway: callers
// pass their own Options. The wire contract it keeps is docs/hbone.md
// (its last section maps each rule to its test: tls_test.go,
// client_*_test.go, pool_test.go, server_*_test.go); the interop package
// checks both sides against Node.js's nghttp2.
//
// Certificates: PoolOptions and ServerOptions take either a fixed
// Certificate and Roots or a CertSource (source.go), whose Current is
// read once per new connection: by the pool before each dial, by the
// server in GetConfigForClient at each handshake (the roots that verify
// the peer come from the same read). A swap thus reaches every new
// connection at once and no open one. A source with no usable
// certificate (none yet, expired, no roots) fails new handshakes with
// ErrNoCertificate, counted in PoolStats.DialsFailed and
// ServerStats.HandshakeFailures. The pool key's source identity is the
// SPIFFE ID of the certificate in force when a flow starts, so flows
// after an identity change get connections of their own. Sources:
// mesh.CertManager (Istio's CA) and hbone/certfile (files, reloaded when
// they change).
//
// Ending a stream, both sides alike (docs/hbone.md, "Ending a stream"):
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
// Both sides run one HTTP/2 engine of our own on x/net/http2's Framer
// and hpack: h2conn.go (the connection, SETTINGS, GOAWAY, teardown),
// h2stream.go (the stream type ClientStream and ServerStream embed: Read,
// WriteBufferedTo, Write, flow control, ending), h2write.go (the write
// model and the PING keepalive), h2read.go (frame reading), h2recvbuf.go
// (received DATA in pooled chunks), h2batch.go (TLS records gathered per
// flush). Per connection there is a reader goroutine and a writer
// goroutine, and nothing per stream: DATA leaves from the stream's Write,
// straight from the caller's buffer, under the connection's write lock;
// the other frames are queued and written by the next holder of that
// lock, or by the writer, which also sends the keepalive PINGs. The
// client files (client.go, client_stream.go, pool*.go) add the CONNECT,
// its answer and the pool; the server files (server*.go) the request
// checks, the handlers and the accept loop.
//
// Throughput: both sides put a batchConn under crypto/tls (h2batch.go),
// so the TLS records of one flush leave in one write(2); received DATA
// waits in pooled chunks that an idle stream does not hold, credited back
// as it is read, and WriteBufferedTo writes them to the destination
// outside the connection's lock. Latency: a small DATA frame that arrives
// while WriteBufferedTo waits is written into a destination that can take
// it without blocking (TryWriter) by the reader itself, so an exchange of
// small messages wakes no stream goroutine (h2stream.go). PoolOptions.ConnsPerKey spreads busy
// flows over a few connections (pool.go, invariant 7). Benchmarks:
// pool_bench_test.go, server_bench_test.go.
//
// A Request exposes what the server logs: PeerIdentity, TraceID (from
// traceparent) and ForwardedFor (from forwarded: for=).
package hbone
