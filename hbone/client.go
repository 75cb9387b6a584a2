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
	for _, c := range []byte(r.Host) {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '-' || c == '_'
		if !ok {
			return fmt.Errorf("hbone: connect %s: host %q is not a hostname", r.Address, r.Host)
		}
	}
	return nil
}

// header builds the CONNECT request's header block fields
// (docs/hbone.md, "The CONNECT request"): :method and :authority, no
// :scheme or :path (RFC 9113 §8.5), no user-agent.
func (r *ConnectRequest) header(target string) []hpack.HeaderField {
	h := []hpack.HeaderField{
		{Name: ":method", Value: "CONNECT"},
		{Name: ":authority", Value: target},
		{Name: "traceparent", Value: clientTraceparent()},
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
