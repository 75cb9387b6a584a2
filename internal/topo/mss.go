package topo

import (
	"context"
	"fmt"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// DialMSS is Dial with the client socket's MSS clamped to mss (TCP_MAXSEG,
// set before connect). The kernel then advertises mss in the SYN, so the
// peer (the kernel server, or the gateway's netstack) sends segments of at
// most mss bytes, and it never sends larger segments itself: both ends see
// what traffic routed in from another host over a 1500-byte link sees
// (mss 1460), whatever the MTU of the TUN or the veth. It touches only this
// socket, not the routes a gateway owns.
func (n *Node) DialMSS(ctx context.Context, network, addr string, mss int) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func() error {
		d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG, mss)
			}); err != nil {
				return err
			}
			if serr != nil {
				return fmt.Errorf("topo: set TCP_MAXSEG %d: %w", mss, serr)
			}
			return nil
		}}
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}
