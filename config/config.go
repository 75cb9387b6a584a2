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

// Config is a decoded, defaulted gateway.toml.
//
// These structs are the schema, the one place it is written: decoding,
// the defaults, the key paths of errors, /config_dump (Dump), the reload
// difference (Diff, ReloadApplied, InForce) and the test that holds the
// shipped gateway.toml to the schema all read their tags:
//
//   - toml:"key" is the key in the file. A struct field is a [table], a
//     slice of structs an [[array of tables]]. Options after a comma:
//     "required" (the file must set it: no default) or "derived" (its
//     default is worked out from other keys, by Default or setDefaults).
//   - if:"cond" or unless:"cond" beside "required": the key is required
//     only while the condition holds, or only while it does not. A
//     condition is a state of the whole file, named in the schema's
//     conditions (schema.go): "mesh" is "[mesh] is on".
//   - default:"text" is the default, written as the value's text: "5s",
//     "65000", "true", "cluster.local"; a list as a TOML array,
//     "[\"cluster.local\"]". A key without it defaults to its
//     zero value ("", [], false). The comment beside a default gives its
//     reason.
//   - values:"a|b|c" lists the values a string key may take; Validate
//     refuses others.
//   - reload:"apply" marks a key that a reload (SIGHUP) puts in force;
//     any other key needs a restart.
//   - toml:"-" (alone) is a field that is not a key: what the program sets
//     from the mesh (an entry's Source, a workload's Network or Waypoint).
//     A file that writes it gets an unknown-key error.
type Config struct {
	Version   int        `toml:"version,required"`
	Gateway   Gateway    `toml:"gateway"`
	Log       Log        `toml:"log"`
	TLS       TLS        `toml:"tls"`
	Mesh      Mesh       `toml:"mesh"`
	TUN       TUN        `toml:"tun"`
	Netstack  Netstack   `toml:"netstack"`
	HBONE     HBONE      `toml:"hbone"`
	Admin     Admin      `toml:"admin"`
	DNS       DNS        `toml:"dns"`
	Peers     []Peer     `toml:"peers" reload:"apply"`
	Networks  []Network  `toml:"networks" reload:"apply"`
	Workloads []Workload `toml:"workloads" reload:"apply"`
	Services  []Service  `toml:"services" reload:"apply"`
	Policies  []Policy   `toml:"policies" reload:"apply"`

	// Network is this node's network in the mesh (its own workload's,
	// from istiod); "" off the mesh. Workloads of another network are
	// reached through their network's gateway (Workload.NetworkGateway),
	// or not at all.
	Network string `toml:"-"`
	// Self is this node's own workload as istiod describes it (its
	// namespace and service account ours, an address among INSTANCE_IPS);
	// nil off the mesh or while istiod sends none.
	Self *Workload `toml:"-"`
}

// Where an entry of [[workloads]], [[services]] or [[policies]] came from
// (their Source): the file, or istiod's xDS. "" reads as SourceFile.
const (
	SourceFile = "file"
	SourceXDS  = "xds"
)

// SourceOf is src with "" read as SourceFile.
func SourceOf(src string) string {
	if src == "" {
		return SourceFile
	}
	return src
}

// Gateway is the [gateway] table: who this gateway is.
type Gateway struct {
	// Logs, metrics and access lines from a node are easiest to read when
	// they carry the node's own name: Default sets the host name.
	Name string `toml:"name,derived"`
	// Kubernetes' and Istio's default, so certificates from a stock istiod
	// or cert-manager setup match.
	TrustDomain string `toml:"trust_domain" default:"cluster.local"`
	// On SIGTERM, the time open flows get to finish. Long enough for short
	// requests, short enough to fit inside Kubernetes' 30s termination
	// grace period.
	DrainTimeout Duration `toml:"drain_timeout" default:"5s" reload:"apply"`
	// Flows open at once from one source address, in each direction
	// (outbound: a local application's address; inbound: the client's, as
	// the peer forwarded it). 0 is no limit: outbound flows of a node
	// mostly come from its one address, so a default would cap the node.
	MaxFlowsPerSource int `toml:"max_flows_per_source" default:"0" reload:"apply"`
	// EastWest, if set, makes this node its network's east-west gateway
	// too: a second HBONE listener at this ip:port, where outer CONNECTs
	// (double HBONE from another network) addressed to a workload or
	// service of this node's routes are forwarded, their inner connection
	// as bytes, to the destination's HBONE address. "" is off: a network
	// needs one such address reachable from the others, not one per node.
	EastWest string `toml:"east_west"`

	// This node's workload as Istio describes one: sent in the baggage
	// header of every outbound CONNECT (hbone.Baggage) and the labels of
	// the metrics of its flows (source_* outbound, destination_* inbound).
	// "" is not known: with [mesh] on, the value istiod gives this node's
	// own workload (Config.Self; the namespace also mesh.namespace, the
	// cluster mesh.cluster_id), else what the node knows of itself (the
	// namespace of its SPIFFE identity, gateway.name as the workload's
	// name), else "unknown" on the metrics and nothing in the baggage. A
	// value set here wins over the mesh's: the operator
	// named it. A reload applies them: they only describe, and new flows
	// take the new description.
	Cluster           string `toml:"cluster" reload:"apply"`
	WorkloadNamespace string `toml:"workload_namespace" reload:"apply"`
	WorkloadName      string `toml:"workload_name" reload:"apply"`
	// The kind of k8s.<kind>.name. Istio's for a WorkloadEntry (a VM);
	// ztunnel reads only these kinds.
	WorkloadKind string `toml:"workload_kind" default:"pod" values:"pod|deployment|job|cronjob" reload:"apply"`
	// "" is Istio's rule when no label names them: the workload's name,
	// and "latest".
	CanonicalService  string `toml:"canonical_service" reload:"apply"`
	CanonicalRevision string `toml:"canonical_revision" reload:"apply"`
}

// Log is the [log] table.
type Log struct {
	// One line per lifecycle event, none per packet.
	Level string `toml:"level" default:"info" values:"trace|debug|info|warn|error" reload:"apply"`
	// Read by people first; json for collectors.
	Format string `toml:"format" default:"text" values:"text|json"`
	// One line per connection when it ends: cheap, and what operators ask
	// for first.
	AccessLog bool `toml:"access_log" default:"true"`
}

// TLS is the [tls] table. After Load the paths are absolute.
//
// With [mesh] on, the certificate and its key come from Istio's CA: Cert
// and Key must be left out, and TrustBundle, optional, adds roots trusted
// beside the mesh's.
type TLS struct {
	Cert        string `toml:"cert,required" unless:"mesh"`         // this gateway's certificate chain (PEM)
	Key         string `toml:"key,required" unless:"mesh"`          // its private key (PEM)
	TrustBundle string `toml:"trust_bundle,required" unless:"mesh"` // roots peers' certificates must chain to
}

// Mesh is the [mesh] table: joining an Istio ambient mesh, whose istiod
// serves this node's certificate (its CA) and the mesh's workloads,
// services and policies (xDS). Setting XDSAddress turns it on (Enabled);
// with it "", the default, meshtun runs from the file alone. After Load
// the paths are absolute.
//
// No key of it is applied by a reload: the connections to istiod, the
// identity in the certificate and the node's metadata are set up once at
// start, so a change needs a restart.
type Mesh struct {
	// istiod's xDS host:port. Off by default: a gateway runs from its
	// file unless told where its control plane is.
	XDSAddress string `toml:"xds_address"`
	// Istio's CA host:port. istiod serves both on one port (15012), so
	// it defaults to XDSAddress (setDefaults).
	CAAddress string `toml:"ca_address,derived"`
	// The roots istiod's serving certificate must chain to (PEM). Where
	// Istio mounts its root into a pod; on a VM, copy it there.
	RootCert string `toml:"root_cert" default:"/var/run/secrets/istio/root-cert.pem"`
	// The name istiod's serving certificate must carry, on the xDS and
	// the CA connection. Istio's certificate names istiod by the host
	// clients dial, so it defaults to the host of XDSAddress
	// (setDefaults).
	ServerName string `toml:"server_name,derived"`
	// A Kubernetes service account token with audience istio-ca, sent to
	// istiod on every call; read anew each time, as kubelet rotates it.
	// Where Kubernetes projects Istio's token into a pod.
	TokenFile string `toml:"token_file" default:"/var/run/secrets/tokens/istio-token"`
	// The cluster istiod serves, sent as the clusterid header and the
	// CLUSTER_ID of the node's metadata. Istio's default cluster name.
	ClusterID string `toml:"cluster_id" default:"Kubernetes"`
	// This node's network, as ztunnel's NETWORK (Istio's
	// global.network): "" takes its own workload's from istiod. Set it
	// for a VM in a network of its own: a multi-network istiod sends only
	// its own network's workloads, never the VM's WorkloadEntry.
	Network string `toml:"network"`
	// This node's workload identity is spiffe://<gateway.trust_domain>/
	// ns/<Namespace>/sa/<ServiceAccount> (MeshIdentity): istiod checks
	// both against the token and signs nothing else.
	Namespace      string `toml:"namespace,required" if:"mesh"`
	ServiceAccount string `toml:"service_account,required" if:"mesh"`
	// The lifetime asked of the CA for this node's certificate. Istio's
	// own workload default (its SECRET_TTL), renewed at half life.
	CertTTL Duration `toml:"cert_ttl" default:"24h"`
	// The node's addresses, sent to istiod as INSTANCE_IPS, by which it
	// finds this node's own workload. Empty: the host's addresses, found
	// at run time; no default can be written, as they are the host's.
	InstanceIPs []netip.Addr `toml:"instance_ips"`
}

// Bounds of mesh.cert_ttl. Below 10 minutes, renewing at half life with
// jitter and retries with backoff leaves no room before the certificate
// expires, and every node asks the CA every few minutes; above 90 days,
// Istio's CA refuses the request (its default MAX_WORKLOAD_CERT_TTL).
const (
	MinCertTTL = 10 * time.Minute
	MaxCertTTL = 90 * 24 * time.Hour
)

// Enabled reports whether the mesh is on: mesh.xds_address is set.
func (m *Mesh) Enabled() bool { return m.XDSAddress != "" }

// MeshIdentity is this node's SPIFFE ID in the mesh,
// spiffe://<gateway.trust_domain>/ns/<mesh.namespace>/sa/<mesh.service_account>,
// the URI SAN of the certificate it asks Istio's CA for; "" with the mesh
// off. Validate checks its parts.
func (c *Config) MeshIdentity() string {
	if !c.Mesh.Enabled() {
		return ""
	}
	return identity.WorkloadString(c.Gateway.TrustDomain, c.Mesh.Namespace, c.Mesh.ServiceAccount)
}

// TUN is the [tun] table: the capture device.
type TUN struct {
	// Names the product and fits in IFNAMSIZ (15 bytes).
	Name string `toml:"name" default:"meshtun0"`
	// Packets never leave the host on the TUN, so the MTU only sets how
	// many bytes cross the kernel boundary per read: larger is faster
	// (docs/field-notes.md, "TUN and MTU").
	MTU int `toml:"mtu" default:"65000"`
	// Given to the device, e.g. 100.64.0.1/32. No default: they depend on
	// the node's address plan, and nothing sensible can be guessed.
	Addresses []netip.Prefix `toml:"addresses"`
	// Destinations captured into the device; no default, as Addresses.
	Routes []netip.Prefix `toml:"routes"`
	// auto uses TSO/GRO where the kernel offers them and falls back
	// silently.
	Offload string `toml:"offload" default:"auto" values:"auto|on|off"`
}

// Netstack is the [netstack] table: the userspace TCP/IP stack.
type Netstack struct {
	// TCP handshakes being set up at once. Bounds memory for half-open
	// handshakes under a SYN flood while leaving room for bursts of
	// thousands of real clients.
	MaxInFlight int `toml:"max_in_flight" default:"4096"`
}

// HBONE is the [hbone] table: the tunnel between gateways.
type HBONE struct {
	// Inbound host:port; "" turns inbound off. ztunnel's HBONE port, so
	// the two interoperate.
	Listen string `toml:"listen" default:"0.0.0.0:15008"`
	// Destinations inbound streams may reach.
	Serve []netip.Prefix `toml:"serve" reload:"apply"`
	// Istio's default; above it a new connection spreads the load and
	// bounds what one lost connection takes down.
	MaxStreamsPerConn int `toml:"max_streams_per_conn" default:"100"`
	// Connections busy flows of one pool key spread over
	// (1..MaxConnsPerPeer). 1 is one connection per pool key until it is
	// full, as ztunnel does and docs/hbone.md ("Pooling") describes;
	// more spreads concurrent bulk flows over that many connections (and
	// their goroutines) on machines with cores to spare.
	ConnsPerPeer int `toml:"conns_per_peer" default:"1"`
	// Idle pooled connections are closed after it. Keeps warm connections
	// across bursts without holding idle sockets to departed peers for
	// long.
	IdleTimeout Duration `toml:"idle_timeout" default:"5m"`
	// Dialling a peer or a target. A peer that takes longer is unreachable
	// in practice; clients are better served by an error.
	ConnectTimeout Duration `toml:"connect_timeout" default:"10s"`
	// Inbound connections open at once, in the handshake or serving. A
	// peer gateway pools its flows on one or a few connections, so even a
	// large mesh needs few; the bound keeps a flood of TCP connections
	// from taking sockets and goroutines without end.
	MaxInboundConns int `toml:"max_inbound_conns" default:"4096"`
	// Streams one inbound connection may have open; more are refused with
	// REFUSED_STREAM and the client opens another connection. ztunnel's
	// SETTINGS_MAX_CONCURRENT_STREAMS.
	MaxInboundStreamsPerConn int `toml:"max_inbound_streams_per_conn" default:"200"`
	// From the TCP accept to the client's first CONNECT: the TLS handshake,
	// the HTTP/2 preface and SETTINGS and one request. A client that
	// takes longer (or sends its ClientHello a byte at a time) is closed.
	HandshakeTimeout Duration `toml:"handshake_timeout" default:"10s"`
}

// MaxConnsPerPeer bounds hbone.conns_per_peer (hbone.MaxConnsPerKey).
const MaxConnsPerPeer = 8

// Admin is the [admin] table. An empty address turns that listener off.
type Admin struct {
	// Config dump, log level, pprof. ztunnel's admin port; local only, as
	// it can change the log level.
	Listen string `toml:"listen" default:"127.0.0.1:15000"`
	// /metrics and /stats/prometheus, on Istio's merged-metrics port,
	// where scrapers look.
	Metrics string `toml:"metrics" default:"0.0.0.0:15020"`
	// /healthz/ready, on Istio's readiness port, where kubelet probes look.
	Readiness string `toml:"readiness" default:"0.0.0.0:15021"`
}

// DNS is the [dns] table: the node's DNS server for mesh names
// (dnsproxy). It answers A and AAAA for the hostnames of the services in
// force (the file's and, with [mesh], istiod's), NXDOMAIN for other names
// within Domains, and forwards every other name to Upstream.
//
// Off by default, as ztunnel's DNS proxy is: it binds port 53 and, where
// systemd-resolved runs, asks it to send Domains to this server; an
// operator turns that on knowingly.
type DNS struct {
	Enabled bool `toml:"enabled"`
	// The server's UDP and TCP address. The TUN's own address is on this
	// host and nothing else listens there (setDefaults: its first
	// tun.addresses address, port 53).
	Listen netip.AddrPort `toml:"listen,derived"`
	// The mesh's DNS domains: names within them are the mesh's, answered
	// or NXDOMAIN, never forwarded; systemd-resolved is told to route
	// them here. Kubernetes' default cluster domain.
	Domains []string `toml:"domains" default:"[\"cluster.local\"]"`
	// Where other names are forwarded, ip:port, tried in order. Empty:
	// the nameservers of /etc/resolv.conf, read at start (no default can
	// be written: they are the host's).
	Upstream []netip.AddrPort `toml:"upstream"`
	// The TTL of the answers for mesh names. ztunnel's: short enough that
	// a changed VIP reaches clients soon, long enough to spare the server
	// a query per connection.
	TTL Duration `toml:"ttl" default:"30s" reload:"apply"`
	// Queries a second each source address may ask, twice that at once;
	// past it they are dropped and counted. The node's clients share one
	// source (the TUN's address, or systemd-resolved, which caches): a
	// few hundred a second is a busy host, ten times that a loop or a
	// flood.
	RateLimit int `toml:"rate_limit" default:"1000"`
}

// MaxDNSTTL bounds dns.ttl: a day. Clients that cache longer would keep a
// VIP the mesh has moved.
const MaxDNSTTL = 24 * time.Hour

// DefaultDNSPort is the port of a derived dns.listen.
const DefaultDNSPort = 53

// setListen derives dns.listen from the TUN's first address.
func (d *DNS) setListen(t *TUN) {
	if !d.Listen.IsValid() && len(t.Addresses) > 0 && t.Addresses[0].IsValid() {
		d.Listen = netip.AddrPortFrom(t.Addresses[0].Addr(), DefaultDNSPort)
	}
}

// Peer is one [[peers]] entry: flows to its CIDRs ride HBONE to Address,
// which must present Identity.
type Peer struct {
	Name     string         `toml:"name,required"`
	CIDRs    []netip.Prefix `toml:"cidrs,required"`
	Address  netip.AddrPort `toml:"address,required"`  // the peer's HBONE ip:port
	Identity string         `toml:"identity,required"` // SPIFFE ID the peer must present
}

// Network is one [[networks]] entry: another network and its east-west
// gateway, for a mesh without istiod (istiod says the same with each
// workload's network_gateway). A [[workloads]] entry whose network names
// it is reached through the gateway as double HBONE.
type Network struct {
	Name     string         `toml:"name,required"`
	Gateway  netip.AddrPort `toml:"gateway,required"`  // the gateway's HBONE ip:port
	Identity string         `toml:"identity,required"` // SPIFFE ID the gateway must present
}

// Workload is one [[workloads]] entry, as in ztunnel's local config.
type Workload struct {
	Name      string `toml:"name,required"`
	Namespace string `toml:"namespace,required"`
	// A pod without a service account runs as Kubernetes' "default" one.
	ServiceAccount string       `toml:"service_account" default:"default"`
	Addresses      []netip.Addr `toml:"addresses,required"`
	// Workloads behind a meshtun or ztunnel node speak HBONE.
	Protocol string `toml:"protocol" default:"HBONE" values:"HBONE|TCP"`
	// Where HBONE to it is sent. ztunnel's convention: its own first
	// address, port 15008, where the node's gateway captures it
	// (setDefaults).
	HBONEAddress netip.AddrPort `toml:"hbone_address,derived"`
	// Overrides the identity derived from namespace and service account.
	Identity string `toml:"identity,derived"`

	// Network is the workload's network: "" (a file's workload) or
	// Config.Network is this node's; another is reached through its
	// network's gateway (a file's: the [[networks]] entry of that name;
	// the mesh's: NetworkGateway), or refused by routing.
	Network string `toml:"network"`

	// From the mesh only (see Source).
	//
	// Waypoint, if set, receives every flow addressed to the workload.
	Waypoint *Waypoint `toml:"-"`
	// NetworkGateway, for a workload of another network, is that
	// network's east-west gateway (WDS network_gateway, resolved as a
	// waypoint is: its instances' HBONE addresses and identities, its
	// service's subject_alt_names): flows to the workload go through it
	// as double HBONE. Nil in another network: refused by routing.
	NetworkGateway *Waypoint `toml:"-"`
	// Unhealthy workloads are kept but are no service's endpoint.
	Unhealthy bool `toml:"-"`
	// Labels are what Istio's metrics label the workload with; nil has
	// none known, as for a file's workload, which is labelled by its Name
	// and Namespace. A pointer: the pods of one Deployment have the same
	// labels, and the mesh shares one copy among them (mesh/intern.go).
	Labels *WorkloadLabels `toml:"-"`
	// Source is SourceFile ("") or SourceXDS.
	Source string `toml:"-"`
}

// WorkloadLabels are what Istio's metrics label a mesh workload with: its
// workload name (a Deployment's, where Workload.Name is a pod's), kind,
// canonical service and revision, and cluster. "" is not known; a
// WorkloadName of "" is read as the workload's Name (a pod that is its
// own workload has "", so that it shares its labels with its service's
// other pods). Labels may be shared among workloads: never changed once
// set.
type WorkloadLabels struct {
	WorkloadName      string
	WorkloadKind      string
	CanonicalService  string
	CanonicalRevision string
	Cluster           string
}

// Waypoint is where flows to a workload or service with a waypoint go
// instead, as ztunnel sends them: a CONNECT to one of Endpoints whose
// :authority is the original destination. Name says what the waypoint is
// ("namespace/hostname" of its service, or its address); a waypoint
// istiod named but did not send has no Endpoints, and flows are denied.
type Waypoint struct {
	Name      string
	Endpoints []WaypointEndpoint
	// SubjectAltNames are the waypoint service's, accepted beside an
	// endpoint's own identity.
	SubjectAltNames []string
}

// WaypointEndpoint is one waypoint instance: its HBONE address and the
// identity it must present.
type WaypointEndpoint struct {
	Address  netip.AddrPort
	Identity string
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
	Name            string            `toml:"name,required"`
	Namespace       string            `toml:"namespace,required"`
	Hostname        string            `toml:"hostname"`
	VIPs            []netip.Addr      `toml:"vips,required"`
	Ports           map[uint16]uint16 `toml:"ports,required"`    // service port → target port
	Endpoints       []string          `toml:"endpoints"`         // workloads as "namespace/name"
	SubjectAltNames []string          `toml:"subject_alt_names"` // extra identities accepted

	// From the mesh only (see Source).
	//
	// EndpointPorts are an endpoint's own target ports ("namespace/name"
	// → service port → target port), which win over Ports; a target
	// port of 0 in Ports means "the endpoint's", and an endpoint without
	// one serves no flow to that port (ztunnel's rule).
	EndpointPorts map[string]map[uint16]uint16 `toml:"-"`
	// Waypoint, if set, receives every flow to a VIP of the service.
	Waypoint *Waypoint `toml:"-"`
	// Source is SourceFile ("") or SourceXDS.
	Source string `toml:"-"`
}

// Policy is one [[policies]] entry, ztunnel's L4 authorization model.
type Policy struct {
	Name   string `toml:"name,required"`
	Action string `toml:"action,required" values:"allow|deny"`
	Rules  []Rule `toml:"rules"` // OR'ed
	// Source is SourceFile ("") or SourceXDS.
	Source string `toml:"-"`
}

// Rule is one [[policies.rules]] entry. Its fields are AND'ed; the entries of
// one list are OR'ed; an empty list matches anything.
type Rule struct {
	Principals          []string       `toml:"principals"` // "td/ns/x/sa/y", "prefix*", "*suffix" or "*"
	NotPrincipals       []string       `toml:"not_principals"`
	Namespaces          []string       `toml:"namespaces"`
	NotNamespaces       []string       `toml:"not_namespaces"`
	SourceIPs           []netip.Prefix `toml:"source_ips"`
	NotSourceIPs        []netip.Prefix `toml:"not_source_ips"`
	DestinationIPs      []netip.Prefix `toml:"destination_ips"`
	NotDestinationIPs   []netip.Prefix `toml:"not_destination_ips"`
	DestinationPorts    []uint16       `toml:"destination_ports"`
	NotDestinationPorts []uint16       `toml:"not_destination_ports"`
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
