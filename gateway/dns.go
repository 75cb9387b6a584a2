package gateway

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/dnsproxy"
	"github.com/meshtun/meshtun/tun"
)

// The DNS server of [dns] (dnsproxy): its names are the hostnames of the
// services of the snapshot in force, so a reload or an xDS push changes
// its answers with the same swap that changes the routes.

// zoneOf is the DNS zone of a config in force: each service's hostname
// and VIPs, within dns.domains; short names expand in this node's
// namespace (mesh.namespace, "" with the mesh off).
func zoneOf(cfg *config.Config) *dnsproxy.Zone {
	ns := ""
	if cfg.Mesh.Enabled() {
		ns = cfg.Mesh.Namespace
	}
	var hosts []dnsproxy.Host
	for _, s := range cfg.Services {
		if s.Hostname != "" {
			hosts = append(hosts, dnsproxy.Host{Name: s.Hostname, Addrs: s.VIPs})
		}
	}
	return dnsproxy.NewZone(dnsproxy.ZoneOptions{
		Domains:   cfg.DNS.Domains,
		Namespace: ns,
		TTL:       cfg.DNS.TTL.Duration,
	}, hosts)
}

// startDNS starts the DNS server on dns.listen and, with a TUN, tells
// systemd-resolved to send dns.domains to it; stop undoes both.
func (g *Gateway) startDNS() (stop func(), err error) {
	d := g.cfg.DNS
	log := g.log.Named("dns")
	upstream := d.Upstream
	if len(upstream) == 0 {
		if upstream, err = dnsproxy.Nameservers(dnsproxy.ResolvConf, d.Listen); err != nil {
			log.Warn("no upstream resolver: names outside the mesh get SERVFAIL", "error", err)
		} else if len(upstream) == 0 {
			log.Warn("no upstream resolver in " + dnsproxy.ResolvConf + ": names outside the mesh get SERVFAIL; set dns.upstream")
		}
	}
	opts := dnsproxy.Options{
		Listen:   d.Listen,
		Upstream: upstream,
		Zone:     func() *dnsproxy.Zone { return g.snapshot().zone },
		// Twice the rate at once: a burst of a starting host's lookups.
		RateLimit: float64(d.RateLimit),
		Burst:     2 * d.RateLimit,
		Logger:    log,
	}
	if g.cfg.TUN.Name != "" {
		// An upstream inside tun.routes (a cluster's DNS VIP) is reached
		// by the main table, not through our own TUN.
		opts.Control = tun.BypassControl
	}
	srv, err := dnsproxy.New(opts)
	if errors.Is(err, syscall.EACCES) && d.Listen.Port() < 1024 {
		return nil, fmt.Errorf("gateway: dns.listen: %w (port %d needs CAP_NET_BIND_SERVICE: add it to the unit's AmbientCapabilities and CapabilityBoundingSet)", err, d.Listen.Port())
	}
	if err != nil {
		return nil, fmt.Errorf("gateway: dns.listen: %w", err)
	}
	g.metrics.dns.Store(srv)
	var reg *dnsproxy.Resolved
	if g.cfg.TUN.Name != "" {
		reg, err = dnsproxy.RegisterResolved(g.cfg.TUN.Name, d.Listen, d.Domains)
		switch {
		case errors.Is(err, dnsproxy.ErrNoResolved):
			log.Info("systemd-resolved is not in use: to send the mesh's names here, write this line first in /etc/resolv.conf",
				"line", dnsproxy.ResolvConfLine(d.Listen), "port_53_only", d.Listen.Port() == 53)
		case err != nil:
			log.Warn("systemd-resolved was not told of the mesh's domains (is it running, and may this user change a link's DNS?); names resolve only when asked of dns.listen, e.g. with this line first in /etc/resolv.conf",
				"line", dnsproxy.ResolvConfLine(d.Listen), "error", err)
		default:
			log.Info("systemd-resolved sends the mesh's domains here", "link", g.cfg.TUN.Name, "domains", fmt.Sprint(d.Domains))
		}
	}
	return func() {
		if reg != nil {
			if err := reg.Close(); err != nil {
				log.Warn("systemd-resolved: taking back the link's DNS settings", "error", err)
			}
		}
		srv.Close()
	}, nil
}

// ExplainName is ExplainRoute for a service's hostname (or its short
// form) and port: the name is resolved as the DNS server would from the
// snapshot in force, and the first address (IPv4 first) is explained.
func (g *Gateway) ExplainName(name string, port uint16, endpoint int) (RouteAnswer, error) {
	s := g.snapshot()
	return explainName(s.zone, s.router, s.cfg, name, port, endpoint)
}

// ExplainConfigName is ExplainName for a gateway that would run cfg, from
// the config alone (ExplainConfig's rules). `meshtun route --config`
// prints it.
func ExplainConfigName(cfg *config.Config, name string, port uint16, endpoint int) (RouteAnswer, error) {
	return explainName(zoneOf(cfg), NewRouter(cfg), cfg, name, port, endpoint)
}

// explainName resolves name in zone as the DNS server answers it, IPv4
// first, and explains the flow to that address and port.
func explainName(zone *dnsproxy.Zone, router *Router, cfg *config.Config, name string, port uint16, endpoint int) (RouteAnswer, error) {
	addrs, ok := zone.Resolve(name)
	if !ok || len(addrs) == 0 {
		return RouteAnswer{}, fmt.Errorf("no service in force has the hostname %q (dns.domains %v)", name, cfg.DNS.Domains)
	}
	slices.SortStableFunc(addrs, func(a, b netip.Addr) int {
		switch {
		case a.Is4() == b.Is4():
			return 0
		case a.Is4():
			return -1
		}
		return 1
	})
	a := explain(router, cfg, netip.AddrPortFrom(addrs[0], port), endpoint)
	a.Name = name
	return a, nil
}

// SplitNamePort splits NAME:PORT, the name a DNS name (not an IP), for
// `meshtun route` and GET /route.
func SplitNamePort(s string) (name string, port uint16, err error) {
	host, p, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, err
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil || n == 0 {
		return "", 0, fmt.Errorf("port %q is not a number from 1 to 65535", p)
	}
	if _, err := netip.ParseAddr(host); err == nil || host == "" {
		return "", 0, fmt.Errorf("%q is not a host name", host)
	}
	return host, uint16(n), nil
}

// dnsQueriesDesc is the DNS server's family: queries by what was done
// with them.
var dnsQueriesDesc = prometheus.NewDesc("meshtun_dns_queries_total",
	"DNS queries by result: answered (from the mesh's names, records or NODATA), nxdomain, forwarded, upstream_error (SERVFAIL: no upstream answered in time), refused, ratelimited (dropped), malformed (dropped or FORMERR).",
	[]string{"result"}, nil)

// dnsResults are the result label's values, each with its count.
var dnsResults = []struct {
	label string
	value func(dnsproxy.Stats) uint64
}{
	{"answered", func(s dnsproxy.Stats) uint64 { return s.Answered }},
	{"nxdomain", func(s dnsproxy.Stats) uint64 { return s.NXDomain }},
	{"forwarded", func(s dnsproxy.Stats) uint64 { return s.Forwarded }},
	{"upstream_error", func(s dnsproxy.Stats) uint64 { return s.UpstreamError }},
	{"refused", func(s dnsproxy.Stats) uint64 { return s.Refused }},
	{"ratelimited", func(s dnsproxy.Stats) uint64 { return s.RateLimited }},
	{"malformed", func(s dnsproxy.Stats) uint64 { return s.Malformed }},
}

// dnsCollector exports the DNS server's Stats, read once per scrape; no
// sample while no server runs.
type dnsCollector struct {
	stats func() (dnsproxy.Stats, bool)
}

var _ prometheus.Collector = (*dnsCollector)(nil)

func (c *dnsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- dnsQueriesDesc }

func (c *dnsCollector) Collect(ch chan<- prometheus.Metric) {
	s, ok := c.stats()
	if !ok {
		return
	}
	for _, r := range dnsResults {
		ch <- prometheus.MustNewConstMetric(dnsQueriesDesc, prometheus.CounterValue, float64(r.value(s)), r.label)
	}
}
