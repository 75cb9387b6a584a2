package dnsproxy

import (
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// Host is one name the zone answers: a service's hostname and its VIPs.
type Host struct {
	Name  string
	Addrs []netip.Addr
}

// ZoneOptions are what a Zone knows besides its hosts.
type ZoneOptions struct {
	// Domains are the mesh's DNS domains ("cluster.local"): a name within
	// one that no host has is NXDOMAIN, never forwarded. Short forms are
	// expanded with each, in order.
	Domains []string
	// Namespace is the clients' namespace, which one-label names are
	// expanded in; "" expands none.
	Namespace string
	// TTL of the answers, in whole seconds.
	TTL time.Duration
}

// Zone is the mesh's names at one moment: built once per snapshot of the
// gateway, read-only after, shared by every query that takes it.
type Zone struct {
	hosts map[string][]netip.Addr // canonical FQDN ("web.default.svc.cluster.local.") → addresses
	// inner holds the names that have hosts below them but are no host
	// themselves ("default.svc.cluster.local."), and the domains: they
	// exist, so a query for them is NODATA, not NXDOMAIN (RFC 8020).
	inner     map[string]bool
	domains   []string // canonical FQDNs
	namespace string
	ttl       uint32
}

// NewZone builds the zone of hosts. Names are compared without case and
// without the final dot; a name given twice has the addresses of both;
// a name that is not a valid domain name is left out.
func NewZone(opts ZoneOptions, hosts []Host) *Zone {
	z := &Zone{
		hosts:     make(map[string][]netip.Addr, len(hosts)),
		inner:     make(map[string]bool),
		namespace: strings.ToLower(opts.Namespace),
		ttl:       uint32(opts.TTL / time.Second),
	}
	for _, d := range opts.Domains {
		if fq, ok := canonical(d); ok {
			z.domains = append(z.domains, fq)
			z.inner[fq] = true
		}
	}
	for _, h := range hosts {
		fq, ok := canonical(h.Name)
		if !ok {
			continue
		}
		addrs := z.hosts[fq]
		for _, a := range h.Addrs {
			a = a.Unmap()
			if a.IsValid() && !slices.Contains(addrs, a) {
				addrs = append(addrs, a)
			}
		}
		z.hosts[fq] = addrs
		if d := z.domainOf(fq); d != "" {
			for p := parent(fq); p != "" && p != d && dns.IsSubDomain(d, p); p = parent(p) {
				z.inner[p] = true
			}
		}
	}
	return z
}

// canonical is name lowercased with its final dot, if it is a valid
// domain name.
func canonical(name string) (string, bool) {
	if name == "" || name == "." {
		return "", false
	}
	fq := dns.CanonicalName(name)
	if _, ok := dns.IsDomainName(fq); !ok {
		return "", false
	}
	return fq, true
}

// parent is fq without its first label; "" for a name of one label.
func parent(fq string) string {
	i := strings.IndexByte(fq, '.')
	if i < 0 || i+1 >= len(fq) {
		return ""
	}
	return fq[i+1:]
}

// domainOf is the mesh domain fq is within (or is), "" for none.
func (z *Zone) domainOf(fq string) string {
	for _, d := range z.domains {
		if dns.IsSubDomain(d, fq) {
			return d
		}
	}
	return ""
}

// match is what the zone holds for a name asked.
type match int

const (
	notOurs match = iota // outside the mesh's domains, no host: forward it
	found                // a host (its addresses may lack the family asked)
	exists               // a domain or a name above hosts: NODATA
	noSuch               // within a mesh domain, no host: NXDOMAIN
)

// lookup finds the host for a question's name, canonical: the name
// itself, then its short-form expansions (ztunnel's). It returns the
// addresses and the mesh domain the answer is authoritative for ("" for a
// host outside them, whose other record types are forwarded).
func (z *Zone) lookup(fq string) (m match, addrs []netip.Addr, domain string) {
	if a, ok := z.hosts[fq]; ok {
		return found, a, z.domainOf(fq)
	}
	for _, name := range z.expand(fq) {
		if a, ok := z.hosts[name]; ok {
			return found, a, z.domainOf(fq)
		}
	}
	domain = z.domainOf(fq)
	switch {
	case domain == "":
		return notOurs, nil, ""
	case z.inner[fq]:
		return exists, nil, domain
	}
	return noSuch, nil, domain
}

// expand lists the FQDNs a short name stands for, per mesh domain D:
// "web" → web.<namespace>.svc.D (with a namespace), "web.default" →
// web.default.svc.D, "web.default.svc" → web.default.svc.D.
func (z *Zone) expand(fq string) []string {
	var out []string
	labels := dns.CountLabel(fq)
	for _, d := range z.domains {
		switch {
		case labels == 1 && z.namespace != "":
			out = append(out, fq+z.namespace+".svc."+d)
		case labels == 2:
			out = append(out, fq+"svc."+d)
		case labels == 3 && strings.HasSuffix(fq, ".svc."):
			out = append(out, fq+d)
		}
	}
	return out
}

// Resolve is the addresses a query for name gets from the zone (its
// short forms included), and whether the zone has such a host: what
// `meshtun route NAME:PORT` routes.
func (z *Zone) Resolve(name string) ([]netip.Addr, bool) {
	fq, ok := canonical(name)
	if !ok {
		return nil, false
	}
	m, addrs, _ := z.lookup(fq)
	return slices.Clone(addrs), m == found
}

// Len is the number of names the zone answers.
func (z *Zone) Len() int { return len(z.hosts) }
