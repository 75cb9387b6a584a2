// Package tcptest gives tests the two ends of a real loopback TCP
// connection, closed when the test ends.
package tcptest

import (
	"net"
	"testing"
)

// Pair returns the dialled and the accepted end of a new TCP connection
// on 127.0.0.1. Both are closed at the test's cleanup; closing one
// earlier is harmless.
func Pair(t testing.TB) (client, server *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type accepted struct {
		c   net.Conn
		err error
	}
	ch := make(chan accepted, 1)
	go func() {
		c, err := ln.Accept()
		ch <- accepted{c, err}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	a := <-ch
	if a.err != nil {
		c.Close()
		t.Fatal(a.err)
	}
	t.Cleanup(func() { c.Close(); a.c.Close() })
	return c.(*net.TCPConn), a.c.(*net.TCPConn)
}
