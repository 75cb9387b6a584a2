package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/meshtun/meshtun/bench/relay"
)

// The load generator: two tiny protocols, served by one Server in node B,
// driven by the client functions below from node A. Both paths (gateway
// pair and kernel) run exactly this code.
//
// Bulk (BulkPort): the client sends a 9-byte header, op ('U' or 'D') and a
// big-endian size.
//
//	'U' upload:   the client sends size bytes and half-closes; the server
//	              counts what it read until EOF and answers with the 8-byte
//	              count, then closes.
//	'D' download: the server sends size bytes and closes; the client counts
//	              until EOF.
//
// No hashing: at 10+ Gbit/s a sha256 of the payload would cost more CPU
// than the kernel path itself and flatten the baseline. Integrity is what
// the end-to-end tests check (internal/xfer); the bench checks byte counts.
//
// Echo (EchoPort): the server reads MsgSize bytes and writes them back,
// until EOF. A short connection is one exchange; a latency run is many on
// one connection; an idle flow is one exchange, then silence.
const (
	BulkPort = 7101
	EchoPort = 7102
	// MsgSize is the request and the reply of the connection-rate and
	// latency scenarios (the 64 B).
	MsgSize = 64
	// bufSize is each bulk read and write: large, so the loadgen spends
	// few syscalls per byte and the path under test is the bottleneck.
	bufSize = 256 << 10
)

// zeros is the payload of every bulk write; never written to.
var zeros = make([]byte, bufSize)

// Server serves both protocols in one node until Close.
type Server struct {
	ls    []net.Listener
	wg    sync.WaitGroup
	conns relay.ConnSet
}

// listenFunc opens a listener (topo.Node.Listen inside a namespace, or
// net.Listen in tests).
type listenFunc func(network, addr string) (net.Listener, error)

// NewServer listens on host:BulkPort and host:EchoPort (host "0.0.0.0"
// accepts every local address, AnyIP ranges included).
func NewServer(listen listenFunc, host string) (*Server, error) {
	return newServer(listen, host, BulkPort, EchoPort)
}

// newServer is NewServer on any ports (0 for ephemeral ones, in tests).
func newServer(listen listenFunc, host string, bulkPort, echoPort int) (*Server, error) {
	s := &Server{}
	for _, p := range []struct {
		port  int
		serve func(net.Conn) error
	}{{bulkPort, serveBulk}, {echoPort, serveEcho}} {
		l, err := listen("tcp", net.JoinHostPort(host, fmt.Sprint(p.port)))
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("bench: listen :%d: %w", p.port, err)
		}
		s.ls = append(s.ls, l)
		s.wg.Add(1)
		go s.accept(l, p.serve)
	}
	return s, nil
}

// Addr is the address of listener i (0 bulk, 1 echo); for tests on
// ephemeral ports.
func (s *Server) Addr(i int) net.Addr { return s.ls[i].Addr() }

func (s *Server) accept(l net.Listener, serve func(net.Conn) error) {
	defer s.wg.Done()
	s.conns.Serve(l, &s.wg, func(c net.Conn) { serve(c) })
}

// Open is the number of connections the server holds.
func (s *Server) Open() int { return s.conns.Len() }

// Close stops the listeners, closes every connection (unblocking their
// goroutines) and waits for all of them. It may be called more than once.
func (s *Server) Close() error {
	s.conns.Close()
	for _, l := range s.ls {
		l.Close()
	}
	s.wg.Wait()
	return nil
}

func serveBulk(c net.Conn) error {
	var hdr [9]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return err
	}
	size := int64(binary.BigEndian.Uint64(hdr[1:]))
	switch hdr[0] {
	case 'U':
		n, err := readToEOF(c)
		if err != nil {
			return err
		}
		var out [8]byte
		binary.BigEndian.PutUint64(out[:], uint64(n))
		_, err = c.Write(out[:])
		return err
	case 'D':
		_, err := writeN(c, size)
		return err
	}
	return fmt.Errorf("bench: unknown bulk op %q", hdr[0])
}

func serveEcho(c net.Conn) error {
	buf := make([]byte, MsgSize)
	for {
		if _, err := io.ReadFull(c, buf); err != nil {
			return err
		}
		if _, err := c.Write(buf); err != nil {
			return err
		}
	}
}

func writeN(w io.Writer, n int64) (int64, error) {
	var done int64
	for done < n {
		chunk := zeros
		if rem := n - done; rem < int64(len(chunk)) {
			chunk = chunk[:rem]
		}
		k, err := w.Write(chunk)
		done += int64(k)
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

type halfCloser interface{ CloseWrite() error }

// bulk runs one bulk transfer of size bytes on c ('U' or 'D') and closes
// c. It fails unless exactly size bytes arrived.
func bulk(c net.Conn, op byte, size int64) error {
	defer c.Close()
	var hdr [9]byte
	hdr[0] = op
	binary.BigEndian.PutUint64(hdr[1:], uint64(size))
	if _, err := c.Write(hdr[:]); err != nil {
		return fmt.Errorf("bench: bulk header: %w", err)
	}
	switch op {
	case 'U':
		if n, err := writeN(c, size); err != nil {
			return fmt.Errorf("bench: upload after %d of %d bytes: %w", n, size, err)
		}
		hc, ok := c.(halfCloser)
		if !ok {
			return errors.New("bench: connection cannot half-close")
		}
		if err := hc.CloseWrite(); err != nil {
			return fmt.Errorf("bench: upload half-close: %w", err)
		}
		var out [8]byte
		if _, err := io.ReadFull(c, out[:]); err != nil {
			return fmt.Errorf("bench: upload receipt: %w", err)
		}
		if got := int64(binary.BigEndian.Uint64(out[:])); got != size {
			return fmt.Errorf("bench: server received %d bytes of %d", got, size)
		}
	case 'D':
		n, err := readToEOF(c)
		if err != nil {
			return fmt.Errorf("bench: download after %d of %d bytes: %w", n, size, err)
		}
		if n != size {
			return fmt.Errorf("bench: downloaded %d bytes of %d", n, size)
		}
	default:
		return fmt.Errorf("bench: unknown bulk op %q", op)
	}
	return nil
}

// echo does one MsgSize exchange on c with buf (len MsgSize).
func echo(c net.Conn, buf []byte) error {
	if _, err := c.Write(buf); err != nil {
		return fmt.Errorf("bench: echo request: %w", err)
	}
	if _, err := io.ReadFull(c, buf); err != nil {
		return fmt.Errorf("bench: echo reply: %w", err)
	}
	return nil
}

// shortConn is one connection-rate unit: connect, 64 B request, 64 B
// reply, close.
func shortConn(ctx context.Context, d *net.Dialer, addr string, buf []byte) error {
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("bench: dial %s: %w", addr, err)
	}
	defer c.Close()
	// A flow the path loses silently must fail the run, not hang it.
	c.SetDeadline(time.Now().Add(d.Timeout + time.Second))
	return echo(c, buf)
}

// pingPong does warmup exchanges, then n timed ones on c, and returns each
// round trip.
func pingPong(c net.Conn, warmup, n int) ([]time.Duration, error) {
	buf := make([]byte, MsgSize)
	for i := 0; i < warmup; i++ {
		if err := echo(c, buf); err != nil {
			return nil, err
		}
	}
	rtts := make([]time.Duration, n)
	for i := range rtts {
		start := time.Now()
		if err := echo(c, buf); err != nil {
			return nil, err
		}
		rtts[i] = time.Since(start)
	}
	return rtts, nil
}

// readToEOF reads and discards c's bytes until EOF, in bufSize reads (the
// load generator's read size is part of what the bench measures, so not
// io.Discard's 8 KiB), and returns how many there were.
func readToEOF(c net.Conn) (int64, error) {
	buf := make([]byte, bufSize)
	var n int64
	for {
		k, err := c.Read(buf)
		n += int64(k)
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}
