package hbone

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/meshtun/meshtun/hbone/devca"
	"github.com/meshtun/meshtun/identity"
)

// The TLS rules of docs/hbone.md ("TLS and identity"), each with a handshake that
// breaks it. checkProtocol is also tested alone, for what Go cannot be
// made to negotiate (ChaCha20 in TLS 1.3, a server picking http/1.1).

func TestTLSCheckProtocol(t *testing.T) {
	ok := tls.ConnectionState{Version: tls.VersionTLS13, CipherSuite: tls.TLS_AES_128_GCM_SHA256, NegotiatedProtocol: "h2"}
	tests := []struct {
		name string
		edit func(*tls.ConnectionState)
		ok   bool
	}{
		{"TLS 1.3 AES-128-GCM h2", func(*tls.ConnectionState) {}, true},
		{"AES-256-GCM", func(cs *tls.ConnectionState) { cs.CipherSuite = tls.TLS_AES_256_GCM_SHA384 }, true},
		{"ChaCha20", func(cs *tls.ConnectionState) { cs.CipherSuite = tls.TLS_CHACHA20_POLY1305_SHA256 }, false},
		{"TLS 1.2", func(cs *tls.ConnectionState) {
			cs.Version, cs.CipherSuite = tls.VersionTLS12, tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
		}, false},
		{"no ALPN", func(cs *tls.ConnectionState) { cs.NegotiatedProtocol = "" }, false},
		{"http/1.1", func(cs *tls.ConnectionState) { cs.NegotiatedProtocol = "http/1.1" }, false},
		{"h2c", func(cs *tls.ConnectionState) { cs.NegotiatedProtocol = "h2c" }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cs := ok
			tt.edit(&cs)
			err := checkProtocol(cs)
			if tt.ok && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if !tt.ok && !errors.Is(err, ErrProtocol) {
				t.Fatalf("err = %v, want ErrProtocol", err)
			}
		})
	}
}

// tlsTestPKI is a CA of cluster.local with a client and a server leaf.
type tlsTestPKI struct {
	ca             *devca.CA
	client, server tls.Certificate
}

const (
	tlsTestDomain   = "cluster.local"
	tlsTestClientID = "spiffe://cluster.local/ns/app/sa/client"
	tlsTestServerID = "spiffe://cluster.local/ns/db/sa/server"
)

func newTLSTestPKI(t *testing.T) *tlsTestPKI {
	t.Helper()
	ca, err := devca.New(tlsTestDomain)
	if err != nil {
		t.Fatal(err)
	}
	p := &tlsTestPKI{ca: ca}
	if p.client, err = ca.KeyPair(tlsTestClientID); err != nil {
		t.Fatal(err)
	}
	if p.server, err = ca.KeyPair(tlsTestServerID); err != nil {
		t.Fatal(err)
	}
	return p
}

// tlsTestIssue signs a leaf with ca from a template edited by edit (no
// URI SAN, both usages, before edit).
func tlsTestIssue(t *testing.T, ca *devca.CA, edit func(*x509.Certificate)) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{Organization: []string{"meshtun test"}},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	edit(tmpl)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

func tlsTestURIs(t *testing.T, ids ...string) []*url.URL {
	var us []*url.URL
	for _, id := range ids {
		u, err := url.Parse(id)
		if err != nil {
			t.Fatal(err)
		}
		us = append(us, u)
	}
	return us
}

// tlsResult is what each side of a handshake saw.
type tlsResult struct {
	srvErr, cliErr     error
	srvState, cliState tls.ConnectionState
}

// tlsHandshake runs one handshake over loopback TCP and then one byte
// each way, which is where a TLS 1.3 server's refusal of the client's
// certificate shows up on the client. Bounded by clientTestWait.
func tlsHandshake(t *testing.T, srv, cli *tls.Config) tlsResult {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return tlsHandshakeOn(t, ln, srv, cli)
}

// tlsHandshakeOn is tlsHandshake on a given listener (a client's session
// cache is keyed by the server's address when there is no SNI).
func tlsHandshakeOn(t *testing.T, ln net.Listener, srv, cli *tls.Config) tlsResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clientTestWait)
	defer cancel()
	var r tlsResult
	done := make(chan struct{})
	go func() {
		defer close(done)
		raw, err := ln.Accept()
		if err != nil {
			r.srvErr = err
			return
		}
		defer raw.Close()
		raw.SetDeadline(time.Now().Add(clientTestWait))
		tc := tls.Server(raw, srv)
		if r.srvErr = tc.HandshakeContext(ctx); r.srvErr != nil {
			return
		}
		r.srvState = tc.ConnectionState()
		if _, r.srvErr = tc.Write([]byte{1}); r.srvErr != nil {
			return
		}
		_, r.srvErr = tc.Read(make([]byte, 1))
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.SetDeadline(time.Now().Add(clientTestWait))
	tc := tls.Client(raw, cli)
	r.cliErr = tc.HandshakeContext(ctx)
	if r.cliErr == nil {
		r.cliState = tc.ConnectionState()
		if _, r.cliErr = tc.Write([]byte{1}); r.cliErr == nil {
			_, r.cliErr = tc.Read(make([]byte, 1))
		}
	}
	raw.Close()
	<-done
	var ne net.Error
	if errors.As(r.srvErr, &ne) && ne.Timeout() || errors.As(r.cliErr, &ne) && ne.Timeout() {
		t.Fatalf("handshake timed out: server %v, client %v", r.srvErr, r.cliErr)
	}
	return r
}

// plainClient is a client with no HBONE checks of its own: it trusts
// anything, so only the server's rules can refuse it.
func plainClient(cert tls.Certificate) *tls.Config {
	return &tls.Config{
		Certificates:       []tls.Certificate{cert},
		InsecureSkipVerify: true,
		NextProtos:         []string{"h2"},
		MinVersion:         tls.VersionTLS12,
	}
}

// plainServer is a server with no HBONE checks of its own.
func plainServer(cert tls.Certificate) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		NextProtos:   []string{"h2"},
		ClientAuth:   tls.RequireAnyClientCert,
		MinVersion:   tls.VersionTLS12,
	}
}

func TestTLSGoodHandshake(t *testing.T) {
	p := newTLSTestPKI(t)
	r := tlsHandshake(t,
		ServerConfig(p.server, p.ca.Pool(), tlsTestDomain),
		ClientConfig(p.client, p.ca.Pool(), []string{tlsTestServerID}))
	if r.srvErr != nil || r.cliErr != nil {
		t.Fatalf("server %v, client %v", r.srvErr, r.cliErr)
	}
	cs := r.srvState
	if cs.Version != tls.VersionTLS13 || cs.NegotiatedProtocol != "h2" {
		t.Errorf("negotiated %s, ALPN %q", tls.VersionName(cs.Version), cs.NegotiatedProtocol)
	}
	if cs.ServerName != "" {
		t.Errorf("client sent SNI %q, want none", cs.ServerName)
	}
	if got := PeerIdentity(cs); got != tlsTestClientID {
		t.Errorf("server sees %q, want %q", got, tlsTestClientID)
	}
	if got := PeerIdentity(r.cliState); got != tlsTestServerID {
		t.Errorf("client sees %q, want %q", got, tlsTestServerID)
	}
}

// What our server refuses. Each client here does no checks of its own.
func TestTLSServerRefuses(t *testing.T) {
	p := newTLSTestPKI(t)
	other, err := devca.New(tlsTestDomain)
	if err != nil {
		t.Fatal(err)
	}
	rogue, err := other.KeyPair(tlsTestClientID)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := p.ca.KeyPair("spiffe://evil.example/ns/app/sa/client")
	if err != nil {
		t.Fatal(err)
	}
	// A certificate whose CN and DNS SAN look like an identity, but which
	// has no URI SAN: nothing to identify the client by.
	cnOnly := tlsTestIssue(t, p.ca, func(c *x509.Certificate) {
		c.Subject.CommonName = tlsTestClientID
		c.DNSNames = []string{"client.app.svc.cluster.local"}
	})
	serverAuthOnly := tlsTestIssue(t, p.ca, func(c *x509.Certificate) {
		c.URIs = tlsTestURIs(t, tlsTestClientID)
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	})
	tests := []struct {
		name string
		cli  func(*tls.Config)
	}{
		{"no client certificate", func(c *tls.Config) { c.Certificates = nil }},
		{"untrusted chain", func(c *tls.Config) { c.Certificates = []tls.Certificate{rogue} }},
		{"foreign trust domain", func(c *tls.Config) { c.Certificates = []tls.Certificate{foreign} }},
		{"CN and DNS only, no URI SAN", func(c *tls.Config) { c.Certificates = []tls.Certificate{cnOnly} }},
		{"no clientAuth usage", func(c *tls.Config) { c.Certificates = []tls.Certificate{serverAuthOnly} }},
		{"TLS 1.2 only", func(c *tls.Config) { c.MaxVersion = tls.VersionTLS12 }},
		{"no ALPN", func(c *tls.Config) { c.NextProtos = nil }},
		{"http/1.1 only", func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cli := plainClient(p.client)
			tt.cli(cli)
			r := tlsHandshake(t, ServerConfig(p.server, p.ca.Pool(), tlsTestDomain), cli)
			if r.srvErr == nil {
				t.Fatalf("server accepted the client (client saw %v)", r.cliErr)
			}
			if r.cliErr == nil {
				t.Fatal("client saw no refusal")
			}
			t.Logf("server: %v", r.srvErr)
		})
	}
	// The plain client itself is fine: the refusals above come from the
	// edits, not from the harness.
	if r := tlsHandshake(t, ServerConfig(p.server, p.ca.Pool(), tlsTestDomain), plainClient(p.client)); r.srvErr != nil || r.cliErr != nil {
		t.Fatalf("unedited plain client: server %v, client %v", r.srvErr, r.cliErr)
	}
}

// What our client refuses. Each server here does no checks of its own.
func TestTLSClientRefuses(t *testing.T) {
	p := newTLSTestPKI(t)
	other, err := devca.New(tlsTestDomain)
	if err != nil {
		t.Fatal(err)
	}
	rogue, err := other.KeyPair(tlsTestServerID)
	if err != nil {
		t.Fatal(err)
	}
	wrong, err := p.ca.KeyPair("spiffe://cluster.local/ns/db/sa/impostor")
	if err != nil {
		t.Fatal(err)
	}
	// CN and DNS SAN equal to the expected identity, URI SAN another:
	// only the URI counts.
	lookalike := tlsTestIssue(t, p.ca, func(c *x509.Certificate) {
		c.Subject.CommonName = tlsTestServerID
		c.DNSNames = []string{"server.db.svc.cluster.local"}
		c.URIs = tlsTestURIs(t, "spiffe://cluster.local/ns/db/sa/impostor")
	})
	clientAuthOnly := tlsTestIssue(t, p.ca, func(c *x509.Certificate) {
		c.URIs = tlsTestURIs(t, tlsTestServerID)
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	})
	tests := []struct {
		name string
		srv  func(*tls.Config)
		want error
	}{
		{"untrusted chain", func(c *tls.Config) { c.Certificates = []tls.Certificate{rogue} }, ErrUntrusted},
		{"wrong identity", func(c *tls.Config) { c.Certificates = []tls.Certificate{wrong} }, ErrWrongIdentity},
		{"CN and DNS match, URI does not", func(c *tls.Config) { c.Certificates = []tls.Certificate{lookalike} }, ErrWrongIdentity},
		{"no serverAuth usage", func(c *tls.Config) { c.Certificates = []tls.Certificate{clientAuthOnly} }, ErrUntrusted},
		{"server picks no ALPN", func(c *tls.Config) { c.NextProtos = nil }, ErrProtocol},
		{"TLS 1.2 only", func(c *tls.Config) { c.MaxVersion = tls.VersionTLS12 }, nil},
		{"http/1.1 only", func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := plainServer(p.server)
			tt.srv(srv)
			r := tlsHandshake(t, srv, ClientConfig(p.client, p.ca.Pool(), []string{tlsTestServerID}))
			if r.cliErr == nil {
				t.Fatal("client accepted the server")
			}
			if tt.want != nil && !errors.Is(r.cliErr, tt.want) {
				t.Fatalf("client error %v, want %v", r.cliErr, tt.want)
			}
			t.Logf("client: %v", r.cliErr)
		})
	}
	if r := tlsHandshake(t, plainServer(p.server), ClientConfig(p.client, p.ca.Pool(), []string{tlsTestServerID})); r.srvErr != nil || r.cliErr != nil {
		t.Fatalf("unedited plain server: server %v, client %v", r.srvErr, r.cliErr)
	}
}

// The client accepts a server presenting any one of the expected
// identities, among other URI SANs.
func TestTLSClientAnyExpectedIdentity(t *testing.T) {
	p := newTLSTestPKI(t)
	r := tlsHandshake(t, plainServer(p.server),
		ClientConfig(p.client, p.ca.Pool(), []string{"spiffe://cluster.local/ns/x/sa/y", tlsTestServerID}))
	if r.cliErr != nil {
		t.Fatalf("client refused a server presenting an expected identity: %v", r.cliErr)
	}
}

// A certificate with two URI SANs is no X.509-SVID: refused by both
// sides, even when one of its URIs is the identity expected.
func TestTLSRefusesTwoURIs(t *testing.T) {
	p := newTLSTestPKI(t)
	twoClient := tlsTestIssue(t, p.ca, func(c *x509.Certificate) {
		c.URIs = tlsTestURIs(t, tlsTestClientID, "spiffe://cluster.local/ns/app/sa/second")
	})
	r := tlsHandshake(t, ServerConfig(p.server, p.ca.Pool(), tlsTestDomain), plainClient(twoClient))
	if r.srvErr == nil || !errors.Is(r.srvErr, identity.ErrManyURIs) {
		t.Errorf("server: %v, want a refusal for two URI SANs", r.srvErr)
	}
	twoServer := tlsTestIssue(t, p.ca, func(c *x509.Certificate) {
		c.URIs = tlsTestURIs(t, "https://example.com/x", tlsTestServerID)
		c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	})
	r = tlsHandshake(t, plainServer(twoServer), ClientConfig(p.client, p.ca.Pool(), []string{tlsTestServerID}))
	if r.cliErr == nil || !errors.Is(r.cliErr, identity.ErrManyURIs) {
		t.Errorf("client: %v, want a refusal for two URI SANs", r.cliErr)
	}
}

// No session resumption either way: our server issues no tickets, and our
// client keeps no session cache (so even a server that issues tickets
// sees full handshakes). Both handshakes go to one address: Go keys its
// session cache by the server's address when there is no SNI.
func TestTLSNoResumption(t *testing.T) {
	p := newTLSTestPKI(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	t.Run("server issues no tickets", func(t *testing.T) {
		cli := plainClient(p.client)
		cli.ClientSessionCache = tls.NewLRUClientSessionCache(8)
		srv := ServerConfig(p.server, p.ca.Pool(), tlsTestDomain)
		for i := range 2 {
			r := tlsHandshakeOn(t, ln, srv, cli)
			if r.srvErr != nil || r.cliErr != nil {
				t.Fatalf("handshake %d: server %v, client %v", i, r.srvErr, r.cliErr)
			}
			if r.srvState.DidResume || r.cliState.DidResume {
				t.Fatalf("handshake %d resumed a session", i)
			}
		}
	})
	t.Run("client resumes nothing", func(t *testing.T) {
		srv := plainServer(p.server) // issues tickets
		cli := ClientConfig(p.client, p.ca.Pool(), []string{tlsTestServerID})
		for i := range 2 {
			r := tlsHandshakeOn(t, ln, srv, cli)
			if r.srvErr != nil || r.cliErr != nil {
				t.Fatalf("handshake %d: server %v, client %v", i, r.srvErr, r.cliErr)
			}
			if r.srvState.DidResume {
				t.Fatalf("handshake %d resumed a session", i)
			}
		}
	})
}

// The pool's dials send no SNI and offer exactly h2 (the ClientHello as
// the server saw it).
func TestTLSPoolClientHello(t *testing.T) {
	pki := newClientTestPKI(t)
	peer := newClientFramePeer(t, pki, nil)
	pool := newClientTestPool(t, pki, nil)
	s, err := pool.Connect(clientCtx(t), clientTestRequest(peer.addr))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	hello := clientRecv(t, peer.hellos, "the ClientHello")
	if hello.ServerName != "" {
		t.Errorf("SNI %q sent, want none", hello.ServerName)
	}
	if len(hello.SupportedProtos) != 1 || hello.SupportedProtos[0] != "h2" {
		t.Errorf("ALPN offered %q, want exactly [h2]", hello.SupportedProtos)
	}
	for _, v := range hello.SupportedVersions {
		if v != tls.VersionTLS13 {
			t.Errorf("offered %s, want TLS 1.3 only", tls.VersionName(v))
		}
	}
}
