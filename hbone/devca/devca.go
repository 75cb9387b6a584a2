// Package devca makes a development certificate authority and SPIFFE
// workload certificates with crypto/x509, so that the demo, the tests and a
// first install need no other tool. It is not a production CA: keys are
// written to disk unencrypted and nothing is ever revoked.
package devca

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// Validity of what devca issues. Long enough for a development cluster,
// short enough that a leaked key does not live for ever.
const (
	CAValidity   = 5 * 365 * 24 * time.Hour
	LeafValidity = 365 * 24 * time.Hour
	// clockSkew back-dates NotBefore so peers with slightly slow clocks
	// accept a certificate issued a moment ago.
	clockSkew = time.Hour
)

// File names inside a certificate directory.
const (
	CAFile    = "ca.pem"
	CAKeyFile = "ca-key.pem"
)

// CA is a development certificate authority.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// New makes a CA for trustDomain, with a fresh P-256 key.
func New(trustDomain string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{Organization: []string{"meshtun development CA"}, CommonName: trustDomain},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("devca: create CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key}, nil
}

// Issue makes a key and a certificate for the SPIFFE ID id, usable both as
// an HBONE client and server (ztunnel's certificates are, too). It returns
// them PEM-encoded.
func (ca *CA) Issue(id string) (certPEM, keyPEM []byte, err error) {
	u, err := url.Parse(id)
	if err != nil || u.Scheme != "spiffe" || u.Host == "" {
		return nil, nil, fmt.Errorf("devca: %q is not a spiffe:// ID", id)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{Organization: []string{"meshtun development"}},
		NotBefore:    now.Add(-clockSkew),
		NotAfter:     now.Add(LeafValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{u},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("devca: issue %s: %w", id, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}

// KeyPair issues a certificate for id and returns it ready for crypto/tls.
func (ca *CA) KeyPair(id string) (tls.Certificate, error) {
	c, k, err := ca.Issue(id)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.X509KeyPair(c, k)
}

// Pool is a trust bundle holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// PEM is the CA certificate, PEM-encoded: the trust bundle.
func (ca *CA) PEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
}

// LoadOrCreate opens the CA kept in dir (ca.pem, ca-key.pem), or makes one
// for trustDomain and writes it there if dir holds none.
func LoadOrCreate(dir, trustDomain string) (ca *CA, created bool, err error) {
	certPath, keyPath := filepath.Join(dir, CAFile), filepath.Join(dir, CAKeyFile)
	certPEM, err := os.ReadFile(certPath)
	if errors.Is(err, os.ErrNotExist) {
		ca, err := New(trustDomain)
		if err != nil {
			return nil, false, err
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(ca.Key)
		if err != nil {
			return nil, false, err
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, false, err
		}
		if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
			return nil, false, err
		}
		if err := os.WriteFile(certPath, ca.PEM(), 0o644); err != nil {
			return nil, false, err
		}
		return ca, true, nil
	}
	if err != nil {
		return nil, false, err
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, false, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, false, fmt.Errorf("devca: %s: %w", dir, err)
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok || !pair.Leaf.IsCA {
		return nil, false, fmt.Errorf("devca: %s does not hold a CA", certPath)
	}
	return &CA{Cert: pair.Leaf, Key: signer}, false, nil
}

// WriteLeaf issues a certificate for id and writes <name>.pem and
// <name>-key.pem into dir. It returns the two paths.
func (ca *CA) WriteLeaf(dir, name, id string) (certPath, keyPath string, err error) {
	c, k, err := ca.Issue(id)
	if err != nil {
		return "", "", err
	}
	certPath, keyPath = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	if err := os.WriteFile(keyPath, k, 0o600); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(certPath, c, 0o644); err != nil {
		return "", "", err
	}
	return certPath, keyPath, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}
