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
	return &env{ns: ns, dev: dev, st: startStack(t, opts)}
}

// startStack is New, with Close at the test's cleanup.
func startStack(t testing.TB, opts netstack.Options) *netstack.Stack {
	t.Helper()
	st, err := netstack.New(opts)
	if err != nil {
		t.Fatalf("netstack.New: %v", err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("Stack.Close: %v", err)
		}
	})
	return st
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
	e := setup(t, netstack.Options{GRO: gro, Handler: echoHandler(t, reqs)})
	c, err := e.dial(dst)
	if err != nil {
		t.Fatalf("dial %s: %v", dst, err)
	}
	defer c.Close()
	got := <-reqs
	checkRequest(t, got, c, dst)
	if got.src.Addr() != client {
		t.Errorf("Src = %s; want the TUN's address %s", got.src, client)
	}
	checkEcho(t, c, 16<<20)
	if st := e.st.Stats(); st.Forwarded != 1 || st.Requests != 1 {
		t.Errorf("Stats = %+v; want 1 request forwarded", st)
	}
}

// clientConn is the client end of a flow: a kernel socket in a namespace,
// or a connection of the gVisor client of the channel tests.
type clientConn interface {
	net.Conn
	CloseWrite() error
}

// checkRequest checks that a Handler saw the client c as Src and the
// destination it dialled as Dst.
func checkRequest(t *testing.T, got seen, c clientConn, dst netip.AddrPort) {
	t.Helper()
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	if got.src != local || got.dst != dst {
		t.Errorf("Request %s -> %s; the client is %s -> %s", got.src, got.dst, local, dst)
	}
}

// echoHandler sends each Request's addresses to reqs, accepts it, echoes
// to the client's FIN and then half-closes.
func echoHandler(t *testing.T, reqs chan<- seen) func(*netstack.Request) {
	return func(r *netstack.Request) {
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
	}
}

// checkEcho writes size random bytes to an echoHandler's client c, then
// half-closes, and checks that the same bytes come back before the EOF.
func checkEcho(t *testing.T, c clientConn, size int64) {
	t.Helper()
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
}

// TestHalfClose: the client sends its request and shuts its write side; the
// server reads to EOF, then still sends the whole reply.
func TestHalfClose(t *testing.T) {
	request := bytes.Repeat([]byte("request "), 1000)
	reply := make([]byte, 4<<20)
	rand.Read(reply)
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			e := setup(t, netstack.Options{Handler: halfCloseHandler(t, request, reply)})
			c, err := e.dial(fam.dst)
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			defer c.Close()
			checkHalfClose(t, c, request, reply)
		})
	}
}

// halfCloseHandler accepts, reads the client's request to its FIN, checks
// it, and then sends the whole reply and a FIN.
func halfCloseHandler(t *testing.T, request, reply []byte) func(*netstack.Request) {
	return func(r *netstack.Request) {
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
	}
}

// checkHalfClose is the client side of halfCloseHandler.
func checkHalfClose(t *testing.T, c clientConn, request, reply []byte) {
	t.Helper()
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
			e := setup(t, netstack.Options{Handler: readUntilClosed(reading, handlerErr)})
			c, err := e.dial(fam.dst)
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			defer c.Close()
			<-reading
			checkCloseAborts(t, e.st, handlerErr)
			if _, err := c.Read(make([]byte, 1)); err == nil {
				t.Errorf("client Read after Close: no error; want a reset or EOF")
			}
			c.Close()
			if err := e.dev.Close(); err != nil {
				t.Fatalf("Device.Close: %v", err)
			}
			waitNoLeak(t, before)
		})
	}
}

// readUntilClosed is a Handler that accepts, closes reading once it
// reads, and sends the Read's error (or Accept's) to handlerErr.
func readUntilClosed(reading chan<- struct{}, handlerErr chan<- error) func(*netstack.Request) {
	return func(r *netstack.Request) {
		c, err := r.Accept()
		if err != nil {
			handlerErr <- err
			return
		}
		defer c.Close()
		close(reading)
		_, err = c.Read(make([]byte, 1)) // until Close aborts it
		handlerErr <- err
	}
}

// checkCloseAborts closes st under a readUntilClosed Handler, twice: the
// first Close returns only after the Handler's Read failed, the second
// returns the same.
func checkCloseAborts(t *testing.T, st *netstack.Stack, handlerErr <-chan error) {
	t.Helper()
	if err := st.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := st.Close(); err != nil {
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
}

// waitNoLeak fails the test unless the number of goroutines is back to
// before within 10 s.
func waitNoLeak(t testing.TB, before int) {
	t.Helper()
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
}

func TestNewRejectsBadOptions(t *testing.T) {
	if _, err := netstack.New(netstack.Options{FD: -1, MTU: 1500}); err == nil {
		t.Error("New without a Handler succeeded")
	}
	if _, err := netstack.New(netstack.Options{FD: -1, Handler: func(*netstack.Request) {}}); err == nil {
		t.Error("New without Device or MTU succeeded")
	}
}
