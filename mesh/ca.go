package mesh

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	pb "istio.io/api/security/v1alpha1"
)

const (
	// DefaultTrustDomain is Istio's default trust domain.
	DefaultTrustDomain = "cluster.local"
	// DefaultCertTTL is the validity asked of the CA, Istio's default
	// workload certificate lifetime.
	DefaultCertTTL = 24 * time.Hour
	// DefaultCACallTimeout bounds one CreateCertificate call, so a CA that
	// accepts the call and never answers turns into a failure to retry
	// rather than a renewal loop stuck for good. Istio's CA signs in
	// milliseconds.
	DefaultCACallTimeout = 30 * time.Second
)

// CAOptions configure a CAClient and a CertManager.
type CAOptions struct {
	// ControlPlane is the CA's endpoint (istiod's 15012 by default).
	ControlPlane ControlPlane
	// TrustDomain, Namespace and ServiceAccount make this node's identity,
	// spiffe://<TrustDomain>/ns/<Namespace>/sa/<ServiceAccount>. TrustDomain
	// defaults to DefaultTrustDomain; the other two are required.
	TrustDomain    string
	Namespace      string
	ServiceAccount string
	// CertTTL is the validity asked of the CA. Default DefaultCertTTL.
	CertTTL time.Duration
	// MinBackoff and MaxBackoff bound the CertManager's retry delays after a
	// failed request (defaults 100 ms and 30 s).
	MinBackoff, MaxBackoff time.Duration
	// CallTimeout bounds one CreateCertificate call; one that runs out is
	// a failed request. Default DefaultCACallTimeout.
	CallTimeout time.Duration
	// Logger receives the CertManager's log lines; nil discards them.
	Logger Logger
}

// Certificate is one workload certificate issued by the CA, with the key it
// was issued for.
type Certificate struct {
	// TLS holds the leaf first, then the intermediates (not the root), the
	// in-memory private key, and the parsed leaf.
	TLS tls.Certificate
	// Roots are the trust roots from the last element of the CA's chain.
	Roots *x509.CertPool
	// Identity is the SPIFFE URI the certificate was requested for.
	Identity string
	// NotAfter is the leaf's expiry.
	NotAfter time.Time
}

// CAClient requests certificates from Istio's CA,
// istio.v1.auth.IstioCertificateService/CreateCertificate. Each Fetch
// makes a fresh key. Safe for concurrent use.
type CAClient struct {
	cp       ControlPlane
	conn     *grpc.ClientConn
	client   pb.IstioCertificateServiceClient
	identity string
	ttl      time.Duration
	timeout  time.Duration // of one call

	closeOnce sync.Once
	closeErr  error
}

// NewCAClient checks opts and makes the client; it does not connect until
// the first Fetch.
func NewCAClient(opts CAOptions) (*CAClient, error) {
	if err := opts.check(); err != nil {
		return nil, err
	}
	conn, err := dial(opts.ControlPlane, newBackoffConfig(opts.MinBackoff, opts.MaxBackoff))
	if err != nil {
		return nil, fmt.Errorf("ca: %w", err)
	}
	return &CAClient{
		cp:       opts.ControlPlane,
		conn:     conn,
		client:   pb.NewIstioCertificateServiceClient(conn),
		identity: opts.identity(),
		ttl:      opts.CertTTL,
		timeout:  opts.CallTimeout,
	}, nil
}

func (o *CAOptions) check() error {
	if err := o.ControlPlane.check("ca"); err != nil {
		return err
	}
	if o.TrustDomain == "" {
		o.TrustDomain = DefaultTrustDomain
	}
	for _, f := range []struct{ name, v string }{
		{"trust domain", o.TrustDomain}, {"namespace", o.Namespace}, {"service account", o.ServiceAccount},
	} {
		if f.v == "" {
			return fmt.Errorf("ca: %s is required", f.name)
		}
		if strings.ContainsAny(f.v, "/?#% ") {
			return fmt.Errorf("ca: %s %q is not a valid SPIFFE path segment", f.name, f.v)
		}
	}
	if o.CertTTL == 0 {
		o.CertTTL = DefaultCertTTL
	}
	if o.CertTTL < time.Second {
		return fmt.Errorf("ca: cert ttl %v is shorter than a second", o.CertTTL)
	}
	if o.CallTimeout < 0 {
		return fmt.Errorf("ca: call timeout %v is negative", o.CallTimeout)
	}
	if o.CallTimeout == 0 {
		o.CallTimeout = DefaultCACallTimeout
	}
	return nil
}

func (o *CAOptions) identity() string {
	return "spiffe://" + o.TrustDomain + "/ns/" + o.Namespace + "/sa/" + o.ServiceAccount
}

// Identity is the SPIFFE URI this client asks for.
func (c *CAClient) Identity() string { return c.identity }

// Close closes the gRPC connection. Idempotent.
func (c *CAClient) Close() error {
	c.closeOnce.Do(func() { c.closeErr = c.conn.Close() })
	return c.closeErr
}

// Fetch makes a new P-256 key, sends a CSR for our identity and returns the
// checked certificate: the leaf must carry our SPIFFE URI, hold our public
// key and chain to the returned root.
func (c *CAClient) Fetch(ctx context.Context) (*Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("ca: generate key: %w", err)
	}
	u, err := url.Parse(c.identity)
	if err != nil {
		return nil, fmt.Errorf("ca: identity %q: %w", c.identity, err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		URIs: []*url.URL{u},
	}, key)
	if err != nil {
		return nil, fmt.Errorf("ca: create csr: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := c.client.CreateCertificate(ctx, &pb.IstioCertificateRequest{
		Csr:              string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})),
		ValidityDuration: int64(c.ttl / time.Second),
	})
	if err != nil {
		return nil, fmt.Errorf("ca: CreateCertificate: %w", c.cp.explainRefusal(err))
	}
	cert, err := parseChain(resp.GetCertChain(), key, c.identity, time.Now())
	if err != nil {
		return nil, fmt.Errorf("ca: response: %w", err)
	}
	return cert, nil
}

// parseChain checks the CA's answer, [leaf, intermediates..., root], each
// element PEM (an element may hold more than one certificate; the last one
// may hold several roots).
func parseChain(chain []string, key *ecdsa.PrivateKey, identity string, now time.Time) (*Certificate, error) {
	if len(chain) < 2 {
		return nil, fmt.Errorf("chain has %d elements, want the leaf and at least the root", len(chain))
	}
	var certs [][]*x509.Certificate
	for i, elem := range chain {
		parsed, err := parsePEMCerts(elem)
		if err != nil {
			return nil, fmt.Errorf("chain element %d: %w", i, err)
		}
		certs = append(certs, parsed)
	}
	leaf := certs[0][0]
	rootCerts := certs[len(certs)-1]
	roots := x509.NewCertPool()
	for _, r := range rootCerts {
		roots.AddCert(r)
	}
	// Istio's CA with a plugged-in intermediate repeats the root at the end
	// of the intermediates' element; a peer has the root already, so it is
	// left out of the chain we present, as is a certificate sent twice.
	var intermediates []*x509.Certificate
	for _, elem := range certs[:len(certs)-1] {
		for _, c := range elem {
			if c != leaf && !slices.ContainsFunc(rootCerts, c.Equal) && !slices.ContainsFunc(intermediates, c.Equal) {
				intermediates = append(intermediates, c)
			}
		}
	}

	pub, ok := leaf.PublicKey.(*ecdsa.PublicKey)
	if !ok || !pub.Equal(key.Public()) {
		return nil, errors.New("leaf certificate does not hold the key of our request")
	}
	if !hasURI(leaf, identity) {
		return nil, fmt.Errorf("leaf certificate does not carry %s (URIs %v)", identity, leaf.URIs)
	}
	pool := x509.NewCertPool()
	for _, c := range intermediates {
		pool.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots:         roots,
		Intermediates: pool,
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	}); err != nil {
		return nil, fmt.Errorf("leaf certificate does not verify against the returned root: %w", err)
	}
	tc := tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}
	for _, c := range intermediates {
		tc.Certificate = append(tc.Certificate, c.Raw)
	}
	return &Certificate{TLS: tc, Roots: roots, Identity: identity, NotAfter: leaf.NotAfter}, nil
}

func parsePEMCerts(s string) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	rest := []byte(s)
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("PEM block %q, want CERTIFICATE", block.Type)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse certificate: %w", err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM certificate")
	}
	return out, nil
}

func hasURI(c *x509.Certificate, uri string) bool {
	for _, u := range c.URIs {
		if u.String() == uri {
			return true
		}
	}
	return false
}
