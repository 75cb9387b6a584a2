package identity

import (
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
)

// Scheme starts every SPIFFE ID.
const Scheme = "spiffe://"

// maxTrustDomain is the SPIFFE specification's bound on a trust domain,
// that of a DNS name: 255 bytes.
const maxTrustDomain = 255

// ErrNoIdentity is returned when a certificate carries no SPIFFE URI SAN.
var ErrNoIdentity = errors.New("identity: certificate has no spiffe:// URI SAN")

// ErrManyURIs is returned for a certificate with more than one URI SAN,
// which is no X.509-SVID.
var ErrManyURIs = errors.New("identity: certificate has more than one URI SAN")

// ID is a valid SPIFFE ID. The zero ID is not one (IsZero); every other
// value comes from Parse or Workload and passed their checks. IDs compare
// with ==.
type ID struct {
	trustDomain string
	path        string // begins with '/'
}

// Parse checks that s is a SPIFFE ID and returns it. The error says which
// rule s breaks and quotes s.
func Parse(s string) (ID, error) {
	rest, ok := strings.CutPrefix(s, Scheme)
	if !ok {
		return ID{}, fmt.Errorf("%q is not a SPIFFE ID: write spiffe://<trust domain>/<path>", s)
	}
	td, path, ok := strings.Cut(rest, "/")
	if !ok || path == "" {
		return ID{}, fmt.Errorf("%q has no path after the trust domain", s)
	}
	if err := CheckTrustDomain(td); err != nil {
		return ID{}, fmt.Errorf("%q: %w", s, err)
	}
	for seg := range strings.SplitSeq(path, "/") {
		if !validSegment(seg) {
			return ID{}, fmt.Errorf("%q: path segment %q may hold only letters, digits, \".\", \"-\" and \"_\", and not be empty, \".\" or \"..\"", s, seg)
		}
	}
	return ID{trustDomain: td, path: "/" + path}, nil
}

// Workload is Istio's identity of a workload: spiffe://<trustDomain>/ns/
// <namespace>/sa/<serviceAccount>. It fails if a part breaks the rules
// Parse applies, or holds a '/'.
func Workload(trustDomain, namespace, serviceAccount string) (ID, error) {
	if err := CheckTrustDomain(trustDomain); err != nil {
		return ID{}, err
	}
	for _, s := range []string{namespace, serviceAccount} {
		if err := CheckSegment(s); err != nil {
			return ID{}, err
		}
	}
	return ID{trustDomain: trustDomain, path: "/ns/" + namespace + "/sa/" + serviceAccount}, nil
}

// WorkloadString is the string form of Workload's ID, unchecked: for
// messages and for configs whose parts were checked on their own.
func WorkloadString(trustDomain, namespace, serviceAccount string) string {
	return Scheme + trustDomain + "/ns/" + namespace + "/sa/" + serviceAccount
}

// String is the ID as written: spiffe://<trust domain>/<path>. The zero ID
// gives "".
func (id ID) String() string {
	if id.IsZero() {
		return ""
	}
	return Scheme + id.trustDomain + id.path
}

// IsZero reports whether id is the zero ID, which names no one.
func (id ID) IsZero() bool { return id.trustDomain == "" }

// TrustDomain is the ID's trust domain, e.g. "cluster.local".
func (id ID) TrustDomain() string { return id.trustDomain }

// Path is the ID's path, with its leading '/', e.g. "/ns/default/sa/web".
func (id ID) Path() string { return id.path }

// Principal is the ID without "spiffe://", the form Istio's authorization
// policies and metrics use: "cluster.local/ns/default/sa/web".
func (id ID) Principal() string {
	if id.IsZero() {
		return ""
	}
	return id.trustDomain + id.path
}

// Namespace is <ns> of an ID of the form spiffe://<td>/ns/<ns>/sa/<sa>,
// and "" for an ID of any other form.
func (id ID) Namespace() string {
	ns, _, _ := id.workload()
	return ns
}

// ServiceAccount is <sa> of an ID of the form spiffe://<td>/ns/<ns>/sa/<sa>,
// and "" for an ID of any other form.
func (id ID) ServiceAccount() string {
	_, sa, _ := id.workload()
	return sa
}

// workload splits an Istio workload path; Parse already refused empty
// segments.
func (id ID) workload() (ns, sa string, ok bool) {
	rest, ok := strings.CutPrefix(id.path, "/ns/")
	if !ok {
		return "", "", false
	}
	ns, rest, ok = strings.Cut(rest, "/sa/")
	if !ok || strings.Contains(ns, "/") || strings.Contains(rest, "/") {
		return "", "", false
	}
	return ns, rest, true
}

// Principal is s without "spiffe://", and whether s had that prefix. It
// looks at the prefix only: authorization compares any presented ID in
// this form, and an identity without the scheme matches no principal.
func Principal(s string) (string, bool) {
	return strings.CutPrefix(s, Scheme)
}

// FromCertificate returns the SPIFFE ID of an X.509-SVID: its one URI
// SAN, which must be a valid SPIFFE ID. A certificate with none, or with a
// URI SAN that is not one, gives ErrNoIdentity; one with more than one URI
// SAN gives ErrManyURIs: the SPIFFE X.509-SVID standard allows exactly one
// (ztunnel takes the first valid one; we are stricter, so that no two
// parties can read different identities out of one certificate). DNS SANs
// and the subject CN are ignored, as ztunnel ignores them.
func FromCertificate(cert *x509.Certificate) (ID, error) {
	switch len(cert.URIs) {
	case 0:
		return ID{}, ErrNoIdentity
	case 1:
	default:
		return ID{}, fmt.Errorf("%w (%d)", ErrManyURIs, len(cert.URIs))
	}
	id, err := Parse(cert.URIs[0].String())
	if err != nil {
		return ID{}, fmt.Errorf("%w: %v", ErrNoIdentity, err)
	}
	return id, nil
}

// CheckTrustDomain applies the SPIFFE rules to a trust domain: not empty,
// at most 255 bytes of lowercase letters, digits, '.', '-' and '_'.
func CheckTrustDomain(td string) error {
	if td == "" {
		return errors.New("required: the SPIFFE trust domain of this mesh, like \"cluster.local\"")
	}
	if len(td) > maxTrustDomain || strings.IndexFunc(td, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_')
	}) >= 0 {
		return fmt.Errorf("invalid trust domain %q: use lowercase letters, digits, \".\", \"-\" and \"_\", like \"cluster.local\"", td)
	}
	return nil
}

// CheckSegment checks a name that becomes one segment of an ID's path
// (a namespace or service account): letters, digits, '.', '-' and '_', not
// empty, "." or "..".
func CheckSegment(s string) error {
	if !validSegment(s) {
		return fmt.Errorf("%q may hold only letters, digits, \".\", \"-\" and \"_\"", s)
	}
	return nil
}

func validSegment(s string) bool {
	return s != "" && s != "." && s != ".." && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_')
	}) < 0
}

// CheckName checks a name that describes a workload in baggage and in
// metric labels (a cluster, a workload, a canonical service or revision):
// 1..253 bytes of letters, digits, '.', '-' and '_'. These are the
// characters of Kubernetes' names and label values, and none of them
// needs encoding in a baggage header (docs/hbone.md, "The CONNECT
// request"); the bound is a DNS name's, the longest Kubernetes name.
func CheckName(s string) error {
	if s == "" || len(s) > maxHostname || strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_')
	}) >= 0 {
		return fmt.Errorf("%q is not a name: use 1 to %d letters, digits, \".\", \"-\" and \"_\"", s, maxHostname)
	}
	return nil
}

// maxHostname and maxLabel are DNS's bounds (RFC 1035 §2.3.4): 253 bytes
// for a name written without its final dot, 63 for one label.
const (
	maxHostname = 253
	maxLabel    = 63
)

// CheckHostname checks a DNS host name: dot-separated labels of 1..63
// letters, digits and '-', neither beginning nor ending with '-', at most
// 253 bytes in all; one final dot is allowed.
func CheckHostname(h string) error {
	bad := fmt.Errorf("%q is not a valid host name", h)
	if h == "" || len(h) > maxHostname {
		return bad
	}
	for l := range strings.SplitSeq(strings.TrimSuffix(h, "."), ".") {
		if l == "" || len(l) > maxLabel || l[0] == '-' || l[len(l)-1] == '-' ||
			strings.IndexFunc(l, func(r rune) bool {
				return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-')
			}) >= 0 {
			return bad
		}
	}
	return nil
}
