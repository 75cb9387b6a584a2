package dnsproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// The hook into systemd-resolved: the TUN link gets this server as its
// DNS server, the mesh's domains as routing-only domains ("~cluster.local")
// and no default route, so resolved sends names within those domains, and
// nothing else, here. Through resolvectl, which speaks resolved's D-Bus
// API (org.freedesktop.resolve1 SetLinkDNS, SetLinkDomains,
// SetLinkDefaultRoute) and is there wherever resolved is. The link's
// settings die with the link, so a crash leaves nothing behind once the
// TUN is gone; RevertResolved is `meshtun cleanup`'s.

// Resolvectl is the command run; a test points it at a stand-in.
var Resolvectl = "resolvectl"

// ErrNoResolved means resolvectl is not installed: systemd-resolved does
// not run here, and the host's resolver must be pointed at the server by
// hand (ResolvConfLine).
var ErrNoResolved = errors.New("dnsproxy: resolvectl not found: systemd-resolved is not in use")

// resolvectlTimeout bounds each resolvectl call: it answers from memory
// over D-Bus at once; one that hangs must not hold the gateway's start.
const resolvectlTimeout = 10 * time.Second

// Resolved is the server's registration with systemd-resolved for one
// link.
type Resolved struct {
	link      string
	closeOnce sync.Once
	closeErr  error
}

// RegisterResolved tells systemd-resolved that link answers domains at
// server. On error nothing stays registered.
func RegisterResolved(link string, server netip.AddrPort, domains []string) (*Resolved, error) {
	if _, err := exec.LookPath(Resolvectl); err != nil {
		return nil, ErrNoResolved
	}
	addr := server.Addr().String()
	if server.Port() != 53 {
		addr = server.String() // resolvectl takes ADDRESS:PORT (systemd 246 and later)
	}
	routing := make([]string, len(domains))
	for i, d := range domains {
		routing[i] = "~" + strings.TrimSuffix(d, ".")
	}
	r := &Resolved{link: link}
	for _, args := range [][]string{
		{"dns", link, addr},
		append([]string{"domain", link}, routing...),
		{"default-route", link, "false"},
	} {
		if err := resolvectl(args...); err != nil {
			r.Close()
			return nil, err
		}
	}
	return r, nil
}

// Close takes the link's DNS settings back (resolvectl revert). It is
// idempotent.
func (r *Resolved) Close() error {
	r.closeOnce.Do(func() { r.closeErr = RevertResolved(r.link) })
	return r.closeErr
}

// RevertResolved drops whatever DNS settings link has in
// systemd-resolved; without resolvectl there are none.
func RevertResolved(link string) error {
	if _, err := exec.LookPath(Resolvectl); err != nil {
		return nil
	}
	return resolvectl("revert", link)
}

func resolvectl(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), resolvectlTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, Resolvectl, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("dnsproxy: resolvectl %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// ResolvConfLine is what to write first in /etc/resolv.conf where
// systemd-resolved is absent: every name then comes to the server, which
// forwards those outside the mesh. resolv.conf has no port: only a
// server on port 53 can be named there.
func ResolvConfLine(server netip.AddrPort) string {
	return "nameserver " + server.Addr().String()
}
