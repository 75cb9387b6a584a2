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
