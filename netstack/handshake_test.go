package netstack_test

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/meshtun/meshtun/netstack"
)

// TestCloseDuringHandshake: a Handler blocked in Accept on a client that
// never completes the handshake must not hold up Close. The client is a
// raw SYN from an address the kernel does not own, so gVisor's SYN-ACK is
// dropped and the handshake would otherwise wait for its retransmissions
// (over a minute).
func TestCloseDuringHandshake(t *testing.T) {
	acceptErr := make(chan error, 1)
	e := setup(t, netstack.Options{Handler: acceptOnce(acceptErr)})
	src := netip.MustParseAddr("10.99.0.77") // on no interface
	dst := netip.MustParseAddr("10.244.2.5")

	// Watch meshtun0 for the SYN-ACK: once it is seen, the handshake
	// endpoint exists and Accept is blocked in it.
	var psock, rawsock int
	var err error
	e.ns.Do(func() {
		if psock, err = unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM, int(htons(unix.ETH_P_IP))); err != nil {
			return
		}
		if err = unix.SetsockoptTimeval(psock, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 1}); err != nil {
			return
		}
		rawsock, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
	})
	if err != nil {
		t.Fatalf("sockets: %v", err)
	}
	defer unix.Close(psock)
	defer unix.Close(rawsock)

	syn := synPacket(src, dst, 40000, 8080)
	if err := unix.Sendto(rawsock, syn, 0, &unix.SockaddrInet4{Addr: dst.As4()}); err != nil {
		t.Fatalf("send SYN: %v", err)
	}
	buf := make([]byte, 1<<16)
	deadline := time.Now().Add(ioTimeout)
	for {
		if time.Now().After(deadline) {
			t.Fatal("no SYN-ACK seen on meshtun0")
		}
		n, _, err := unix.Recvfrom(psock, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			t.Fatalf("recv: %v", err)
		}
		if isSynAck(buf[:n], dst, src) {
			break
		}
	}

	checkCloseDuringHandshake(t, e.st, acceptErr)
}

// acceptOnce is a Handler that sends Accept's error to acceptErr (and
// closes the Conn, if any).
func acceptOnce(acceptErr chan<- error) func(*netstack.Request) {
	return func(r *netstack.Request) {
		c, err := r.Accept()
		if c != nil {
			c.Close()
		}
		acceptErr <- err
	}
}

// checkCloseDuringHandshake closes st while an acceptOnce Handler waits in
// a handshake that will not complete: Close must return, after the
// Handler, whose Accept failed.
func checkCloseDuringHandshake(t *testing.T, st *netstack.Stack, acceptErr <-chan error) {
	t.Helper()
	closed := make(chan error, 1)
	go func() { closed <- st.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(ioTimeout):
		t.Fatal("Close blocked behind a pending handshake")
	}
	select {
	case err := <-acceptErr:
		t.Logf("Accept: %v", err)
		if err == nil {
			t.Error("Accept succeeded on a handshake that never completed")
		}
	default:
		t.Error("Close returned before the Handler did")
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func synPacket(src, dst netip.Addr, sport, dport uint16) []byte {
	b := make([]byte, header.IPv4MinimumSize+header.TCPMinimumSize)
	ip := header.IPv4(b)
	ip.Encode(&header.IPv4Fields{
		TotalLength: uint16(len(b)),
		TTL:         64,
		Protocol:    uint8(header.TCPProtocolNumber),
		SrcAddr:     tcpip.AddrFrom4(src.As4()),
		DstAddr:     tcpip.AddrFrom4(dst.As4()),
	})
	ip.SetChecksum(^ip.CalculateChecksum())
	tcp := header.TCP(b[header.IPv4MinimumSize:])
	tcp.Encode(&header.TCPFields{
		SrcPort:    sport,
		DstPort:    dport,
		SeqNum:     1000,
		DataOffset: header.TCPMinimumSize,
		Flags:      header.TCPFlagSyn,
		WindowSize: 65535,
	})
	xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, ip.SourceAddress(), ip.DestinationAddress(), uint16(len(tcp)))
	tcp.SetChecksum(^tcp.CalculateChecksum(xsum))
	return b
}

func isSynAck(b []byte, src, dst netip.Addr) bool {
	ip := header.IPv4(b)
	if len(b) < header.IPv4MinimumSize || !ip.IsValid(len(b)) || ip.TransportProtocol() != header.TCPProtocolNumber {
		return false
	}
	if ip.SourceAddress() != tcpip.AddrFrom4(src.As4()) || ip.DestinationAddress() != tcpip.AddrFrom4(dst.As4()) {
		return false
	}
	tcp := header.TCP(ip.Payload())
	return len(tcp) >= header.TCPMinimumSize && tcp.Flags() == header.TCPFlagSyn|header.TCPFlagAck
}
