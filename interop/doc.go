// Package interop proves meshtun's HBONE against an implementation we did
// not write: Node.js's http2 module (nghttp2 over OpenSSL), with
// certificates made by the openssl command rather than by hbone/devca.
//
// The package holds only tests. A Node HBONE client (testdata/client.js)
// drives hbone.Server, and hbone.Pool dials a Node HBONE server
// (testdata/server.js) that reports what it saw on the wire: the
// :authority, the forwarded, traceparent and baggage headers, the client
// certificate's URI SAN, the ALPN, and how many TLS connections it
// accepted. A Node client also drives a whole gateway.Gateway (no TUN),
// sending the baggage a ztunnel sends, which must reach the labels of
// its /metrics. The tests skip, saying why, where node or openssl is
// missing.
package interop
