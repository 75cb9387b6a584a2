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
// parsed: check the target, dial it, answer 200 only once the dial
// succeeded, then relay.
func (g *Gateway) handleInbound(r *hbone.Request) {
	g.flows.Add(1)
	defer g.flows.Done()
	target := r.Target()
	fl := &flowLog{direction: inbound, srcIdentity: r.PeerIdentity(), dst: target, dstIdentity: g.identity, start: time.Now()}
	fl.src = forwardedFor(r.Header())
	defer fl.emit(g.accessLog)

	if status, err := g.checkInbound(target); err != nil {
		r.Reject(status)
		fl.err = err
		return
	}
	d := net.Dialer{Timeout: g.cfg.HBONE.ConnectTimeout.Duration}
	tc, err := d.DialContext(r.Context(), "tcp", target.String())
	if err != nil {
		r.Reject(http.StatusServiceUnavailable)
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
