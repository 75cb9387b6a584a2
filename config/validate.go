package config

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/meshtun/meshtun/identity"
)

// Validate checks c as a whole and returns an *Errors listing every
// problem, each with its key path, or nil. It reads no files; Load checks
// the TLS paths.
func (c *Config) Validate() error {
	p := problems{list: c.check()}
	return p.errs("")
}

// check returns every problem with c, in schema order. The checks name
// the value they find wrong (p.at(&c.TUN.MTU, …)); its key path,
// "tun.mtu", comes from the schema (keyIndex).
func (c *Config) check() []*Error {
	p := problems{keys: indexKeys(c), cfg: c}
	switch c.Version {
	case 0:
		p.at(&c.Version, "required: the file must start with version = %d", schemaVersion)
	case schemaVersion:
	default:
		p.at(&c.Version, "unsupported version %d (this build understands %d)", c.Version, schemaVersion)
	}
	c.checkGateway(&p)
	c.checkMesh(&p)
	c.checkTUN(&p)
	c.checkListeners(&p)
	c.checkDNS(&p)
	td := c.Gateway.TrustDomain
	if identity.CheckTrustDomain(td) != nil {
		td = "" // reported once above; don't hold every identity against it
	}
	c.checkPeers(&p, td)
	c.checkNetworks(&p, td)
	c.checkWorkloads(&p, td)
	c.checkServices(&p, td)
	c.checkPolicies(&p)
	return p.list
}

func (c *Config) checkGateway(p *problems) {
	g := &c.Gateway
	if g.Name == "" {
		p.at(&g.Name, "required (it defaults to the host name, which could not be read)")
	}
	if err := identity.CheckTrustDomain(g.TrustDomain); err != nil {
		p.at(&g.TrustDomain, "%v", err)
	}
	if g.DrainTimeout.Duration < 0 {
		p.at(&g.DrainTimeout, "must not be negative (got %s)", g.DrainTimeout)
	}
	if g.MaxFlowsPerSource < 0 {
		p.at(&g.MaxFlowsPerSource, "must not be negative (got %d); 0 is no limit", g.MaxFlowsPerSource)
	}
	for _, v := range []*string{&g.Cluster, &g.WorkloadNamespace, &g.WorkloadName, &g.CanonicalService, &g.CanonicalRevision} {
		if *v != "" {
			if err := identity.CheckName(*v); err != nil {
				p.at(v, "%v", err)
			}
		}
	}
	oneOf(p, &g.WorkloadKind)

	oneOf(p, &c.Log.Level)
	oneOf(p, &c.Log.Format)

	// Required with the mesh off only (their schema tags say so).
	required(p, &c.TLS.Cert, "the path of this gateway's certificate chain (PEM)")
	required(p, &c.TLS.Key, "the path of this gateway's private key (PEM)")
	required(p, &c.TLS.TrustBundle, "the path of the roots peers' certificates must chain to (PEM)")
}

// checkMesh checks [mesh]: the values it sets always, what the mesh needs
// while it is on, and [tls] beside it. A value derived from a bad
// xds_address is reported once, at xds_address.
func (c *Config) checkMesh(p *problems) {
	if n := &c.Mesh.Network; *n != "" {
		if err := identity.CheckName(*n); err != nil {
			p.at(n, "%v", err)
		}
	}
	m := &c.Mesh
	on := m.Enabled()
	_, _, xdsErr := splitDial(m.XDSAddress)
	derivedName, _, _ := net.SplitHostPort(m.XDSAddress) // as setDefaults derives server_name
	if on && xdsErr != nil {
		p.at(&m.XDSAddress, "%v", xdsErr)
	}
	switch {
	case m.CAAddress != "" && m.CAAddress != m.XDSAddress:
		if _, _, err := splitDial(m.CAAddress); err != nil {
			p.at(&m.CAAddress, "%v", err)
		}
	case on && m.CAAddress == "":
		// Parse fills it in; a Config built in code may not have.
		p.at(&m.CAAddress, "required while [mesh] is on (Parse defaults it to mesh.xds_address)")
	}
	switch {
	case m.ServerName != "" && m.ServerName != derivedName:
		if _, err := netip.ParseAddr(m.ServerName); err != nil && identity.CheckHostname(m.ServerName) != nil {
			p.at(&m.ServerName, "%q is neither a host name nor an IP address (without a port), like \"istiod.istio-system.svc\"", m.ServerName)
		}
	case on && m.ServerName == "" && xdsErr == nil:
		p.at(&m.ServerName, "required while [mesh] is on (Parse defaults it to the host of mesh.xds_address)")
	}
	required(p, &m.Namespace, "this node's workload namespace, as in its WorkloadEntry, like \"vm\"")
	required(p, &m.ServiceAccount, "the service account this node's token belongs to, like \"vm-sa\"")
	checkNamePart(p, &m.Namespace)
	checkNamePart(p, &m.ServiceAccount)
	if on {
		// Each has a default; only a file that writes it empty gets here.
		if m.RootCert == "" {
			p.at(&m.RootCert, "required while [mesh] is on: the roots istiod's certificate must chain to (PEM)")
		}
		if m.TokenFile == "" {
			p.at(&m.TokenFile, "required while [mesh] is on: the file holding this node's istio-ca token")
		}
		if m.ClusterID == "" {
			p.at(&m.ClusterID, "required while [mesh] is on: the cluster istiod serves (Istio's default is \"Kubernetes\")")
		}
	}
	if strings.IndexFunc(m.ClusterID, func(r rune) bool { return r <= ' ' || r > '~' }) >= 0 {
		// It travels in a gRPC header, which takes visible ASCII only.
		p.at(&m.ClusterID, "%q may hold only visible ASCII characters, no spaces", m.ClusterID)
	}
	if ttl := m.CertTTL.Duration; ttl < MinCertTTL || ttl > MaxCertTTL {
		p.at(&m.CertTTL, "%s is out of range (10m..2160h, which is 90 days)", m.CertTTL)
	}
	seen := map[netip.Addr]string{}
	for i := range m.InstanceIPs {
		a := &m.InstanceIPs[i]
		switch {
		case !a.IsValid():
			p.at(a, "invalid IP address")
		case a.IsUnspecified() || a.IsMulticast():
			p.at(a, "%s is not an address of a host", *a)
		default:
			if other, dup := seen[*a]; dup {
				p.at(a, "%s is listed twice (also %s)", *a, other)
				continue
			}
			seen[*a] = p.path(a)
		}
	}
	if on {
		// Istio's CA issues this node's certificate; its key never leaves
		// memory.
		if c.TLS.Cert != "" {
			p.at(&c.TLS.Cert, "with [mesh] on, this gateway's certificate comes from Istio's CA (mesh.ca_address): remove tls.cert")
		}
		if c.TLS.Key != "" {
			p.at(&c.TLS.Key, "with [mesh] on, this gateway's key is made in memory for the certificate Istio's CA issues: remove tls.key")
		}
	}
}

func (c *Config) checkTUN(p *problems) {
	t := &c.TUN
	switch {
	case t.Name == "":
		p.at(&t.Name, "required")
	case len(t.Name) > 15:
		p.at(&t.Name, "%q is longer than 15 bytes, the most Linux allows for an interface name", t.Name)
	case t.Name == "." || t.Name == ".." || strings.ContainsAny(t.Name, "/: \t\n"):
		p.at(&t.Name, "%q is not a valid interface name (no \"/\", \":\" or spaces)", t.Name)
	}
	if t.MTU < 576 || t.MTU > 65535 {
		// 576 is the smallest datagram every IPv4 host must accept; 65535
		// is the largest an IP packet can be.
		p.at(&t.MTU, "%d is out of range (576..65535)", t.MTU)
	}
	for i := range t.Addresses {
		if !t.Addresses[i].IsValid() {
			p.at(&t.Addresses[i], "invalid address")
		}
	}
	for i := range t.Routes {
		checkCIDR(p, &t.Routes[i])
	}
	oneOf(p, &t.Offload)

	if n := &c.Netstack.MaxInFlight; *n < 1 {
		p.at(n, "must be at least 1 (got %d)", *n)
	}

	h := &c.HBONE
	for i := range h.Serve {
		checkCIDR(p, &h.Serve[i])
	}
	if h.MaxStreamsPerConn < 1 {
		p.at(&h.MaxStreamsPerConn, "must be at least 1 (got %d)", h.MaxStreamsPerConn)
	}
	if h.ConnsPerPeer < 1 || h.ConnsPerPeer > MaxConnsPerPeer {
		p.at(&h.ConnsPerPeer, "%d is out of range (1..%d)", h.ConnsPerPeer, MaxConnsPerPeer)
	}
	positive(p, &h.IdleTimeout)
	positive(p, &h.ConnectTimeout)
	positive(p, &h.HandshakeTimeout)
	if h.MaxInboundConns < 1 {
		p.at(&h.MaxInboundConns, "must be at least 1 (got %d)", h.MaxInboundConns)
	}
	// HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS is 32 bits; a million is far
	// more than one connection should ever carry.
	if h.MaxInboundStreamsPerConn < 1 || h.MaxInboundStreamsPerConn > 1<<20 {
		p.at(&h.MaxInboundStreamsPerConn, "%d is out of range (1..%d)", h.MaxInboundStreamsPerConn, 1<<20)
	}
}

// checkListeners checks hbone.listen and the admin listeners, and that no
// two of them would bind the same port.
func (c *Config) checkListeners(p *problems) {
	type listener struct{ path, host, port string }
	var ls []listener
	for _, addr := range []*string{&c.HBONE.Listen, &c.Gateway.EastWest, &c.Admin.Listen, &c.Admin.Metrics, &c.Admin.Readiness} {
		if *addr == "" {
			continue // off
		}
		host, port, err := splitListen(*addr)
		if err != nil {
			p.at(addr, "%v", err)
			continue
		}
		for _, o := range ls {
			if o.port == port && (o.host == host || unspecified(o.host) || unspecified(host)) {
				p.at(addr, "%q would bind the same port as %s", *addr, o.path)
			}
		}
		ls = append(ls, listener{p.path(addr), host, port})
	}
}

// checkDNS checks [dns]. Its addresses are IPs, not host names: the
// server binds listen before any resolver is there to ask, and upstream
// is what it asks.
func (c *Config) checkDNS(p *problems) {
	d := &c.DNS
	switch {
	case d.Listen.IsValid() && (d.Listen.Port() == 0 || d.Listen.Addr().IsMulticast()):
		p.at(&d.Listen, "%s is not an address to listen on: write an IP of this host and a port, like \"100.64.0.1:53\"", d.Listen)
	case d.Enabled && !d.Listen.IsValid():
		p.at(&d.Listen, "required while dns.enabled is true: tun.addresses has no address to derive it from; write one like \"100.64.0.1:53\"")
	}
	if d.Enabled && len(d.Domains) == 0 {
		p.at(&d.Domains, "at least one domain while dns.enabled is true, like [\"cluster.local\"]")
	}
	seen := map[string]string{}
	for i := range d.Domains {
		dom := &d.Domains[i]
		name := strings.TrimSuffix(strings.ToLower(*dom), ".")
		if identity.CheckHostname(name) != nil {
			p.at(dom, "%q is not a DNS domain, like \"cluster.local\"", *dom)
			continue
		}
		if other, dup := seen[name]; dup {
			p.at(dom, "%q is listed twice (also %s)", *dom, other)
			continue
		}
		seen[name] = p.path(dom)
	}
	for i := range d.Upstream {
		u := &d.Upstream[i]
		if !u.IsValid() || u.Port() == 0 || u.Addr().IsUnspecified() || u.Addr().IsMulticast() {
			p.at(u, "%s is not a resolver's address: write ip:port, like \"192.0.2.53:53\"", *u)
		} else if *u == d.Listen {
			p.at(u, "%s is dns.listen: this server would forward to itself", *u)
		}
	}
	if d.RateLimit < 1 {
		p.at(&d.RateLimit, "must be at least 1 (got %d)", d.RateLimit)
	}
	if ttl := d.TTL.Duration; ttl < 0 || ttl > MaxDNSTTL || ttl%time.Second != 0 {
		p.at(&d.TTL, "%s is out of range: whole seconds, 0s..24h", d.TTL)
	}
}

// splitListen checks a listen address: host:port with a numeric port, the
// host empty (all interfaces), an IP or a host name.
func splitListen(s string) (host, port string, err error) {
	return splitAddress(s, `like "0.0.0.0:15008", "[::]:15008" or "" to turn it off`)
}

// splitDial checks an address to dial: host:port with a numeric port, the
// host a host name or an IP other than the unspecified one.
func splitDial(s string) (host, port string, err error) {
	const like = `like "istiod.istio-system.svc:15012" or "[fd00::10]:15012"`
	host, port, err = splitAddress(s, like)
	switch {
	case err != nil:
		return "", "", err
	case host == "":
		return "", "", fmt.Errorf("%q names no host; write it %s", s, like)
	}
	if a, err := netip.ParseAddr(host); err == nil && a.IsUnspecified() {
		return "", "", fmt.Errorf("%q: the unspecified address cannot be dialled; write it %s", s, like)
	}
	return host, port, nil
}

// splitAddress checks host:port, with a numeric port and the host empty,
// an IP or a host name; like shows the operator how to write it.
func splitAddress(s, like string) (host, port string, err error) {
	host, port, err = net.SplitHostPort(s)
	if err != nil {
		return "", "", fmt.Errorf("%q is not host:port; write it %s", s, like)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return "", "", fmt.Errorf("%q: port must be a number 1..65535; write it %s", s, like)
	}
	if _, err := netip.ParseAddr(host); host != "" && err != nil && identity.CheckHostname(host) != nil {
		return "", "", fmt.Errorf("%q: %q is neither an IP address nor a host name", s, host)
	}
	return host, port, nil
}

func unspecified(host string) bool {
	return host == "" || host == "0.0.0.0" || host == "::"
}

func (c *Config) checkPeers(p *problems, td string) {
	names := map[string]string{}        // name → path of the peer that has it
	routed := map[netip.Prefix]string{} // CIDR → path of the peer that has it
	for i := range c.Peers {
		peer := &c.Peers[i]
		uniqueName(p, names, &peer.Name, peer.Name, p.path(peer))
		if len(peer.CIDRs) == 0 {
			p.at(&peer.CIDRs, "required: the destinations to send to this peer, like [\"10.244.2.0/24\"]")
		}
		for j := range peer.CIDRs {
			cidr := &peer.CIDRs[j]
			if !checkCIDR(p, cidr) {
				continue
			}
			if other, dup := routed[*cidr]; dup {
				p.at(cidr, "%s is already routed to %s", *cidr, other)
				continue
			}
			routed[*cidr] = fmt.Sprintf("%s (%q)", p.path(peer), peer.Name)
		}
		switch {
		case !peer.Address.IsValid():
			p.at(&peer.Address, "required: the peer's HBONE ip:port, like \"192.0.2.2:15008\"")
		default:
			checkDialable(p, &peer.Address)
		}
		if peer.Identity == "" {
			p.at(&peer.Identity, "required: the SPIFFE ID the peer must present, like %q", exampleID(td, "meshtun", "node-b"))
		} else if err := checkIdentity(peer.Identity, td); err != nil {
			p.at(&peer.Identity, "%v", err)
		}
	}
}

func (c *Config) checkNetworks(p *problems, td string) {
	names := map[string]string{}
	for i := range c.Networks {
		n := &c.Networks[i]
		uniqueName(p, names, &n.Name, n.Name, p.path(n))
		if n.Name != "" && identity.CheckName(n.Name) != nil {
			p.at(&n.Name, "%q: a network's name is 1..253 letters, digits, '.', '-', '_'", n.Name)
		}
		switch {
		case !n.Gateway.IsValid():
			p.at(&n.Gateway, "required: the network's east-west gateway, its HBONE ip:port, like \"203.0.113.10:15008\"")
		default:
			checkDialable(p, &n.Gateway)
		}
		if n.Identity == "" {
			p.at(&n.Identity, "required: the SPIFFE ID the gateway must present, like %q", exampleID(td, "istio-system", "istio-eastwestgateway"))
		} else if err := checkIdentity(n.Identity, td); err != nil {
			p.at(&n.Identity, "%v", err)
		}
	}
}

func (c *Config) checkWorkloads(p *problems, td string) {
	names := map[string]string{}
	addrs := map[netip.Addr]string{}
	for i := range c.Workloads {
		w := &c.Workloads[i]
		base := p.path(w)
		if w.Network != "" && w.Source != SourceXDS && !slices.ContainsFunc(c.Networks, func(n Network) bool { return n.Name == w.Network }) {
			p.at(&w.Network, "network %q is not declared: add a [[networks]] entry with its gateway", w.Network)
		}
		required(p, &w.Name, "")
		required(p, &w.Namespace, "")
		checkNamePart(p, &w.Name)
		checkNamePart(p, &w.Namespace)
		if w.Name != "" && w.Namespace != "" {
			uniqueName(p, names, &w.Name, w.Namespace+"/"+w.Name, base)
		}
		if len(w.Addresses) == 0 {
			p.at(&w.Addresses, "required: at least one IP address")
		}
		for j := range w.Addresses {
			a := &w.Addresses[j]
			if !a.IsValid() {
				p.at(a, "invalid IP address")
				continue
			}
			if other, dup := addrs[*a]; dup {
				p.at(a, "%s is also the address of %s", *a, other)
				continue
			}
			addrs[*a] = fmt.Sprintf("%s (%s/%s)", base, w.Namespace, w.Name)
		}
		oneOf(p, &w.Protocol)
		if w.Protocol == "HBONE" {
			switch {
			case w.HBONEAddress.IsValid():
				checkDialable(p, &w.HBONEAddress)
			case len(w.Addresses) > 0 && w.Addresses[0].IsValid():
				// Parse fills it in; a Config built in code may not have.
				p.at(&w.HBONEAddress, "required for protocol HBONE (Parse defaults it to the first address, port 15008)")
			}
		}
		if w.Identity != "" {
			if err := checkIdentity(w.Identity, td); err != nil {
				p.at(&w.Identity, "%v", err)
			}
			continue
		}
		// The identity is derived from these two, so they must fit in a
		// SPIFFE ID path.
		required(p, &w.ServiceAccount, "")
		checkNamePart(p, &w.ServiceAccount)
	}
}

func (c *Config) checkServices(p *problems, td string) {
	workloads := make([]string, 0, len(c.Workloads))
	for _, w := range c.Workloads {
		workloads = append(workloads, w.Namespace+"/"+w.Name)
	}
	names := map[string]string{}
	served := map[netip.AddrPort]string{} // VIP:port → path of the service
	for i := range c.Services {
		s := &c.Services[i]
		base := p.path(s)
		required(p, &s.Name, "")
		required(p, &s.Namespace, "")
		if s.Name != "" && s.Namespace != "" {
			uniqueName(p, names, &s.Name, s.Namespace+"/"+s.Name, base)
		}
		if s.Hostname != "" {
			if err := identity.CheckHostname(s.Hostname); err != nil {
				p.at(&s.Hostname, "%v", err)
			}
		}
		if len(s.VIPs) == 0 {
			p.at(&s.VIPs, "required: at least one virtual IP, like [\"10.96.0.10\"]")
		}
		if len(s.Ports) == 0 {
			p.at(&s.Ports, "required: service port = target port, like { 80 = 8080 }")
		}
		ports := make([]uint16, 0, len(s.Ports))
		for sp := range s.Ports {
			ports = append(ports, sp)
		}
		slices.Sort(ports)
		for _, sp := range ports {
			// A map's values have no address: the path of an entry is
			// the map's and its key.
			path := joinPath(p.path(&s.Ports), strconv.Itoa(int(sp)))
			switch {
			case sp == 0:
				p.add(path, "service port 0 is not a port (1..65535)")
			case s.Ports[sp] == 0:
				p.add(path, "target port 0 is not a port (1..65535)")
			}
		}
		for j := range s.VIPs {
			vip := &s.VIPs[j]
			if !vip.IsValid() {
				p.at(vip, "invalid IP address")
				continue
			}
			for _, sp := range ports {
				ap := netip.AddrPortFrom(*vip, sp)
				if other, dup := served[ap]; dup {
					p.at(vip, "%s is already served by %s", ap, other)
					continue
				}
				served[ap] = fmt.Sprintf("%s (%s/%s)", base, s.Namespace, s.Name)
			}
		}
		for j := range s.Endpoints {
			checkEndpoint(p, &s.Endpoints[j], workloads)
		}
		for j := range s.SubjectAltNames {
			if err := checkIdentity(s.SubjectAltNames[j], td); err != nil {
				p.at(&s.SubjectAltNames[j], "%v", err)
			}
		}
	}
}

func checkEndpoint(p *problems, ep *string, workloads []string) {
	ns, name, ok := strings.Cut(*ep, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		p.at(ep, "%q is not namespace/name of a workload, like \"default/web\"", *ep)
		return
	}
	if slices.Contains(workloads, *ep) {
		return
	}
	if s, ok := closest(*ep, workloads); ok {
		p.at(ep, "no workload %q is declared in [[workloads]] (did you mean %q?)", *ep, s)
	} else {
		p.at(ep, "no workload %q is declared in [[workloads]]", *ep)
	}
}

func (c *Config) checkPolicies(p *problems) {
	names := map[string]string{}
	for i := range c.Policies {
		pol := &c.Policies[i]
		uniqueName(p, names, &pol.Name, pol.Name, p.path(pol))
		if pol.Action == "" {
			p.at(&pol.Action, "required: %s", strings.Join(p.lookup(&pol.Action).key.values, " | "))
		} else {
			oneOf(p, &pol.Action)
		}
		for j := range pol.Rules {
			r := &pol.Rules[j]
			patterns(p, r.Principals, true)
			patterns(p, r.NotPrincipals, true)
			patterns(p, r.Namespaces, false)
			patterns(p, r.NotNamespaces, false)
			for _, list := range [][]netip.Prefix{r.SourceIPs, r.NotSourceIPs, r.DestinationIPs, r.NotDestinationIPs} {
				for k := range list {
					checkCIDR(p, &list[k])
				}
			}
			for _, list := range [][]uint16{r.DestinationPorts, r.NotDestinationPorts} {
				for k := range list {
					if list[k] == 0 {
						p.at(&list[k], "port 0 is not a port (1..65535)")
					}
				}
			}
		}
	}
}

// patterns checks ztunnel-style string matches: exact, "prefix*",
// "*suffix" or "*".
func patterns(p *problems, list []string, principals bool) {
	for i, s := range list {
		switch {
		case s == "":
			p.at(&list[i], "empty; write \"*\" to match anything")
		case principals && strings.HasPrefix(s, identity.Scheme):
			p.at(&list[i], "%q: write principals without \"spiffe://\", like %q", s, strings.TrimPrefix(s, identity.Scheme))
		case s != "*" && strings.Contains(strings.TrimSuffix(strings.TrimPrefix(s, "*"), "*"), "*"),
			len(s) > 1 && strings.HasPrefix(s, "*") && strings.HasSuffix(s, "*"):
			p.at(&list[i], "%q: \"*\" may only stand alone, or begin or end the pattern", s)
		}
	}
}

// checkCIDR reports whether *cidr is a valid, masked prefix, and reports
// why not.
func checkCIDR(p *problems, cidr *netip.Prefix) bool {
	switch {
	case !cidr.IsValid():
		p.at(cidr, "invalid CIDR")
		return false
	case *cidr != cidr.Masked():
		p.at(cidr, "%s has address bits set past its /%d prefix (did you mean %s?)", *cidr, cidr.Bits(), cidr.Masked())
		return false
	}
	return true
}

func checkDialable(p *problems, ap *netip.AddrPort) {
	switch {
	case ap.Port() == 0:
		p.at(ap, "%s: port 0 is not a port (1..65535)", *ap)
	case ap.Addr().IsUnspecified():
		p.at(ap, "%s: the unspecified address cannot be dialled", *ap)
	}
}

// required reports *v empty, if the key must be set in the Config being
// checked: a key tagged if:"cond" or unless:"cond" only while its
// condition asks for it (and the message of an if:"cond" key says when).
func required(p *problems, v *string, what string) {
	if *v != "" {
		return
	}
	msg := "required"
	if k := p.lookup(v).key; k != nil && k.when != "" {
		if !k.applies(p.cfg) {
			return
		}
		if !k.unless {
			msg += " while " + conditions[k.when].doc
		}
	}
	if what == "" {
		p.at(v, "%s", msg)
	} else {
		p.at(v, "%s: %s", msg, what)
	}
}

// oneOf checks a key whose schema lists its values (values:"a|b").
func oneOf(p *problems, v *string) {
	allowed := p.lookup(v).key.values
	if !slices.Contains(allowed, *v) {
		p.at(v, "%q is not one of: %s", *v, strings.Join(allowed, " | "))
	}
}

// uniqueName checks the name of the entry at base, whose name key is at;
// unique is what must be unique among the entries of its array (the name,
// or namespace/name).
func uniqueName(p *problems, seen map[string]string, at *string, unique, base string) {
	if unique == "" {
		p.at(at, "required")
		return
	}
	if other, dup := seen[unique]; dup {
		p.at(at, "duplicate name %q (also %s)", unique, other)
		return
	}
	seen[unique] = base
}

func positive(p *problems, d *Duration) {
	if d.Duration <= 0 {
		p.at(d, "must be positive (got %s)", *d)
	}
}

// checkNamePart checks a Kubernetes-style name that ends up in a SPIFFE ID
// path segment or a "namespace/name" reference.
func checkNamePart(p *problems, s *string) {
	if *s == "" {
		return // reported as required
	}
	if err := identity.CheckSegment(*s); err != nil {
		p.at(s, "%v", err)
	}
}

// exampleID is a SPIFFE ID for messages.
func exampleID(td, ns, sa string) string {
	if td == "" {
		td = "cluster.local"
	}
	return identity.WorkloadString(td, ns, sa)
}

// checkIdentity checks that id is a SPIFFE ID in the trust domain td (any,
// if td is ""): the trust bundle holds the roots of that domain only.
func checkIdentity(id, td string) error {
	parsed, err := identity.Parse(id)
	if err != nil {
		return fmt.Errorf("%w, like %q", err, exampleID(td, "default", "web"))
	}
	if td != "" && parsed.TrustDomain() != td {
		return fmt.Errorf("%q is in trust domain %q, not this mesh's %q (gateway.trust_domain)", id, parsed.TrustDomain(), td)
	}
	return nil
}
