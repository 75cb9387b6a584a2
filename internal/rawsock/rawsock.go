// Package rawsock reads and writes non-blocking file descriptors (kernel
// sockets, the TUN) with raw system calls, from inside a
// syscall.RawConn's Read or Write, so that the Go poller still parks the
// goroutine while the descriptor is not ready and deadlines and Close
// still wake it.
//
// Why not the ordinary calls: every syscall.Syscall enters the
// scheduler's syscall state, and the first one after the process went
// wholly idle wakes the runtime's monitor thread (sysmon), which parks
// whenever no P is running. A gateway carrying one short connection at a
// time goes idle between every hop, so that wake-up, a futex call that
// on these virtual machines costs the caller an inter-processor
// interrupt, came on nearly every read: 22 % of node B's CPU and 6 % of
// node A's (docs/field-notes.md, "The monitor thread's wake-ups"). A read
// or write of a descriptor that is non-blocking returns at once (EAGAIN
// when not ready), so it never needs the P handed to another thread
// meanwhile: a raw call is what it costs the kernel, nothing more.
//
// Only descriptors opened non-blocking (everything under the Go poller)
// may be passed here: a raw call that blocks holds its P, and the
// collector's stop-the-world waits for it.
//
// While the runtime's execution tracer runs (runtime/trace, the bench's
// -trace), the calls are the ordinary ones instead: a raw call leaves no
// event in the trace, and the round-trip account (bench/rtt.go) cuts a
// round trip at these reads and writes. The tracer perturbs the timing
// far more than the monitor's wake-ups do.
package rawsock

import (
	"errors"
	"io"
	"net"
	"os"
	"runtime/trace"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// call is one system call on a non-blocking descriptor, EINTR retried:
// raw, or an ordinary one the tracer can see while it runs.
func call(trap, fd uintptr, p unsafe.Pointer, n uintptr) (int, unix.Errno) {
	for {
		var r uintptr
		var errno unix.Errno
		if trace.IsEnabled() {
			r, _, errno = unix.Syscall(trap, fd, uintptr(p), n)
		} else {
			r, _, errno = unix.RawSyscall(trap, fd, uintptr(p), n)
		}
		if errno == unix.EINTR {
			continue
		}
		return int(r), errno
	}
}

// Read is one read(2) of fd into p: n and 0, or the error number, EINTR
// retried. EAGAIN comes back as it is, for the caller to park on.
func Read(fd uintptr, p []byte) (int, unix.Errno) {
	if len(p) == 0 {
		return 0, 0
	}
	return call(unix.SYS_READ, fd, unsafe.Pointer(&p[0]), uintptr(len(p)))
}

// Write is one write(2) of p to fd, as Read.
func Write(fd uintptr, p []byte) (int, unix.Errno) {
	if len(p) == 0 {
		return 0, 0
	}
	return call(unix.SYS_WRITE, fd, unsafe.Pointer(&p[0]), uintptr(len(p)))
}

// Readv is one readv(2) of fd into iov, as Read.
func Readv(fd uintptr, iov []unix.Iovec) (int, unix.Errno) {
	return call(unix.SYS_READV, fd, unsafe.Pointer(&iov[0]), uintptr(len(iov)))
}

// Writev is one writev(2) of iov to fd, as Read.
func Writev(fd uintptr, iov []unix.Iovec) (int, unix.Errno) {
	return call(unix.SYS_WRITEV, fd, unsafe.Pointer(&iov[0]), uintptr(len(iov)))
}

// Conn is a kernel TCP connection whose Read and Write are the raw calls
// above under its RawConn. Everything else (deadlines, CloseWrite, Close,
// addresses) is the *net.TCPConn's. Errors read as net's own do: a
// *net.OpError around the poller's error (net.ErrClosed,
// os.ErrDeadlineExceeded) or around the system call's, and io.EOF at the
// peer's FIN.
type Conn struct {
	*net.TCPConn
	rc syscall.RawConn
}

// Wrap returns c as a *Conn when it is a kernel TCP connection, and c
// itself otherwise (a pipe in a test, a TLS connection).
func Wrap(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	return &Conn{TCPConn: tc, rc: rc}
}

// Read reads into p, parking in the poller until the socket is readable.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var (
		n     int
		errno unix.Errno
	)
	err := c.rc.Read(func(fd uintptr) bool {
		n, errno = Read(fd, p)
		return errno != unix.EAGAIN
	})
	switch {
	case err != nil:
		return 0, c.opError("read", err)
	case errno != 0:
		return 0, c.opError("read", os.NewSyscallError("read", errno))
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// Write writes all of p, parking in the poller while the socket's send
// buffer is full.
func (c *Conn) Write(p []byte) (int, error) {
	var (
		n     int
		errno unix.Errno
	)
	err := c.rc.Write(func(fd uintptr) bool {
		for n < len(p) {
			var m int
			m, errno = Write(fd, p[n:])
			if errno != 0 {
				return errno != unix.EAGAIN
			}
			n += m
		}
		return true
	})
	switch {
	case err != nil:
		return n, c.opError("write", err)
	case errno != 0:
		return n, c.opError("write", os.NewSyscallError("write", errno))
	}
	return n, nil
}

func (c *Conn) opError(op string, err error) error {
	if errors.Is(err, io.EOF) {
		return err
	}
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}
