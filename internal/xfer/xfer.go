// Package xfer is the small transfer protocol the end-to-end tests and the
// demo push through the gateways, so that both directions are checked byte
// for byte and TCP half-close is exercised on every connection:
//
//	client → server: 8-byte big-endian reply size, then the payload, then FIN
//	server → client: sha256(payload), 8-byte payload length,
//	                 reply size random bytes, sha256(reply), then FIN
//
// The client checks the server's hash of what it sent and its own hash of
// what came back.
package xfer

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"sync"
	"time"
)

// halfCloser is a connection whose write side can be closed alone.
type halfCloser interface {
	net.Conn
	CloseWrite() error
}

// Result is what one transfer moved.
type Result struct {
	Sent, Received int64
	Duration       time.Duration
}

// Serve answers the protocol on every connection of l until l is closed.
// It returns when l's Accept fails and every connection has ended.
func Serve(l net.Listener) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			ServeConn(c)
		}()
	}
}

// ServeConn answers the protocol on one connection.
func ServeConn(c net.Conn) error {
	var hdr [8]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return fmt.Errorf("xfer: read header: %w", err)
	}
	replySize := int64(binary.BigEndian.Uint64(hdr[:]))
	h := sha256.New()
	n, err := io.Copy(h, c)
	if err != nil {
		return fmt.Errorf("xfer: read payload: %w", err)
	}
	var out [sha256.Size + 8]byte
	copy(out[:], h.Sum(nil))
	binary.BigEndian.PutUint64(out[sha256.Size:], uint64(n))
	if _, err := c.Write(out[:]); err != nil {
		return err
	}
	rh := sha256.New()
	if _, err := writeRandom(io.MultiWriter(c, rh), replySize); err != nil {
		return err
	}
	if _, err := c.Write(rh.Sum(nil)); err != nil {
		return err
	}
	if hc, ok := c.(halfCloser); ok {
		return hc.CloseWrite()
	}
	return nil
}

// Run does one transfer on c: it sends size random bytes, asks for reply
// bytes back, and checks both directions. It closes c.
func Run(c net.Conn, size, reply int64) (Result, error) {
	defer c.Close()
	start := time.Now()
	hc, ok := c.(halfCloser)
	if !ok {
		return Result{}, errors.New("xfer: connection cannot half-close")
	}
	sent := sha256.New()
	werr := make(chan error, 1)
	go func() {
		var hdr [8]byte
		binary.BigEndian.PutUint64(hdr[:], uint64(reply))
		if _, err := c.Write(hdr[:]); err != nil {
			werr <- err
			return
		}
		if _, err := writeRandom(io.MultiWriter(c, sent), size); err != nil {
			werr <- err
			return
		}
		werr <- hc.CloseWrite()
	}()

	var head [sha256.Size + 8]byte
	if _, err := io.ReadFull(c, head[:]); err != nil {
		return Result{}, fmt.Errorf("xfer: read the server's receipt: %w (write side: %v)", err, pending(werr))
	}
	if err := <-werr; err != nil {
		return Result{}, fmt.Errorf("xfer: send: %w", err)
	}
	if got := int64(binary.BigEndian.Uint64(head[sha256.Size:])); got != size {
		return Result{}, fmt.Errorf("xfer: server received %d bytes, sent %d", got, size)
	}
	if !equal(head[:sha256.Size], sent) {
		return Result{}, errors.New("xfer: the server's hash of the payload differs: data corrupted on the way there")
	}
	rh := sha256.New()
	n, err := io.CopyN(rh, c, reply)
	if err != nil {
		return Result{}, fmt.Errorf("xfer: read reply after %d of %d bytes: %w", n, reply, err)
	}
	var tail [sha256.Size]byte
	if _, err := io.ReadFull(c, tail[:]); err != nil {
		return Result{}, fmt.Errorf("xfer: read reply hash: %w", err)
	}
	if !equal(tail[:], rh) {
		return Result{}, errors.New("xfer: reply hash differs: data corrupted on the way back")
	}
	var one [1]byte
	switch k, err := c.Read(one[:]); {
	case k != 0:
		return Result{}, fmt.Errorf("xfer: expected EOF after the reply, got %d bytes more", k)
	case err == nil:
		return Result{}, errors.New("xfer: expected EOF after the reply, got 0 bytes and no error")
	case err != io.EOF:
		// Wrapped: a caller tells a deadline from a reset by the cause.
		return Result{}, fmt.Errorf("xfer: expected EOF after the reply, got 0 bytes: %w", err)
	}
	return Result{Sent: size, Received: reply, Duration: time.Since(start)}, nil
}

func pending(ch chan error) error {
	select {
	case err := <-ch:
		return err
	default:
		return errors.New("still sending")
	}
}

func equal(sum []byte, h hash.Hash) bool {
	return string(sum) == string(h.Sum(nil))
}

// writeRandom writes n random bytes to w in large chunks.
func writeRandom(w io.Writer, n int64) (int64, error) {
	buf := make([]byte, 256<<10)
	rand.Read(buf) // one random block, varied per chunk below: cheap and not compressible
	var done int64
	for done < n {
		chunk := buf
		if rem := n - done; rem < int64(len(chunk)) {
			chunk = chunk[:rem]
		}
		if len(chunk) >= 8 {
			// Stamp the offset so a reordered or repeated chunk changes the hash.
			binary.BigEndian.PutUint64(chunk, uint64(done))
		}
		k, err := w.Write(chunk)
		done += int64(k)
		if err != nil {
			return done, err
		}
	}
	return done, nil
}
