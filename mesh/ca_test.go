package mesh

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	pb "istio.io/api/security/v1alpha1"
)

// noLeaks checks, after the test's other cleanups, that its goroutines
// are gone.
func noLeaks(t *testing.T) {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
}

// caCall is what the fake CA saw of one CreateCertificate call.
type caCall struct {
	at            time.Time
	authorization []string
	clusterID     []string
	csr           *x509.CertificateRequest
	ttl           int64
	failed        bool
	leaf          *x509.Certificate
}

// fakeCA implements IstioCertificateService over the test PKI: it signs the
// CSR's key with the intermediate, for the CSR's URIs (Istio's CA takes the
// identity from the caller's token; the test checks the CSR separately).
type fakeCA struct {
	pb.UnimplementedIstioCertificateServiceServer
	t   *testing.T
	pki *testPKI

	calls chan caCall

	mu sync.Mutex
	// fail, when set, fails every call with this error.
	fail error
	// chain, when set, replaces the chain sent back.
	chain func(leaf *x509.Certificate) []string
	// edit, when set, changes the leaf's template before signing.
	edit func(*x509.Certificate)
	// hang, when set, holds every call until the caller gives up.
	hang bool
}

func (f *fakeCA) setFail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = err
}

func (f *fakeCA) CreateCertificate(ctx context.Context, req *pb.IstioCertificateRequest) (*pb.IstioCertificateResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	call := caCall{at: time.Now(), authorization: md.Get("authorization"), clusterID: md.Get("clusterid"), ttl: req.GetValidityDuration()}
	f.mu.Lock()
	fail, chainFn, edit, hang := f.fail, f.chain, f.edit, f.hang
	f.mu.Unlock()
	record := func() {
		select {
		case f.calls <- call:
		default:
			f.t.Errorf("fake CA: more calls than the test reads")
		}
	}
	block, _ := pem.Decode([]byte(req.GetCsr()))
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		record()
		return nil, status.Error(codes.InvalidArgument, "csr is not PEM")
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err == nil {
		err = csr.CheckSignature()
	}
	if err != nil {
		record()
		return nil, status.Errorf(codes.InvalidArgument, "csr: %v", err)
	}
	call.csr = csr
	if hang {
		call.failed = true
		record()
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if fail != nil {
		call.failed = true
		record()
		return nil, fail
	}
	tmpl := &x509.Certificate{
		URIs:        csr.URIs,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		NotBefore:   time.Now().Add(-time.Second),
		NotAfter:    time.Now().Add(time.Duration(req.GetValidityDuration()) * time.Second),
	}
	if edit != nil {
		edit(tmpl)
	}
	leaf := f.pki.issue(f.t, tmpl, f.pki.inter, f.pki.interKey, csr.PublicKey.(*ecdsa.PublicKey), nil, 0)
	call.leaf = leaf
	record()
	chain := []string{string(pemCert(leaf)), string(pemCert(f.pki.inter)), string(pemCert(f.pki.root))}
	if chainFn != nil {
		chain = chainFn(leaf)
	}
	return &pb.IstioCertificateResponse{CertChain: chain}, nil
}

func startCA(t *testing.T, p *testPKI) (*fakeCA, string) {
	t.Helper()
	ca := &fakeCA{t: t, pki: p, calls: make(chan caCall, 64)}
	ln := listen(t)
	serveGRPC(t, p, ln, func(s *grpc.Server) { pb.RegisterIstioCertificateServiceServer(s, ca) })
	return ca, ln.Addr().String()
}

func (f *fakeCA) next(t *testing.T) caCall {
	t.Helper()
	select {
	case c := <-f.calls:
		return c
	case <-time.After(waitFor):
		t.Fatal("no call reached the CA")
		return caCall{}
	}
}

func testCAOptions(t *testing.T, p *testPKI, addr string) CAOptions {
	return CAOptions{
		ControlPlane:   testControlPlane(t, p, addr, "token-1"),
		Namespace:      "vm",
		ServiceAccount: "vm-sa",
		CertTTL:        time.Hour,
	}
}

const testIdentity = "spiffe://cluster.local/ns/vm/sa/vm-sa"

// noCall fails the test if the CA has received a call; why says how a
// call would have come in.
func (ca *fakeCA) noCall(t *testing.T, why string) {
	t.Helper()
	select {
	case call := <-ca.calls:
		t.Fatalf("the CA was called %s: %+v", why, call)
	default:
	}
}

func newTestCAClient(t *testing.T, opts CAOptions) *CAClient {
	t.Helper()
	c, err := NewCAClient(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestCAFetchSendsCSRTokenAndClusterID(t *testing.T) {
	noLeaks(t)
	p := newTestPKI(t)
	ca, addr := startCA(t, p)
	opts := testCAOptions(t, p, addr)
	c := newTestCAClient(t, opts)

	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	cert, err := c.Fetch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	call := ca.next(t)

	// The CSR: exactly our SPIFFE URI, nothing else, a P-256 key.
	if n := len(call.csr.URIs); n != 1 || call.csr.URIs[0].String() != testIdentity {
		t.Errorf("csr URIs %v, want exactly [%s]", call.csr.URIs, testIdentity)
	}
	if len(call.csr.DNSNames)+len(call.csr.EmailAddresses)+len(call.csr.IPAddresses) != 0 {
		t.Errorf("csr has other SANs: %v %v %v", call.csr.DNSNames, call.csr.EmailAddresses, call.csr.IPAddresses)
	}
	pub, ok := call.csr.PublicKey.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		t.Errorf("csr key %T, want ECDSA P-256", call.csr.PublicKey)
	}
	if call.ttl != int64(time.Hour/time.Second) {
		t.Errorf("validity_duration %d, want 3600", call.ttl)
	}
	if got := strings.Join(call.authorization, ","); got != "Bearer token-1" {
		t.Errorf("authorization %q, want %q", got, "Bearer token-1")
	}
	if got := strings.Join(call.clusterID, ","); got != "Kubernetes" {
		t.Errorf("clusterid %q, want Kubernetes", got)
	}

	// The result: leaf + intermediate, our key, the root as trust root.
	if len(cert.TLS.Certificate) != 2 {
		t.Fatalf("tls chain has %d certificates, want leaf and intermediate", len(cert.TLS.Certificate))
	}
	if cert.TLS.Leaf.SerialNumber.Cmp(call.leaf.SerialNumber) != 0 {
		t.Error("leaf is not the one the CA issued")
	}
	key, ok := cert.TLS.PrivateKey.(*ecdsa.PrivateKey)
	if !ok || !key.PublicKey.Equal(pub) {
		t.Error("private key is not the one of the CSR")
	}
	if cert.Identity != testIdentity || !cert.NotAfter.Equal(call.leaf.NotAfter) {
		t.Errorf("identity %q expiry %v", cert.Identity, cert.NotAfter)
	}
	inter, err := x509.ParseCertificate(cert.TLS.Certificate[1])
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(inter)
	if _, err := cert.TLS.Leaf.Verify(x509.VerifyOptions{Roots: cert.Roots, Intermediates: pool}); err != nil {
		t.Errorf("leaf does not verify against the returned roots: %v", err)
	}
	if _, err := inter.Verify(x509.VerifyOptions{Roots: x509.NewCertPool()}); err == nil {
		t.Error("empty pool verified the intermediate: the check above proves nothing")
	}

	// The token is read again for the next call.
	writeFile(t, opts.ControlPlane.TokenFile, "token-2")
	if _, err := c.Fetch(ctx); err != nil {
		t.Fatal(err)
	}
	call2 := ca.next(t)
	if got := strings.Join(call2.authorization, ","); got != "Bearer token-2" {
		t.Errorf("after the token changed: authorization %q, want %q", got, "Bearer token-2")
	}
	if call2.csr.PublicKey.(*ecdsa.PublicKey).Equal(pub) {
		t.Error("second request reused the first key")
	}
}

func TestCAFetchRejectsBadAnswers(t *testing.T) {
	noLeaks(t)
	p := newTestPKI(t)
	ca, addr := startCA(t, p)
	c := newTestCAClient(t, testCAOptions(t, p, addr))
	other := newTestPKI(t)

	for _, tc := range []struct {
		name  string
		chain func(leaf *x509.Certificate) []string
		edit  func(*x509.Certificate)
		want  string
	}{
		{"empty chain", func(*x509.Certificate) []string { return nil }, nil, "0 elements"},
		{"leaf only", func(l *x509.Certificate) []string { return []string{string(pemCert(l))} }, nil, "1 elements"},
		{"garbage", func(*x509.Certificate) []string { return []string{"not pem", "nor this"} }, nil, "no PEM certificate"},
		{"other SAN", nil, func(c *x509.Certificate) {
			c.URIs = nil
			c.DNSNames = []string{"x.example"}
		}, "does not carry " + testIdentity},
		{"wrong root", func(l *x509.Certificate) []string {
			return []string{string(pemCert(l)), string(pemCert(p.inter)), string(pemCert(other.root))}
		}, nil, "does not verify"},
		{"wrong key", func(*x509.Certificate) []string {
			return []string{string(pemCert(p.serving.Leaf)), string(pemCert(p.inter)), string(pemCert(p.root))}
		}, nil, "does not hold the key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ca.mu.Lock()
			ca.chain, ca.edit = tc.chain, tc.edit
			ca.mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), waitFor)
			defer cancel()
			cert, err := c.Fetch(ctx)
			ca.next(t)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Fetch = %v, %v; want an error with %q", cert, err, tc.want)
			}
		})
	}
}

func TestCARefusesWrongServerName(t *testing.T) {
	noLeaks(t)
	p := newTestPKI(t)
	ca, addr := startCA(t, p)
	opts := testCAOptions(t, p, addr)
	opts.ControlPlane.ServerName = "not-istiod.example"
	c := newTestCAClient(t, opts)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	_, err := c.Fetch(ctx)
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("Fetch with the wrong server name = %v, want a certificate error", err)
	}
	ca.noCall(t, "through an unverified connection")
}

func TestCAMissingTokenFailsBeforeTheCall(t *testing.T) {
	noLeaks(t)
	p := newTestPKI(t)
	ca, addr := startCA(t, p)
	opts := testCAOptions(t, p, addr)
	opts.ControlPlane.TokenFile += ".missing"
	c := newTestCAClient(t, opts)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	_, err := c.Fetch(ctx)
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "read token") {
		t.Fatalf("Fetch without a token = %v, want Unauthenticated reading the token", err)
	}
	ca.noCall(t, "without a token")
}

func TestCAOptionsChecked(t *testing.T) {
	p := newTestPKI(t)
	good := func() CAOptions { return testCAOptions(t, p, "127.0.0.1:1") }
	for _, tc := range []struct {
		name string
		edit func(*CAOptions)
		want string
	}{
		{"no address", func(o *CAOptions) { o.ControlPlane.Address = "" }, "address is required"},
		{"bad address", func(o *CAOptions) { o.ControlPlane.Address = "istiod" }, "not host:port"},
		{"no root", func(o *CAOptions) { o.ControlPlane.RootCert = "" }, "root certificate file is required"},
		{"missing root", func(o *CAOptions) { o.ControlPlane.RootCert += ".missing" }, "read root certificate"},
		{"empty root", func(o *CAOptions) { o.ControlPlane.RootCert = o.ControlPlane.TokenFile }, "no PEM certificate"},
		{"no namespace", func(o *CAOptions) { o.Namespace = "" }, "namespace is required"},
		{"slash in sa", func(o *CAOptions) { o.ServiceAccount = "a/b" }, "not a valid SPIFFE path segment"},
		{"short ttl", func(o *CAOptions) { o.CertTTL = time.Millisecond }, "shorter than a second"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := good()
			tc.edit(&o)
			c, err := NewCAClient(o)
			if err == nil {
				_ = c.Close()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "ca: ") {
				t.Fatalf("NewCAClient = %v, want an error with %q", err, tc.want)
			}
		})
	}
	o := good()
	o.ControlPlane.ServerName = ""
	o.TrustDomain = ""
	c, err := NewCAClient(o)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Identity() != testIdentity {
		t.Errorf("default trust domain: identity %q", c.Identity())
	}
}

// startedCertManager starts a CertManager on opts with a subscriber and
// waits for its first certificate.
func startedCertManager(t *testing.T, opts CAOptions) (*CertManager, <-chan struct{}) {
	t.Helper()
	m := newTestCertManager(t, opts)
	updates, cancel := m.Subscribe()
	t.Cleanup(cancel)
	m.Start()
	waitSignal(t, updates, "first certificate")
	return m, updates
}

func newTestCertManager(t *testing.T, opts CAOptions) *CertManager {
	t.Helper()
	m, err := NewCertManager(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := m.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
	})
	return m
}

func waitSignal(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case _, ok := <-ch:
		if !ok {
			t.Fatalf("%s: channel closed", what)
		}
	case <-time.After(waitFor):
		t.Fatalf("%s: nothing within %v", what, waitFor)
	}
}

func TestCertManagerRenewsAtHalfLife(t *testing.T) {
	noLeaks(t)
	p := newTestPKI(t)
	ca, addr := startCA(t, p)
	opts := testCAOptions(t, p, addr)
	opts.CertTTL = 3 * time.Second
	m := newTestCertManager(t, opts)
	updates, cancel := m.Subscribe()
	defer cancel()
	if c, _, _ := m.Current(); c != nil {
		t.Fatal("a certificate before Start")
	}
	m.Start()

	waitSignal(t, updates, "first certificate")
	select {
	case <-m.Ready():
	default:
		t.Fatal("Ready not closed with the first certificate")
	}
	first := ca.next(t)
	cert, roots, expiry := m.Current()
	if cert == nil || roots == nil || cert.Leaf.SerialNumber.Cmp(first.leaf.SerialNumber) != 0 || !expiry.Equal(first.leaf.NotAfter) {
		t.Fatalf("Current after the first issuance: %v %v %v", cert, roots, expiry)
	}

	waitSignal(t, updates, "renewal")
	second := ca.next(t)
	cert, _, expiry = m.Current()
	if cert.Leaf.SerialNumber.Cmp(second.leaf.SerialNumber) != 0 || !expiry.Equal(second.leaf.NotAfter) {
		t.Fatal("Current is not the renewed certificate")
	}
	// Renewal waits for half the remaining life, less at most the jitter.
	life := first.leaf.NotAfter.Sub(first.at)
	if earliest := first.at.Add(time.Duration(float64(life/2) * (1 - renewJitter))); second.at.Before(earliest) {
		t.Errorf("renewed at %v, before half-life (earliest %v)", second.at, earliest)
	}
	s := m.Stats()
	if s.Renewals != 2 || s.RenewalFailures != 0 || s.Identity != testIdentity || !s.Expiry.Equal(second.leaf.NotAfter) {
		t.Errorf("stats %+v", s)
	}
}

func TestCertManagerKeepsOldCertAndBacksOff(t *testing.T) {
	noLeaks(t)
	p := newTestPKI(t)
	ca, addr := startCA(t, p)
	opts := testCAOptions(t, p, addr)
	opts.CertTTL = 2 * time.Second
	opts.MinBackoff = 40 * time.Millisecond
	opts.MaxBackoff = 160 * time.Millisecond
	m, updates := startedCertManager(t, opts)
	first := ca.next(t)
	ca.setFail(status.Error(codes.Unavailable, "ca is down"))

	// Failed renewals: the old certificate stays, the delays grow.
	var prev time.Time
	for i := range 5 {
		call := ca.next(t)
		if !call.failed {
			t.Fatalf("call %d succeeded", i)
		}
		if i > 0 {
			// The i-th retry waits at least half of min(Min*2^(i-1), Max).
			least := min(opts.MinBackoff<<(i-1), opts.MaxBackoff) / 2
			if gap := call.at.Sub(prev); gap < least {
				t.Errorf("retry %d came %v after the last, want at least %v", i, gap, least)
			}
		}
		prev = call.at
		cert, _, exp := m.Current()
		if cert == nil && time.Now().Before(first.leaf.NotAfter) {
			t.Fatalf("failed renewal %d dropped the certificate in force", i)
		}
		if cert != nil && (cert.Leaf.SerialNumber.Cmp(first.leaf.SerialNumber) != 0 || !exp.Equal(first.leaf.NotAfter)) {
			t.Fatalf("failed renewal %d changed the certificate in force", i)
		}
	}
	ca.next(t) // the manager has recorded the fifth failure once it makes the sixth call
	s := m.Stats()
	if s.RenewalFailures < 5 || !strings.Contains(s.LastError, "ca is down") || !s.Expiry.Equal(first.leaf.NotAfter) {
		t.Errorf("stats after failures: %+v", s)
	}

	// At expiry the subscribers hear that there is no certificate in force.
	waitSignal(t, updates, "expiry")
	if cert, roots, exp := m.Current(); cert != nil || roots == nil || !exp.Equal(first.leaf.NotAfter) {
		t.Fatalf("after expiry Current = %v, %v, %v; want no certificate, the roots, the old expiry", cert, roots, exp)
	}
	if m.Certificate() == nil {
		t.Error("Certificate() dropped the expired certificate")
	}

	// The CA comes back: a new certificate.
	ca.setFail(nil)
	var renewed caCall
	for range 64 {
		if renewed = ca.next(t); !renewed.failed {
			break
		}
	}
	waitSignal(t, updates, "certificate after recovery")
	cert, _, _ := m.Current()
	if cert == nil || cert.Leaf.SerialNumber.Cmp(renewed.leaf.SerialNumber) != 0 {
		t.Fatal("no new certificate after the CA recovered")
	}
	if s := m.Stats(); s.LastError != "" || s.Renewals != 2 {
		t.Errorf("stats after recovery: %+v", s)
	}
}

func TestCertManagerCloseWithCADown(t *testing.T) {
	noLeaks(t)
	p := newTestPKI(t)
	ln := listen(t)
	addr := ln.Addr().String()
	ln.Close() // nothing listens: every request fails to connect
	m := newTestCertManager(t, testCAOptions(t, p, addr))
	updates, cancel := m.Subscribe()
	defer cancel()
	m.Start()
	closed := make(chan error, 1)
	go func() { closed <- m.Close() }()
	select {
	case <-closed:
	case <-time.After(waitFor):
		t.Fatal("Close hung while the CA was down")
	}
	select {
	case _, ok := <-updates:
		if ok {
			t.Fatal("a certificate from a CA that is down")
		}
	case <-time.After(waitFor):
		t.Fatal("Close did not close the subscription")
	}
	if c, _, _ := m.Current(); c != nil {
		t.Fatal("a certificate from a CA that is down")
	}
	select {
	case <-m.Ready():
		t.Fatal("Ready closed without a certificate")
	default:
	}
}

// An element may hold more than one certificate: the leaf with its
// intermediate in one, the intermediate and the root in the next (a
// plugged-in CA chain), several roots in the last (a root rotation).
func TestParseChainElementsWithSeveralCertificates(t *testing.T) {
	p := newTestPKI(t)
	other := newTestPKI(t)
	key := newKey(t)
	leaf := p.issue(t, &x509.Certificate{URIs: mustURIs(t, testIdentity)}, p.inter, p.interKey, &key.PublicKey, nil, time.Hour)
	chain := []string{
		string(pemCert(leaf)) + string(pemCert(p.inter)),
		string(pemCert(p.inter)) + string(pemCert(p.root)), // as Istio's CA sends a plugged-in chain
		string(pemCert(other.root)) + string(pemCert(p.root)),
	}
	cert, err := parseChain(chain, key, testIdentity, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(cert.TLS.Certificate) != 2 || !bytes.Equal(cert.TLS.Certificate[1], p.inter.Raw) {
		t.Errorf("tls chain of %d, want the leaf and the intermediate once, without the root", len(cert.TLS.Certificate))
	}
	otherLeaf := other.issue(t, &x509.Certificate{}, other.root, other.rootKey, &key.PublicKey, nil, time.Hour)
	if _, err := otherLeaf.Verify(x509.VerifyOptions{Roots: cert.Roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Errorf("the second root of the last element is not trusted: %v", err)
	}
	if _, err := parseChain([]string{chain[0], "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"}, key, testIdentity, time.Now()); err == nil || !strings.Contains(err.Error(), "want CERTIFICATE") {
		t.Errorf("a key in the chain: %v", err)
	}
	if _, err := parseChain(chain, key, testIdentity, leaf.NotAfter.Add(time.Second)); err == nil {
		t.Error("an expired leaf was accepted")
	}
}

func mustURIs(t *testing.T, s ...string) []*url.URL {
	t.Helper()
	var out []*url.URL
	for _, x := range s {
		u, err := url.Parse(x)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, u)
	}
	return out
}

// The expiry is announced when it happens, not at the next retry.
func TestCertManagerAnnouncesExpiryBetweenRetries(t *testing.T) {
	noLeaks(t)
	p := newTestPKI(t)
	ca, addr := startCA(t, p)
	opts := testCAOptions(t, p, addr)
	opts.CertTTL = 2 * time.Second
	// Retries at least 20 s apart: longer than the wait below, so only the
	// expiry can wake the subscriber.
	opts.MinBackoff, opts.MaxBackoff = 40*time.Second, 40*time.Second
	m, updates := startedCertManager(t, opts)
	first := ca.next(t)
	ca.setFail(status.Error(codes.Unavailable, "ca is down"))
	if call := ca.next(t); !call.failed {
		t.Fatal("renewal did not fail")
	}
	waitSignal(t, updates, "expiry")
	if time.Now().Before(first.leaf.NotAfter) {
		t.Fatal("announced before the expiry")
	}
	if cert, _, _ := m.Current(); cert != nil {
		t.Fatal("Current returns the expired certificate")
	}
	if s := m.Stats(); s.RenewalFailures != 1 || !s.NextAttempt.After(first.leaf.NotAfter) {
		t.Errorf("stats %+v", s)
	}
}

// The root file is read again for a new connection: a rotated root is
// trusted without a new client.
func TestCARootFileRotation(t *testing.T) {
	noLeaks(t)
	trusted, serving := newTestPKI(t), newTestPKI(t)
	ca, addr := startCA(t, serving)
	opts := testCAOptions(t, trusted, addr)
	c := newTestCAClient(t, opts)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if _, err := c.Fetch(ctx); err == nil || !strings.Contains(err.Error(), "control plane certificate") {
		t.Fatalf("Fetch from a server of an untrusted root = %v", err)
	}

	writeFile(t, opts.ControlPlane.RootCert, string(pemCert(serving.root)))
	// gRPC waits out its reconnect backoff (here at most a few hundred
	// milliseconds) before the next handshake; calls fail fast meanwhile.
	var err error
	deadline := time.Now().Add(waitFor)
	for {
		if _, err = c.Fetch(ctx); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("Fetch after the root rotation: %v", err)
	}
	ca.next(t)
}

// ControlPlane.Control is applied to the socket of every connection (the
// gateway marks them to bypass its own TUN), and a Control that fails
// fails the call instead of connecting unmarked.
func TestControlPlaneSocketControl(t *testing.T) {
	noLeaks(t)
	p := newTestPKI(t)
	_, addr := startCA(t, p)

	var calls atomic.Int32
	opts := testCAOptions(t, p, addr)
	opts.ControlPlane.Control = func(network, address string, c syscall.RawConn) error {
		calls.Add(1)
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if _, err := newTestCAClient(t, opts).Fetch(ctx); err != nil {
		t.Fatal(err)
	}
	if calls.Load() == 0 {
		t.Error("Control was not called on the connection's socket")
	}

	opts.ControlPlane.Control = func(network, address string, c syscall.RawConn) error {
		return errors.New("mark refused")
	}
	ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := newTestCAClient(t, opts).Fetch(ctx); err == nil {
		t.Error("a Fetch whose socket Control failed succeeded")
	}
}

// istiod refusing the token: the error keeps the code and says which
// token file was refused (istiod's message names none).
func TestCARefusedTokenNamesTheFile(t *testing.T) {
	noLeaks(t)
	p := newTestPKI(t)
	ca, addr := startCA(t, p)
	ca.setFail(status.Error(codes.Unauthenticated, "request authenticate failure"))
	opts := testCAOptions(t, p, addr)
	c := newTestCAClient(t, opts)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	_, err := c.Fetch(ctx)
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "refused the token in "+opts.ControlPlane.TokenFile) {
		t.Fatalf("Fetch with a refused token = %v, want Unauthenticated naming %s", err, opts.ControlPlane.TokenFile)
	}
}

// A CA that takes the call and never answers: each call ends at
// CallTimeout as a failed request, retried with backoff, and the
// certificate in force stays; once the CA answers again, the next one is
// issued.
func TestCertManagerCACallTimesOut(t *testing.T) {
	noLeaks(t)
	p := newTestPKI(t)
	ca, addr := startCA(t, p)
	opts := testCAOptions(t, p, addr)
	// The first renewal comes at about half the TTL: long enough that a
	// test descheduled on a loaded machine still sets hang before it.
	opts.CertTTL = 10 * time.Second
	opts.CallTimeout = 100 * time.Millisecond
	opts.MinBackoff, opts.MaxBackoff = 20*time.Millisecond, 80*time.Millisecond
	m, updates := startedCertManager(t, opts)
	ca.mu.Lock()
	ca.hang = true
	ca.mu.Unlock()
	first := ca.next(t)

	for i := range 3 {
		if call := ca.next(t); !call.failed {
			t.Fatalf("call %d was answered", i)
		}
	}
	ca.next(t) // the third has ended as a failure once the fourth comes
	s := m.Stats()
	if s.RenewalFailures < 3 || !strings.Contains(s.LastError, "DeadlineExceeded") {
		t.Errorf("stats after calls that ran out: %+v", s)
	}
	if cert, _, _ := m.Current(); time.Now().Before(first.leaf.NotAfter) &&
		(cert == nil || cert.Leaf.SerialNumber.Cmp(first.leaf.SerialNumber) != 0) {
		t.Fatal("calls that ran out changed the certificate in force")
	}

	ca.mu.Lock()
	ca.hang = false
	ca.mu.Unlock()
	var renewed caCall
	for range 64 {
		if renewed = ca.next(t); !renewed.failed {
			break
		}
	}
	if renewed.failed {
		t.Fatal("the CA answered again but every call failed")
	}
	deadline := time.Now().Add(waitFor)
	for {
		if cert, _, _ := m.Current(); cert != nil && cert.Leaf.SerialNumber.Cmp(renewed.leaf.SerialNumber) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the certificate the CA issued after the timeouts is not in force")
		}
		select {
		case <-updates:
		case <-time.After(10 * time.Millisecond):
		}
	}
}
