package netstack_test

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshtun/meshtun/netstack"
	"github.com/meshtun/meshtun/tun"
)

// TestTransfer moves data both ways with half-close through the stack, for
// each device mode (offload on and off), MTU 1500 and 65000, IPv4 and
// IPv6, and a client whose MSS is clamped to 1460 (what traffic routed in
// from other hosts looks like). Both directions are hashed; the server
// reads the whole upload to EOF before it answers, and the client reads
// the whole answer after its own FIN.
func TestTransfer(t *testing.T) {
	const up, down = 24 << 20, 16<<20 + 7
	for _, offload := range []string{tun.OffloadOff, tun.OffloadOn} {
		for _, mtu := range []int{1500, 65000} {
			for _, fam := range families {
				for _, mss := range []int{0, 1460} {
					if mss != 0 && mtu == 1500 {
						continue // the MTU already gives MSS 1460
					}
					name := fmt.Sprintf("offload-%s/mtu%d/%s", offload, mtu, fam.name)
					if mss != 0 {
						name += fmt.Sprintf("/mss%d", mss)
					}
					t.Run(name, func(t *testing.T) {
						testTransfer(t, tun.Options{MTU: mtu, Offload: offload}, fam.dst, mss, up, down)
					})
				}
			}
		}
	}
}

type transferResult struct {
	got  [32]byte // hash of what the server read
	n    int64
	sent [32]byte // hash of what the server sent
	err  error
}

func testTransfer(t *testing.T, topts tun.Options, dst netip.AddrPort, mss int, up, down int64) {
	res := make(chan transferResult, 1)
	e := setupDev(t, netstack.Options{Handler: func(r *netstack.Request) {
		var tr transferResult
		defer func() { res <- tr }()
		c, err := r.Accept()
		if err != nil {
			tr.err = err
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(ioTimeout))
		h := sha256.New()
		if tr.n, tr.err = io.Copy(h, c); tr.err != nil {
			return
		}
		copy(tr.got[:], h.Sum(nil))
		h.Reset()
		if _, tr.err = io.Copy(c, io.TeeReader(io.LimitReader(rand.Reader, down), h)); tr.err != nil {
			return
		}
		copy(tr.sent[:], h.Sum(nil))
		tr.err = c.CloseWrite()
	}}, topts)
	if topts.Offload == tun.OffloadOn && !e.dev.Offload() {
		t.Fatal("device opened with Offload on reports no offload")
	}

	var c net.Conn
	var err error
	e.ns.Do(func() {
		d := net.Dialer{Timeout: ioTimeout}
		if mss != 0 {
			d.Control = func(_, _ string, rc syscall.RawConn) error {
				var serr error
				if err := rc.Control(func(fd uintptr) {
					serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG, mss)
				}); err != nil {
					return err
				}
				return serr
			}
		}
		c, err = d.Dial("tcp", dst.String())
	})
	if err != nil {
		t.Fatalf("dial %s: %v", dst, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(ioTimeout))
	tc := c.(*net.TCPConn)

	upHash := sha256.New()
	if _, err := io.Copy(tc, io.TeeReader(io.LimitReader(rand.Reader, up), upHash)); err != nil {
		t.Fatalf("client write: %v", err)
	}
	if err := tc.CloseWrite(); err != nil {
		t.Fatalf("client CloseWrite: %v", err)
	}
	downHash := sha256.New()
	n, err := io.Copy(downHash, tc)
	if err != nil {
		t.Fatalf("client read after its FIN: %v after %d bytes", err, n)
	}
	tr := <-res
	if tr.err != nil {
		t.Fatalf("server: %v", tr.err)
	}
	if tr.n != up || !bytes.Equal(tr.got[:], upHash.Sum(nil)) {
		t.Fatalf("upload: server read %d bytes (hash match %v), want %d", tr.n, bytes.Equal(tr.got[:], upHash.Sum(nil)), up)
	}
	if n != down || !bytes.Equal(tr.sent[:], downHash.Sum(nil)) {
		t.Fatalf("download: client read %d bytes (hash match %v), want %d", n, bytes.Equal(tr.sent[:], downHash.Sum(nil)), down)
	}
}

// TestOffloadCloseNoLeak: with offload, Close ends the read loop and
// every goroutine, and closes the fd.
func TestOffloadCloseNoLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	e := setupDev(t, netstack.Options{Handler: func(r *netstack.Request) {
		c, err := r.Accept()
		if err == nil {
			c.Write([]byte("hi"))
			c.Close()
		}
	}}, tun.Options{MTU: 1500, Offload: tun.OffloadOn})
	c, err := e.dial(families[0].dst)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	if b, err := io.ReadAll(c); err != nil || string(b) != "hi" {
		t.Fatalf("read %q, %v", b, err)
	}
	c.Close()
	if err := e.st.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := e.dev.Close(); err != nil {
		t.Fatalf("Device.Close: %v", err)
	}
	waitNoLeak(t, before)
}
