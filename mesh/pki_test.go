package mesh

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// testServerName is the name on the test control plane's serving
// certificate, as istiod's carries istiod.istio-system.svc.
const testServerName = "istiod.istio-system.svc"

// waitFor bounds every wait of these tests.
const waitFor = 10 * time.Second

// testPKI is a root, an intermediate that signs workload certificates (as
// Istio's CA may run under an intermediate), and istiod's serving
// certificate, all made for the test.
type testPKI struct {
	root, inter       *x509.Certificate
	rootKey, interKey *ecdsa.PrivateKey
	rootFile          string
	serving           tls.Certificate
	serial            int64
	mu                sync.Mutex
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	p := &testPKI{}
	p.rootKey = newKey(t)
	p.root = p.issue(t, &x509.Certificate{
		Subject:               pkix.Name{CommonName: "test root"},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}, nil, nil, &p.rootKey.PublicKey, p.rootKey, time.Hour)
	p.interKey = newKey(t)
	p.inter = p.issue(t, &x509.Certificate{
		Subject:               pkix.Name{CommonName: "test intermediate"},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}, p.root, p.rootKey, &p.interKey.PublicKey, nil, time.Hour)

	servingKey := newKey(t)
	serving := p.issue(t, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "istiod"},
		DNSNames:    []string{testServerName},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, p.inter, p.interKey, &servingKey.PublicKey, nil, time.Hour)
	p.serving = tls.Certificate{Certificate: [][]byte{serving.Raw, p.inter.Raw}, PrivateKey: servingKey, Leaf: serving}

	p.rootFile = filepath.Join(t.TempDir(), "root-cert.pem")
	writeFile(t, p.rootFile, string(pemCert(p.root)))
	return p
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// issue signs tmpl with parent's key (self-signed when parent is nil, then
// with self).
func (p *testPKI) issue(t *testing.T, tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, pub *ecdsa.PublicKey, self *ecdsa.PrivateKey, ttl time.Duration) *x509.Certificate {
	t.Helper()
	p.mu.Lock()
	p.serial++
	tmpl.SerialNumber = big.NewInt(p.serial)
	p.mu.Unlock()
	if tmpl.NotBefore.IsZero() {
		tmpl.NotBefore = time.Now().Add(-time.Minute)
	}
	if tmpl.NotAfter.IsZero() {
		tmpl.NotAfter = time.Now().Add(ttl)
	}
	if parent == nil {
		parent, parentKey = tmpl, self
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func pemCert(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// serveGRPC serves a TLS gRPC server with the test PKI's serving
// certificate on ln until the test ends.
func serveGRPC(t *testing.T, p *testPKI, ln net.Listener, register func(*grpc.Server)) {
	t.Helper()
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{p.serving},
		MinVersion:   tls.VersionTLS12,
	})))
	register(srv)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// testControlPlane returns client options for addr with a token file
// holding token.
func testControlPlane(t *testing.T, p *testPKI, addr, token string) ControlPlane {
	t.Helper()
	tokenFile := filepath.Join(t.TempDir(), "istio-token")
	writeFile(t, tokenFile, token+"\n")
	return ControlPlane{
		Address:    addr,
		RootCert:   p.rootFile,
		ServerName: testServerName,
		TokenFile:  tokenFile,
		ClusterID:  "Kubernetes",
	}
}
