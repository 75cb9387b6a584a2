package netstack_test

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meshtun/meshtun/netstack"
	"github.com/meshtun/meshtun/tun"
	"github.com/meshtun/meshtun/tun/tuntest"
)

// Each test builds: a namespace with a TUN "meshtun0" holding 10.99.0.1 and
// fd00:99::1, routes for 10.244.0.0/16 and fd00:244::/32 into it, and a
// Stack serving it. Kernel clients in the namespace dial the routed
// addresses.
var families = []struct {
	name   string
	dst    netip.AddrPort
	client netip.Addr // the TUN's address, the kernel's source address
}{
	{"IPv4", netip.MustParseAddrPort("10.244.2.5:8080"), netip.MustParseAddr("10.99.0.1")},
	{"IPv6", netip.MustParseAddrPort("[fd00:244:2::5]:8080"), netip.MustParseAddr("fd00:99::1")},
}

const ioTimeout = 30 * time.Second

type env struct {
	ns  *tuntest.Netns
	dev *tun.Device
	st  *netstack.Stack
}

func setup(t *testing.T, opts netstack.Options) *env {
	t.Helper()
	return setupDev(t, opts, tun.Options{})
}

// setupDev is setup with the device's MTU and Offload from topts.
func setupDev(t testing.TB, opts netstack.Options, topts tun.Options) *env {
	t.Helper()
	ns := tuntest.NewNetns(t, "mt-ns")
	level := hclog.Debug
	if _, ok := t.(*testing.B); ok {
		level = hclog.Warn // keep benchmark output to its figures
	}
	log := hclog.New(&hclog.LoggerOptions{Output: tWriter{t}, Level: level})
	var dev *tun.Device
	var err error
	ns.Do(func() {
		dev, err = tun.Open(tun.Options{
			Name:      "meshtun0",
			Addresses: []netip.Prefix{netip.MustParsePrefix("10.99.0.1/32"), netip.MustParsePrefix("fd00:99::1/128")},
			Routes:    []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/32")},
			MTU:       topts.MTU,
			Offload:   topts.Offload,
			Logger:    log.Named("tun"),
		})
	})
	if err != nil {
		t.Fatalf("tun.Open: %v", err)
	}
	t.Cleanup(func() { dev.Close() })
	opts.Device = dev
	opts.Logger = log.Named("netstack")
	st, err := netstack.New(opts)
	if err != nil {
		t.Fatalf("netstack.New: %v", err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("Stack.Close: %v", err)
		}
	})
	return &env{ns: ns, dev: dev, st: st}
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimSpace(p)))
	return len(p), nil
}

// dial connects from the namespace's kernel.
func (e *env) dial(dst netip.AddrPort) (*net.TCPConn, error) {
	var c net.Conn
	var err error
	e.ns.Do(func() { c, err = net.DialTimeout("tcp", dst.String(), ioTimeout) })
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(ioTimeout))
	return c.(*net.TCPConn), nil
}

// seen carries what a Handler observed to the test goroutine.
type seen struct {
	src, dst netip.AddrPort
}

func TestAcceptEcho16MiB(t *testing.T) {
	for _, fam := range families {
		for _, gro := range []bool{false, true} {
			name := fam.name
			if gro {
				name += "/GRO"
			}
			t.Run(name, func(t *testing.T) { testEcho(t, fam.dst, fam.client, gro) })
		}
	}
}

func testEcho(t *testing.T, dst netip.AddrPort, client netip.Addr, gro bool) {
	reqs := make(chan seen, 1)
	e := setup(t, netstack.Options{GRO: gro, Handler: func(r *netstack.Request) {
		reqs <- seen{r.Src(), r.Dst()}
		c, err := r.Accept()
		if err != nil {
			t.Errorf("Accept: %v", err)
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(ioTimeout))
		if _, err := io.Copy(c, c); err != nil {
			t.Errorf("server echo: %v", err)
		}
		c.CloseWrite()
	}})

	c, err := e.dial(dst)
	if err != nil {
		t.Fatalf("dial %s: %v", dst, err)
	}
	defer c.Close()
	got := <-reqs
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	if got.dst != dst {
		t.Errorf("Dst = %s; want %s", got.dst, dst)
	}
	if got.src != local || got.src.Addr() != client {
		t.Errorf("Src = %s; want the client's %s (address %s)", got.src, local, client)
	}

	const size = 16 << 20
	sent := sha256.New()
	wdone := make(chan error, 1)
	go func() {
		_, err := io.Copy(c, io.TeeReader(io.LimitReader(rand.Reader, size), sent))
		if err == nil {
			err = c.CloseWrite()
		}
		wdone <- err
	}()
	recv := sha256.New()
	n, err := io.Copy(recv, c)
	if err != nil {
		t.Fatalf("client read: %v after %d bytes", err, n)
	}
	if err := <-wdone; err != nil {
		t.Fatalf("client write: %v", err)
	}
	if n != size || !bytes.Equal(sent.Sum(nil), recv.Sum(nil)) {
		t.Fatalf("echo returned %d bytes, hash match %v; want %d, true", n, bytes.Equal(sent.Sum(nil), recv.Sum(nil)), size)
	}
	if st := e.st.Stats(); st.Forwarded != 1 || st.Requests != 1 {
		t.Errorf("Stats = %+v; want 1 request forwarded", st)
	}
}

// TestHalfClose: the client sends its request and shuts its write side; the
// server reads to EOF, then still sends the whole reply.
func TestHalfClose(t *testing.T) {
	request := bytes.Repeat([]byte("request "), 1000)
	reply := make([]byte, 4<<20)
	rand.Read(reply)
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			e := setup(t, netstack.Options{Handler: func(r *netstack.Request) {
				c, err := r.Accept()
				if err != nil {
					t.Errorf("Accept: %v", err)
					return
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(ioTimeout))
				got, err := io.ReadAll(c) // returns at the client's FIN
				if err != nil || !bytes.Equal(got, request) {
					t.Errorf("server read %d bytes, err %v; want the %d-byte request", len(got), err, len(request))
				}
				if _, err := c.Write(reply); err != nil {
					t.Errorf("server write after EOF: %v", err)
				}
				if err := c.CloseWrite(); err != nil {
					t.Errorf("server CloseWrite: %v", err)
				}
			}})
			c, err := e.dial(fam.dst)
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			defer c.Close()
			if _, err := c.Write(request); err != nil {
				t.Fatal(err)
			}
			if err := c.CloseWrite(); err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(c)
			if err != nil || !bytes.Equal(got, reply) {
				t.Fatalf("client read %d bytes, err %v; want the %d-byte reply", len(got), err, len(reply))
			}
		})
	}
}

func TestRefused(t *testing.T) {
	tests := []struct {
		name    string
		handler func(*netstack.Request)
	}{
		{"Reject", func(r *netstack.Request) { r.Reject() }},
		{"no decision", func(r *netstack.Request) {}},
		{"Reject then Accept", func(r *netstack.Request) {
			r.Reject()
			if c, err := r.Accept(); !errors.Is(err, netstack.ErrDecided) {
				t.Errorf("Accept after Reject = %v, %v; want ErrDecided", c, err)
			}
			r.Reject()
		}},
	}
	for _, fam := range families {
		for _, tt := range tests {
			t.Run(fam.name+"/"+tt.name, func(t *testing.T) {
				e := setup(t, netstack.Options{Handler: tt.handler})
				c, err := e.dial(fam.dst)
				if err == nil {
					c.Close()
					t.Fatal("dial succeeded; want ECONNREFUSED")
				}
				if !errors.Is(err, syscall.ECONNREFUSED) {
					t.Fatalf("dial: %v; want ECONNREFUSED (a RST, not a timeout)", err)
				}
				if st := e.st.Stats(); st.Rejected != 1 || st.Forwarded != 0 {
					t.Errorf("Stats = %+v; want 1 rejected", st)
				}
			})
		}
	}
}

// TestDecideTwice: a second Accept and a Reject after Accept are harmless.
func TestDecideTwice(t *testing.T) {
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			e := setup(t, netstack.Options{Handler: func(r *netstack.Request) {
				c, err := r.Accept()
				if err != nil {
					t.Errorf("Accept: %v", err)
					return
				}
				defer c.Close()
				if c2, err := r.Accept(); !errors.Is(err, netstack.ErrDecided) {
					t.Errorf("second Accept = %v, %v; want ErrDecided", c2, err)
				}
				r.Reject()
				c.SetDeadline(time.Now().Add(ioTimeout))
				io.Copy(c, c)
			}})
			c, err := e.dial(fam.dst)
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			defer c.Close()
			msg := []byte("still open")
			if _, err := c.Write(msg); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, msg) {
				t.Fatalf("echo after double decision: %q, %v", got, err)
			}
			if st := e.st.Stats(); st.Forwarded != 1 || st.Rejected != 0 {
				t.Errorf("Stats = %+v; want 1 forwarded, 0 rejected", st)
			}
		})
	}
}

// TestMaxInFlight: with one slot held by an undecided request, a second SYN
// is dropped and counted; once the first is decided, the second gets in (its
// SYN is retransmitted by the kernel).
func TestMaxInFlight(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free)
	first := true
	var mu sync.Mutex
	e := setup(t, netstack.Options{MaxInFlight: 1, Handler: func(r *netstack.Request) {
		mu.Lock()
		hold := first
		first = false
		mu.Unlock()
		if hold {
			<-release
		}
		r.Reject()
	}})
	dst := families[0].dst
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			c, err := e.dial(dst)
			if err == nil {
				c.Close()
			}
			errs <- err
		}()
	}
	deadline := time.Now().Add(ioTimeout)
	for e.st.Stats().InFlightDrops == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no SYN dropped with MaxInFlight 1: %+v", e.st.Stats())
		}
		time.Sleep(10 * time.Millisecond) // polling a counter, bounded above
	}
	free()
	for range 2 {
		if err := <-errs; !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("dial: %v; want ECONNREFUSED", err)
		}
	}
}

// TestCloseNoLeak: Close aborts live connections (the Handler blocked in
// Read returns, the client sees a reset), waits for Handlers, and leaves no
// goroutine behind.
func TestCloseNoLeak(t *testing.T) {
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			before := runtime.NumGoroutine()
			reading := make(chan struct{})
			handlerErr := make(chan error, 1)
			e := setup(t, netstack.Options{Handler: func(r *netstack.Request) {
				c, err := r.Accept()
				if err != nil {
					handlerErr <- err
					return
				}
				defer c.Close()
				close(reading)
				_, err = c.Read(make([]byte, 1)) // until Close aborts it
				handlerErr <- err
			}})
			c, err := e.dial(fam.dst)
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			defer c.Close()
			<-reading
			if err := e.st.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if err := e.st.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
			select {
			case err := <-handlerErr:
				if err == nil {
					t.Errorf("Handler's Read returned no error after Close")
				}
			default:
				t.Fatalf("Close returned before the Handler did")
			}
			if _, err := c.Read(make([]byte, 1)); err == nil {
				t.Errorf("client Read after Close: no error; want a reset or EOF")
			}
			c.Close()
			if err := e.dev.Close(); err != nil {
				t.Fatalf("Device.Close: %v", err)
			}

			deadline := time.Now().Add(10 * time.Second)
			n := runtime.NumGoroutine()
			for n > before && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond) // bounded wait for exits
				n = runtime.NumGoroutine()
			}
			if n > before {
				buf := make([]byte, 1<<20)
				t.Fatalf("goroutines: %d before, %d after Close\n%s", before, n, buf[:runtime.Stack(buf, true)])
			}
		})
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	if _, err := netstack.New(netstack.Options{FD: -1, MTU: 1500}); err == nil {
		t.Error("New without a Handler succeeded")
	}
	if _, err := netstack.New(netstack.Options{FD: -1, Handler: func(*netstack.Request) {}}); err == nil {
		t.Error("New without Device or MTU succeeded")
	}
}
