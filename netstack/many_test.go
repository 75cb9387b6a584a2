package netstack_test

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/meshtun/meshtun/netstack"
)

// manyDsts is how many distinct destination IPs TestManyDestinations
// dials. gVisor's IPv4 catch-all used to scan every live destination on
// each packet (docs/field-notes.md, "Many destination IPs"): at
// 5,000 it crawled, at 20,000 dials timed out. 10,000 pins the fix well
// past the knee; with -short it is 1,000.
const manyDsts = 10000

// TestManyDestinations opens one connection to each of manyDsts distinct
// destination IPs and holds them all open: every dial must succeed, and
// each Handler must see the exact destination its client dialled (the
// Handler echoes Dst back). It reports the connection rate per block of
// dials, which stays flat when setup does not depend on the number of
// live destinations; rates are reported, never asserted.
func TestManyDestinations(t *testing.T) {
	n := manyDsts
	if testing.Short() {
		n = 1000
	}
	for _, fam := range []struct {
		name string
		dst  func(i int) netip.AddrPort
	}{
		{"IPv4", func(i int) netip.AddrPort {
			return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(100 + i/250), byte(1 + i%250)}), 80)
		}},
		{"IPv6", func(i int) netip.AddrPort {
			return netip.AddrPortFrom(netip.AddrFrom16([16]byte{0xfd, 0, 2, 0x44, 0, 0, 0, 7, 14: byte((i + 1) >> 8), 15: byte(i + 1)}), 80)
		}},
	} {
		t.Run(fam.name, func(t *testing.T) { testManyDestinations(t, n, fam.dst) })
	}
}

func testManyDestinations(t *testing.T, n int, dstOf func(int) netip.AddrPort) {
	e := setup(t, netstack.Options{Handler: func(r *netstack.Request) {
		c, err := r.Accept()
		if err != nil {
			t.Errorf("Accept %s: %v", r.Dst(), err)
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Minute))
		fmt.Fprintf(c, "%-48s", r.Dst())
		io.Copy(io.Discard, c) // hold the flow until the client closes
	}})

	conns := make([]net.Conn, n)
	t.Cleanup(func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	})
	const workers = 16
	const block = 1000
	start := time.Now()
	last := start
	for base := 0; base < n; base += block {
		end := min(base+block, n)
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		next := make(chan int)
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					if err := dialCheck(e, dstOf(i), conns, i); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
	feed:
		for i := base; i < end; i++ {
			select {
			case next <- i:
			case err := <-errs:
				close(next)
				wg.Wait()
				t.Fatalf("after %d connections: %v", i, err)
				break feed
			}
		}
		close(next)
		wg.Wait()
		select {
		case err := <-errs:
			t.Fatalf("connections %d..%d: %v", base, end, err)
		default:
		}
		now := time.Now()
		t.Logf("connections %5d..%5d: %6.0f conn/s", base, end, float64(end-base)/now.Sub(last).Seconds())
		last = now
	}
	t.Logf("%d connections to %d distinct IPs held open: %.0f conn/s overall", n, n, float64(n)/time.Since(start).Seconds())
	if st := e.st.Stats(); st.Forwarded != uint64(n) {
		t.Errorf("Stats = %+v; want %d forwarded", st, n)
	}
}

// dialCheck dials dst, reads the destination the Handler saw, and keeps
// the connection open in conns[i].
func dialCheck(e *env, dst netip.AddrPort, conns []net.Conn, i int) error {
	c, err := e.dial(dst)
	if err != nil {
		return fmt.Errorf("dial %s: %w", dst, err)
	}
	conns[i] = c
	buf := make([]byte, 48)
	if _, err := io.ReadFull(c, buf); err != nil {
		return fmt.Errorf("read from %s: %w", dst, err)
	}
	if got := fmt.Sprintf("%-48s", dst); string(buf) != got {
		return fmt.Errorf("Handler saw destination %q; client dialled %s", buf, dst)
	}
	return nil
}
