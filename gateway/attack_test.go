package gateway

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/meshtun/meshtun/hbone"
	"github.com/meshtun/meshtun/hbone/devca"
)

// Identity and policy under attack: each attempt below is refused with
// the status the contract gives it (docs/hbone.md), the target it named
// sees no connection at all, and the receiving gateway writes exactly one
// line about it.

// attackEnv is gateway B's inbound side as Run builds it (the gateway's
// handler behind an HBONE server logging to the gateway's logger), a
// target inside hbone.serve and one outside it that count every
// connection, and one of B's own listeners.
type attackEnv struct {
	*reloadEnv
	ca              *devca.CA
	server          netip.AddrPort // B's HBONE server, with B's logger
	served, outside *countingTarget
	own             netip.AddrPort
}

type countingTarget struct {
	addr  netip.AddrPort
	conns atomic.Int64
}

func countTarget(t *testing.T, addr string) *countingTarget {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	c := &countingTarget{addr: ln.Addr().(*net.TCPAddr).AddrPort()}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			c.conns.Add(1)
			conn.Close()
		}
	}()
	return c
}

func newAttackEnv(t *testing.T) *attackEnv {
	own, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { own.Close() })
	ownAddr := own.Addr().(*net.TCPAddr).AddrPort()
	e := &attackEnv{
		reloadEnv: newReloadEnv(t, fmt.Sprintf("[admin]\nreadiness = %q\n", ownAddr.String())),
		served:    countTarget(t, "127.0.0.1:0"),
		outside:   countTarget(t, "127.0.0.2:0"), // hbone.serve is 127.0.0.1/32
		own:       ownAddr,
	}
	var created bool
	if e.ca, created, err = devca.LoadOrCreate(e.dir, "cluster.local"); err != nil || created {
		t.Fatalf("the env's CA: created %v, %v", created, err)
	}
	srv, err := hbone.NewServer(hbone.ServerOptions{
		Source:      e.g.certs(),
		TrustDomain: "cluster.local",
		Handler:     e.g.handleInbound,
		Logger:      e.g.log.Named("hbone"),
	})
	if err != nil {
		t.Fatal(err)
	}
	e.server = serveLoopback(t, srv, nil)
	return e
}

// serveLoopback serves srv on a loopback port until the test's cleanup,
// which closes srv, waits for Serve to return, then runs after (if set).
func serveLoopback(t *testing.T, srv *hbone.Server, after func()) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { srv.Serve(ln); close(served) }()
	t.Cleanup(func() {
		srv.Close()
		<-served
		if after != nil {
			after()
		}
	})
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// leaf issues a client certificate from ca, edited by mod.
func leaf(t *testing.T, ca *devca.CA, mod func(*x509.Certificate)) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(reloadClientID)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()),
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		URIs:         []*url.URL{u},
	}
	if mod != nil {
		mod(tmpl)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func uris(t *testing.T, ids ...string) []*url.URL {
	t.Helper()
	var out []*url.URL
	for _, id := range ids {
		u, err := url.Parse(id)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, u)
	}
	return out
}

// countLines is the number of lines of logs containing sub.
func countLines(logs *syncBuffer, sub string) int { return len(logs.lines(sub)) }

// waitLines waits (bounded) until logs has want lines containing sub, and
// fails if it has more or never gets there.
func waitLines(t *testing.T, logs *syncBuffer, sub string, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for n := countLines(logs, sub); n != want; n = countLines(logs, sub) {
		if n > want || time.Now().After(deadline) {
			t.Fatalf("%d lines with %q, want %d:\n%q", n, sub, want, logs.lines(sub))
		}
		time.Sleep(5 * time.Millisecond) // polling the log, bounded
	}
}

func TestAttackCertificates(t *testing.T) {
	e := newAttackEnv(t)
	other, err := devca.New("cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cert func() tls.Certificate
		why  string // in the refusal's log line
	}{
		{"expired", func() tls.Certificate {
			return leaf(t, e.ca, func(c *x509.Certificate) {
				c.NotBefore, c.NotAfter = time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour)
			})
		}, "expired"},
		{"another CA", func() tls.Certificate { return leaf(t, other, nil) }, "unknown authority"},
		{"two SPIFFE URIs", func() tls.Certificate {
			return leaf(t, e.ca, func(c *x509.Certificate) {
				c.URIs = uris(t, reloadClientID, "spiffe://cluster.local/ns/meshtun/sa/other")
			})
		}, "more than one URI SAN"},
		{"another trust domain", func() tls.Certificate {
			return leaf(t, e.ca, func(c *x509.Certificate) { c.URIs = uris(t, "spiffe://evil.example/ns/meshtun/sa/node-a") })
		}, "evil.example"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := countLines(e.logs, "TLS handshake refused")
			// A plain TLS client: the pool refuses to present such a
			// certificate at all.
			d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 10 * time.Second},
				Config: hbone.ClientConfig(tc.cert(), e.ca.Pool(), []string{reloadServerID})}
			c, err := d.Dial("tcp", e.server.String())
			if err == nil {
				// TLS 1.3: the client may finish first; the server's alert
				// then ends the connection at the first read.
				c.SetDeadline(time.Now().Add(10 * time.Second))
				_, err = c.Read(make([]byte, 1))
				c.Close()
			}
			if err == nil {
				t.Fatal("the gateway accepted the certificate")
			}
			waitLines(t, e.logs, "TLS handshake refused", before+1)
			if l := e.logs.lines("TLS handshake refused"); !bytes.Contains([]byte(l[len(l)-1]), []byte(tc.why)) {
				t.Errorf("the refusal's line does not say %q: %s", tc.why, l[len(l)-1])
			}
			if n := e.served.conns.Load(); n != 0 {
				t.Errorf("the target saw %d connections", n)
			}
		})
	}
}

// rawConnect sends one CONNECT with authority over a fresh mutual-TLS
// HTTP/2 connection and returns the response's status.
func rawConnect(t *testing.T, e *attackEnv, authority string) int {
	t.Helper()
	cert, err := e.ca.KeyPair(reloadClientID)
	if err != nil {
		t.Fatal(err)
	}
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 10 * time.Second},
		Config: hbone.ClientConfig(cert, e.ca.Pool(), []string{reloadServerID})}
	c, err := d.Dial("tcp", e.server.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fr := http2.NewFramer(c, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	io.WriteString(c, http2.ClientPreface)
	fr.WriteSettings()
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	enc.WriteField(hpack.HeaderField{Name: ":method", Value: "CONNECT"})
	enc.WriteField(hpack.HeaderField{Name: ":authority", Value: authority})
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	for range 100 {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("waiting for the answer to CONNECT %q: %v", authority, err)
		}
		if mh, ok := f.(*http2.MetaHeadersFrame); ok && mh.StreamID == 1 {
			status, _ := strconv.Atoi(mh.PseudoValue("status"))
			return status
		}
	}
	t.Fatalf("no answer to CONNECT %q in 100 frames", authority)
	return 0
}

func TestAttackConnects(t *testing.T) {
	e := newAttackEnv(t)
	for _, tc := range []struct {
		name      string
		authority func() string
		status    int
		line      string // the one line B writes about it
	}{
		{"the gateway's own port", func() string { return e.own.String() }, 503, "own ports"},
		{"a destination outside hbone.serve", func() string { return e.outside.addr.String() }, 503, "not in hbone.serve"},
		{"junk in the authority", func() string { return e.served.addr.String() + "/../x" }, 400, "CONNECT refused"},
		{"a host name", func() string { return "example.com:" + strconv.Itoa(int(e.served.addr.Port())) }, 400, "CONNECT refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := countLines(e.logs, tc.line)
			if got := rawConnect(t, e, tc.authority()); got != tc.status {
				t.Fatalf("status %d, want %d", got, tc.status)
			}
			waitLines(t, e.logs, tc.line, before+1)
			if n := e.served.conns.Load() + e.outside.conns.Load(); n != 0 {
				t.Errorf("the targets saw %d connections", n)
			}
		})
	}
}
