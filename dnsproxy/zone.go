package dnsproxy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/meshtun/meshtun/internal/pmap"
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

// Zone is the mesh's names at one moment, read-only, shared by every
// query that takes it. With changes a new Zone shares all but what they
// changed with the old one (persistent maps), so an istiod push that
// changes one service costs that service, not the mesh.
type Zone struct {
	hosts pmap.Map[string, zoneName]  // canonical FQDN ("web.default.svc.cluster.local.") → its host
	byKey pmap.Map[string, zoneEntry] // what each key of With gave
	// inner counts, for the names that have hosts below them but are no
	// host themselves ("default.svc.cluster.local."), the hosts below
	// them: such a name exists, so a query for it is NODATA, not NXDOMAIN
	// (RFC 8020). The domains are in domainSet.
	inner     pmap.Map[string, int]
	domains   []string // canonical FQDNs
	domainSet map[string]bool
	namespace string
	ttl       uint32
}

// zoneName is one name of the zone: the keys that gave it, sorted, and the
// union of their addresses in that order.
type zoneName struct {
	keys  []string
	addrs []netip.Addr
}

type zoneEntry struct {
	fq    string
	addrs []netip.Addr
}

// NewZone builds the zone of hosts. Names are compared without case and
// without the final dot; a name given twice has the addresses of both;
// a name that is not a valid domain name is left out.
func NewZone(opts ZoneOptions, hosts []Host) *Zone {
	z := &Zone{
		domainSet: make(map[string]bool),
		namespace: strings.ToLower(opts.Namespace),
		ttl:       uint32(opts.TTL / time.Second),
	}
	for _, d := range opts.Domains {
		if fq, ok := canonical(d); ok {
			z.domains = append(z.domains, fq)
			z.domainSet[fq] = true
		}
	}
	for i, h := range hosts {
		z.set(fmt.Sprintf("#%08d", i), h)
	}
	return z
}

// With returns z with the host of each key of changes replaced: a Host
// with no Name removes the key's. Keys are the caller's names for where a
// host came from (a service); a key of NewZone's own hosts is never one of
// the caller's, which start with any byte but '#'.
func (z *Zone) With(changes map[string]Host) *Zone {
	if len(changes) == 0 {
		return z
	}
	next := *z
	for key, h := range changes {
		next.set(key, h)
	}
	return &next
}

// set replaces the host key gave with h, in place: z is not shared yet.
func (z *Zone) set(key string, h Host) {
	if old, ok := z.byKey.Get(key); ok {
		z.byKey = z.byKey.Delete(key)
		n, _ := z.hosts.Get(old.fq)
		n.keys = slices.DeleteFunc(slices.Clone(n.keys), func(k string) bool { return k == key })
		if len(n.keys) == 0 {
			z.hosts = z.hosts.Delete(old.fq)
			z.countInner(old.fq, -1)
		} else {
			z.hosts = z.hosts.Set(old.fq, z.union(n.keys))
		}
	}
	fq, ok := canonical(h.Name)
	if !ok {
		return
	}
	var addrs []netip.Addr
	for _, a := range h.Addrs {
		if a = a.Unmap(); a.IsValid() {
			addrs = append(addrs, a)
		}
	}
	z.byKey = z.byKey.Set(key, zoneEntry{fq, addrs})
	n, had := z.hosts.Get(fq)
	keys := append(slices.Clone(n.keys), key)
	slices.Sort(keys)
	z.hosts = z.hosts.Set(fq, z.union(keys))
	if !had {
		z.countInner(fq, 1)
	}
}

// union is the name given by keys.
func (z *Zone) union(keys []string) zoneName {
	n := zoneName{keys: keys}
	for _, k := range keys {
		e, _ := z.byKey.Get(k)
		for _, a := range e.addrs {
			if !slices.Contains(n.addrs, a) {
				n.addrs = append(n.addrs, a)
			}
		}
	}
	return n
}

// countInner adds d to the count of the names between fq and its domain.
func (z *Zone) countInner(fq string, d int) {
	dom := z.domainOf(fq)
	if dom == "" {
		return
	}
	for p := parent(fq); p != "" && p != dom && dns.IsSubDomain(dom, p); p = parent(p) {
		n, _ := z.inner.Get(p)
		if n+d == 0 {
			z.inner = z.inner.Delete(p)
		} else {
			z.inner = z.inner.Set(p, n+d)
		}
	}
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
	if n, ok := z.hosts.Get(fq); ok {
		return found, n.addrs, z.domainOf(fq)
	}
	for _, name := range z.expand(fq) {
		if n, ok := z.hosts.Get(name); ok {
			return found, n.addrs, z.domainOf(fq)
		}
	}
	domain = z.domainOf(fq)
	switch {
	case domain == "":
		return notOurs, nil, ""
	case z.domainSet[fq]:
		return exists, nil, domain
	}
	if n, _ := z.inner.Get(fq); n > 0 {
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
func (z *Zone) Len() int { return z.hosts.Len() }
