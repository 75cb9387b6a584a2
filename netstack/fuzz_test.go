package netstack_test

import (
	"net/netip"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/meshtun/meshtun/netstack"
)

// FuzzInboundPacket hands the stack any packet the TUN could read (the
// packet path from the device into gVisor and the forwarder), then checks
// the stack still serves: a SYN of a flow of its own reaches the Handler
// and is answered with the Handler's RST. A panic, a wedged processor or
// a Handler that is never called again fails.
func FuzzInboundPacket(f *testing.F) {
	v4, v6 := chanFamilies[0], chanFamilies[1]
	syn4 := buildSegment(v4.src, v4.dst, header.TCPFlagSyn, clientISN, 0, nil)
	syn6 := buildSegment(v6.src, v6.dst, header.TCPFlagSyn, clientISN, 0, nil)
	f.Add(syn4)
	f.Add(syn6)
	f.Add(buildSegment(v4.src, v4.dst, header.TCPFlagAck|header.TCPFlagPsh, clientISN, 1, []byte("data without a flow")))
	f.Add(buildSegment(v6.src, v6.dst, header.TCPFlagRst, clientISN, 0, nil))
	f.Add(syn4[:header.IPv4MinimumSize+4]) // TCP header cut short
	bad := append([]byte(nil), syn4...)
	bad[len(bad)-1] ^= 0xff // a checksum that does not add up
	f.Add(bad)
	f.Add([]byte{0x45})
	f.Add([]byte{})

	probe := netip.MustParseAddrPort("10.99.0.2:40001")
	f.Fuzz(func(t *testing.T, pkt []byte) {
		if len(pkt) > 1<<16 { // an IP packet's own limit; the TUN reads no more
			return
		}
		probes := make(chan struct{}, 1)
		e := newChanEnv(t, netstack.Options{Handler: func(r *netstack.Request) {
			if r.Src() == probe {
				probes <- struct{}{}
			}
			r.Reject()
		}})
		e.inject(pkt)

		p := e.peer(probe, v4.dst)
		p.send(header.TCPFlagSyn, nil)
		select {
		case <-probes:
		case <-time.After(ioTimeout):
			t.Fatalf("after packet %x: the Handler never saw the probe's SYN in %v", pkt, ioTimeout)
		}
		// The fuzzed packet may have been answered too (a RST, an ICMP
		// error); only the probe's RST counts.
		deadline := time.After(ioTimeout)
		for range readBound {
			select {
			case b := <-e.tap.out:
				seg, err := parseSegment(b)
				if err == nil && seg.src == p.dst && seg.dst == p.src && seg.flags&header.TCPFlagRst != 0 {
					return
				}
			case <-deadline:
				t.Fatalf("after packet %x: no RST for the probe in %v", pkt, ioTimeout)
			}
		}
		t.Fatalf("after packet %x: no RST for the probe in %d packets", pkt, readBound)
	})
}
