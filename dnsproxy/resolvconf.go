package dnsproxy

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"strings"
)

// ResolvConf is the default upstream file: the host's resolvers.
const ResolvConf = "/etc/resolv.conf"

// Nameservers reads the nameserver lines of a resolv.conf file, as
// ip:53, leaving out self (this server's own address: forwarding to it
// would loop) and what is no IP address.
func Nameservers(path string, self netip.AddrPort) ([]netip.AddrPort, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("dnsproxy: upstream: %w", err)
	}
	defer f.Close()
	var out []netip.AddrPort
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || fields[0] != "nameserver" {
			continue
		}
		a, err := netip.ParseAddr(fields[1])
		if err != nil {
			continue
		}
		ap := netip.AddrPortFrom(a.Unmap(), 53)
		if ap == self {
			continue
		}
		out = append(out, ap)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("dnsproxy: upstream: %s: %w", path, err)
	}
	return out, nil
}
