package hbone

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// ErrNoIdentity is returned when a certificate carries no SPIFFE URI SAN.
var ErrNoIdentity = errors.New("hbone: certificate has no spiffe:// URI SAN")

// ParseID checks that id is a SPIFFE ID (spiffe://<trust-domain>/<path>)
// and returns its trust domain.
func ParseID(id string) (trustDomain string, err error) {
	u, err := url.Parse(id)
	if err != nil {
		return "", fmt.Errorf("hbone: identity %q: %w", id, err)
	}
	switch {
	case u.Scheme != "spiffe":
		return "", fmt.Errorf("hbone: identity %q: scheme must be spiffe", id)
	case u.Host == "" || u.Port() != "" || u.User != nil:
		return "", fmt.Errorf("hbone: identity %q: needs a trust domain and nothing else before the path", id)
	case u.RawQuery != "" || u.Fragment != "":
		return "", fmt.Errorf("hbone: identity %q: no query or fragment allowed", id)
	case u.Path == "" || u.Path == "/":
		return "", fmt.Errorf("hbone: identity %q: path is empty", id)
	}
	return strings.ToLower(u.Host), nil
}

// IdentityOf returns the first valid SPIFFE ID among cert's URI SANs. DNS
// SANs and the subject CN are ignored, as ztunnel does.
func IdentityOf(cert *x509.Certificate) (string, error) {
	for _, u := range cert.URIs {
		id := u.String()
		if _, err := ParseID(id); err == nil {
			return id, nil
		}
	}
	return "", ErrNoIdentity
}

// identitiesOf returns every valid SPIFFE ID among cert's URI SANs.
func identitiesOf(cert *x509.Certificate) []string {
	var ids []string
	for _, u := range cert.URIs {
		id := u.String()
		if _, err := ParseID(id); err == nil {
			ids = append(ids, id)
		}
	}
	return ids
}

// Principal is id without its "spiffe://" prefix, the form Istio's
// authorization policies and metrics use.
func Principal(id string) string {
	return strings.TrimPrefix(id, "spiffe://")
}
