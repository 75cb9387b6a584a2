package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
)

func TestKeyPaths(t *testing.T) {
	paths := keyPaths()
	for _, want := range []string{"version", "gateway.trust_domain", "tun.mtu", "hbone.serve", "peers", "peers.cidrs",
		"workloads.hbone_address", "services.vips", "policies.rules", "policies.rules.not_destination_ports"} {
		if !slices.Contains(paths, want) {
			t.Errorf("keyPaths lacks %q: %q", want, paths)
		}
	}
	for _, p := range paths {
		if _, ok := lookup(p); !ok {
			t.Errorf("lookup(%q) finds nothing", p)
		}
	}
	for name, cond := range conditions {
		if k, ok := lookup(cond.key); !ok || k.sub != nil {
			t.Errorf("condition %q reads %q, which is not a key of the schema", name, cond.key)
		}
	}
	for path, want := range map[string]string{"peers[1].cidrs[0]": "peers.cidrs", "tun.mtu": "tun.mtu",
		"policies[0].rules[2].principals[1]": "policies.rules.principals", "": ""} {
		if got := schemaPath(path); got != want {
			t.Errorf("schemaPath(%q) = %q, want %q", path, got, want)
		}
	}
	for _, bad := range []string{"", "tun", "tun.mtuu", "peers.cidrs.x", "gateway.name.x"} {
		if k, ok := lookup(bad); ok && (k.sub == nil || k.array) && bad != "tun" {
			t.Errorf("lookup(%q) found %q", bad, k.name)
		}
	}
}

func TestDiff(t *testing.T) {
	a := mustParse(t, base)
	b := mustParse(t, base+`
[gateway]
drain_timeout = "1s"
[log]
access_log = false
[tun]
mtu = 1500
[hbone]
serve = ["10.0.0.0/8"]
[[policies]]
name = "p"
action = "deny"
`)
	want := []string{"gateway.drain_timeout", "log.access_log", "tun.mtu", "hbone.serve", "policies"}
	if got := Diff(a, b); !slices.Equal(got, want) {
		t.Errorf("Diff = %q, want %q", got, want)
	}
	if got := Diff(a, a); len(got) != 0 {
		t.Errorf("Diff of a config with itself = %q", got)
	}
}

func TestReloadApplied(t *testing.T) {
	for _, k := range []string{"peers", "workloads", "services", "policies", "hbone.serve", "gateway.drain_timeout", "log.level",
		"gateway.cluster", "gateway.workload_namespace", "gateway.workload_name", "gateway.workload_kind", "gateway.canonical_service", "gateway.canonical_revision"} {
		if !ReloadApplied(k) {
			t.Errorf("ReloadApplied(%q) = false, want true", k)
		}
	}
	for _, k := range []string{"version", "gateway.name", "log.access_log", "tun.mtu", "hbone.listen", "admin.listen", "tls.cert", "peers.cidrs", "nonsense"} {
		if ReloadApplied(k) {
			t.Errorf("ReloadApplied(%q) = true, want false", k)
		}
	}
	// Every key of [mesh] needs a restart.
	var mesh []string
	for _, k := range keyPaths() {
		if strings.HasPrefix(k, "mesh.") {
			mesh = append(mesh, k)
			if ReloadApplied(k) {
				t.Errorf("ReloadApplied(%q) = true, want false", k)
			}
		}
	}
	if len(mesh) != 11 {
		t.Errorf("[mesh] has keys %q, want the 11 of the schema", mesh)
	}
}

// A change to [mesh] is listed by Diff, and a reload keeps the running
// value of each.
func TestDiffMesh(t *testing.T) {
	a := mustParse(t, meshFile())
	b := mustParse(t, meshFile(`xds_address = "[fd00::10]:15012"`, `cluster_id = "east-1"`, `namespace = "vm2"`,
		`cert_ttl = "12h"`, `instance_ips = ["192.0.2.10"]`))
	want := []string{"mesh.xds_address", "mesh.ca_address", "mesh.server_name", "mesh.cluster_id", "mesh.namespace",
		"mesh.cert_ttl", "mesh.instance_ips"}
	if got := Diff(a, b); !slices.Equal(got, want) {
		t.Errorf("Diff = %q, want %q", got, want)
	}
	if got := InForce(a, b); !reflect.DeepEqual(got.Mesh, a.Mesh) || len(Diff(a, got)) != 0 {
		t.Errorf("InForce changed [mesh]: %+v, want %+v", got.Mesh, a.Mesh)
	}
	if got := Diff(mustParse(t, base), a); !slices.Contains(got, "tls.cert") || !slices.Contains(got, "mesh.xds_address") {
		t.Errorf("Diff(mesh off, mesh on) = %q, want tls.cert and mesh.xds_address among them", got)
	}
}

// The dump of a config with the mesh on shows [mesh] as written, the
// derived keys worked out, and parses back to the same config.
func TestDumpMesh(t *testing.T) {
	c := mustParse(t, meshFile(`xds_address = "[fd00::10]:15012"`, `instance_ips = ["192.0.2.10", "fd00::5"]`, `cert_ttl = "12h"`)+
		"[tls]\ntrust_bundle = \"/etc/meshtun/extra.pem\"\n")
	d := Dump(c)
	want := map[string]any{
		"xds_address":     "[fd00::10]:15012",
		"ca_address":      "[fd00::10]:15012",
		"root_cert":       "/var/run/secrets/istio/root-cert.pem",
		"server_name":     "fd00::10",
		"token_file":      "/var/run/secrets/tokens/istio-token",
		"cluster_id":      "Kubernetes",
		"network":         "",
		"namespace":       "vm",
		"service_account": "vm-sa",
		"cert_ttl":        "12h0m0s",
		"instance_ips":    []any{"192.0.2.10", "fd00::5"},
	}
	if !reflect.DeepEqual(d["mesh"], want) {
		t.Errorf("mesh = %#v\nwant %#v", d["mesh"], want)
	}
	var out bytes.Buffer
	if err := toml.NewEncoder(&out).Encode(tomlReady(d)); err != nil {
		t.Fatal(err)
	}
	back, err := Parse(out.Bytes(), "dump")
	if err != nil {
		t.Fatalf("the dump, written as TOML, does not parse: %v\n%s", err, out.String())
	}
	if !reflect.DeepEqual(Dump(back), d) {
		t.Errorf("the dump parses to another config:\n%s", out.String())
	}
}

func TestInForce(t *testing.T) {
	running := mustParse(t, base)
	next := mustParse(t, base+"[log]\nlevel = \"debug\"\naccess_log = false\n[tun]\nmtu = 1500\n")
	before := *next
	got := InForce(running, next)
	if got.Log.Level != "debug" || got.Log.AccessLog != running.Log.AccessLog || got.TUN.MTU != running.TUN.MTU {
		t.Errorf("InForce: level %q, access_log %v, mtu %d; want debug, %v, %d",
			got.Log.Level, got.Log.AccessLog, got.TUN.MTU, running.Log.AccessLog, running.TUN.MTU)
	}
	if !reflect.DeepEqual(*next, before) {
		t.Error("InForce changed next")
	}
	if d := Diff(running, got); !slices.Equal(d, []string{"log.level"}) {
		t.Errorf("Diff(running, InForce) = %q, want [log.level]", d)
	}
}

// The dump has exactly the schema's keys, values in their file form, and
// written as TOML it parses back to the same config.
func TestDump(t *testing.T) {
	c := mustParse(t, base+`
[hbone]
serve = ["10.244.1.0/24"]
`+peerDoc("b", `["10.244.3.0/24"]`, "192.0.2.2:15008")+`
[[networks]]
name = "cluster-net"
gateway = "203.0.113.10:15008"
identity = "spiffe://cluster.local/ns/istio-system/sa/istio-eastwestgateway"
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
[[policies.rules]]
destination_ports = [8080]
`)
	d := Dump(c)
	for _, tc := range []struct {
		path []string
		want any
	}{
		{[]string{"gateway", "drain_timeout"}, "5s"},
		{[]string{"tun", "mtu"}, int64(65000)},
		{[]string{"log", "access_log"}, true},
		{[]string{"hbone", "serve"}, []any{"10.244.1.0/24"}},
	} {
		var v any = d
		for _, k := range tc.path {
			v = v.(map[string]any)[k]
		}
		if !reflect.DeepEqual(v, tc.want) {
			t.Errorf("%s = %#v, want %#v", strings.Join(tc.path, "."), v, tc.want)
		}
	}
	w := d["workloads"].([]any)[0].(map[string]any)
	if w["hbone_address"] != "10.244.2.5:15008" || w["service_account"] != "default" {
		t.Errorf("workloads[0] = %v", w)
	}
	if p := d["services"].([]any)[0].(map[string]any)["ports"]; !reflect.DeepEqual(p, map[string]any{"80": uint64(8080)}) {
		t.Errorf("services[0].ports = %#v", p)
	}
	var keys []string
	var walk func(prefix string, m map[string]any)
	walk = func(prefix string, m map[string]any) {
		for k, v := range m {
			p := joinPath(prefix, k)
			switch v := v.(type) {
			case map[string]any:
				if k == "ports" {
					keys = append(keys, p)
					continue
				}
				walk(p, v)
			case []any:
				keys = append(keys, p)
				if len(v) > 0 {
					if e, ok := v[0].(map[string]any); ok {
						walk(p, e)
					}
				}
			default:
				keys = append(keys, p)
			}
		}
	}
	walk("", d)
	slices.Sort(keys)
	keys = slices.Compact(keys)
	want := keyPaths()
	slices.Sort(want)
	if !slices.Equal(keys, want) {
		t.Errorf("dump keys\n%q\nwant the schema's\n%q", keys, want)
	}

	if _, err := json.Marshal(d); err != nil {
		t.Fatalf("the dump is not JSON: %v", err)
	}
	var out bytes.Buffer
	if err := toml.NewEncoder(&out).Encode(tomlReady(d)); err != nil {
		t.Fatal(err)
	}
	back, err := Parse(out.Bytes(), "dump")
	if err != nil {
		t.Fatalf("the dump, written as TOML, does not parse: %v\n%s", err, out.String())
	}
	if !reflect.DeepEqual(Dump(back), d) {
		t.Errorf("the dump parses to another config:\n%s", out.String())
	}
	if back.Gateway.DrainTimeout.Duration != 5*time.Second {
		t.Errorf("drain_timeout came back as %v", back.Gateway.DrainTimeout)
	}
}

// tomlReady makes a dump encodable as TOML: lists of tables become
// []map[string]any, and the empty strings of unset values are left out,
// as a file would leave them out.
func tomlReady(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range v {
			if e == "" {
				continue
			}
			out[k] = tomlReady(e)
		}
		return out
	case []any:
		if len(v) > 0 {
			if _, ok := v[0].(map[string]any); ok {
				ts := make([]map[string]any, len(v))
				for i, e := range v {
					ts[i] = tomlReady(e).(map[string]any)
				}
				return ts
			}
		}
		return v
	}
	return v
}

// peerDoc is a [[peers]] entry named name, with identity .../sa/<name>.
func peerDoc(name, cidrs, address string) string {
	return fmt.Sprintf("[[peers]]\nname = %q\ncidrs = %s\naddress = %q\nidentity = \"spiffe://cluster.local/ns/meshtun/sa/%s\"\n",
		name, cidrs, address, name)
}

func TestIndexKeys(t *testing.T) {
	c := mustParse(t, base+
		peerDoc("a", `["10.244.2.0/24"]`, "192.0.2.2:15008")+
		peerDoc("b", `["10.244.3.0/24", "10.244.4.0/24"]`, "192.0.2.3:15008"))
	keys := indexKeys(c)
	for _, tc := range []struct {
		ptr  any
		want string
	}{
		{&c.Version, "version"},
		{&c.Gateway, "gateway"},
		{&c.Gateway.Name, "gateway.name"}, // same address as &c.Gateway, another type
		{&c.TUN.MTU, "tun.mtu"},
		{&c.Gateway.DrainTimeout, "gateway.drain_timeout"},
		{&c.Peers, "peers"},
		{&c.Peers[1], "peers[1]"},
		{&c.Peers[1].Name, "peers[1].name"},
		{&c.Peers[1].CIDRs[1], "peers[1].cidrs[1]"},
	} {
		if got, ok := keys[tc.ptr]; !ok || got.path != tc.want {
			t.Errorf("path of %T = %q, %v; want %q", tc.ptr, got.path, ok, tc.want)
		}
	}
	other := *c
	if _, ok := keys[&other.TUN.MTU]; ok {
		t.Error("a field of another Config has a path")
	}
}

// Every value type of the schema has a rule in the decoder and in Dump: a
// value of the wrong type is reported, never a crash.
func TestEveryKeyHasRules(t *testing.T) {
	for _, path := range keyPaths() {
		k, _ := lookup(path)
		if k.sub != nil {
			continue
		}
		raws := []any{1.5}
		if k.typ.Kind() == reflect.Slice {
			raws = append(raws, []any{1.5})
		}
		for _, raw := range raws {
			d := decoder{order: make(map[string]int)}
			// A list with a bad entry is kept, the entry zero, so that
			// later indexes stay those of the file; the entry is reported.
			if _, ok := d.value(path, raw, k.typ); len(d.list) == 0 || ok && k.typ.Kind() != reflect.Slice {
				t.Errorf("%s = %v decoded, ok %v, problems %v", path, raw, ok, d.list)
			}
		}
		v := reflect.New(k.typ).Elem()
		if k.typ.Kind() == reflect.Slice {
			v = reflect.MakeSlice(k.typ, 1, 1)
		}
		_ = dumpValue(v) // panics if Dump has no rule
	}
}

// A toml:"-" field is no key: the file cannot write it, Dump leaves it
// out, and Diff does not compare it on its own.
func TestHiddenFieldsAreNotKeys(t *testing.T) {
	for _, p := range keyPaths() {
		if strings.HasSuffix(p, ".network_gateway") || strings.HasSuffix(p, ".source") || strings.HasSuffix(p, ".waypoint") || p == "network" {
			t.Errorf("keyPaths holds %q, a toml:\"-\" field", p)
		}
	}
	doc := base + `
[[workloads]]
name = "w"
namespace = "ns"
addresses = ["10.0.0.1"]
source = "xds"
`
	_, err := Parse([]byte(doc), "test.toml")
	if err == nil || !strings.Contains(err.Error(), "workloads[0].source") {
		t.Fatalf("Parse of a hidden field as a key = %v, want an unknown-key error at workloads[0].source", err)
	}
	c := mustParse(t, base)
	c.Network = "net-1"
	d := Dump(c)
	if _, ok := d["network"]; ok {
		t.Errorf("Dump shows the hidden field network: %v", d)
	}
	c2 := mustParse(t, base)
	if diff := Diff(c, c2); len(diff) != 0 {
		t.Errorf("Diff compares a hidden top-level field: %q", diff)
	}
}

func TestHiddenFieldTakesNoOtherTag(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("mustSchema accepted toml:\"-\" with another tag")
		}
	}()
	mustSchema(reflect.TypeFor[struct {
		X int `toml:"-" reload:"apply"`
	}]())
}
