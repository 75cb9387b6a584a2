package main

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshtun/meshtun/hbone/devca"
)

const testTimeout = 20 * time.Second

const (
	idA = "spiffe://cluster.local/ns/meshtun/sa/node-a"
	idB = "spiffe://cluster.local/ns/meshtun/sa/node-b"
)

// certs writes a CA and node-a's and node-b's certificates into a temp
// dir, as `meshtun certs` does for the bench, and returns the dir.
func certs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	ca, err := devca.New("cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.pem"), ca.PEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, id := range map[string]string{"node-a": idA, "node-b": idB} {
		if _, _, err := ca.WriteLeaf(dir, name, id); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func side(dir, name, peer string) options {
	return options{
		cert: filepath.Join(dir, name+".pem"), key: filepath.Join(dir, name+"-key.pem"),
		ca: filepath.Join(dir, "ca.pem"), peerID: peer,
	}
}

// pair starts hbone-pair's server and client on loopback, the client
// forwarding to target through the server, the client expecting the
// server to be clientPeer; it returns the client's listen address.
func pair(t *testing.T, target, clientPeer string) string {
	t.Helper()
	dir := certs(t)
	so := side(dir, "node-b", idA)
	so.mode, so.listen = "server", "127.0.0.1:0"
	srv, saddrs, err := start(so)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	co := side(dir, "node-a", clientPeer)
	co.mode, co.proxy, co.forward = "client", saddrs[0].String(), "127.0.0.1:0="+target
	cli, caddrs, err := start(co)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return caddrs[0].String()
}

// target listens on loopback and runs serve on each connection; accepted
// receives one value per connection.
func target(t *testing.T, serve func(c *net.TCPConn)) (string, <-chan struct{}) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	accepted := make(chan struct{}, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- struct{}{}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(testTimeout))
				serve(c.(*net.TCPConn))
			}()
		}
	}()
	return l.Addr().String(), accepted
}

func dial(t *testing.T, addr string) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, testTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(testTimeout))
	return c.(*net.TCPConn)
}

// Round trips and a download that ends with the server's FIN cross
// Istio's HBONE intact (what the bench's rr and downloads do).
func TestPairEchoAndDownload(t *testing.T) {
	down := make([]byte, 1<<20+3)
	rand.Read(down)
	addr, _ := target(t, func(c *net.TCPConn) {
		var op [1]byte
		if _, err := io.ReadFull(c, op[:]); err != nil {
			return
		}
		if op[0] == 'D' {
			c.Write(down)
			return // closes: the server's FIN
		}
		c.Write(op[:])
		io.Copy(c, c)
	})
	entry := pair(t, addr, idB)

	c := dial(t, entry)
	buf := make([]byte, 64)
	if _, err := c.Write([]byte{'E'}); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, buf[:1]); err != nil || buf[0] != 'E' {
		t.Fatalf("first echo: %q, %v", buf[:1], err)
	}
	for i := range 100 {
		msg := bytes.Repeat([]byte{byte(i)}, 64)
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil || !bytes.Equal(buf, msg) {
			t.Fatalf("exchange %d: %v", i, err)
		}
	}

	d := dial(t, entry)
	if _, err := d.Write([]byte{'D'}); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(d) // EOF: the server's FIN came through
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, down) {
		t.Fatalf("downloaded %d bytes, not the %d sent", len(got), len(down))
	}
}

// A server that is not the expected identity is refused: nothing
// reaches the target and the client's connection is closed.
func TestPairChecksPeerID(t *testing.T) {
	addr, accepted := target(t, func(c *net.TCPConn) { io.Copy(c, c) })
	entry := pair(t, addr, "spiffe://cluster.local/ns/meshtun/sa/someone-else")
	c := dial(t, entry)
	c.Write([]byte("hello"))
	if n, err := c.Read(make([]byte, 8)); n != 0 || err == nil {
		t.Fatalf("read %d bytes, %v through a server with the wrong identity; want the connection closed", n, err)
	}
	select {
	case <-accepted:
		t.Fatal("the target was reached through a server with the wrong identity")
	default:
	}
}

// What the bench says of this pair (bench/peers.go, istioNoHalfClose):
// Istio's dialer cannot pass the client's half-close on, so a reply sent
// after it is lost. If Istio's dialer learns to half-close, this fails,
// and the bench should measure uploads and short connections on it.
func TestPairLosesReplyAfterHalfClose(t *testing.T) {
	gotEOF := make(chan error, 1)
	addr, _ := target(t, func(c *net.TCPConn) {
		_, err := io.Copy(io.Discard, c)
		gotEOF <- err
		c.Write([]byte("receipt"))
	})
	entry := pair(t, addr, idB)
	c := dial(t, entry)
	if _, err := c.Write([]byte("upload")); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if len(got) > 0 {
		t.Fatalf("read %q after the half-close: Istio's dialer passes half-closes on now; measure uploads and short connections on this peer", got)
	}
	if err != nil && !errors.Is(err, io.EOF) {
		t.Logf("read after the half-close: %v", err)
	}
	select {
	case err := <-gotEOF:
		if err != nil {
			t.Fatalf("the target read %v, want EOF", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("the client's FIN never reached the target")
	}
}
