package hbone

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http2/hpack"
)

// ConnectRequest describes one flow to carry over HBONE.
type ConnectRequest struct {
	// Address is the peer's HBONE address, e.g. 192.0.2.2:15008.
	Address netip.AddrPort
	// Authority is the final target, sent as :authority (IPv6 as
	// [addr]:port, without a zone).
	Authority netip.AddrPort
	// Identities are the SPIFFE IDs the server may present (any one).
	Identities []string
	// Source is the original client, sent as forwarded: for="ip:port".
	// The zero value omits the header.
	Source netip.AddrPort
	// SourceIP is the local address to bind (zero: any). Part of the pool
	// key.
	SourceIP netip.Addr
	// Host, if set, is the destination service's hostname, added to the
	// forwarded header as ;host=<Host>.
	Host string
	// Baggage, if set, is sent as the baggage header.
	Baggage string

	// AuthorityName, if set, is sent as :authority instead of
	// Authority: a service's "hostname:port", as ztunnel addresses a
	// destination behind a network gateway (docs/hbone.md, "Double
	// HBONE"). Authority stays the target the flow is for.
	AuthorityName string
	// Gateway, if set, is the network gateway the flow goes through as
	// double HBONE: an outer CONNECT to the gateway (pooled, keyed on
	// the gateway's address and identities), and inside its stream an
	// inner mutual TLS and HTTP/2 connection of this flow alone to the
	// destination, which must present one of Identities. Address is then
	// the destination's own HBONE address, not dialled.
	Gateway *GatewayHop
	// Network, if set with Gateway, is this node's network, sent as
	// x-forwarded-network on the inner CONNECT (ztunnel's): the
	// destination reads from it that the flow came through a gateway.
	Network string

	// traceparent, if set, is sent instead of a fresh one: the outer and
	// inner CONNECT of one flow carry the same (ztunnel's).
	traceparent string
	// inner marks the inner CONNECT of a double-HBONE flow: not counted
	// in the pool's stream counters (the outer one is).
	inner bool
}

// GatewayHop is the outer hop of a double-HBONE flow: a network
// gateway's HBONE address and the identities it may present.
type GatewayHop struct {
	Address    netip.AddrPort
	Identities []string
}

// check refuses requests the pool cannot key or the server cannot parse.
func (r *ConnectRequest) check() error {
	switch {
	case !r.Address.IsValid():
		return errors.New("hbone: connect: no HBONE address")
	case !r.Authority.IsValid():
		return errors.New("hbone: connect: no target authority")
	case len(r.Identities) == 0:
		return fmt.Errorf("hbone: connect %s: no expected server identity", r.Address)
	}
	if !httpguts.ValidHeaderFieldValue(r.Baggage) {
		return fmt.Errorf("hbone: connect %s: baggage %q is not a valid header value", r.Address, r.Baggage)
	}
	if !isHostname(r.Host) && r.Host != "" {
		return fmt.Errorf("hbone: connect %s: host %q is not a hostname", r.Address, r.Host)
	}
	if r.AuthorityName != "" {
		if _, _, err := ParseNameAuthority(r.AuthorityName); err != nil {
			return fmt.Errorf("hbone: connect %s: %w", r.Address, err)
		}
	}
	if g := r.Gateway; g != nil {
		switch {
		case !g.Address.IsValid():
			return fmt.Errorf("hbone: connect %s: no network gateway address", r.Address)
		case len(g.Identities) == 0:
			return fmt.Errorf("hbone: connect %s: no expected identity for network gateway %s", r.Address, g.Address)
		}
		if !httpguts.ValidHeaderFieldValue(r.Network) {
			return fmt.Errorf("hbone: connect %s: network %q is not a valid header value", r.Address, r.Network)
		}
	}
	return nil
}

// isHostname reports whether s is a non-empty run of letters, digits,
// '.', '-' and '_'.
func isHostname(s string) bool {
	for _, c := range []byte(s) {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '-' || c == '_'
		if !ok {
			return false
		}
	}
	return s != ""
}

// target is the :authority of the request.
func (r *ConnectRequest) target() string {
	if r.AuthorityName != "" {
		return r.AuthorityName
	}
	return netip.AddrPortFrom(r.Authority.Addr().WithZone(""), r.Authority.Port()).String()
}

// header builds the CONNECT request's header block fields
// (docs/hbone.md, "The CONNECT request"): :method and :authority, no
// :scheme or :path (RFC 9113 §8.5), no user-agent.
func (r *ConnectRequest) header(target string) []hpack.HeaderField {
	tp := r.traceparent
	if tp == "" {
		tp = clientTraceparent()
	}
	h := []hpack.HeaderField{
		{Name: ":method", Value: "CONNECT"},
		{Name: ":authority", Value: target},
		{Name: "traceparent", Value: tp},
	}
	if r.Source.IsValid() {
		fwd := `for="` + r.Source.String() + `"`
		if r.Host != "" {
			fwd += ";host=" + r.Host
		}
		h = append(h, hpack.HeaderField{Name: "forwarded", Value: fwd})
	}
	if r.Baggage != "" {
		h = append(h, hpack.HeaderField{Name: "baggage", Value: r.Baggage})
	}
	if r.inner && r.Network != "" {
		h = append(h, hpack.HeaderField{Name: "x-forwarded-network", Value: r.Network})
	}
	return h
}

// clientTraceparent is a fresh W3C traceparent: version 00, random trace
// and parent IDs (never all zero, which the format forbids), not sampled.
func clientTraceparent() string {
	var hi, lo, span uint64
	for hi|lo == 0 {
		hi, lo = rand.Uint64(), rand.Uint64()
	}
	for span == 0 {
		span = rand.Uint64()
	}
	b := make([]byte, 0, 55)
	b = append(b, "00-"...)
	b = clientHex64(b, hi)
	b = clientHex64(b, lo)
	b = append(b, '-')
	b = clientHex64(b, span)
	b = append(b, "-00"...)
	return string(b)
}

// clientHex64 appends v as 16 lowercase hex digits.
func clientHex64(b []byte, v uint64) []byte {
	const digits = "0123456789abcdef"
	for shift := 60; shift >= 0; shift -= 4 {
		b = append(b, digits[v>>shift&0xf])
	}
	return b
}

// Connect opens a CONNECT stream to req.Authority through the HBONE peer
// at req.Address, on a pooled connection. It returns once the peer
// answered 200; any other answer is a *StatusError. TLS refusals wrap the
// sentinels of tls.go (ErrWrongIdentity, ErrUntrusted…). ctx bounds the
// wait for a connection and for the answer, not the stream's life.
func (p *Pool) Connect(ctx context.Context, req ConnectRequest) (*ClientStream, error) {
	if err := req.check(); err != nil {
		return nil, err
	}
	if req.Gateway != nil {
		return p.connectDouble(ctx, req)
	}
	key := p.keyFor(&req)
	for attempt := 1; ; attempt++ {
		pc, err := p.acquire(ctx, key, req.Identities)
		if err != nil {
			return nil, err
		}
		if p.opts.beforeOpen != nil {
			p.opts.beforeOpen(pc)
		}
		s, retry, err := p.open(ctx, pc, &req)
		if err == nil {
			return s, nil
		}
		p.release(pc)
		// A request the peer never processed (a GOAWAY or a failure came
		// between taking the slot and sending, or the GOAWAY's last stream
		// is below ours) is safe to send again, once: the going-away
		// connection refuses new slots, so acquire finds another.
		if !retry || attempt == connectAttempts {
			return nil, err
		}
		p.log.Debug("CONNECT not processed by the peer, retrying on another connection", "addr", key.addr, "error", err)
	}
}

// connectAttempts bounds Connect's tries of one request: the first, and
// one retry on another connection if the peer did not process it.
const connectAttempts = 2
