package hbone

import (
	"fmt"
	"net/netip"
	"strings"
)

// srvParseAuthority parses a CONNECT's :authority, which HBONE requires to
// be the target's ip:port: IPv4 as a.b.c.d:port, IPv6 as [addr]:port,
// port 1..65535 in decimal without a leading zero or sign, no IPv6 zone
// (a zone names one of the client's interfaces, meaningless here).
func srvParseAuthority(s string) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("authority %q is not ip:port", s)
	}
	if ap.Port() == 0 {
		return netip.AddrPort{}, fmt.Errorf("authority %q: port 0", s)
	}
	if ap.Addr().Zone() != "" {
		return netip.AddrPort{}, fmt.Errorf("authority %q: IPv6 zones are not allowed", s)
	}
	port := s[strings.LastIndexByte(s, ':')+1:]
	if port[0] < '1' || port[0] > '9' {
		return netip.AddrPort{}, fmt.Errorf("authority %q: port must be decimal without leading zero", s)
	}
	return ap, nil
}

// ParseNameAuthority parses a "hostname:port" :authority, the form
// ztunnel sends for a service behind a network gateway (docs/hbone.md,
// "Double HBONE"): a hostname of letters, digits, '.', '-' and '_' that
// is not an IP address, and a port 1..65535 in decimal without a
// leading zero or sign.
func ParseNameAuthority(s string) (host string, port uint16, err error) {
	i := strings.LastIndexByte(s, ':')
	if i <= 0 || i == len(s)-1 {
		return "", 0, fmt.Errorf("authority %q is not hostname:port", s)
	}
	host, ps := s[:i], s[i+1:]
	if !isHostname(host) {
		return "", 0, fmt.Errorf("authority %q: %q is not a hostname", s, host)
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return "", 0, fmt.Errorf("authority %q is an IP address, not hostname:port", s)
	}
	if ps[0] < '1' || ps[0] > '9' || len(ps) > 5 {
		return "", 0, fmt.Errorf("authority %q: port must be decimal 1-65535 without leading zero", s)
	}
	n := 0
	for _, c := range []byte(ps) {
		if c < '0' || c > '9' {
			return "", 0, fmt.Errorf("authority %q: port must be decimal 1-65535 without leading zero", s)
		}
		n = n*10 + int(c-'0')
	}
	if n > 65535 {
		return "", 0, fmt.Errorf("authority %q: port above 65535", s)
	}
	return host, uint16(n), nil
}
