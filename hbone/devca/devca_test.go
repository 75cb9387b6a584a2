package devca

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
)

func TestIssueChainsAndNamesTheIdentity(t *testing.T) {
	ca, err := New("cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.KeyPair("spiffe://cluster.local/ns/default/sa/web")
	if err != nil {
		t.Fatal(err)
	}
	leaf := pair.Leaf
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			t.Errorf("leaf does not verify for %v: %v", usage, err)
		}
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != "spiffe://cluster.local/ns/default/sa/web" {
		t.Errorf("URI SANs = %v", leaf.URIs)
	}
	other, _ := New("cluster.local")
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: other.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err == nil {
		t.Errorf("leaf verified against another CA")
	}
	if _, _, err := ca.Issue("https://example.com/x"); err == nil {
		t.Errorf("issued a certificate for a non-SPIFFE ID")
	}
}

func TestLoadOrCreateReusesTheCA(t *testing.T) {
	dir := t.TempDir()
	ca1, created, err := LoadOrCreate(dir, "cluster.local")
	if err != nil || !created {
		t.Fatalf("first call: created=%v err=%v", created, err)
	}
	certPath, keyPath, err := ca1.WriteLeaf(dir, "node-a", "spiffe://cluster.local/ns/meshtun/sa/node-a")
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(keyPath); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("key file mode: %v %v", fi.Mode(), err)
	}
	ca2, created, err := LoadOrCreate(dir, "ignored.example")
	if err != nil || created {
		t.Fatalf("second call: created=%v err=%v", created, err)
	}
	if !ca2.Cert.Equal(ca1.Cert) {
		t.Fatalf("second call made a new CA")
	}
	// A leaf written by the first CA verifies against the reloaded one.
	b, _ := os.ReadFile(certPath)
	blk, _ := pem.Decode(b)
	leaf, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: ca2.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Fatalf("leaf does not verify against the reloaded CA: %v", err)
	}
	// A directory whose ca.pem is not a CA is refused.
	bad := t.TempDir()
	os.WriteFile(filepath.Join(bad, CAFile), b, 0o644)
	os.WriteFile(filepath.Join(bad, CAKeyFile), mustRead(t, keyPath), 0o600)
	if _, _, err := LoadOrCreate(bad, "cluster.local"); err == nil {
		t.Fatalf("accepted a leaf certificate as a CA")
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
