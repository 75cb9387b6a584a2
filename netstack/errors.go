package netstack

import (
	"errors"
	"syscall"

	"gvisor.dev/gvisor/pkg/tcpip"
)

// toError converts a tcpip.Error into a Go error at the package edge. The
// errors callers branch on become the matching syscall.Errno, so
// errors.Is(err, syscall.ECONNRESET) works as it does for kernel sockets.
func toError(e tcpip.Error) error {
	if e == nil {
		return nil
	}
	switch e.(type) {
	case *tcpip.ErrConnectionReset:
		return syscall.ECONNRESET
	case *tcpip.ErrConnectionAborted, *tcpip.ErrAborted:
		return syscall.ECONNABORTED
	case *tcpip.ErrConnectionRefused:
		return syscall.ECONNREFUSED
	case *tcpip.ErrTimeout:
		return syscall.ETIMEDOUT
	case *tcpip.ErrNetworkUnreachable:
		return syscall.ENETUNREACH
	case *tcpip.ErrHostUnreachable:
		return syscall.EHOSTUNREACH
	case *tcpip.ErrClosedForSend:
		return syscall.EPIPE
	case *tcpip.ErrInvalidEndpointState:
		return syscall.EINVAL
	}
	return errors.New(e.String())
}
