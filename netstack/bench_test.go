package netstack_test

import (
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/meshtun/meshtun/netstack"
	"github.com/meshtun/meshtun/tun"
)

// BenchmarkStream measures one flow between a kernel client and a Handler
// through the TUN and the stack, per device mode, MTU and direction
// ("up": client → stack, "down": stack → client). It reports Gbit/s and
// the CPU seconds per GiB of this whole process (client sockets, TUN and
// stack together, from getrusage), which is steadier than Gbit/s on a
// shared machine.
//
//	go test -run XXX -bench Stream -benchtime 10x ./netstack
func BenchmarkStream(b *testing.B) {
	const chunk = 64 << 20
	for _, offload := range []string{tun.OffloadOff, tun.OffloadOn} {
		for _, mtu := range []int{1500, 65000} {
			for _, dir := range []string{"up", "down"} {
				b.Run(fmt.Sprintf("offload-%s/mtu%d/%s", offload, mtu, dir), func(b *testing.B) {
					benchStream(b, tun.Options{MTU: mtu, Offload: offload}, dir == "up", chunk)
				})
			}
		}
	}
}

func benchStream(b *testing.B, topts tun.Options, up bool, chunk int64) {
	done := make(chan error, 1)
	e := setupDev(b, netstack.Options{Handler: func(r *netstack.Request) {
		c, err := r.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		if up {
			_, err = io.Copy(io.Discard, c)
		} else {
			_, err = io.Copy(c, io.LimitReader(zeros{}, chunk*int64(b.N)))
			c.CloseWrite()
		}
		done <- err
	}}, topts)
	c, err := e.dial(families[0].dst)
	if err != nil {
		b.Fatalf("dial: %v", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Minute))
	cpu0 := cpuTime()
	b.ResetTimer()
	start := time.Now()
	var n int64
	if up {
		n, err = io.Copy(c, io.LimitReader(zeros{}, chunk*int64(b.N)))
		c.CloseWrite()
	} else {
		n, err = io.Copy(io.Discard, c)
	}
	if err == nil {
		err = <-done
	}
	b.StopTimer()
	if err != nil {
		b.Fatalf("after %d bytes: %v", n, err)
	}
	el := time.Since(start).Seconds()
	b.ReportMetric(float64(n)*8/el/1e9, "Gbit/s")
	b.ReportMetric((cpuTime()-cpu0).Seconds()/(float64(n)/(1<<30)), "CPU-s/GiB")
	b.SetBytes(chunk)
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

var _ net.Conn = (*netstack.Conn)(nil)
