package config

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// parseErrors parses doc, which must fail, and returns its problems.
func parseErrors(t *testing.T, doc string) *Errors {
	t.Helper()
	c, err := Parse([]byte(doc), "gateway.toml")
	if err == nil {
		t.Fatalf("Parse succeeded, want errors; config %+v", c)
	}
	if c != nil {
		t.Errorf("Parse returned a Config beside its error")
	}
	var errs *Errors
	if !errors.As(err, &errs) {
		t.Fatalf("error is %T, want *Errors: %v", err, err)
	}
	return errs
}

// wantLines checks that each of want is a whole line of errs.Error().
func wantLines(t *testing.T, errs *Errors, want ...string) {
	t.Helper()
	lines := strings.Split(errs.Error(), "\n")
	for _, w := range want {
		if !slices.Contains(lines, w) {
			t.Errorf("missing line %q in:\n%s", w, errs)
		}
	}
}

func TestUnknownKeys(t *testing.T) {
	for _, tc := range []struct {
		name string
		doc  string
		want string
	}{
		{"typo in table", base + "[tun]\nmtuu = 1500\n",
			`gateway.toml: tun.mtuu: unknown key (did you mean "mtu"?)`},
		{"typo in array of tables", base + "[[peers]]\nname = \"b\"\nadress = \"192.0.2.2:15008\"\n",
			`gateway.toml: peers[0].adress: unknown key (did you mean "address"?)`},
		{"typo in second entry", base + "[[peers]]\nname = \"a\"\n[[peers]]\nname = \"b\"\nidentiy = \"x\"\n",
			`gateway.toml: peers[1].identiy: unknown key (did you mean "identity"?)`},
		{"typo in nested array of tables", base + "[[policies]]\nname = \"p\"\naction = \"allow\"\n[[policies.rules]]\nprincipal = [\"*\"]\n",
			`gateway.toml: policies[0].rules[0].principal: unknown key (did you mean "principals"?)`},
		{"wrong case", base + "[tun]\nMTU = 1500\n",
			`gateway.toml: tun.MTU: unknown key (did you mean "mtu"?)`},
		{"dash for underscore", base + "[gateway]\ntrust-domain = \"x\"\n",
			`gateway.toml: gateway.trust-domain: unknown key (did you mean "trust_domain"?)`},
		{"unknown table", base + "[tunn]\nmtu = 1500\n",
			`gateway.toml: tunn: unknown key (did you mean "tun"?)`},
		{"nothing close", base + "[netstack]\nbanana = 1\n",
			`gateway.toml: netstack.banana: unknown key (this table has: max_in_flight)`},
		{"quoted key", base + "[log]\n\"a b\" = 1\n",
			`gateway.toml: log."a b": unknown key (this table has: level, format, access_log)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantLines(t, parseErrors(t, tc.doc), tc.want)
		})
	}
}

func TestSyntaxError(t *testing.T) {
	errs := parseErrors(t, "version = 1\n[tun]\nmtu = = 5\n")
	if len(errs.List) != 1 {
		t.Fatalf("got %d problems, want 1: %v", len(errs.List), errs)
	}
	e := errs.List[0]
	if e.Line != 3 || e.Column != 7 {
		t.Errorf("position %d:%d, want 3:7", e.Line, e.Column)
	}
	if got := errs.Error(); !strings.HasPrefix(got, "gateway.toml:3:7: syntax error: ") {
		t.Errorf("message %q, want it to start with gateway.toml:3:7: syntax error: ", got)
	}
}

func TestTypeErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		doc  string
		want string
	}{
		{"string for int", base + "[tun]\nmtu = \"1500\"\n",
			`gateway.toml: tun.mtu: must be an integer, not a string ("1500")`},
		{"int for string", base + "[log]\nlevel = 3\n",
			`gateway.toml: log.level: must be a string, not an integer (3)`},
		{"string for bool", base + "[log]\naccess_log = \"yes\"\n",
			`gateway.toml: log.access_log: must be true or false, not a string ("yes")`},
		{"int for duration", base + "[hbone]\nidle_timeout = 300\n",
			`gateway.toml: hbone.idle_timeout: must be a duration string like "5s", not an integer (300)`},
		{"bad duration", base + "[hbone]\nidle_timeout = \"5 minutes\"\n",
			`gateway.toml: hbone.idle_timeout: invalid duration "5 minutes": write a number and a unit, like "5s" or "5m"`},
		{"string for list", base + "[tun]\nroutes = \"10.0.0.0/8\"\n",
			`gateway.toml: tun.routes: must be an array, not a string ("10.0.0.0/8")`},
		{"table for array of tables", base + "[peers]\nname = \"b\"\n",
			`gateway.toml: peers: must be an array of tables ([[peers]]), not a table`},
		{"value for table", "tun = 5\n" + base,
			`gateway.toml: tun: must be a table ([tun]), not an integer (5)`},
		{"port out of range", base + "[[policies]]\nname = \"p\"\naction = \"deny\"\n[[policies.rules]]\ndestination_ports = [80, 70000]\n",
			`gateway.toml: policies[0].rules[0].destination_ports[1]: port 70000 is out of range (1..65535)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantLines(t, parseErrors(t, tc.doc), tc.want)
		})
	}
}

func TestVersion(t *testing.T) {
	const tls = "[tls]\ncert = \"c\"\nkey = \"k\"\ntrust_bundle = \"b\"\n"
	for _, tc := range []struct {
		name string
		doc  string
		want string
	}{
		{"missing", tls, `gateway.toml: version: required: the file must start with version = 1`},
		{"zero", "version = 0\n" + tls, `gateway.toml: version: required: the file must start with version = 1`},
		{"unknown", "version = 2\n" + tls, `gateway.toml: version: unsupported version 2 (this build understands 1)`},
		{"string", "version = \"1\"\n" + tls, `gateway.toml: version: must be an integer, not a string ("1")`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := parseErrors(t, tc.doc)
			wantLines(t, errs, tc.want)
			if len(errs.List) != 1 {
				t.Errorf("got %d problems, want only the version one:\n%s", len(errs.List), errs)
			}
		})
	}
}

func TestAddresses(t *testing.T) {
	for _, tc := range []struct {
		name string
		doc  string
		want string
	}{
		{"prefix too long", base + "[tun]\nroutes = [\"10.0.0.0/8\", \"10.244.0.0/33\"]\n",
			`gateway.toml: tun.routes[1]: invalid CIDR "10.244.0.0/33" (prefix length out of range): write an address with an optional /length, like "10.244.0.0/16", "10.0.0.5" or "fd00::/64"`},
		{"bad octet", base + "[hbone]\nserve = [\"10.0.0.300\"]\n",
			`gateway.toml: hbone.serve[0]: invalid CIDR "10.0.0.300" (IPv4 field has value >255): write an address with an optional /length, like "10.244.0.0/16", "10.0.0.5" or "fd00::/64"`},
		{"host bits", base + "[tun]\nroutes = [\"10.244.2.1/24\"]\n",
			`gateway.toml: tun.routes[0]: 10.244.2.1/24 has address bits set past its /24 prefix (did you mean 10.244.2.0/24?)`},
		{"ipv6 zone", base + "[tun]\nroutes = [\"fe80::1%eth0\"]\n",
			`gateway.toml: tun.routes[0]: invalid CIDR "fe80::1%eth0" (IPv6 zones are not allowed): write an address with an optional /length, like "10.244.0.0/16", "10.0.0.5" or "fd00::/64"`},
		{"peer cidr", base + "[[peers]]\nname = \"b\"\ncidrs = [\"10.244.2.0/24\", \"banana\"]\naddress = \"192.0.2.2:15008\"\nidentity = \"spiffe://cluster.local/b\"\n",
			`gateway.toml: peers[0].cidrs[1]: invalid CIDR "banana" (unable to parse IP): write an address with an optional /length, like "10.244.0.0/16", "10.0.0.5" or "fd00::/64"`},
		{"peer address without port", base + "[[peers]]\nname = \"b\"\ncidrs = [\"10.244.2.0/24\"]\naddress = \"192.0.2.2\"\nidentity = \"spiffe://cluster.local/b\"\n",
			`gateway.toml: peers[0].address: invalid ip:port "192.0.2.2" (not an ip:port): write it like "192.0.2.2:15008" or "[fd00::2]:15008"`},
		{"workload address", base + "[[workloads]]\nname = \"w\"\nnamespace = \"n\"\naddresses = [\"10.0.0.1/32\"]\n",
			`gateway.toml: workloads[0].addresses[0]: invalid IP address "10.0.0.1/32" (unexpected character (at "/32"))`},
		{"listen", base + "[hbone]\nlisten = \"15008\"\n",
			`gateway.toml: hbone.listen: "15008" is not host:port; write it like "0.0.0.0:15008", "[::]:15008" or "" to turn it off`},
		{"listen port clash", base + "[admin]\nmetrics = \"127.0.0.1:15008\"\n",
			`gateway.toml: admin.metrics: "127.0.0.1:15008" would bind the same port as hbone.listen`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantLines(t, parseErrors(t, tc.doc), tc.want)
		})
	}
}

func TestRanges(t *testing.T) {
	for _, tc := range []struct {
		name string
		doc  string
		want string
	}{
		{"mtu too small", base + "[tun]\nmtu = 575\n", `gateway.toml: tun.mtu: 575 is out of range (576..65535)`},
		{"mtu too large", base + "[tun]\nmtu = 65536\n", `gateway.toml: tun.mtu: 65536 is out of range (576..65535)`},
		{"max_in_flight", base + "[netstack]\nmax_in_flight = 0\n", `gateway.toml: netstack.max_in_flight: must be at least 1 (got 0)`},
		{"conns_per_peer zero", base + "[hbone]\nconns_per_peer = 0\n", `gateway.toml: hbone.conns_per_peer: 0 is out of range (1..8)`},
		{"conns_per_peer large", base + "[hbone]\nconns_per_peer = 9\n", `gateway.toml: hbone.conns_per_peer: 9 is out of range (1..8)`},
		{"max_flows_per_source negative", base + "[gateway]\nmax_flows_per_source = -1\n", `gateway.toml: gateway.max_flows_per_source: must not be negative (got -1); 0 is no limit`},
		{"max_inbound_conns zero", base + "[hbone]\nmax_inbound_conns = 0\n", `gateway.toml: hbone.max_inbound_conns: must be at least 1 (got 0)`},
		{"max_inbound_streams_per_conn zero", base + "[hbone]\nmax_inbound_streams_per_conn = 0\n", `gateway.toml: hbone.max_inbound_streams_per_conn: 0 is out of range (1..1048576)`},
		{"handshake_timeout zero", base + "[hbone]\nhandshake_timeout = \"0s\"\n", `gateway.toml: hbone.handshake_timeout: must be positive (got 0s)`},
		{"max_streams", base + "[hbone]\nmax_streams_per_conn = -1\n", `gateway.toml: hbone.max_streams_per_conn: must be at least 1 (got -1)`},
		{"negative drain", base + "[gateway]\ndrain_timeout = \"-1s\"\n", `gateway.toml: gateway.drain_timeout: must not be negative (got -1s)`},
		{"workload name", base + "[gateway]\nworkload_name = \"db vm\"\n", `gateway.toml: gateway.workload_name: "db vm" is not a name: use 1 to 253 letters, digits, ".", "-" and "_"`},
		{"canonical revision", base + "[gateway]\ncanonical_revision = \"v1,x\"\n", `gateway.toml: gateway.canonical_revision: "v1,x" is not a name: use 1 to 253 letters, digits, ".", "-" and "_"`},
		{"workload kind", base + "[gateway]\nworkload_kind = \"daemonset\"\n", `gateway.toml: gateway.workload_kind: "daemonset" is not one of: pod | deployment | job | cronjob`},
		{"zero connect timeout", base + "[hbone]\nconnect_timeout = \"0s\"\n", `gateway.toml: hbone.connect_timeout: must be positive (got 0s)`},
		{"level", base + "[log]\nlevel = \"verbose\"\n", `gateway.toml: log.level: "verbose" is not one of: trace | debug | info | warn | error`},
		{"offload", base + "[tun]\noffload = \"yes\"\n", `gateway.toml: tun.offload: "yes" is not one of: auto | on | off`},
		{"tun name", base + "[tun]\nname = \"meshtun-gateway-0\"\n", `gateway.toml: tun.name: "meshtun-gateway-0" is longer than 15 bytes, the most Linux allows for an interface name`},
		{"trust domain", base + "[gateway]\ntrust_domain = \"Cluster.Local\"\n", `gateway.toml: gateway.trust_domain: invalid trust domain "Cluster.Local": use lowercase letters, digits, ".", "-" and "_", like "cluster.local"`},
		{"service port 0", base + "[[workloads]]\nname = \"w\"\nnamespace = \"n\"\naddresses = [\"10.0.0.1\"]\n[[services]]\nname = \"s\"\nnamespace = \"n\"\nvips = [\"10.96.0.1\"]\nports = { 0 = 80 }\n",
			`gateway.toml: services[0].ports.0: service port 0 is not a port (1..65535)`},
		{"target port 0", base + "[[services]]\nname = \"s\"\nnamespace = \"n\"\nvips = [\"10.96.0.1\"]\nports = { 80 = 0 }\n",
			`gateway.toml: services[0].ports.80: target port 0 is not a port (1..65535)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantLines(t, parseErrors(t, tc.doc), tc.want)
		})
	}
}

// TestAllAtOnce checks that one file with many problems yields them all,
// each at its own path, in the order of the schema.
func TestAllAtOnce(t *testing.T) {
	doc := `version = 1
[gateway]
trust_domain = ""
[log]
format = "xml"
[tls]
cert = ""
key = "k"
trust_bundle = "b"
[tun]
mtu = 100
mtuu = 1
routes = ["10.0.0.0/8", "nope"]
[[peers]]
name = "b"
cidrs = ["10.244.2.0/24"]
address = "192.0.2.2:15008"
identity = "spiffe://cluster.local/ns/meshtun/sa/b"
[[peers]]
name = "b"
cidrs = ["10.244.2.0/24"]
identity = "https://cluster.local/b"
[[workloads]]
name = "web"
namespace = "default"
addresses = ["10.244.2.5"]
protocol = "UDP"
[[services]]
name = "web"
namespace = "default"
vips = ["10.96.0.10"]
ports = { 80 = 8080 }
endpoints = ["default/wbe", "web"]
[[policies]]
name = "p"
[[policies.rules]]
principals = ["spiffe://cluster.local/ns/default/sa/client", "a*b"]
`
	errs := parseErrors(t, doc)
	want := []string{
		"gateway.trust_domain",
		"log.format",
		"tls.cert",
		"tun.mtu",
		"tun.routes[1]",
		"tun.mtuu", // unknown keys come after the known keys of their table
		"peers[1].name",
		"peers[1].cidrs[0]",
		"peers[1].address",
		"peers[1].identity",
		"workloads[0].protocol",
		"services[0].endpoints[0]",
		"services[0].endpoints[1]",
		"policies[0].action",
		"policies[0].rules[0].principals[0]",
		"policies[0].rules[0].principals[1]",
	}
	var got []string
	for _, e := range errs.List {
		got = append(got, e.Path)
	}
	if !slices.Equal(got, want) {
		t.Errorf("paths\n%q\nwant\n%q\nerrors:\n%s", got, want, errs)
	}
	wantLines(t, errs,
		`gateway.toml: peers[1].name: duplicate name "b" (also peers[0])`,
		`gateway.toml: peers[1].cidrs[0]: 10.244.2.0/24 is already routed to peers[0] ("b")`,
		`gateway.toml: services[0].endpoints[0]: no workload "default/wbe" is declared in [[workloads]] (did you mean "default/web"?)`,
		`gateway.toml: policies[0].action: required: allow | deny`,
	)
}

func TestValidateWithoutParse(t *testing.T) {
	c := Default()
	c.Version = 1
	c.TLS = TLS{Cert: "c", Key: "k", TrustBundle: "b"}
	if err := c.Validate(); err != nil {
		t.Fatalf("Default with version and tls: %v", err)
	}
	c.TUN.MTU = 70000
	c.Peers = []Peer{{Name: "b"}}
	err := c.Validate()
	var errs *Errors
	if !errors.As(err, &errs) {
		t.Fatalf("Validate = %v, want *Errors", err)
	}
	wantLines(t, errs,
		"tun.mtu: 70000 is out of range (576..65535)",
		"peers[0].address: required: the peer's HBONE ip:port, like \"192.0.2.2:15008\"",
		"peers[0].identity: required: the SPIFFE ID the peer must present, like \"spiffe://cluster.local/ns/meshtun/sa/node-b\"",
	)
}

func TestErrorsFormat(t *testing.T) {
	for _, tc := range []struct {
		name string
		errs Errors
		want string
	}{
		{"with position", Errors{Source: "gw.toml", List: []*Error{{Line: 3, Column: 7, Msg: "syntax error: x"}}}, "gw.toml:3:7: syntax error: x"},
		{"with path", Errors{Source: "gw.toml", List: []*Error{{Path: "tun.mtu", Msg: "m"}}}, "gw.toml: tun.mtu: m"},
		{"no source", Errors{List: []*Error{{Path: "tun.mtu", Msg: "m"}}}, "tun.mtu: m"},
		{"one per line", Errors{Source: "s", List: []*Error{{Path: "a", Msg: "1"}, {Path: "b", Msg: "2"}}}, "s: a: 1\ns: b: 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.errs.Error(); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestClosest(t *testing.T) {
	known := []string{"name", "cidrs", "address", "identity"}
	for _, tc := range []struct {
		key, want string
		ok        bool
	}{
		{"adress", "address", true},
		{"Name", "name", true},
		{"idenity", "identity", true},
		{"zzz", "", false},
		{"addresses", "address", true},
		{"port", "", false},
	} {
		t.Run(tc.key, func(t *testing.T) {
			got, ok := closest(tc.key, known)
			if got != tc.want || ok != tc.ok {
				t.Errorf("closest(%q) = %q, %v; want %q, %v", tc.key, got, ok, tc.want, tc.ok)
			}
		})
	}
}

// Every problem of [mesh], each at its key path, and nothing else: the
// want lines are the whole of the error.
func TestMeshErrors(t *testing.T) {
	const dialLike = `write it like "istiod.istio-system.svc:15012" or "[fd00::10]:15012"`
	for _, tc := range []struct {
		name string
		doc  string
		want []string
	}{
		{"xds without port", meshFile(`xds_address = "istiod.istio-system.svc"`),
			[]string{`mesh.xds_address: "istiod.istio-system.svc" is not host:port; ` + dialLike}},
		{"xds ipv6 without brackets", meshFile(`xds_address = "fd00::10:15012"`),
			[]string{`mesh.xds_address: "fd00::10:15012" is not host:port; ` + dialLike}},
		{"xds port 0", meshFile(`xds_address = "istiod:0"`),
			[]string{`mesh.xds_address: "istiod:0": port must be a number 1..65535; ` + dialLike}},
		{"xds named port", meshFile(`xds_address = "istiod:grpc"`),
			[]string{`mesh.xds_address: "istiod:grpc": port must be a number 1..65535; ` + dialLike}},
		{"xds without host", meshFile(`xds_address = ":15012"`),
			[]string{`mesh.xds_address: ":15012" names no host; ` + dialLike}},
		{"xds unspecified", meshFile(`xds_address = "[::]:15012"`),
			[]string{`mesh.xds_address: "[::]:15012": the unspecified address cannot be dialled; ` + dialLike}},
		{"xds bad host name", meshFile(`xds_address = "ist_iod:15012"`),
			[]string{`mesh.xds_address: "ist_iod:15012": "ist_iod" is neither an IP address nor a host name`}},
		{"xds not a string", meshFile(`xds_address = 15012`),
			[]string{`mesh.xds_address: must be a string, not an integer (15012)`}},
		{"ca without port", meshFile(`ca_address = "istiod.istio-system.svc"`),
			[]string{`mesh.ca_address: "istiod.istio-system.svc" is not host:port; ` + dialLike}},
		{"ca bad, mesh off", base + "[mesh]\nca_address = \"0.0.0.0:15012\"\n",
			[]string{`mesh.ca_address: "0.0.0.0:15012": the unspecified address cannot be dialled; ` + dialLike}},
		{"server name with port", meshFile(`server_name = "istiod:15012"`),
			[]string{`mesh.server_name: "istiod:15012" is neither a host name nor an IP address (without a port), like "istiod.istio-system.svc"`}},
		{"namespace missing", meshFile(`namespace = <absent>`),
			[]string{`mesh.namespace: required while [mesh] is on: this node's workload namespace, as in its WorkloadEntry, like "vm"`}},
		{"namespace empty", meshFile(`namespace = ""`),
			[]string{`mesh.namespace: required while [mesh] is on: this node's workload namespace, as in its WorkloadEntry, like "vm"`}},
		{"service account missing", meshFile(`service_account = <absent>`),
			[]string{`mesh.service_account: required while [mesh] is on: the service account this node's token belongs to, like "vm-sa"`}},
		{"namespace with slash", meshFile(`namespace = "vm/x"`),
			[]string{`mesh.namespace: "vm/x" may hold only letters, digits, ".", "-" and "_"`}},
		{"service account dot dot", meshFile(`service_account = ".."`),
			[]string{`mesh.service_account: ".." may hold only letters, digits, ".", "-" and "_"`}},
		{"namespace bad, mesh off", base + "[mesh]\nnamespace = \"a b\"\n",
			[]string{`mesh.namespace: "a b" may hold only letters, digits, ".", "-" and "_"`}},
		{"root cert empty", meshFile(`root_cert = ""`),
			[]string{`mesh.root_cert: required while [mesh] is on: the roots istiod's certificate must chain to (PEM)`}},
		{"token file empty", meshFile(`token_file = ""`),
			[]string{`mesh.token_file: required while [mesh] is on: the file holding this node's istio-ca token`}},
		{"cluster id empty", meshFile(`cluster_id = ""`),
			[]string{`mesh.cluster_id: required while [mesh] is on: the cluster istiod serves (Istio's default is "Kubernetes")`}},
		{"cluster id with space", meshFile(`cluster_id = "east 1"`),
			[]string{`mesh.cluster_id: "east 1" may hold only visible ASCII characters, no spaces`}},
		{"cert ttl short", meshFile(`cert_ttl = "9m59s"`),
			[]string{`mesh.cert_ttl: 9m59s is out of range (10m..2160h, which is 90 days)`}},
		{"cert ttl long", meshFile(`cert_ttl = "2161h"`),
			[]string{`mesh.cert_ttl: 2161h0m0s is out of range (10m..2160h, which is 90 days)`}},
		{"cert ttl zero", meshFile(`cert_ttl = "0s"`),
			[]string{`mesh.cert_ttl: 0s is out of range (10m..2160h, which is 90 days)`}},
		{"cert ttl negative, mesh off", base + "[mesh]\ncert_ttl = \"-24h\"\n",
			[]string{`mesh.cert_ttl: -24h0m0s is out of range (10m..2160h, which is 90 days)`}},
		{"cert ttl not a duration", meshFile(`cert_ttl = "1d"`),
			[]string{`mesh.cert_ttl: invalid duration "1d": write a number and a unit, like "5s" or "5m"`}},
		{"instance ip invalid", meshFile(`instance_ips = ["192.0.2.10", "192.0.2.300"]`),
			[]string{`mesh.instance_ips[1]: invalid IP address "192.0.2.300" (IPv4 field has value >255)`}},
		{"instance ip prefix", meshFile(`instance_ips = ["192.0.2.0/24"]`),
			[]string{`mesh.instance_ips[0]: invalid IP address "192.0.2.0/24" (unexpected character (at "/24"))`}},
		{"instance ip unspecified and multicast", meshFile(`instance_ips = ["0.0.0.0", "ff02::1"]`),
			[]string{`mesh.instance_ips[0]: 0.0.0.0 is not an address of a host`, `mesh.instance_ips[1]: ff02::1 is not an address of a host`}},
		{"instance ip twice", meshFile(`instance_ips = ["192.0.2.10", "fd00::10", "192.0.2.10", "192.0.2.10"]`),
			[]string{`mesh.instance_ips[2]: 192.0.2.10 is listed twice (also mesh.instance_ips[0])`, `mesh.instance_ips[3]: 192.0.2.10 is listed twice (also mesh.instance_ips[0])`}},
		{"unknown key", meshFile(`xds_adress = "istiod:15012"`),
			[]string{`mesh.xds_adress: unknown key (did you mean "xds_address"?)`}},
		{"tls cert and key with the mesh", meshFile() + "[tls]\ncert = \"c.pem\"\nkey = \"k.pem\"\ntrust_bundle = \"b.pem\"\n",
			[]string{
				`tls.cert: with [mesh] on, this gateway's certificate comes from Istio's CA (mesh.ca_address): remove tls.cert`,
				`tls.key: with [mesh] on, this gateway's key is made in memory for the certificate Istio's CA issues: remove tls.key`,
			}},
		{"tls without the mesh", "version = 1\n[mesh]\ncluster_id = \"east-1\"\n",
			[]string{
				`tls.cert: required: the path of this gateway's certificate chain (PEM)`,
				`tls.key: required: the path of this gateway's private key (PEM)`,
				`tls.trust_bundle: required: the path of the roots peers' certificates must chain to (PEM)`,
			}},
		{"all at once, in schema order", meshFile(`xds_address = "istiod"`, `namespace = <absent>`, `service_account = "a/b"`,
			`cert_ttl = "1m"`, `instance_ips = ["0.0.0.0"]`) + "[tls]\nkey = \"k.pem\"\n[tun]\nmtu = 1\n",
			[]string{
				`tls.key: with [mesh] on, this gateway's key is made in memory for the certificate Istio's CA issues: remove tls.key`,
				`mesh.xds_address: "istiod" is not host:port; ` + dialLike,
				`mesh.namespace: required while [mesh] is on: this node's workload namespace, as in its WorkloadEntry, like "vm"`,
				`mesh.service_account: "a/b" may hold only letters, digits, ".", "-" and "_"`,
				`mesh.cert_ttl: 1m0s is out of range (10m..2160h, which is 90 days)`,
				`mesh.instance_ips[0]: 0.0.0.0 is not an address of a host`,
				`tun.mtu: 1 is out of range (576..65535)`,
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := parseErrors(t, tc.doc)
			var want []string
			for _, w := range tc.want {
				want = append(want, "gateway.toml: "+w)
			}
			if got := errs.Error(); got != strings.Join(want, "\n") {
				t.Errorf("errors:\n%s\nwant:\n%s\nfile:\n%s", got, strings.Join(want, "\n"), tc.doc)
			}
		})
	}
}

// The mesh on, [tls] may be left out whole, or hold only a trust bundle
// (extra roots); [[workloads]] and the like stay valid beside the mesh
// (TestMeshValues).
func TestMeshMakesTLSOptional(t *testing.T) {
	for _, doc := range []string{
		meshFile(),
		meshFile() + "[tls]\n",
		meshFile() + "[tls]\ntrust_bundle = \"extra-roots.pem\"\n",
	} {
		if _, err := Parse([]byte(doc), "gateway.toml"); err != nil {
			t.Errorf("%v\nfile:\n%s", err, doc)
		}
	}
}

// A Config built in code with the mesh on has no derived values unless it
// sets them: Validate asks for them rather than letting them be empty.
func TestValidateMeshWithoutParse(t *testing.T) {
	c := Default()
	c.Version = 1
	c.Mesh.XDSAddress = "istiod.istio-system.svc:15012"
	c.Mesh.Namespace, c.Mesh.ServiceAccount = "vm", "vm-sa"
	err := c.Validate()
	var errs *Errors
	if !errors.As(err, &errs) {
		t.Fatalf("Validate = %v, want *Errors", err)
	}
	want := "mesh.ca_address: required while [mesh] is on (Parse defaults it to mesh.xds_address)\n" +
		"mesh.server_name: required while [mesh] is on (Parse defaults it to the host of mesh.xds_address)"
	if got := errs.Error(); got != want {
		t.Errorf("errors:\n%s\nwant:\n%s", got, want)
	}
	c.Mesh.setDefaults()
	if err := c.Validate(); err != nil {
		t.Errorf("after setDefaults: %v", err)
	}
}
