package hbone

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshtun/meshtun/hbone/devca"
)

// Certificate swaps through a CertSource, with real TLS on loopback: a
// new connection takes the certificate and roots in force, an open one
// keeps working, a source without a certificate fails handshakes cleanly
// and counted, and the pool key follows the source identity.

const srvTestOtherClientID = "spiffe://cluster.local/ns/default/sa/other"

// swapSource is a CertSource the test changes.
type swapSource struct {
	mu     sync.Mutex
	cert   *tls.Certificate
	roots  *x509.CertPool
	expiry time.Time
}

var _ CertSource = (*swapSource)(nil)

func (s *swapSource) Current() (*tls.Certificate, *x509.CertPool, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cert, s.roots, s.expiry
}

func (s *swapSource) set(cert *tls.Certificate, roots *x509.CertPool, expiry time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cert, s.roots, s.expiry = cert, roots, expiry
}

// put makes cert (with its own expiry) and roots the ones in force.
func (s *swapSource) put(cert *tls.Certificate, roots *x509.CertPool) {
	s.set(cert, roots, cert.Leaf.NotAfter)
}

// sourceTestIssue issues a certificate for id from ca.
func sourceTestIssue(t *testing.T, ca *devca.CA, id string) *tls.Certificate {
	t.Helper()
	c, err := ca.KeyPair(id)
	if err != nil {
		t.Fatal(err)
	}
	return &c
}

// sourceTestPeer is what the server saw of one CONNECT's client.
type sourceTestPeer struct{ id, serial string }

// sourceTestEnv is a server and a pool on loopback, each over a
// swapSource, the server echoing every stream.
type sourceTestEnv struct {
	ca             *devca.CA
	srv            *srvTestEnv
	pool           *Pool
	srvSrc, cliSrc *swapSource
	srvCert        *tls.Certificate
	cliCert        *tls.Certificate
	peers          chan sourceTestPeer // one per CONNECT the server handled
}

func newSourceTest(t *testing.T, editPool func(*PoolOptions)) *sourceTestEnv {
	t.Helper()
	ca, err := srvTestCA()
	if err != nil {
		t.Fatal(err)
	}
	e := &sourceTestEnv{
		ca:      ca,
		srvSrc:  &swapSource{},
		cliSrc:  &swapSource{},
		srvCert: sourceTestIssue(t, ca, srvTestServerID),
		cliCert: sourceTestIssue(t, ca, srvTestClientID),
		peers:   make(chan sourceTestPeer, 16),
	}
	e.srvSrc.put(e.srvCert, ca.Pool())
	e.cliSrc.put(e.cliCert, ca.Pool())
	e.srv = newSrvTest(t, func(r *Request) {
		e.peers <- sourceTestPeer{id: r.PeerIdentity(), serial: connPeerSerial(r.st.c)}
		srvEcho(r)
	}, func(o *ServerOptions) {
		o.Certificate, o.Roots, o.Source = tls.Certificate{}, nil, e.srvSrc
	})
	e.pool = newClientTestPool(t, &clientTestPKI{ca: ca}, func(o *PoolOptions) {
		o.Certificate, o.Roots, o.Source = tls.Certificate{}, nil, e.cliSrc
		if editPool != nil {
			editPool(o)
		}
	})
	return e
}

// connect opens a stream and returns it with what the server saw of us.
func (e *sourceTestEnv) connect(t *testing.T) (*ClientStream, sourceTestPeer) {
	t.Helper()
	s, err := e.pool.Connect(clientCtx(t), srvRequest(e.srv, srvTestTarget))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, clientRecv(t, e.peers, "the server's handler")
}

// connPeerSerial is the serial number of the leaf the peer of c presented.
func connPeerSerial(c *h2Conn) string {
	tc, ok := c.tc.(*tls.Conn)
	if !ok {
		return ""
	}
	certs := tc.ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return ""
	}
	return certs[0].SerialNumber.String()
}

func serialOf(c *tls.Certificate) string { return c.Leaf.SerialNumber.String() }

// sourceEcho writes msg on s and reads it back from the echoing server,
// bounded by clientTestWait.
func sourceEcho(t *testing.T, s *ClientStream, msg string) {
	t.Helper()
	if _, err := s.Write([]byte(msg)); err != nil {
		t.Fatalf("write %q: %v", msg, err)
	}
	type result struct {
		got string
		err error
	}
	done := make(chan result, 1)
	go func() {
		buf := make([]byte, len(msg))
		_, err := io.ReadFull(s, buf)
		done <- result{string(buf), err}
	}()
	r := clientRecv(t, done, "the echo of "+msg)
	if r.err != nil || r.got != msg {
		t.Fatalf("echo of %q: got %q, %v", msg, r.got, r.err)
	}
}

// Both sides swap certificates: the next connection presents the new
// ones both ways (checked by serial number), and a stream of the
// connection made before the swap keeps carrying data.
func TestSourceSwapNewConnections(t *testing.T) {
	// One stream per connection, so the second flow needs a new one while
	// the first stays open.
	e := newSourceTest(t, func(o *PoolOptions) { o.MaxStreamsPerConn = 1 })

	s1, peer1 := e.connect(t)
	sourceEcho(t, s1, "before the swap")
	if got, want := connPeerSerial(s1.pc.cc), serialOf(e.srvCert); got != want {
		t.Fatalf("first connection: server presented serial %s, want %s", got, want)
	}
	if want := serialOf(e.cliCert); peer1.serial != want {
		t.Fatalf("first connection: client presented serial %s, want %s", peer1.serial, want)
	}

	srvNew := sourceTestIssue(t, e.ca, srvTestServerID)
	cliNew := sourceTestIssue(t, e.ca, srvTestClientID)
	e.srvSrc.put(srvNew, e.ca.Pool())
	e.cliSrc.put(cliNew, e.ca.Pool())

	s2, peer2 := e.connect(t)
	if s2.pc == s1.pc {
		t.Fatal("second flow shared the first connection despite MaxStreamsPerConn 1")
	}
	if got, want := connPeerSerial(s2.pc.cc), serialOf(srvNew); got != want {
		t.Errorf("after the swap: server presented serial %s, want the new %s", got, want)
	}
	if want := serialOf(cliNew); peer2.serial != want {
		t.Errorf("after the swap: client presented serial %s, want the new %s", peer2.serial, want)
	}
	sourceEcho(t, s2, "on the new connection")
	sourceEcho(t, s1, "on the old connection after the swap")

	if st := e.pool.Stats(); st.ConnsOpened != 2 || st.DialsFailed != 0 {
		t.Errorf("pool stats %+v, want 2 connections opened, no dial failed", st)
	}
	if st := e.srv.srv.Stats(); st.ConnsAccepted != 2 || st.HandshakeFailures != 0 {
		t.Errorf("server stats %+v, want 2 connections accepted, no handshake failure", st)
	}
}

// The server checks a new client against the roots in force at its
// handshake: roots without our CA refuse new connections (counted),
// the open one keeps working, and roots with it again let them in.
func TestSourceServerRootsSwap(t *testing.T) {
	e := newSourceTest(t, func(o *PoolOptions) { o.MaxStreamsPerConn = 1 })
	s1, _ := e.connect(t)

	other, err := devca.New(srvTestDomain)
	if err != nil {
		t.Fatal(err)
	}
	e.srvSrc.put(e.srvCert, other.Pool())
	if _, err := e.pool.Connect(clientCtx(t), srvRequest(e.srv, srvTestTarget)); err == nil {
		t.Fatal("a client of a CA no longer in the server's roots connected")
	}
	poolWaitFor(t, func() bool { return e.srv.srv.Stats().HandshakeFailures == 1 })
	sourceEcho(t, s1, "open connection after the roots changed")

	both := other.Pool()
	both.AddCert(e.ca.Cert)
	e.srvSrc.put(e.srvCert, both)
	s3, _ := e.connect(t)
	sourceEcho(t, s3, "with both CAs in the roots")
	if st := e.pool.Stats(); st.DialsFailed != 1 || st.ConnsOpened != 2 {
		t.Errorf("pool stats %+v, want 1 dial failed and 2 connections opened", st)
	}
}

// A source with no usable certificate fails new handshakes with
// ErrNoCertificate, counted, and nothing else breaks: open streams keep
// working and the next certificate is used at once.
func TestSourceNoCertificate(t *testing.T) {
	t.Run("client", func(t *testing.T) {
		e := newSourceTest(t, func(o *PoolOptions) { o.MaxStreamsPerConn = 1 })
		s1, _ := e.connect(t)
		cases := []struct {
			name string
			set  func()
			want string
		}{
			{"none", func() { e.cliSrc.set(nil, e.ca.Pool(), time.Time{}) }, "none issued"},
			{"expired", func() { e.cliSrc.set(e.cliCert, e.ca.Pool(), time.Now().Add(-time.Minute)) }, "expired at"},
			{"no roots", func() { e.cliSrc.set(e.cliCert, nil, e.cliCert.Leaf.NotAfter) }, "no trust bundle"},
		}
		for i, c := range cases {
			c.set()
			_, err := e.pool.Connect(clientCtx(t), srvRequest(e.srv, srvTestTarget))
			if !errors.Is(err, ErrNoCertificate) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%s: Connect error %v, want ErrNoCertificate saying %q", c.name, err, c.want)
			}
			if got := e.pool.Stats().DialsFailed; got != uint64(i+1) {
				t.Fatalf("%s: DialsFailed = %d, want %d", c.name, got, i+1)
			}
		}
		if st := e.srv.srv.Stats(); st.ConnsAccepted != 1 || st.HandshakeFailures != 0 {
			t.Errorf("server stats %+v: the failed dials reached it", st)
		}
		sourceEcho(t, s1, "open stream while the source is empty")

		e.cliSrc.put(e.cliCert, e.ca.Pool())
		s2, _ := e.connect(t)
		sourceEcho(t, s2, "certificate back")
	})
	t.Run("server", func(t *testing.T) {
		e := newSourceTest(t, func(o *PoolOptions) { o.MaxStreamsPerConn = 1 })
		s1, _ := e.connect(t)
		e.srvSrc.set(nil, nil, time.Time{})
		if _, err := e.pool.Connect(clientCtx(t), srvRequest(e.srv, srvTestTarget)); err == nil {
			t.Fatal("connected to a server with no certificate")
		}
		poolWaitFor(t, func() bool { return e.srv.srv.Stats().HandshakeFailures == 1 })
		if got := e.pool.Stats().DialsFailed; got != 1 {
			t.Errorf("DialsFailed = %d, want 1", got)
		}
		sourceEcho(t, s1, "open stream while the server's source is empty")

		e.srvSrc.put(e.srvCert, e.ca.Pool())
		s2, _ := e.connect(t)
		sourceEcho(t, s2, "server certificate back")
	})
}

// The source identity is part of the pool key, read from the certificate
// in force when a flow starts: after an identity change a flow gets a
// connection of its own and the server sees the new identity; a renewal
// of the same identity keeps sharing.
func TestSourceIdentityChange(t *testing.T) {
	e := newSourceTest(t, nil)
	s1, peer := e.connect(t)
	if peer.id != srvTestClientID {
		t.Fatalf("server saw %s, want %s", peer.id, srvTestClientID)
	}
	first := s1.pc
	s1.Close() // the connection stays, idle, with room for more

	other := sourceTestIssue(t, e.ca, srvTestOtherClientID)
	e.cliSrc.put(other, e.ca.Pool())
	s2, peer := e.connect(t)
	if s2.pc == first {
		t.Fatal("a flow of the new identity rode the connection made under the old one")
	}
	if peer.id != srvTestOtherClientID {
		t.Errorf("after the identity change the server saw %s, want %s", peer.id, srvTestOtherClientID)
	}

	renewed := sourceTestIssue(t, e.ca, srvTestClientID)
	e.cliSrc.put(renewed, e.ca.Pool())
	s3, peer := e.connect(t)
	if s3.pc != first || peer.id != srvTestClientID {
		t.Errorf("a renewed certificate of the first identity: shared the first connection %v, server saw %s",
			s3.pc == first, peer.id)
	}
	sourceEcho(t, s3, "renewed")
	if got := e.pool.Stats().ConnsOpened; got != 2 {
		t.Errorf("ConnsOpened = %d, want 2 (one per identity)", got)
	}
}

// Source and the static fields are one or the other; with Source, no
// certificate is needed at construction (the CA may not have issued one
// yet).
func TestSourceOptions(t *testing.T) {
	ca, err := srvTestCA()
	if err != nil {
		t.Fatal(err)
	}
	cert := sourceTestIssue(t, ca, srvTestClientID)
	empty := &swapSource{}
	handler := func(r *Request) { r.Reject(503) }

	if _, err := NewPool(PoolOptions{Source: empty, Certificate: *cert}); err == nil {
		t.Error("NewPool took Source and Certificate together")
	}
	if _, err := NewServer(ServerOptions{Source: empty, Roots: ca.Pool(), TrustDomain: srvTestDomain, Handler: handler}); err == nil {
		t.Error("NewServer took Source and Roots together")
	}
	if _, err := NewServer(ServerOptions{TrustDomain: srvTestDomain, Handler: handler}); err == nil ||
		!strings.Contains(err.Error(), "Certificate: missing") || !strings.Contains(err.Error(), "Roots: missing") {
		t.Errorf("NewServer without certificate or source: %v, want both fields named", err)
	}
	p, err := NewPool(PoolOptions{Source: empty})
	if err != nil {
		t.Fatalf("NewPool with an empty source: %v", err)
	}
	p.Close()
	if _, err := NewServer(ServerOptions{Source: empty, TrustDomain: srvTestDomain, Handler: handler}); err != nil {
		t.Errorf("NewServer with an empty source: %v", err)
	}
}
