package gateway

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/meshtun/meshtun/hbone"
)

// handleInbound serves one CONNECT stream that hbone.Server accepted and
// parsed: check the target, authorize the connection, dial the target,
// answer 200 only once the dial succeeded, then relay.
func (g *Gateway) handleInbound(r *hbone.Request) {
	g.flows.Add(1)
	defer g.flows.Done()
	target := r.Target()
	fl := &flowLog{direction: inbound, srcIdentity: r.PeerIdentity(), dst: target, dstIdentity: g.identity, start: time.Now()}
	fl.src = inboundSource(r)
	fl.traceID = traceID(r.Header().Get("Traceparent"))
	defer fl.emit(g.accessLog)

	if status, err := g.checkInbound(target); err != nil {
		r.Reject(status)
		fl.flag = flagConnect
		fl.err = err
		return
	}
	// Authorization before the dial: a denied client must not even make
	// the target see a connection attempt.
	if d := g.authz.Authorize(AuthzConn{Identity: r.PeerIdentity(), Src: fl.src.Addr(), Dst: target}); !d.Allow {
		r.Reject(http.StatusUnauthorized)
		fl.flag = flagDeny
		fl.err = fmt.Errorf("authorization: %s", d.Reason)
		return
	}
	d := net.Dialer{Timeout: g.cfg.HBONE.ConnectTimeout.Duration}
	tc, err := d.DialContext(r.Context(), "tcp", target.String())
	if err != nil {
		r.Reject(http.StatusServiceUnavailable)
		fl.flag = flagConnect
		fl.err = fmt.Errorf("dial target: %w", err)
		return
	}
	s, err := r.Accept()
	if err != nil {
		tc.Close()
		fl.err = err
		return
	}
	res := relay(s, tc.(*net.TCPConn))
	fl.sent, fl.recv, fl.err = res.AToB, res.BToA, res.Err
}

// checkInbound decides whether a CONNECT target may be served, and with
// which status it is refused if not.
func (g *Gateway) checkInbound(target netip.AddrPort) (int, error) {
	addr := target.Addr().Unmap()
	served := false
	for _, p := range g.cfg.HBONE.Serve {
		if p.Contains(addr) {
			served = true
			break
		}
	}
	if !served {
		return http.StatusServiceUnavailable, fmt.Errorf("target %s is not in hbone.serve", target)
	}
	if g.isOwnListener(target) {
		return http.StatusServiceUnavailable, fmt.Errorf("target %s is one of this gateway's own ports", target)
	}
	return 0, nil
}

// inboundSource is the client of an inbound stream: the forwarded for=
// address when the peer sent one, else the HBONE peer's own address (see
// authz.go for why forwarded is trusted).
func inboundSource(r *hbone.Request) netip.AddrPort {
	if ap := forwardedFor(r.Header()); ap.IsValid() {
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	if ta, ok := r.RemoteAddr().(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}

// traceID returns the trace id of a W3C traceparent
// ("00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>"), or "" when
// tp is not one. Only the fields' shape is checked: the id is logged, not
// interpreted.
func traceID(tp string) string {
	parts := strings.Split(strings.TrimSpace(tp), "-")
	if len(parts) < 4 || len(parts[0]) != 2 || len(parts[1]) != 32 || len(parts[2]) != 16 || len(parts[3]) != 2 {
		return ""
	}
	if parts[0] == "ff" || (parts[0] == "00" && len(parts) != 4) {
		return "" // version ff is invalid; version 00 has exactly four fields
	}
	for _, p := range parts[:4] {
		if !isLowerHex(p) {
			return ""
		}
	}
	if strings.Trim(parts[1], "0") == "" {
		return "" // all-zero trace id is invalid
	}
	return parts[1]
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// forwardedFor reads the client's address from `forwarded: for="ip:port"`,
// or returns the zero AddrPort.
func forwardedFor(h http.Header) netip.AddrPort {
	for _, v := range h.Values("Forwarded") {
		for _, part := range splitForwarded(v) {
			if len(part) > 4 && strings.EqualFold(part[:4], "for=") {
				val := part[4:]
				if len(val) >= 2 && val[0] == '"' && val[len(val)-1] == '"' {
					val = val[1 : len(val)-1]
				}
				if ap, err := netip.ParseAddrPort(val); err == nil {
					return ap
				}
			}
		}
	}
	return netip.AddrPort{}
}

// splitForwarded splits a Forwarded element list on ';' and ',' outside
// quotes.
func splitForwarded(v string) []string {
	var parts []string
	start, quoted := 0, false
	for i := 0; i < len(v); i++ {
		switch v[i] {
		case '"':
			quoted = !quoted
		case ';', ',':
			if !quoted {
				parts = append(parts, strings.TrimSpace(v[start:i]))
				start = i + 1
			}
		}
	}
	return append(parts, strings.TrimSpace(v[start:]))
}
