package hbone

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/meshtun/meshtun/identity"
)

// CertSource supplies this side's certificate and the trust bundle that
// goes with it. The pool reads it once per new connection and the server
// once per TLS handshake, so a source whose Current changes swaps
// certificates for new connections while open ones keep theirs.
// *mesh.CertManager (Istio's CA) and *certfile.Source (files, reloaded
// when they change) implement it; PoolOptions.Certificate and
// ServerOptions.Certificate are a source that never changes.
type CertSource interface {
	// Current returns the certificate in force (nil when there is none:
	// not issued yet, or expired), the trust roots in force, and the
	// certificate's expiry (zero if unknown). A new certificate must come
	// as a new pointer: callers may keep the pointer and never expect
	// what it points to to change.
	Current() (*tls.Certificate, *x509.CertPool, time.Time)
}

// ErrNoCertificate is why a handshake fails while the CertSource holds no
// usable certificate of ours: none yet, an expired one, or no trust
// bundle. The pool counts such dials in DialsFailed, the server such
// handshakes in HandshakeFailures.
var ErrNoCertificate = errors.New("hbone: no certificate of ours in force")

// staticSource is the CertSource of the Certificate and Roots options.
type staticSource struct {
	cert  *tls.Certificate
	roots *x509.CertPool
	leaf  *x509.Certificate
}

var _ CertSource = (*staticSource)(nil)

// newStaticSource checks that cert has a key and a parsable leaf and
// that roots is set, and makes a source that always returns them.
func newStaticSource(cert tls.Certificate, roots *x509.CertPool) (*staticSource, error) {
	var errs []error
	if len(cert.Certificate) == 0 || cert.PrivateKey == nil {
		errs = append(errs, errors.New("Certificate: missing certificate or key"))
	}
	if roots == nil {
		errs = append(errs, errors.New("Roots: missing trust bundle"))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	leaf, err := certLeaf(&cert)
	if err != nil {
		return nil, fmt.Errorf("Certificate: %w", err)
	}
	return &staticSource{cert: &cert, roots: roots, leaf: leaf}, nil
}

func (s *staticSource) Current() (*tls.Certificate, *x509.CertPool, time.Time) {
	return s.cert, s.roots, s.leaf.NotAfter
}

// certLeaf returns cert's parsed leaf.
func certLeaf(cert *tls.Certificate) (*x509.Certificate, error) {
	if cert.Leaf != nil {
		return cert.Leaf, nil
	}
	if len(cert.Certificate) == 0 {
		return nil, errors.New("empty chain")
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("leaf: %w", err)
	}
	return leaf, nil
}

// inForce returns what src holds at now, or an error wrapping
// ErrNoCertificate that says what is missing.
func inForce(src CertSource, now time.Time) (*tls.Certificate, *x509.CertPool, error) {
	cert, roots, expiry := src.Current()
	switch {
	case cert == nil || len(cert.Certificate) == 0 || cert.PrivateKey == nil:
		return nil, nil, fmt.Errorf("%w (none issued or loaded yet, or it expired)", ErrNoCertificate)
	case roots == nil:
		return nil, nil, fmt.Errorf("%w: no trust bundle", ErrNoCertificate)
	case !expiry.IsZero() && !now.Before(expiry):
		return nil, nil, fmt.Errorf("%w: it expired at %s", ErrNoCertificate, expiry.UTC().Format(time.RFC3339))
	}
	return cert, roots, nil
}

// certIdentity is the SPIFFE ID of cert's leaf.
func certIdentity(cert *tls.Certificate) (string, error) {
	leaf, err := certLeaf(cert)
	if err != nil {
		return "", err
	}
	id, err := identity.FromCertificate(leaf)
	if err != nil {
		return "", err
	}
	return id.String(), nil
}
