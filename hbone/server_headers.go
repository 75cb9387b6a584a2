package hbone

import (
	"net/netip"
	"strings"
)

// The CONNECT headers a server reads (docs/hbone.md, "The CONNECT
// request"): traceparent for the logs, forwarded for the original source,
// baggage for the source workload's description (its parser is in
// baggage.go). All come from the peer, so every parser accepts anything
// without panicking and answers "absent" for what it cannot read.

// TraceID is the trace id of the request's W3C traceparent header (32
// lowercase hex digits), or "" when the header is absent or malformed.
// The client sends a fresh one per connection; log it to correlate the
// two sides of a flow.
func (r *Request) TraceID() string {
	return parseTraceID(r.header.Get("Traceparent"))
}

// Baggage is the source workload's description in the request's baggage
// header lines (ParseBaggage): the zero Baggage when there is none, and
// each field empty that is absent or unreadable. It is the peer's claim,
// as trustworthy as the peer's identity.
func (r *Request) Baggage() Baggage {
	return ParseBaggage(r.header.Values("Baggage"))
}

// ForwardedFor is the original client named by the request's
// `forwarded: for="ip:port"` header (the first element that has a for=
// parameter), or the zero AddrPort when there is none or it is not an
// address. A for= without a port gives port 0. The value is the peer's
// claim, as trustworthy as the peer's identity.
func (r *Request) ForwardedFor() netip.AddrPort {
	return parseForwardedFor(r.header.Values("Forwarded"))
}

// parseTraceID returns the trace-id field of a traceparent value
// (version-traceid-parentid-flags, W3C Trace Context §3.2), or "".
func parseTraceID(v string) string {
	v = strings.TrimSpace(v)
	// 2 + 1 + 32 + 1 + 16 + 1 + 2 bytes; later versions may append
	// "-<more>", version 00 may not.
	const size = 55
	if len(v) < size || (len(v) > size && v[size] != '-') {
		return ""
	}
	version, trace, parent, flags := v[0:2], v[3:35], v[36:52], v[53:55]
	if v[2] != '-' || v[35] != '-' || v[52] != '-' {
		return ""
	}
	if !isLowerHex(version) || version == "ff" || (version == "00" && len(v) != size) {
		return ""
	}
	if !isLowerHex(trace) || !isLowerHex(parent) || !isLowerHex(flags) {
		return ""
	}
	if trace == strings.Repeat("0", 32) || parent == strings.Repeat("0", 16) {
		return ""
	}
	return trace
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// parseForwardedFor reads the for= parameter of the first forwarded
// element (RFC 7239 §4) that has one, across every header line.
func parseForwardedFor(values []string) netip.AddrPort {
	for _, line := range values {
		for elem := range forwardedElements(line) {
			for pair := range forwardedPairs(elem) {
				name, value, ok := strings.Cut(pair, "=")
				if !ok || !strings.EqualFold(strings.TrimSpace(name), "for") {
					continue
				}
				return forwardedNode(unquote(strings.TrimSpace(value)))
			}
		}
	}
	return netip.AddrPort{}
}

// forwardedNode parses a node (RFC 7239 §6): ip:port, [v6]:port, ip,
// [v6]. "unknown" and obfuscated names give the zero AddrPort.
func forwardedNode(s string) netip.AddrPort {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap
	}
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		s = s[1 : len(s)-1]
		if a, err := netip.ParseAddr(s); err == nil && a.Is6() {
			return netip.AddrPortFrom(a, 0)
		}
		return netip.AddrPort{}
	}
	if a, err := netip.ParseAddr(s); err == nil && a.Is4() {
		return netip.AddrPortFrom(a, 0)
	}
	return netip.AddrPort{}
}

// forwardedElements splits a header value at the commas outside quoted
// strings.
func forwardedElements(v string) func(yield func(string) bool) {
	return func(yield func(string) bool) { splitOutsideQuotes(v, ',', yield) }
}

// forwardedPairs splits an element at the semicolons outside quoted
// strings.
func forwardedPairs(elem string) func(yield func(string) bool) {
	return func(yield func(string) bool) { splitOutsideQuotes(elem, ';', yield) }
}

func splitOutsideQuotes(v string, sep byte, yield func(string) bool) {
	start, quoted := 0, false
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case quoted && c == '\\':
			i++ // skip the escaped byte
		case c == '"':
			quoted = !quoted
		case !quoted && c == sep:
			if !yield(v[start:i]) {
				return
			}
			start = i + 1
		}
	}
	yield(v[start:])
}

// unquote removes the quotes and backslash escapes of an RFC 7230
// quoted-string; anything else is returned as is.
func unquote(s string) string {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return s
	}
	s = s[1 : len(s)-1]
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
