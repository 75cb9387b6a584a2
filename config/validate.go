package config

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/meshtun/meshtun/identity"
)

// Validate checks c as a whole and returns an *Errors listing every
// problem, each with its key path, or nil. It reads no files; Load checks
// the TLS paths.
func (c *Config) Validate() error {
	p := problems{list: c.check()}
	return p.errs("")
}

// check returns every problem with c, in schema order.
func (c *Config) check() []*Error {
	var p problems
	switch c.Version {
	case 0:
		p.add("version", "required: the file must start with version = %d", schemaVersion)
	case schemaVersion:
	default:
		p.add("version", "unsupported version %d (this build understands %d)", c.Version, schemaVersion)
	}
	c.checkGateway(&p)
	c.checkTUN(&p)
	c.checkListeners(&p)
	td := c.Gateway.TrustDomain
	if identity.CheckTrustDomain(td) != nil {
		td = "" // reported once above; don't hold every identity against it
	}
	c.checkPeers(&p, td)
	c.checkWorkloads(&p, td)
	c.checkServices(&p, td)
	c.checkPolicies(&p)
	return p.list
}

func (c *Config) checkGateway(p *problems) {
	if c.Gateway.Name == "" {
		p.add("gateway.name", "required (it defaults to the host name, which could not be read)")
	}
	if err := identity.CheckTrustDomain(c.Gateway.TrustDomain); err != nil {
		p.add("gateway.trust_domain", "%v", err)
	}
	nonNegative(p, "gateway.drain_timeout", c.Gateway.DrainTimeout)

	oneOf(p, "log.level", c.Log.Level, "trace", "debug", "info", "warn", "error")
	oneOf(p, "log.format", c.Log.Format, "text", "json")

	required(p, "tls.cert", c.TLS.Cert, "the path of this gateway's certificate chain (PEM)")
	required(p, "tls.key", c.TLS.Key, "the path of this gateway's private key (PEM)")
	required(p, "tls.trust_bundle", c.TLS.TrustBundle, "the path of the roots peers' certificates must chain to (PEM)")
}

func (c *Config) checkTUN(p *problems) {
	t := &c.TUN
	switch {
	case t.Name == "":
		p.add("tun.name", "required")
	case len(t.Name) > 15:
		p.add("tun.name", "%q is longer than 15 bytes, the most Linux allows for an interface name", t.Name)
	case t.Name == "." || t.Name == ".." || strings.ContainsAny(t.Name, "/: \t\n"):
		p.add("tun.name", "%q is not a valid interface name (no \"/\", \":\" or spaces)", t.Name)
	}
	if t.MTU < 576 || t.MTU > 65535 {
		// 576 is the smallest datagram every IPv4 host must accept; 65535
		// is the largest an IP packet can be.
		p.add("tun.mtu", "%d is out of range (576..65535)", t.MTU)
	}
	for i, a := range t.Addresses {
		if !a.IsValid() {
			p.add(indexPath("tun.addresses", i), "invalid address")
		}
	}
	for i, r := range t.Routes {
		checkCIDR(p, indexPath("tun.routes", i), r)
	}
	oneOf(p, "tun.offload", t.Offload, "auto", "on", "off")

	if c.Netstack.MaxInFlight < 1 {
		p.add("netstack.max_in_flight", "must be at least 1 (got %d)", c.Netstack.MaxInFlight)
	}

	h := &c.HBONE
	for i, s := range h.Serve {
		checkCIDR(p, indexPath("hbone.serve", i), s)
	}
	if h.MaxStreamsPerConn < 1 {
		p.add("hbone.max_streams_per_conn", "must be at least 1 (got %d)", h.MaxStreamsPerConn)
	}
	if h.ConnsPerPeer < 1 || h.ConnsPerPeer > MaxConnsPerPeer {
		p.add("hbone.conns_per_peer", "%d is out of range (1..%d)", h.ConnsPerPeer, MaxConnsPerPeer)
	}
	positive(p, "hbone.idle_timeout", h.IdleTimeout)
	positive(p, "hbone.connect_timeout", h.ConnectTimeout)
}

// checkListeners checks hbone.listen and the admin listeners, and that no
// two of them would bind the same port.
func (c *Config) checkListeners(p *problems) {
	type listener struct{ path, host, port string }
	var ls []listener
	for _, l := range []struct{ path, addr string }{
		{"hbone.listen", c.HBONE.Listen},
		{"admin.listen", c.Admin.Listen},
		{"admin.metrics", c.Admin.Metrics},
		{"admin.readiness", c.Admin.Readiness},
	} {
		if l.addr == "" {
			continue // off
		}
		host, port, err := splitListen(l.addr)
		if err != nil {
			p.add(l.path, "%v", err)
			continue
		}
		for _, o := range ls {
			if o.port == port && (o.host == host || unspecified(o.host) || unspecified(host)) {
				p.add(l.path, "%q would bind the same port as %s", l.addr, o.path)
			}
		}
		ls = append(ls, listener{l.path, host, port})
	}
}

// splitListen checks a listen address: host:port with a numeric port, the
// host empty (all interfaces), an IP or a host name.
func splitListen(s string) (host, port string, err error) {
	const like = `like "0.0.0.0:15008", "[::]:15008" or "" to turn it off`
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
		base := indexPath("peers", i)
		uniqueName(p, names, base, peer.Name)
		if len(peer.CIDRs) == 0 {
			p.add(base+".cidrs", "required: the destinations to send to this peer, like [\"10.244.2.0/24\"]")
		}
		for j, cidr := range peer.CIDRs {
			path := indexPath(base+".cidrs", j)
			if !checkCIDR(p, path, cidr) {
				continue
			}
			if other, dup := routed[cidr]; dup {
				p.add(path, "%s is already routed to %s", cidr, other)
				continue
			}
			routed[cidr] = fmt.Sprintf("%s (%q)", base, peer.Name)
		}
		switch {
		case !peer.Address.IsValid():
			p.add(base+".address", "required: the peer's HBONE ip:port, like \"192.0.2.2:15008\"")
		default:
			checkDialable(p, base+".address", peer.Address)
		}
		if peer.Identity == "" {
			p.add(base+".identity", "required: the SPIFFE ID the peer must present, like %q", exampleID(td, "meshtun", "node-b"))
		} else if err := checkIdentity(peer.Identity, td); err != nil {
			p.add(base+".identity", "%v", err)
		}
	}
}

func (c *Config) checkWorkloads(p *problems, td string) {
	names := map[string]string{}
	addrs := map[netip.Addr]string{}
	for i := range c.Workloads {
		w := &c.Workloads[i]
		base := indexPath("workloads", i)
		required(p, base+".name", w.Name, "")
		required(p, base+".namespace", w.Namespace, "")
		checkNamePart(p, base+".name", w.Name)
		checkNamePart(p, base+".namespace", w.Namespace)
		if w.Name != "" && w.Namespace != "" {
			uniqueName(p, names, base, w.Namespace+"/"+w.Name)
		}
		if len(w.Addresses) == 0 {
			p.add(base+".addresses", "required: at least one IP address")
		}
		for j, a := range w.Addresses {
			path := indexPath(base+".addresses", j)
			if !a.IsValid() {
				p.add(path, "invalid IP address")
				continue
			}
			if other, dup := addrs[a]; dup {
				p.add(path, "%s is also the address of %s", a, other)
				continue
			}
			addrs[a] = fmt.Sprintf("%s (%s/%s)", base, w.Namespace, w.Name)
		}
		oneOf(p, base+".protocol", w.Protocol, "HBONE", "TCP")
		if w.Protocol == "HBONE" {
			switch {
			case w.HBONEAddress.IsValid():
				checkDialable(p, base+".hbone_address", w.HBONEAddress)
			case len(w.Addresses) > 0 && w.Addresses[0].IsValid():
				// Parse fills it in; a Config built in code may not have.
				p.add(base+".hbone_address", "required for protocol HBONE (Parse defaults it to the first address, port 15008)")
			}
		}
		if w.Identity != "" {
			if err := checkIdentity(w.Identity, td); err != nil {
				p.add(base+".identity", "%v", err)
			}
			continue
		}
		// The identity is derived from these two, so they must fit in a
		// SPIFFE ID path.
		required(p, base+".service_account", w.ServiceAccount, "")
		checkNamePart(p, base+".service_account", w.ServiceAccount)
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
		base := indexPath("services", i)
		required(p, base+".name", s.Name, "")
		required(p, base+".namespace", s.Namespace, "")
		if s.Name != "" && s.Namespace != "" {
			uniqueName(p, names, base, s.Namespace+"/"+s.Name)
		}
		if s.Hostname != "" {
			if err := identity.CheckHostname(s.Hostname); err != nil {
				p.add(base+".hostname", "%v", err)
			}
		}
		if len(s.VIPs) == 0 {
			p.add(base+".vips", "required: at least one virtual IP, like [\"10.96.0.10\"]")
		}
		if len(s.Ports) == 0 {
			p.add(base+".ports", "required: service port = target port, like { 80 = 8080 }")
		}
		ports := make([]uint16, 0, len(s.Ports))
		for sp := range s.Ports {
			ports = append(ports, sp)
		}
		slices.Sort(ports)
		for _, sp := range ports {
			path := joinPath(base+".ports", strconv.Itoa(int(sp)))
			switch {
			case sp == 0:
				p.add(path, "service port 0 is not a port (1..65535)")
			case s.Ports[sp] == 0:
				p.add(path, "target port 0 is not a port (1..65535)")
			}
		}
		for j, vip := range s.VIPs {
			path := indexPath(base+".vips", j)
			if !vip.IsValid() {
				p.add(path, "invalid IP address")
				continue
			}
			for _, sp := range ports {
				ap := netip.AddrPortFrom(vip, sp)
				if other, dup := served[ap]; dup {
					p.add(path, "%s is already served by %s", ap, other)
					continue
				}
				served[ap] = fmt.Sprintf("%s (%s/%s)", base, s.Namespace, s.Name)
			}
		}
		for j, ep := range s.Endpoints {
			checkEndpoint(p, indexPath(base+".endpoints", j), ep, workloads)
		}
		for j, san := range s.SubjectAltNames {
			if err := checkIdentity(san, td); err != nil {
				p.add(indexPath(base+".subject_alt_names", j), "%v", err)
			}
		}
	}
}

func checkEndpoint(p *problems, path, ep string, workloads []string) {
	ns, name, ok := strings.Cut(ep, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		p.add(path, "%q is not namespace/name of a workload, like \"default/web\"", ep)
		return
	}
	if slices.Contains(workloads, ep) {
		return
	}
	if s, ok := closest(ep, workloads); ok {
		p.add(path, "no workload %q is declared in [[workloads]] (did you mean %q?)", ep, s)
	} else {
		p.add(path, "no workload %q is declared in [[workloads]]", ep)
	}
}

func (c *Config) checkPolicies(p *problems) {
	names := map[string]string{}
	for i := range c.Policies {
		pol := &c.Policies[i]
		base := indexPath("policies", i)
		uniqueName(p, names, base, pol.Name)
		if pol.Action == "" {
			p.add(base+".action", "required: allow | deny")
		} else {
			oneOf(p, base+".action", pol.Action, "allow", "deny")
		}
		for j := range pol.Rules {
			r := &pol.Rules[j]
			rb := indexPath(base+".rules", j)
			patterns(p, rb+".principals", r.Principals, true)
			patterns(p, rb+".not_principals", r.NotPrincipals, true)
			patterns(p, rb+".namespaces", r.Namespaces, false)
			patterns(p, rb+".not_namespaces", r.NotNamespaces, false)
			for _, f := range []struct {
				key  string
				list []netip.Prefix
			}{
				{"source_ips", r.SourceIPs},
				{"not_source_ips", r.NotSourceIPs},
				{"destination_ips", r.DestinationIPs},
				{"not_destination_ips", r.NotDestinationIPs},
			} {
				for k, cidr := range f.list {
					checkCIDR(p, indexPath(rb+"."+f.key, k), cidr)
				}
			}
			for _, f := range []struct {
				key  string
				list []uint16
			}{
				{"destination_ports", r.DestinationPorts},
				{"not_destination_ports", r.NotDestinationPorts},
			} {
				for k, port := range f.list {
					if port == 0 {
						p.add(indexPath(rb+"."+f.key, k), "port 0 is not a port (1..65535)")
					}
				}
			}
		}
	}
}

// patterns checks ztunnel-style string matches: exact, "prefix*",
// "*suffix" or "*".
func patterns(p *problems, path string, list []string, principals bool) {
	for i, s := range list {
		ip := indexPath(path, i)
		switch {
		case s == "":
			p.add(ip, "empty; write \"*\" to match anything")
		case principals && strings.HasPrefix(s, "spiffe://"):
			p.add(ip, "%q: write principals without \"spiffe://\", like %q", s, strings.TrimPrefix(s, "spiffe://"))
		case s != "*" && strings.Contains(strings.TrimSuffix(strings.TrimPrefix(s, "*"), "*"), "*"),
			len(s) > 1 && strings.HasPrefix(s, "*") && strings.HasSuffix(s, "*"):
			p.add(ip, "%q: \"*\" may only stand alone, or begin or end the pattern", s)
		}
	}
}

// checkCIDR reports whether cidr is a valid, masked prefix, and reports
// why not.
func checkCIDR(p *problems, path string, cidr netip.Prefix) bool {
	switch {
	case !cidr.IsValid():
		p.add(path, "invalid CIDR")
		return false
	case cidr != cidr.Masked():
		p.add(path, "%s has address bits set past its /%d prefix (did you mean %s?)", cidr, cidr.Bits(), cidr.Masked())
		return false
	}
	return true
}

func checkDialable(p *problems, path string, ap netip.AddrPort) {
	switch {
	case ap.Port() == 0:
		p.add(path, "%s: port 0 is not a port (1..65535)", ap)
	case ap.Addr().IsUnspecified():
		p.add(path, "%s: the unspecified address cannot be dialled", ap)
	}
}

func required(p *problems, path, v, what string) {
	if v != "" {
		return
	}
	if what == "" {
		p.add(path, "required")
	} else {
		p.add(path, "required: %s", what)
	}
}

func oneOf(p *problems, path, v string, allowed ...string) {
	if !slices.Contains(allowed, v) {
		p.add(path, "%q is not one of: %s", v, strings.Join(allowed, " | "))
	}
}

func uniqueName(p *problems, seen map[string]string, base, name string) {
	if name == "" {
		p.add(base+".name", "required")
		return
	}
	if other, dup := seen[name]; dup {
		p.add(base+".name", "duplicate name %q (also %s)", name, other)
		return
	}
	seen[name] = base
}

func nonNegative(p *problems, path string, d Duration) {
	if d.Duration < 0 {
		p.add(path, "must not be negative (got %s)", d)
	}
}

func positive(p *problems, path string, d Duration) {
	if d.Duration <= 0 {
		p.add(path, "must be positive (got %s)", d)
	}
}

// checkNamePart checks a Kubernetes-style name that ends up in a SPIFFE ID
// path segment or a "namespace/name" reference.
func checkNamePart(p *problems, path, s string) {
	if s == "" {
		return // reported as required
	}
	if err := identity.CheckSegment(s); err != nil {
		p.add(path, "%v", err)
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
