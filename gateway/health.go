package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Check is the gateway's self-check, what a service manager's watchdog
// is fed with (cmd/meshtun sends WATCHDOG=1 only while it passes). Each
// part proves that one stage of the data path still does its work, not
// merely that it exists:
//
//   - the TUN device (tun.name) is up and running: its link flags, read
//     over netlink (RTM_GETLINK), have IFF_UP and IFF_RUNNING (a TUN is
//     running while a process holds its queue);
//   - the stack processes packets: netstack's Probe, a SYN handed to the
//     stack where the TUN's packets enter, answered by gVisor's TCP
//     processing with a SYN-ACK before ctx ends;
//   - the HBONE listener accepts: a TCP connection to hbone.listen (its
//     loopback address when it listens on all addresses) is completed by
//     the kernel and then taken by the HBONE server's accept loop, which
//     recognizes it by its source port and closes it without a TLS
//     handshake (so the probe counts as no handshake failure).
//
// It returns nil when every part configured passes, else an error naming
// each part that failed. Before Run serves (Serving) and after the drain
// began it fails; while it waits for istiod it checks the data path as
// when ready. Safe to call concurrently; each call does the whole check.
func (g *Gateway) Check(ctx context.Context) error {
	select {
	case <-g.servingCh:
	default:
		return errors.New("gateway: not serving yet (starting)")
	}
	if g.draining.Load() {
		return errors.New("gateway: not serving (draining)")
	}
	var problems []string
	if name := g.cfg.TUN.Name; name != "" {
		if err := linkUp(name); err != nil {
			problems = append(problems, err.Error())
		}
		if st := g.metrics.stack.Load(); st == nil {
			problems = append(problems, "netstack: not running")
		} else if err := st.Probe(ctx); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if l := g.hboneProbe.Load(); l != nil {
		if err := l.probe(ctx); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// linkUp checks that the device name is up and running.
func linkUp(name string) error {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return fmt.Errorf("tun %s: %w", name, err)
	}
	switch {
	case ifi.Flags&net.FlagUp == 0:
		return fmt.Errorf("tun %s: link is down", name)
	case ifi.Flags&net.FlagRunning == 0:
		return fmt.Errorf("tun %s: link is up but not running (no queue attached)", name)
	}
	return nil
}

// probedListener is the HBONE listener as the server's accept loop sees
// it: Accept hands on every connection but the self-check's own, which
// it recognizes by the source address the check registered before it
// connected, signals, and closes.
type probedListener struct {
	net.Listener
	target netip.AddrPort // where the check connects: the listener, loopback for an unspecified address

	mu      sync.Mutex
	pending map[netip.AddrPort]chan struct{} // source address of a check in progress → closed once accepted
}

var _ net.Listener = (*probedListener)(nil)

// newProbedListener wraps ln, which listens on listen (hbone.listen):
// the check connects to ln's address, or to loopback of listen's family
// when that is unspecified (Go listens on "0.0.0.0:15008" with a
// dual-stack [::] socket, but 127.0.0.1 is what the operator wrote).
func newProbedListener(ln net.Listener, listen string) (*probedListener, error) {
	ap, err := netip.ParseAddrPort(ln.Addr().String())
	if err != nil {
		return nil, fmt.Errorf("gateway: hbone listener address %s: %w", ln.Addr(), err)
	}
	a := ap.Addr().Unmap()
	if conf, err := netip.ParseAddrPort(listen); err == nil && conf.Addr().IsUnspecified() {
		a = conf.Addr().Unmap()
	}
	if a.IsUnspecified() {
		if a.Is4() {
			a = netip.AddrFrom4([4]byte{127, 0, 0, 1})
		} else {
			a = netip.IPv6Loopback()
		}
	}
	return &probedListener{Listener: ln, target: netip.AddrPortFrom(a, ap.Port()), pending: map[netip.AddrPort]chan struct{}{}}, nil
}

// Accept returns the next connection that is not a self-check's.
func (l *probedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.answer(c) {
			c.Close()
			continue
		}
		return c, nil
	}
}

// answer reports whether c comes from a check in progress, and tells it.
func (l *probedListener) answer(c net.Conn) bool {
	ta, ok := c.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return false
	}
	src := ta.AddrPort()
	src = netip.AddrPortFrom(src.Addr().Unmap(), src.Port())
	l.mu.Lock()
	defer l.mu.Unlock()
	ch, ok := l.pending[src]
	if ok {
		delete(l.pending, src)
		close(ch)
	}
	return ok
}

// probe connects to the listener and waits until its accept loop has
// taken the connection. The source address is bound and registered
// before the connect, so Accept can never see the connection first. A
// probe that gives up forgets its address: should the accept loop take
// the connection later, the server gets it (closed by then), a handshake
// failure counted at a time the check already reports a failure.
func (l *probedListener) probe(ctx context.Context) error {
	accepted := make(chan struct{})
	var src netip.AddrPort
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var err error
		cerr := rc.Control(func(fd uintptr) { src, err = l.register(int(fd), accepted) })
		return errors.Join(cerr, err)
	}}
	c, err := d.DialContext(ctx, "tcp", l.target.String())
	defer func() {
		l.mu.Lock()
		delete(l.pending, src)
		l.mu.Unlock()
	}()
	if err != nil {
		return fmt.Errorf("hbone listener %s: does not accept: %w", l.target, err)
	}
	defer c.Close()
	select {
	case <-accepted:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("hbone listener %s: the kernel accepted, the HBONE server's accept loop did not: %w", l.target, ctx.Err())
	}
}

// register binds the socket fd to an ephemeral port of the target's
// address and records it as a check's source.
func (l *probedListener) register(fd int, accepted chan struct{}) (netip.AddrPort, error) {
	var sa unix.Sockaddr
	if a := l.target.Addr(); a.Is4() {
		sa = &unix.SockaddrInet4{Addr: a.As4()}
	} else {
		sa = &unix.SockaddrInet6{Addr: a.As16()}
	}
	if err := unix.Bind(fd, sa); err != nil {
		return netip.AddrPort{}, fmt.Errorf("bind to %s: %w", l.target.Addr(), err)
	}
	got, err := unix.Getsockname(fd)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("getsockname: %w", err)
	}
	var src netip.AddrPort
	switch s := got.(type) {
	case *unix.SockaddrInet4:
		src = netip.AddrPortFrom(netip.AddrFrom4(s.Addr), uint16(s.Port))
	case *unix.SockaddrInet6:
		src = netip.AddrPortFrom(netip.AddrFrom16(s.Addr).Unmap(), uint16(s.Port))
	default:
		return netip.AddrPort{}, fmt.Errorf("getsockname: %T", got)
	}
	l.mu.Lock()
	l.pending[src] = accepted
	l.mu.Unlock()
	return src, nil
}
