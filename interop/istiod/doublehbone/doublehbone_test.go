// Package doublehbone holds meshtun's double HBONE against Istio's own
// Go HBONE code (istio.io/istio/pkg/hbone) as the independent peer: our
// client through an east-west gateway made of Istio's HBONE server, and
// Istio's NewDoubleDialer through that gateway to a meshtun destination.
// Real sockets on loopback, real TLS 1.3 with SPIFFE certificates,
// Go's and our own HTTP/2.
package doublehbone

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	istiohbone "istio.io/istio/pkg/hbone"

	"github.com/meshtun/meshtun/config"
	meshtungw "github.com/meshtun/meshtun/gateway"
	"github.com/meshtun/meshtun/hbone"
	"github.com/meshtun/meshtun/hbone/devca"
)

const (
	domain   = "cluster.local"
	clientID = "spiffe://cluster.local/ns/vm/sa/vm-sa"
	gwID     = "spiffe://cluster.local/ns/istio-system/sa/istio-eastwestgateway"
	destID   = "spiffe://cluster.local/ns/default/sa/server"
	host     = "server.default.svc.cluster.local"
	wait     = 20 * time.Second // bound of every wait
	secret   = "plaintext that only the destination may read, never the gateway"
)

var ca = sync.OnceValues(func() (*devca.CA, error) { return devca.New(domain) })

func keyPair(t *testing.T, id string) (tls.Certificate, *devca.CA) {
	t.Helper()
	c, err := ca()
	if err != nil {
		t.Fatal(err)
	}
	kp, err := c.KeyPair(id)
	if err != nil {
		t.Fatal(err)
	}
	return kp, c
}

// echo is the application behind the destination.
func echo(t *testing.T) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// destination is a meshtun HBONE server, as a meshtun node's inbound
// takes a flow through a network gateway: the inner TLS ends here, and a
// CONNECT to host:80 (or to the echo's ip:port) reaches the echo.
type destination struct {
	addr netip.AddrPort
	seen chan *hbone.Request
}

func newDestination(t *testing.T, app netip.AddrPort) *destination {
	t.Helper()
	cert, c := keyPair(t, destID)
	d := &destination{seen: make(chan *hbone.Request, 16)}
	srv, err := hbone.NewServer(hbone.ServerOptions{
		Certificate: cert, Roots: c.Pool(), TrustDomain: domain, NameAuthorities: true,
		Handler: func(r *hbone.Request) {
			d.seen <- r
			if r.TargetName() != host+":80" && r.Target() != app {
				r.Reject(http.StatusServiceUnavailable)
				return
			}
			tc, err := net.DialTimeout("tcp", app.String(), wait)
			if err != nil {
				r.Reject(http.StatusServiceUnavailable)
				return
			}
			defer tc.Close()
			st, err := r.Accept()
			if err != nil {
				return
			}
			defer st.Close()
			done := make(chan struct{})
			go func() {
				io.Copy(tc, st)
				tc.(*net.TCPConn).CloseWrite()
				close(done)
			}()
			io.Copy(st, tc)
			st.CloseWrite()
			<-done
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d.addr = ln.Addr().(*net.TCPAddr).AddrPort()
	served := make(chan struct{})
	go func() { srv.Serve(ln); close(served) }()
	t.Cleanup(func() { srv.Close(); <-served })
	return d
}

// gateway is an east-west gateway made of Istio's HBONE server
// (pkg/hbone.NewServer: it answers the CONNECT, dials its :authority and
// copies bytes both ways). What an east-west gateway adds, routing the
// :authority to the destination's HBONE listener, is the one thing done
// here: the request's Host is rewritten to dest before Istio's handler
// runs.
type gateway struct {
	addr  netip.AddrPort
	hosts chan string // the :authority of each outer CONNECT
}

func newGateway(t *testing.T, dest netip.AddrPort) *gateway {
	t.Helper()
	cert, c := keyPair(t, gwID)
	g := &gateway{hosts: make(chan string, 16)}
	srv := istiohbone.NewServer()
	srv.Protocols.SetHTTP2(true) // Istio's server speaks h2c; HBONE is h2 over TLS
	istio := srv.Handler
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.hosts <- r.Host
		r.Host = dest.String()
		istio.ServeHTTP(w, r)
	})
	srv.TLSConfig = hbone.ServerConfig(cert, c.Pool(), domain)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g.addr = ln.Addr().(*net.TCPAddr).AddrPort()
	served := make(chan struct{})
	go func() { srv.ServeTLS(ln, "", ""); close(served) }()
	t.Cleanup(func() { srv.Close(); <-served })
	return g
}

// tap sits between the gateway and the destination and records what
// passes: what the gateway forwards after ending the outer TLS, the inner
// connection as the gateway sees it.
type tap struct {
	addr netip.AddrPort
	mu   sync.Mutex
	buf  bytes.Buffer
}

func newTap(t *testing.T, to netip.AddrPort) *tap {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	tp := &tap{addr: ln.Addr().(*net.TCPAddr).AddrPort()}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.DialTimeout("tcp", to.String(), wait)
				if err != nil {
					return
				}
				defer u.Close()
				done := make(chan struct{})
				go func() {
					io.Copy(u, io.TeeReader(c, tp))
					u.(*net.TCPConn).CloseWrite()
					close(done)
				}()
				io.Copy(c, io.TeeReader(u, tp))
				c.(*net.TCPConn).CloseWrite()
				<-done
			}()
		}
	}()
	return tp
}

func (tp *tap) Write(p []byte) (int, error) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return tp.buf.Write(p)
}

func (tp *tap) seen() string {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return tp.buf.String()
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), wait)
	t.Cleanup(cancel)
	return c
}

func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(wait):
		t.Fatalf("no %s within %s", what, wait)
		panic("unreachable")
	}
}

// setup is app ← destination ← tap ← Istio's gateway.
func setup(t *testing.T) (app netip.AddrPort, d *destination, tp *tap, g *gateway) {
	app = echo(t)
	d = newDestination(t, app)
	tp = newTap(t, d.addr)
	g = newGateway(t, tp.addr)
	return
}

func ourPool(t *testing.T) *hbone.Pool {
	t.Helper()
	cert, c := keyPair(t, clientID)
	p, err := hbone.NewPool(hbone.PoolOptions{Certificate: cert, Roots: c.Pool()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func ourRequest(d *destination, g *gateway, app netip.AddrPort) hbone.ConnectRequest {
	return hbone.ConnectRequest{
		Address:       d.addr,
		Authority:     app,
		AuthorityName: host + ":80",
		Identities:    []string{destID},
		Source:        netip.MustParseAddrPort("10.9.0.5:40000"),
		Host:          host,
		Gateway:       &hbone.GatewayHop{Address: g.addr, Identities: []string{gwID}},
		Network:       "vm-net",
	}
}

// Our double HBONE client through a gateway made of Istio's HBONE server
// to a meshtun destination: both authorities are ztunnel's, the inner TLS
// is end to end (the destination sees our identity; what the gateway
// forwards never holds the plaintext), half-close crosses both layers.
func TestOurDoubleHBONEThroughIstioGateway(t *testing.T) {
	app, d, tp, g := setup(t)
	pool := ourPool(t)
	for i := range 2 {
		s, err := pool.Connect(ctx(t), ourRequest(d, g, app))
		if err != nil {
			t.Fatal(err)
		}
		if got := s.PeerIdentity(); got != destID {
			t.Errorf("inner peer %q, want %s", got, destID)
		}
		if _, id, ok := s.Gateway(); !ok || id != gwID {
			t.Errorf("gateway identity %q, want %s", id, gwID)
		}
		io.WriteString(s, secret)
		s.CloseWrite()
		back, err := io.ReadAll(s)
		if err != nil || string(back) != secret {
			t.Fatalf("flow %d: %q, %v; want the echo and a clean end", i, back, err)
		}
		s.Close()
		if got := recv(t, g.hosts, "outer CONNECT"); got != host+":80" {
			t.Errorf("the gateway got :authority %q, want %s:80", got, host)
		}
		inner := recv(t, d.seen, "inner CONNECT")
		if inner.TargetName() != host+":80" || inner.PeerIdentity() != clientID {
			t.Errorf("inner CONNECT %q from %q, want %s:80 from %s", inner.TargetName(), inner.PeerIdentity(), host, clientID)
		}
		if got := inner.Header().Get("X-Forwarded-Network"); got != "vm-net" {
			t.Errorf("inner x-forwarded-network %q", got)
		}
		if got := inner.ForwardedFor(); got != netip.MustParseAddrPort("10.9.0.5:40000") {
			t.Errorf("inner forwarded for %v", got)
		}
	}
	if seen := tp.seen(); seen == "" || strings.Contains(seen, secret) {
		t.Errorf("the gateway forwarded %d bytes; the plaintext must not be among them", len(seen))
	}
	if st := pool.Stats(); st.ConnsOpened != 1 {
		t.Errorf("%d connections opened, want 1 to the gateway for both flows", st.ConnsOpened)
	}
}

// The fault cases against Istio's gateway: down (refused, then back),
// the destination's identity wrong (refused, nothing reaches the
// destination), the destination unreachable behind a gateway that
// answered the outer CONNECT (Istio's server sends its 200 before it
// dials) and then ends the stream.
func TestOurDoubleHBONEFaultsThroughIstioGateway(t *testing.T) {
	t.Run("gateway down, then back", func(t *testing.T) {
		app, d, _, g := setup(t)
		pool := ourPool(t)
		req := ourRequest(d, g, app)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		req.Gateway.Address = ln.Addr().(*net.TCPAddr).AddrPort()
		ln.Close()
		if _, err := pool.Connect(ctx(t), req); err == nil || !strings.Contains(err.Error(), "network gateway "+req.Gateway.Address.String()) {
			t.Fatalf("through a gateway that is down: %v", err)
		}
		s, err := pool.Connect(ctx(t), ourRequest(d, g, app))
		if err != nil {
			t.Fatalf("back through the gateway that is up: %v", err)
		}
		s.Close()
	})
	t.Run("wrong destination identity", func(t *testing.T) {
		app, d, _, g := setup(t)
		pool := ourPool(t)
		req := ourRequest(d, g, app)
		req.Identities = []string{"spiffe://cluster.local/ns/default/sa/impostor"}
		if _, err := pool.Connect(ctx(t), req); !errors.Is(err, hbone.ErrWrongIdentity) {
			t.Fatalf("Connect = %v, want ErrWrongIdentity", err)
		}
		select {
		case r := <-d.seen:
			t.Errorf("the destination got a CONNECT (%s) past a wrong identity", r.TargetName())
		default:
		}
	})
	t.Run("gateway answers, then the destination is unreachable", func(t *testing.T) {
		app, d, _, _ := setup(t)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		nowhere := ln.Addr().(*net.TCPAddr).AddrPort()
		ln.Close()
		g := newGateway(t, nowhere)
		pool := ourPool(t)
		if _, err := pool.Connect(ctx(t), ourRequest(d, g, app)); err == nil {
			t.Fatal("Connect succeeded with nothing behind the gateway")
		}
	})
}

// Istio's NewDoubleDialer, an independent double-HBONE client, through
// Istio's gateway to the meshtun destination: the inner connection ends
// at meshtun's server, which sees the client's own identity.
func TestIstioDoubleDialerToMeshtun(t *testing.T) {
	_, d, tp, g := setup(t)
	istioDoubleEcho(t, g.addr, d)
	if got := recv(t, g.hosts, "outer CONNECT"); got != host+":80" {
		t.Errorf("Istio's outer :authority %q", got)
	}
	inner := recv(t, d.seen, "inner CONNECT")
	if inner.TargetName() != host+":80" || inner.PeerIdentity() != clientID {
		t.Errorf("meshtun served %q for %q, want %s:80 for %s (the inner TLS end to end)", inner.TargetName(), inner.PeerIdentity(), host, clientID)
	}
	if strings.Contains(tp.seen(), secret) {
		t.Error("the gateway forwarded the plaintext")
	}
}

// istioDoubleEcho dials host:80 with Istio's NewDoubleDialer, as
// clientID, through the gateway at gw (expecting gwID) to d (expecting
// destID), and checks that secret comes back; it returns the dialer.
func istioDoubleEcho(t *testing.T, gw netip.AddrPort, d *destination) istiohbone.Dialer {
	t.Helper()
	cert, c := keyPair(t, clientID)
	innerTLS := hbone.ClientConfig(cert, c.Pool(), []string{destID})
	dialer := istiohbone.NewDoubleDialer(
		istiohbone.Config{ProxyAddress: gw.String(), TLS: hbone.ClientConfig(cert, c.Pool(), []string{gwID})},
		istiohbone.Config{ProxyAddress: d.addr.String(), TLS: innerTLS},
		innerTLS)
	conn, err := dialer.DialContext(ctx(t), "tcp", host+":80")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, secret); err != nil {
		t.Fatal(err)
	}
	back := make([]byte, len(secret))
	done := make(chan error, 1)
	go func() { _, err := io.ReadFull(conn, back); done <- err }()
	if err := recv(t, done, "the echo"); err != nil || string(back) != secret {
		t.Fatalf("echo %q, %v", back, err)
	}
	return dialer
}

// meshtunGateway is a meshtun gateway whose gateway.east_west handler
// serves on loopback: the network's east-west gateway of the issue's
// "meshtun as its network's gateway", made by gateway.New from a file
// that names the destination's workload and service.
func meshtunGateway(t *testing.T, d *destination, app netip.AddrPort) netip.AddrPort {
	t.Helper()
	c, err := ca()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, _, err := c.WriteLeaf(dir, "ew", gwID); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.pem"), c.PEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	text := fmt.Sprintf(`version = 1
[gateway]
name = "ew"
[tls]
cert = "ew.pem"
key = "ew-key.pem"
trust_bundle = "ca.pem"
[[workloads]]
name = "server"
namespace = "default"
service_account = "server"
addresses = [%q]
hbone_address = %q
[[services]]
name = "server"
namespace = "default"
hostname = %q
vips = ["10.96.0.77"]
ports = { 80 = %d }
endpoints = ["default/server"]
`, app.Addr(), d.addr, host, app.Port())
	path := filepath.Join(dir, "gateway.toml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	g, err := meshtungw.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := keyPair(t, gwID)
	srv, err := hbone.NewServer(hbone.ServerOptions{Certificate: cert, Roots: c.Pool(), TrustDomain: domain,
		Handler: g.EastWestHandler(), NameAuthorities: true})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { srv.Serve(ln); close(served) }()
	t.Cleanup(func() { srv.Close(); <-served })
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// Istio's NewDoubleDialer through meshtun as the east-west gateway to a
// meshtun destination: meshtun routes Istio's outer CONNECT to the
// service's endpoint and relays the inner TLS, which ends at the
// destination with the client's identity.
func TestIstioDoubleDialerThroughMeshtunGateway(t *testing.T) {
	app := echo(t)
	d := newDestination(t, app)
	gw := meshtunGateway(t, d, app)
	dialer := istioDoubleEcho(t, gw, d)
	inner := recv(t, d.seen, "inner CONNECT")
	if inner.TargetName() != host+":80" || inner.PeerIdentity() != clientID {
		t.Errorf("the destination served %q for %q, want %s:80 for %s", inner.TargetName(), inner.PeerIdentity(), host, clientID)
	}

	// A service meshtun does not know is refused: Istio's dialer fails.
	if _, err := dialer.DialContext(ctx(t), "tcp", "unknown.default.svc.cluster.local:80"); err == nil {
		t.Error("Istio's dialer got through meshtun's gateway to a service it does not know")
	}
}
