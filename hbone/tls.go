package hbone

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/meshtun/meshtun/identity"
)

// ALPN is the only application protocol HBONE speaks.
const ALPN = "h2"

// Sentinel errors for the TLS refusals callers and logs branch on.
var (
	ErrUntrusted        = errors.New("hbone: peer certificate does not chain to the trust bundle")
	ErrWrongIdentity    = errors.New("hbone: peer identity is not one of the expected identities")
	ErrForeignDomain    = errors.New("hbone: peer identity is in a foreign trust domain")
	ErrNoClientCert     = errors.New("hbone: client presented no certificate")
	ErrProtocol         = errors.New("hbone: TLS parameters not allowed (need TLS 1.3, AES-GCM, ALPN h2)")
	errNoPeerCerts      = ErrNoClientCert
	allowedCipherSuites = []uint16{tls.TLS_AES_128_GCM_SHA256, tls.TLS_AES_256_GCM_SHA384}
)

// verifyChain checks that the peer's chain leads to roots for usage and
// returns the leaf.
func verifyChain(certs []*x509.Certificate, roots *x509.CertPool, usage x509.ExtKeyUsage) (*x509.Certificate, error) {
	if len(certs) == 0 {
		return nil, errNoPeerCerts
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	_, err := certs[0].Verify(x509.VerifyOptions{
		Roots:         roots,
		Intermediates: inter,
		KeyUsages:     []x509.ExtKeyUsage{usage},
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUntrusted, err)
	}
	return certs[0], nil
}

// checkProtocol refuses what Go's TLS 1.3 would otherwise allow: its suites
// are not configurable, so ChaCha20 is refused after the fact, and a peer
// that did not agree on h2 is refused rather than served HTTP/1.
func checkProtocol(cs tls.ConnectionState) error {
	if cs.Version != tls.VersionTLS13 {
		return fmt.Errorf("%w: negotiated %s", ErrProtocol, tls.VersionName(cs.Version))
	}
	if !slices.Contains(allowedCipherSuites, cs.CipherSuite) {
		return fmt.Errorf("%w: negotiated %s", ErrProtocol, tls.CipherSuiteName(cs.CipherSuite))
	}
	if cs.NegotiatedProtocol != ALPN {
		return fmt.Errorf("%w: ALPN %q", ErrProtocol, cs.NegotiatedProtocol)
	}
	return nil
}

// ServerConfig is the TLS configuration of an HBONE server: TLS 1.3 only,
// ALPN h2 only, a client certificate is mandatory, must chain to roots and
// must carry a SPIFFE ID in trustDomain. Use PeerIdentity on the
// connection state to learn who the client is.
func ServerConfig(cert tls.Certificate, roots *x509.CertPool, trustDomain string) *tls.Config {
	return &tls.Config{
		MinVersion:             tls.VersionTLS13,
		MaxVersion:             tls.VersionTLS13,
		Certificates:           []tls.Certificate{cert},
		NextProtos:             []string{ALPN},
		ClientAuth:             tls.RequireAnyClientCert, // verified below, against our roots and trust domain
		SessionTicketsDisabled: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if err := checkProtocol(cs); err != nil {
				return err
			}
			leaf, err := verifyChain(cs.PeerCertificates, roots, x509.ExtKeyUsageClientAuth)
			if err != nil {
				return err
			}
			id, err := identity.FromCertificate(leaf)
			if err != nil {
				return fmt.Errorf("hbone: %w", err)
			}
			if id.TrustDomain() != trustDomain {
				return fmt.Errorf("%w: %s is not in %s", ErrForeignDomain, id, trustDomain)
			}
			return nil
		},
	}
}

// sourceServerConfig is ServerConfig over a CertSource: each handshake
// takes the certificate and roots src holds at that moment (through
// GetConfigForClient), so connections accepted after a swap present the
// new certificate and verify clients against the new roots, and open
// connections are not touched. While src holds no usable certificate,
// handshakes fail with an error wrapping ErrNoCertificate.
func sourceServerConfig(src CertSource, trustDomain string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		MaxVersion: tls.VersionTLS13,
		NextProtos: []string{ALPN},
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			cert, roots, err := inForce(src, time.Now())
			if err != nil {
				return nil, err
			}
			return ServerConfig(*cert, roots, trustDomain), nil
		},
	}
}

// ClientConfig is the TLS configuration for dialling an HBONE server that
// must present one of the expected SPIFFE IDs. No SNI is sent (the peer is
// an IP, and IPs are illegal in SNI), sessions are not resumed, and the
// chain is verified by hand against roots because no host name applies.
func ClientConfig(cert tls.Certificate, roots *x509.CertPool, expected []string) *tls.Config {
	expected = slices.Clone(expected)
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		MaxVersion:         tls.VersionTLS13,
		Certificates:       []tls.Certificate{cert},
		NextProtos:         []string{ALPN},
		InsecureSkipVerify: true, // the standard check needs a host name; VerifyConnection does the real one
		VerifyConnection: func(cs tls.ConnectionState) error {
			if err := checkProtocol(cs); err != nil {
				return err
			}
			leaf, err := verifyChain(cs.PeerCertificates, roots, x509.ExtKeyUsageServerAuth)
			if err != nil {
				return err
			}
			id, err := identity.FromCertificate(leaf)
			if err != nil {
				return fmt.Errorf("%w: %w", ErrWrongIdentity, err)
			}
			if !slices.Contains(expected, id.String()) {
				return fmt.Errorf("%w: peer is %s, expected one of %v", ErrWrongIdentity, id, expected)
			}
			return nil
		},
	}
}

// PeerIdentity is the identity of the peer of a verified connection: the
// SPIFFE ID of its leaf certificate (identity.FromCertificate), or "" if
// there is none.
func PeerIdentity(cs tls.ConnectionState) string {
	if len(cs.PeerCertificates) == 0 {
		return ""
	}
	id, _ := identity.FromCertificate(cs.PeerCertificates[0])
	return id.String()
}

// LoadKeyPair loads a certificate chain and key, and returns them with the
// SPIFFE ID the leaf carries, which is this side's identity.
func LoadKeyPair(certFile, keyFile string) (tls.Certificate, string, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return tls.Certificate{}, "", fmt.Errorf("hbone: load key pair: %w", err)
	}
	id, err := identity.FromCertificate(cert.Leaf)
	if err != nil {
		return tls.Certificate{}, "", fmt.Errorf("hbone: %s: %w", certFile, err)
	}
	return cert, id.String(), nil
}

// LoadRoots reads a PEM trust bundle.
func LoadRoots(pemData []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemData) {
		return nil, errors.New("hbone: trust bundle holds no PEM certificate")
	}
	return pool, nil
}
