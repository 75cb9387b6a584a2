package netstack_test

import (
	"encoding/binary"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/meshtun/meshtun/netstack"
	"github.com/meshtun/meshtun/tun"
)

// TestBadChecksums: a SYN with a wrong TCP checksum, sent from the
// namespace's kernel over a raw socket (which leaves the checksum as
// written and marks the packet neither partial nor verified), is dropped
// by the offload link and counted in Stats.BadChecksums; the Handler
// never sees it.
func TestBadChecksums(t *testing.T) {
	e := setupDev(t, netstack.Options{Handler: func(r *netstack.Request) {
		t.Errorf("Handler called for %v → %v: the SYN's checksum is wrong", r.Src(), r.Dst())
		r.Reject()
	}}, tun.Options{Offload: tun.OffloadOn})

	src := netip.MustParseAddrPort(families[0].client.String() + ":40000")
	dst := families[0].dst
	pkt := synIPv4(src, dst)
	var err error
	e.ns.Do(func() {
		var fd int
		fd, err = syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_RAW)
		if err != nil {
			return
		}
		defer syscall.Close(fd)
		err = syscall.Sendto(fd, pkt, 0, &syscall.SockaddrInet4{Addr: dst.Addr().As4()})
	})
	if err != nil {
		t.Fatalf("send the raw SYN: %v", err)
	}
	deadline := time.Now().Add(ioTimeout)
	for e.st.Stats().BadChecksums == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the bad SYN was not counted: %+v", e.st.Stats())
		}
		time.Sleep(10 * time.Millisecond) // polling a counter, bounded above
	}
	if st := e.st.Stats(); st.BadChecksums != 1 || st.Requests != 0 {
		t.Errorf("stats %+v, want 1 bad checksum and no request", st)
	}
}

// synIPv4 is an IPv4 TCP SYN from src to dst whose TCP checksum is off
// by one. The IP header checksum is left 0: the kernel fills it in for a
// raw socket, as it does the total length.
func synIPv4(src, dst netip.AddrPort) []byte {
	p := make([]byte, 40)
	p[0] = 0x45 // version 4, 5-word header
	binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
	p[8] = 64 // TTL
	p[9] = syscall.IPPROTO_TCP
	s, d := src.Addr().As4(), dst.Addr().As4()
	copy(p[12:], s[:])
	copy(p[16:], d[:])
	tcp := p[20:]
	binary.BigEndian.PutUint16(tcp[0:], src.Port())
	binary.BigEndian.PutUint16(tcp[2:], dst.Port())
	binary.BigEndian.PutUint32(tcp[4:], 1) // sequence number
	tcp[12] = 5 << 4                       // data offset: 5 words
	tcp[13] = 0x02                         // SYN
	binary.BigEndian.PutUint16(tcp[14:], 65535)

	// The ones' complement sum of the pseudo-header and the segment.
	var sum uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(b[i:]))
		}
	}
	add(s[:])
	add(d[:])
	sum += syscall.IPPROTO_TCP + uint32(len(tcp))
	add(tcp)
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	good := ^uint16(sum)
	binary.BigEndian.PutUint16(tcp[16:], good+1)
	return p
}
