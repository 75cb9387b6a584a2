package config

import (
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// base is the smallest valid file: what has no default.
const base = `version = 1
[tls]
cert = "/etc/meshtun/tls/cert.pem"
key = "/etc/meshtun/tls/key.pem"
trust_bundle = "/etc/meshtun/tls/ca.pem"
`

func mustParse(t *testing.T, doc string) *Config {
	t.Helper()
	c, err := Parse([]byte(doc), "test.toml")
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return c
}

func prefixes(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, x := range s {
		out = append(out, netip.MustParsePrefix(x))
	}
	return out
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, x := range s {
		out = append(out, netip.MustParseAddr(x))
	}
	return out
}

func TestShippedFile(t *testing.T) {
	data, err := os.ReadFile("../gateway.toml")
	if err != nil {
		t.Fatal(err)
	}
	got := mustParse(t, string(data))
	want := &Config{
		Version: 1,
		Gateway: Gateway{Name: "node-a", TrustDomain: "cluster.local", DrainTimeout: Duration{5 * time.Second}, WorkloadKind: "pod"},
		Log:     Log{Level: "info", Format: "text", AccessLog: true},
		TLS: TLS{
			Cert:        "/etc/meshtun/tls/cert.pem",
			Key:         "/etc/meshtun/tls/key.pem",
			TrustBundle: "/etc/meshtun/tls/ca.pem",
		},
		Mesh: Mesh{ // off: the shipped file has [mesh] commented out
			RootCert:  "/var/run/secrets/istio/root-cert.pem",
			TokenFile: "/var/run/secrets/tokens/istio-token",
			ClusterID: "Kubernetes",
			CertTTL:   Duration{24 * time.Hour},
		},
		TUN: TUN{
			Name:      "meshtun0",
			MTU:       65000,
			Addresses: prefixes("100.64.0.1/32"),
			Routes:    prefixes("10.244.2.0/24", "10.96.0.0/16"),
			Offload:   "auto",
		},
		Netstack: Netstack{MaxInFlight: 4096},
		HBONE: HBONE{
			Listen:                   "0.0.0.0:15008",
			Serve:                    prefixes("10.244.1.0/24"),
			MaxStreamsPerConn:        100,
			ConnsPerPeer:             1,
			IdleTimeout:              Duration{5 * time.Minute},
			ConnectTimeout:           Duration{10 * time.Second},
			MaxInboundConns:          4096,
			MaxInboundStreamsPerConn: 200,
			HandshakeTimeout:         Duration{10 * time.Second},
		},
		Admin: Admin{Listen: "127.0.0.1:15000", Metrics: "0.0.0.0:15020", Readiness: "0.0.0.0:15021"},
		Peers: []Peer{{
			Name:     "node-b",
			CIDRs:    prefixes("10.244.2.0/24"),
			Address:  netip.MustParseAddrPort("192.0.2.2:15008"),
			Identity: "spiffe://cluster.local/ns/meshtun/sa/node-b",
		}},
		Networks: []Network{{
			Name:     "cluster-net",
			Gateway:  netip.MustParseAddrPort("203.0.113.10:15008"),
			Identity: "spiffe://cluster.local/ns/istio-system/sa/istio-eastwestgateway",
		}},
		Workloads: []Workload{{
			Name:           "web",
			Namespace:      "default",
			ServiceAccount: "web",
			Addresses:      addrs("10.244.2.5"),
			Protocol:       "HBONE",
			HBONEAddress:   netip.MustParseAddrPort("192.0.2.2:15008"),
		}},
		Services: []Service{{
			Name:            "web",
			Namespace:       "default",
			Hostname:        "web.default.svc.cluster.local",
			VIPs:            addrs("10.96.0.10"),
			Ports:           map[uint16]uint16{80: 8080},
			Endpoints:       []string{"default/web"},
			SubjectAltNames: []string{},
		}},
		DNS: DNS{
			Listen:    netip.MustParseAddrPort("100.64.0.1:53"),
			Domains:   []string{"cluster.local"},
			Upstream:  []netip.AddrPort{},
			TTL:       Duration{30 * time.Second},
			RateLimit: 1000,
		},
		Policies: []Policy{{
			Name:   "web-from-client",
			Action: "allow",
			Rules: []Rule{{
				Principals:       []string{"cluster.local/ns/default/sa/client"},
				DestinationPorts: []uint16{8080},
			}},
		}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("../gateway.toml decoded to\n%+v\nwant\n%+v", got, want)
	}
}

func TestExampleFile(t *testing.T) {
	data, err := os.ReadFile("testdata/gateway-example.toml")
	if err != nil {
		t.Fatal(err)
	}
	c := mustParse(t, string(data))
	for _, tc := range []struct {
		name      string
		got, want any
	}{
		{"gateway.name", c.Gateway.Name, "node-a"},
		{"tun.routes", c.TUN.Routes, prefixes("10.244.2.0/24", "10.96.0.0/16")},
		{"peers[0].address", c.Peers[0].Address, netip.MustParseAddrPort("192.0.2.2:15008")},
		{"workloads[0].identity", c.Workloads[0].ExpectedIdentity(c.Gateway.TrustDomain), "spiffe://cluster.local/ns/default/sa/web"},
		{"services[0].ports", c.Services[0].Ports, map[uint16]uint16{80: 8080}},
		{"policies[0].rules[0].destination_ports", c.Policies[0].Rules[0].DestinationPorts, []uint16{8080}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !reflect.DeepEqual(tc.got, tc.want) {
				t.Errorf("got %v, want %v", tc.got, tc.want)
			}
		})
	}
}

func TestDefault(t *testing.T) {
	host, _ := os.Hostname()
	d := Default()
	for _, tc := range []struct {
		name      string
		got, want any
	}{
		{"version", d.Version, 0}, // required, no default
		{"gateway.name", d.Gateway.Name, host},
		{"gateway.trust_domain", d.Gateway.TrustDomain, "cluster.local"},
		{"gateway.drain_timeout", d.Gateway.DrainTimeout.Duration, 5 * time.Second},
		{"gateway.max_flows_per_source", d.Gateway.MaxFlowsPerSource, 0},
		{"log.level", d.Log.Level, "info"},
		{"log.format", d.Log.Format, "text"},
		{"log.access_log", d.Log.AccessLog, true},
		{"tls", d.TLS, TLS{}},
		{"tun.name", d.TUN.Name, "meshtun0"},
		{"tun.mtu", d.TUN.MTU, 65000},
		{"tun.offload", d.TUN.Offload, "auto"},
		{"tun.addresses", len(d.TUN.Addresses), 0},
		{"tun.routes", len(d.TUN.Routes), 0},
		{"netstack.max_in_flight", d.Netstack.MaxInFlight, 4096},
		{"hbone.listen", d.HBONE.Listen, "0.0.0.0:15008"},
		{"hbone.max_streams_per_conn", d.HBONE.MaxStreamsPerConn, 100},
		{"hbone.conns_per_peer", d.HBONE.ConnsPerPeer, 1},
		{"hbone.idle_timeout", d.HBONE.IdleTimeout.Duration, 5 * time.Minute},
		{"hbone.connect_timeout", d.HBONE.ConnectTimeout.Duration, 10 * time.Second},
		{"hbone.handshake_timeout", d.HBONE.HandshakeTimeout.Duration, 10 * time.Second},
		{"hbone.max_inbound_conns", d.HBONE.MaxInboundConns, 4096},
		{"hbone.max_inbound_streams_per_conn", d.HBONE.MaxInboundStreamsPerConn, 200},
		{"admin.listen", d.Admin.Listen, "127.0.0.1:15000"},
		{"admin.metrics", d.Admin.Metrics, "0.0.0.0:15020"},
		{"admin.readiness", d.Admin.Readiness, "0.0.0.0:15021"},
		{"mesh.xds_address", d.Mesh.XDSAddress, ""},
		{"mesh.ca_address", d.Mesh.CAAddress, ""},
		{"mesh.root_cert", d.Mesh.RootCert, "/var/run/secrets/istio/root-cert.pem"},
		{"mesh.server_name", d.Mesh.ServerName, ""},
		{"mesh.token_file", d.Mesh.TokenFile, "/var/run/secrets/tokens/istio-token"},
		{"mesh.cluster_id", d.Mesh.ClusterID, "Kubernetes"},
		{"mesh.namespace", d.Mesh.Namespace, ""},
		{"mesh.service_account", d.Mesh.ServiceAccount, ""},
		{"mesh.cert_ttl", d.Mesh.CertTTL.Duration, 24 * time.Hour},
		{"mesh.instance_ips", len(d.Mesh.InstanceIPs), 0},
		{"mesh off", d.Mesh.Enabled(), false},
		{"no mesh identity", d.MeshIdentity(), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !reflect.DeepEqual(tc.got, tc.want) {
				t.Errorf("got %v, want %v", tc.got, tc.want)
			}
		})
	}
}

func TestDefaultsFillOmittedKeys(t *testing.T) {
	got := mustParse(t, base)
	want := Default()
	want.Version = 1
	want.TLS = TLS{Cert: "/etc/meshtun/tls/cert.pem", Key: "/etc/meshtun/tls/key.pem", TrustBundle: "/etc/meshtun/tls/ca.pem"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Parse(base) =\n%+v\nwant Default() with version and tls:\n%+v", got, want)
	}
}

func TestWorkloadDefaults(t *testing.T) {
	for _, tc := range []struct {
		name string
		toml string
		want Workload
	}{
		{
			name: "all defaults",
			toml: `name = "web"
namespace = "default"
addresses = ["10.244.2.5", "10.244.2.6"]`,
			want: Workload{Name: "web", Namespace: "default", ServiceAccount: "default",
				Addresses: addrs("10.244.2.5", "10.244.2.6"), Protocol: "HBONE",
				HBONEAddress: netip.MustParseAddrPort("10.244.2.5:15008")},
		},
		{
			name: "ipv6 hbone address",
			toml: `name = "web"
namespace = "default"
addresses = ["fd00::5"]`,
			want: Workload{Name: "web", Namespace: "default", ServiceAccount: "default",
				Addresses: addrs("fd00::5"), Protocol: "HBONE",
				HBONEAddress: netip.MustParseAddrPort("[fd00::5]:15008")},
		},
		{
			name: "tcp has no hbone address",
			toml: `name = "db"
namespace = "data"
service_account = "pg"
addresses = ["10.244.2.7"]
protocol = "TCP"`,
			want: Workload{Name: "db", Namespace: "data", ServiceAccount: "pg",
				Addresses: addrs("10.244.2.7"), Protocol: "TCP"},
		},
		{
			name: "explicit values kept",
			toml: `name = "web"
namespace = "default"
addresses = ["10.244.2.5"]
hbone_address = "192.0.2.2:15008"
identity = "spiffe://cluster.local/ns/meshtun/sa/node-b"`,
			want: Workload{Name: "web", Namespace: "default", ServiceAccount: "default",
				Addresses: addrs("10.244.2.5"), Protocol: "HBONE",
				HBONEAddress: netip.MustParseAddrPort("192.0.2.2:15008"),
				Identity:     "spiffe://cluster.local/ns/meshtun/sa/node-b"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := mustParse(t, base+"[[workloads]]\n"+tc.toml+"\n")
			if !reflect.DeepEqual(c.Workloads[0], tc.want) {
				t.Errorf("got %+v\nwant %+v", c.Workloads[0], tc.want)
			}
		})
	}
}

func TestExpectedIdentity(t *testing.T) {
	for _, tc := range []struct {
		name string
		w    Workload
		want string
	}{
		{"derived", Workload{Namespace: "default", ServiceAccount: "web"}, "spiffe://example.org/ns/default/sa/web"},
		{"override", Workload{Namespace: "default", ServiceAccount: "web", Identity: "spiffe://example.org/x"}, "spiffe://example.org/x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.w.ExpectedIdentity("example.org"); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestDuration(t *testing.T) {
	for _, tc := range []struct {
		name    string
		text    string
		want    time.Duration
		wantErr bool
	}{
		{"seconds", "5s", 5 * time.Second, false},
		{"minutes", "5m", 5 * time.Minute, false},
		{"compound", "1h30m", 90 * time.Minute, false},
		{"no unit", "5", 0, true},
		{"garbage", "soon", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var d Duration
			err := d.UnmarshalText([]byte(tc.text))
			if (err != nil) != tc.wantErr {
				t.Fatalf("UnmarshalText(%q) error = %v, want error %v", tc.text, err, tc.wantErr)
			}
			if err != nil {
				return
			}
			if d.Duration != tc.want {
				t.Errorf("got %v, want %v", d.Duration, tc.want)
			}
			text, _ := d.MarshalText()
			var back Duration
			if err := back.UnmarshalText(text); err != nil || back != d {
				t.Errorf("round trip through %q gave %v, %v", text, back, err)
			}
		})
	}
}

func TestIPv6(t *testing.T) {
	c := mustParse(t, base+`
[tun]
addresses = ["fd00:100::1/128"]
routes = ["fd00:244::/48", "fd00:96::10"]
[hbone]
listen = "[::]:15008"
serve = ["fd00:244:1::/64"]
[[peers]]
name = "b"
cidrs = ["fd00:244:2::/64"]
address = "[fd00::2]:15008"
identity = "spiffe://cluster.local/ns/meshtun/sa/b"
`)
	if want := prefixes("fd00:244::/48", "fd00:96::10/128"); !reflect.DeepEqual(c.TUN.Routes, want) {
		t.Errorf("tun.routes = %v, want %v", c.TUN.Routes, want)
	}
	if want := netip.MustParseAddrPort("[fd00::2]:15008"); c.Peers[0].Address != want {
		t.Errorf("peers[0].address = %v, want %v", c.Peers[0].Address, want)
	}
}

// meshFile is the smallest valid file with the mesh on (no [tls]), with
// lines added to [mesh]; a line for xds_address, namespace or
// service_account replaces the default one.
func meshFile(lines ...string) string {
	keys := []string{
		`xds_address = "istiod.istio-system.svc:15012"`,
		`namespace = "vm"`,
		`service_account = "vm-sa"`,
	}
	for _, l := range lines {
		name, _, _ := strings.Cut(l, " =")
		keys = slices.DeleteFunc(keys, func(k string) bool { return strings.HasPrefix(k, name+" =") })
		if !strings.HasSuffix(l, "= <absent>") {
			keys = append(keys, l)
		}
	}
	return "version = 1\n[mesh]\n" + strings.Join(keys, "\n") + "\n"
}

func TestMeshDefaults(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		lines                []string
		wantCA, wantServer   string
		wantEnabled          bool
		wantMeshIdentityText string
	}{
		{"host name", nil,
			"istiod.istio-system.svc:15012", "istiod.istio-system.svc", true, "spiffe://cluster.local/ns/vm/sa/vm-sa"},
		{"ipv4 literal", []string{`xds_address = "10.96.0.20:15012"`},
			"10.96.0.20:15012", "10.96.0.20", true, "spiffe://cluster.local/ns/vm/sa/vm-sa"},
		{"ipv6 literal", []string{`xds_address = "[fd00:96::20]:15012"`},
			"[fd00:96::20]:15012", "fd00:96::20", true, "spiffe://cluster.local/ns/vm/sa/vm-sa"},
		{"explicit values kept", []string{`ca_address = "ca.example.org:15443"`, `server_name = "istiod.example.org"`},
			"ca.example.org:15443", "istiod.example.org", true, "spiffe://cluster.local/ns/vm/sa/vm-sa"},
		{"server name from xds, not ca", []string{`ca_address = "ca.example.org:15443"`},
			"ca.example.org:15443", "istiod.istio-system.svc", true, "spiffe://cluster.local/ns/vm/sa/vm-sa"},
		{"written empty is derived", []string{`ca_address = ""`, `server_name = ""`},
			"istiod.istio-system.svc:15012", "istiod.istio-system.svc", true, "spiffe://cluster.local/ns/vm/sa/vm-sa"},
		{"off", []string{`xds_address = <absent>`, `namespace = <absent>`, `service_account = <absent>`},
			"", "", false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := meshFile(tc.lines...)
			if !tc.wantEnabled {
				doc = base + "[mesh]\n"
			}
			c := mustParse(t, doc)
			m := c.Mesh
			if m.CAAddress != tc.wantCA || m.ServerName != tc.wantServer || m.Enabled() != tc.wantEnabled {
				t.Errorf("ca_address %q, server_name %q, enabled %v; want %q, %q, %v",
					m.CAAddress, m.ServerName, m.Enabled(), tc.wantCA, tc.wantServer, tc.wantEnabled)
			}
			if got := c.MeshIdentity(); got != tc.wantMeshIdentityText {
				t.Errorf("MeshIdentity = %q, want %q", got, tc.wantMeshIdentityText)
			}
			if want := (Mesh{RootCert: "/var/run/secrets/istio/root-cert.pem", TokenFile: "/var/run/secrets/tokens/istio-token",
				ClusterID: "Kubernetes", CertTTL: Duration{24 * time.Hour}}); m.RootCert != want.RootCert ||
				m.TokenFile != want.TokenFile || m.ClusterID != want.ClusterID || m.CertTTL != want.CertTTL || m.InstanceIPs != nil {
				t.Errorf("mesh = %+v, want the defaults of %+v", m, want)
			}
		})
	}
}

func TestMeshValues(t *testing.T) {
	c := mustParse(t, `version = 1
[gateway]
trust_domain = "example.org"
[tls]
trust_bundle = "/etc/meshtun/extra-roots.pem"
[mesh]
xds_address = "istiod.istio-system.svc:15012"
root_cert = "/etc/istio/root.pem"
token_file = "/etc/istio/token"
cluster_id = "east-1"
namespace = "vms"
service_account = "db-vm"
cert_ttl = "12h"
instance_ips = ["192.0.2.10", "fd00::10"]
[[peers]]
name = "b"
cidrs = ["10.244.3.0/24"]
address = "192.0.2.2:15008"
identity = "spiffe://example.org/ns/meshtun/sa/b"
[[workloads]]
name = "web"
namespace = "default"
addresses = ["10.244.2.5"]
[[services]]
name = "web"
namespace = "default"
vips = ["10.96.0.10"]
ports = { 80 = 8080 }
endpoints = ["default/web"]
[[policies]]
name = "p"
action = "allow"
`)
	want := Mesh{
		XDSAddress: "istiod.istio-system.svc:15012", CAAddress: "istiod.istio-system.svc:15012",
		RootCert: "/etc/istio/root.pem", ServerName: "istiod.istio-system.svc", TokenFile: "/etc/istio/token",
		ClusterID: "east-1", Namespace: "vms", ServiceAccount: "db-vm", CertTTL: Duration{12 * time.Hour},
		InstanceIPs: addrs("192.0.2.10", "fd00::10"),
	}
	if !reflect.DeepEqual(c.Mesh, want) {
		t.Errorf("mesh = %+v\nwant %+v", c.Mesh, want)
	}
	if got, want := c.MeshIdentity(), "spiffe://example.org/ns/vms/sa/db-vm"; got != want {
		t.Errorf("MeshIdentity = %q, want %q", got, want)
	}
	if c.TLS != (TLS{TrustBundle: "/etc/meshtun/extra-roots.pem"}) {
		t.Errorf("tls = %+v, want the trust bundle only", c.TLS)
	}
	if len(c.Peers) != 1 || len(c.Workloads) != 1 || len(c.Services) != 1 || len(c.Policies) != 1 {
		t.Errorf("the file's entries beside the mesh: %d peers, %d workloads, %d services, %d policies; want 1 each",
			len(c.Peers), len(c.Workloads), len(c.Services), len(c.Policies))
	}
}
