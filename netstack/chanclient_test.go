package netstack_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"

	"github.com/meshtun/meshtun/netstack"
)

// chanClient is a second gVisor stack standing in for the client's
// kernel: joined to a chanEnv's channel endpoint by two pump goroutines,
// it gives the tests over the channel a complete TCP client (windows,
// retransmission, half-close) without root. The stack under test still
// sees nothing but IP packets on its endpoint.
type chanClient struct {
	stack *stack.Stack
}

// clientNIC is the client stack's one NIC.
const clientNIC tcpip.NICID = 1

// newChanClient starts the client stack with the addresses of
// chanFamilies' clients, and the pumps; cleanup stops them before the
// Stack under test closes.
func newChanClient(t *testing.T, e *chanEnv) *chanClient {
	t.Helper()
	cep := channel.New(chanQueue, chanMTU, "")
	ctap := &tap{ep: cep, out: make(chan []byte, chanTapSize)}
	cep.AddNotify(ctap)
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, ipv6.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol},
	})
	if err := s.CreateNIC(clientNIC, cep); err != nil {
		t.Fatalf("client NIC: %v", err)
	}
	for _, fam := range chanFamilies {
		a := fam.src.Addr()
		proto := header.IPv4ProtocolNumber
		if !a.Is4() {
			proto = header.IPv6ProtocolNumber
		}
		pa := tcpip.ProtocolAddress{Protocol: proto, AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpipAddr(a), PrefixLen: a.BitLen()}}
		if err := s.AddProtocolAddress(clientNIC, pa, stack.AddressProperties{}); err != nil {
			t.Fatalf("client address %s: %v", a, err)
		}
	}
	s.SetRouteTable([]tcpip.Route{
		{Destination: header.IPv4EmptySubnet, NIC: clientNIC},
		{Destination: header.IPv6EmptySubnet, NIC: clientNIC},
	})

	stop := make(chan struct{})
	var wg sync.WaitGroup
	pump := func(from <-chan []byte, to func([]byte)) {
		defer wg.Done()
		for {
			select {
			case b := <-from:
				to(b)
			case <-stop:
				return
			}
		}
	}
	wg.Add(2)
	go pump(e.tap.out, func(b []byte) { injectInto(cep, b) })
	go pump(ctap.out, e.inject)
	t.Cleanup(func() {
		close(stop)
		wg.Wait()
		s.Close()
		s.Wait()
	})
	return &chanClient{stack: s}
}

// dial connects to dst from the client stack, from the family's address.
func (c *chanClient) dial(t *testing.T, dst netip.AddrPort) *gonet.TCPConn {
	t.Helper()
	proto := header.IPv4ProtocolNumber
	if !dst.Addr().Is4() {
		proto = header.IPv6ProtocolNumber
	}
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	conn, err := gonet.DialContextTCP(ctx, c.stack, tcpip.FullAddress{NIC: clientNIC, Addr: tcpipAddr(dst.Addr()), Port: dst.Port()}, proto)
	if err != nil {
		t.Fatalf("client dial %s: %v", dst, err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(ioTimeout))
	return conn
}

// TestChanEcho is TestAcceptEcho16MiB over the channel, with a gVisor
// client: the Handler sees the client's address and port, and 1 MiB
// echoed with half-close come back intact.
func TestChanEcho(t *testing.T) {
	for _, fam := range chanFamilies {
		t.Run(fam.name, func(t *testing.T) {
			reqs := make(chan seen, 1)
			e := newChanEnv(t, netstack.Options{Handler: echoHandler(t, reqs)})
			c := newChanClient(t, e).dial(t, fam.dst)
			checkRequest(t, <-reqs, c, fam.dst)
			checkEcho(t, c, 1<<20)
			if st := e.st.Stats(); st.Forwarded != 1 || st.Requests != 1 {
				t.Errorf("Stats = %+v; want 1 request forwarded", st)
			}
		})
	}
}

// TestChanHalfClose is TestHalfClose over the channel: the client sends
// its request and shuts its write side; the server reads to EOF, then
// still sends the whole reply.
func TestChanHalfClose(t *testing.T) {
	request := bytes.Repeat([]byte("request "), 1000)
	reply := make([]byte, 1<<20)
	rand.Read(reply)
	for _, fam := range chanFamilies {
		t.Run(fam.name, func(t *testing.T) {
			e := newChanEnv(t, netstack.Options{Handler: halfCloseHandler(t, request, reply)})
			checkHalfClose(t, newChanClient(t, e).dial(t, fam.dst), request, reply)
		})
	}
}

// TestChanTryWrite: TryWrite takes what the send buffer holds and then
// returns 0 without waiting, against a peer that acknowledges nothing;
// after Close it fails.
func TestChanTryWrite(t *testing.T) {
	fam := chanFamilies[0]
	_, _, c := connected(t, fam.src, fam.dst)
	done := make(chan error, 1)
	var took int
	go func() {
		chunk := make([]byte, 64<<10)
		for range 1024 { // 64 MiB: far above any send buffer
			n, err := c.TryWrite(chunk)
			took += n
			if err != nil {
				done <- err
				return
			}
			if n == 0 {
				done <- nil
				return
			}
		}
		done <- errors.New("TryWrite still took data after 64 MiB with nothing acknowledged")
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(ioTimeout):
		t.Fatal("TryWrite blocked")
	}
	if took == 0 {
		t.Fatal("TryWrite took nothing on a fresh connection")
	}
	t.Logf("the send buffer took %d bytes", took)
	c.Close()
	if n, err := c.TryWrite([]byte("x")); err == nil {
		t.Fatalf("TryWrite after Close: %d, nil; want an error", n)
	}
}
