package gateway

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/identity"
)

// Authorization of inbound connections: ztunnel's L4 model
// (docs/hbone.md, "Authorization"; istio/ztunnel src/rbac.rs, read, not
// copied).
//
// Evaluation: any matching DENY policy denies; else, when there is no
// ALLOW policy, the connection is allowed; else a matching ALLOW policy
// allows it; else it is denied. Denied inbound streams are answered 401.
//
// Matching, as ztunnel's Authorization::matches:
//   - a policy without rules matches nothing (rbac.rs returns false for
//     empty rules), so an ALLOW policy without rules allows nothing, yet its
//     presence turns on default deny;
//   - a policy matches when any of its rules does;
//   - a rule matches when all of its fields do; an empty rule (no fields)
//     matches every connection: it is Istio's `rules: [{}]`, which istiod
//     hands ztunnel as a rule without clauses, and rbac.rs's empty-clause
//     case matches;
//   - a field matches when its list is empty or any entry matches, and its
//     not_ form matches when that list is empty or no entry matches.
//
// Principals are the peer's SPIFFE ID without "spiffe://" (an ID without
// that scheme matches no principal), compared exactly, as "prefix*",
// "*suffix", or "*" (present, non-empty). Namespaces are the <ns> of
// spiffe://<td>/ns/<ns>/sa/<sa>, with the same patterns; an identity of
// another shape has no namespace.
//
// The source IP is the client's address from the CONNECT's forwarded
// header when there is one, else the HBONE peer's address. ztunnel uses
// the connection's source address, which is the client workload's own IP
// because ztunnel spoofs it; a meshtun gateway does not spoof, so its
// connection comes from the node's address and the client is only known
// from forwarded. The header is trusted because the peer authenticated
// with a certificate of our trust domain: a peer of the mesh can claim any
// client address, exactly as a ztunnel peer could spoof one.
//
// The destination is the CONNECT target: its IP for destination_ips, its
// port (not 15008) for destination_ports.

// AuthzConn is what authorization sees of one inbound connection.
type AuthzConn struct {
	// Identity is the peer's SPIFFE ID ("spiffe://td/ns/x/sa/y").
	Identity string
	// Src is the client's IP (see above), Dst the CONNECT target.
	Src netip.Addr
	Dst netip.AddrPort
}

// Decision is the outcome of Authorizer.Authorize.
type Decision struct {
	Allow bool
	// Policy names the policy that decided ("" when no policy matched).
	Policy string
	// Reason says why, for logs and `meshtun route`.
	Reason string
}

// Authorizer evaluates [[policies]]. Built once from a config, read-only
// afterwards: Authorize is a pure function, safe for concurrent use.
type Authorizer struct {
	deny, allow []authzPolicy
}

type authzPolicy struct {
	name  string
	rules []authzRule
}

type authzRule struct {
	principals, notPrincipals         []stringMatch
	namespaces, notNamespaces         []stringMatch
	sourceIPs, notSourceIPs           []netip.Prefix
	destinationIPs, notDestinationIPs []netip.Prefix
	ports, notPorts                   []uint16
}

// NewAuthorizer compiles policies, which must have passed config.Validate.
func NewAuthorizer(policies []config.Policy) *Authorizer {
	a := &Authorizer{}
	for _, p := range policies {
		ap := authzPolicy{name: p.Name}
		for _, r := range p.Rules {
			ap.rules = append(ap.rules, authzRule{
				principals:        compileMatches(r.Principals),
				notPrincipals:     compileMatches(r.NotPrincipals),
				namespaces:        compileMatches(r.Namespaces),
				notNamespaces:     compileMatches(r.NotNamespaces),
				sourceIPs:         r.SourceIPs,
				notSourceIPs:      r.NotSourceIPs,
				destinationIPs:    r.DestinationIPs,
				notDestinationIPs: r.NotDestinationIPs,
				ports:             r.DestinationPorts,
				notPorts:          r.NotDestinationPorts,
			})
		}
		if strings.EqualFold(p.Action, "deny") {
			a.deny = append(a.deny, ap)
		} else {
			a.allow = append(a.allow, ap)
		}
	}
	return a
}

// Authorize decides whether c may be served.
func (a *Authorizer) Authorize(c AuthzConn) Decision {
	c.Src, c.Dst = c.Src.Unmap(), netip.AddrPortFrom(c.Dst.Addr().Unmap(), c.Dst.Port())
	m := newAuthzSubject(c)
	for _, p := range a.deny {
		if p.matches(m) {
			return Decision{Policy: p.name, Reason: fmt.Sprintf("denied by policy %q", p.name)}
		}
	}
	if len(a.allow) == 0 {
		return Decision{Allow: true, Reason: "no allow policy"}
	}
	for _, p := range a.allow {
		if p.matches(m) {
			return Decision{Allow: true, Policy: p.name, Reason: fmt.Sprintf("allowed by policy %q", p.name)}
		}
	}
	return Decision{Reason: "no allow policy matches"}
}

// authzSubject is an AuthzConn with the principal and namespace worked out
// once.
type authzSubject struct {
	AuthzConn
	principal    string
	hasPrincipal bool
	namespace    string
}

func newAuthzSubject(c AuthzConn) authzSubject {
	s := authzSubject{AuthzConn: c}
	s.principal, s.hasPrincipal = identity.Principal(c.Identity)
	if id, err := identity.Parse(c.Identity); err == nil {
		s.namespace = id.Namespace() // "" unless …/ns/<ns>/sa/<sa>
	}
	return s
}

func (p *authzPolicy) matches(s authzSubject) bool {
	for i := range p.rules {
		if p.rules[i].matches(s) {
			return true
		}
	}
	return false // no rules: nothing matches
}

func (r *authzRule) matches(s authzSubject) bool {
	principal := func(m stringMatch) bool { return s.hasPrincipal && m.match(s.principal) }
	namespace := func(m stringMatch) bool { return m.match(s.namespace) }
	srcIP := func(p netip.Prefix) bool { return p.Contains(s.Src) }
	dstIP := func(p netip.Prefix) bool { return p.Contains(s.Dst.Addr()) }
	port := func(p uint16) bool { return p == s.Dst.Port() }
	return field(r.principals, r.notPrincipals, principal) &&
		field(r.namespaces, r.notNamespaces, namespace) &&
		field(r.sourceIPs, r.notSourceIPs, srcIP) &&
		field(r.destinationIPs, r.notDestinationIPs, dstIP) &&
		field(r.ports, r.notPorts, port)
}

// field is one match field and its not_ form: an empty list matches.
func field[T any](pos, neg []T, match func(T) bool) bool {
	if len(pos) > 0 && !slices.ContainsFunc(pos, match) {
		return false
	}
	return !slices.ContainsFunc(neg, match)
}

// stringMatch is one principal or namespace pattern.
type stringMatch struct {
	kind matchKind
	s    string
}

type matchKind int

const (
	matchExact matchKind = iota
	matchPrefix
	matchSuffix
	matchPresence
)

// compileMatches turns "x", "x*", "*x" and "*" into matchers.
func compileMatches(patterns []string) []stringMatch {
	var ms []stringMatch
	for _, p := range patterns {
		switch {
		case p == "*":
			ms = append(ms, stringMatch{kind: matchPresence})
		case strings.HasSuffix(p, "*"):
			ms = append(ms, stringMatch{kind: matchPrefix, s: strings.TrimSuffix(p, "*")})
		case strings.HasPrefix(p, "*"):
			ms = append(ms, stringMatch{kind: matchSuffix, s: strings.TrimPrefix(p, "*")})
		default:
			ms = append(ms, stringMatch{kind: matchExact, s: p})
		}
	}
	return ms
}

func (m stringMatch) match(v string) bool {
	switch m.kind {
	case matchPrefix:
		return strings.HasPrefix(v, m.s)
	case matchSuffix:
		return strings.HasSuffix(v, m.s)
	case matchPresence:
		return v != ""
	default:
		return v == m.s
	}
}
