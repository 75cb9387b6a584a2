package config

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/meshtun/meshtun/identity"
)

// schemaVersion is the only value of the top-level version key this build
// understands.
const schemaVersion = 1

// Config is a decoded, defaulted gateway.toml. Field comments give the TOML
// key; defaults are in Default.
type Config struct {
	Version   int        // version (required)
	Gateway   Gateway    // [gateway]
	Log       Log        // [log]
	TLS       TLS        // [tls]
	TUN       TUN        // [tun]
	Netstack  Netstack   // [netstack]
	HBONE     HBONE      // [hbone]
	Admin     Admin      // [admin]
	Peers     []Peer     // [[peers]]
	Workloads []Workload // [[workloads]]
	Services  []Service  // [[services]]
	Policies  []Policy   // [[policies]]
}

// Gateway is the [gateway] table: who this gateway is.
type Gateway struct {
	Name         string   // name
	TrustDomain  string   // trust_domain
	DrainTimeout Duration // drain_timeout: on SIGTERM, time given to open flows
}

// Log is the [log] table.
type Log struct {
	Level     string // level: trace | debug | info | warn | error
	Format    string // format: text | json
	AccessLog bool   // access_log: one line per connection when it ends
}

// TLS is the [tls] table. After Load the paths are absolute.
type TLS struct {
	Cert        string // cert: this gateway's certificate chain (PEM)
	Key         string // key: its private key (PEM)
	TrustBundle string // trust_bundle: roots peers' certificates must chain to
}

// TUN is the [tun] table: the capture device.
type TUN struct {
	Name      string         // name
	MTU       int            // mtu
	Addresses []netip.Prefix // addresses: given to the device, e.g. 100.64.0.1/32
	Routes    []netip.Prefix // routes: destinations captured into the device
	Offload   string         // offload: auto | on | off
}

// Netstack is the [netstack] table: the userspace TCP/IP stack.
type Netstack struct {
	MaxInFlight int // max_in_flight: TCP handshakes being set up at once
}

// HBONE is the [hbone] table: the tunnel between gateways.
type HBONE struct {
	Listen            string         // listen: inbound host:port; "" turns inbound off
	Serve             []netip.Prefix // serve: destinations inbound streams may reach
	MaxStreamsPerConn int            // max_streams_per_conn
	ConnsPerPeer      int            // conns_per_peer: connections busy flows of one pool key spread over (1..MaxConnsPerPeer)
	IdleTimeout       Duration       // idle_timeout: idle pooled connections are closed
	ConnectTimeout    Duration       // connect_timeout: dialling a peer or a target
}

// MaxConnsPerPeer bounds hbone.conns_per_peer (hbone.MaxConnsPerKey).
const MaxConnsPerPeer = 8

// Admin is the [admin] table. An empty address turns that listener off.
type Admin struct {
	Listen    string // listen: config dump, log level, pprof
	Metrics   string // metrics: /metrics and /stats/prometheus
	Readiness string // readiness: /healthz/ready
}

// Peer is one [[peers]] entry: flows to its CIDRs ride HBONE to Address,
// which must present Identity.
type Peer struct {
	Name     string         // name
	CIDRs    []netip.Prefix // cidrs
	Address  netip.AddrPort // address: the peer's HBONE ip:port
	Identity string         // identity: SPIFFE ID the peer must present
}

// Workload is one [[workloads]] entry, as in ztunnel's local config.
type Workload struct {
	Name           string         // name
	Namespace      string         // namespace
	ServiceAccount string         // service_account
	Addresses      []netip.Addr   // addresses
	Protocol       string         // protocol: HBONE | TCP
	HBONEAddress   netip.AddrPort // hbone_address: where HBONE to it is sent
	Identity       string         // identity: overrides the derived identity
}

// ExpectedIdentity is the SPIFFE ID w must present: Identity if set, else
// spiffe://<trustDomain>/ns/<namespace>/sa/<service account>.
func (w *Workload) ExpectedIdentity(trustDomain string) string {
	if w.Identity != "" {
		return w.Identity
	}
	return identity.WorkloadString(trustDomain, w.Namespace, w.ServiceAccount)
}

// Service is one [[services]] entry: flows to a VIP and service port go to
// one of Endpoints at the mapped target port.
type Service struct {
	Name            string            // name
	Namespace       string            // namespace
	Hostname        string            // hostname
	VIPs            []netip.Addr      // vips
	Ports           map[uint16]uint16 // ports: service port → target port
	Endpoints       []string          // endpoints: workloads as "namespace/name"
	SubjectAltNames []string          // subject_alt_names: extra identities accepted
}

// Policy is one [[policies]] entry, ztunnel's L4 authorization model.
type Policy struct {
	Name   string // name
	Action string // action: allow | deny (required)
	Rules  []Rule // [[policies.rules]]: OR'ed
}

// Rule is one [[policies.rules]] entry. Its fields are AND'ed; the entries of
// one list are OR'ed; an empty list matches anything.
type Rule struct {
	Principals          []string       // principals: "td/ns/x/sa/y", "prefix*", "*suffix" or "*"
	NotPrincipals       []string       // not_principals
	Namespaces          []string       // namespaces
	NotNamespaces       []string       // not_namespaces
	SourceIPs           []netip.Prefix // source_ips
	NotSourceIPs        []netip.Prefix // not_source_ips
	DestinationIPs      []netip.Prefix // destination_ips
	NotDestinationIPs   []netip.Prefix // not_destination_ips
	DestinationPorts    []uint16       // destination_ports
	NotDestinationPorts []uint16       // not_destination_ports
}

// Duration is a time.Duration written in TOML as a string such as "5s" or
// "5m" (time.ParseDuration syntax).
type Duration struct{ time.Duration }

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(text []byte) error {
	v, err := time.ParseDuration(string(text))
	if err != nil {
		return fmt.Errorf("invalid duration %q: write a number and a unit, like \"5s\" or \"5m\"", text)
	}
	d.Duration = v
	return nil
}

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) {
	return []byte(d.Duration.String()), nil
}
