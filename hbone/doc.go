// Package hbone speaks HBONE, Istio ambient's tunnel protocol: one HTTP/2
// CONNECT stream per proxied TCP connection, over mutual TLS 1.3 whose peers
// are named by SPIFFE IDs in their certificates' URI SANs.
//
// It owns the TLS identity rules (this file's siblings tls.go and
// identity.go), the client side (a pool of HTTP/2 connections, one CONNECT
// stream per flow) and the server side (accept, parse and check the CONNECT,
// hand the stream to a handler). It knows nothing of meshtun's config, TUN
// or gateway: callers pass their own Options. The wire contract it keeps is
// written down in ARCHITECTURE.md, "HBONE on the wire".
package hbone
