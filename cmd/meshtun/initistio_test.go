package main

import (
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/hbone/devca"
)

// writeIstioVMFiles writes, under dir, the five files in the form
// `istioctl x workload entry configure` gives them, with clusterEnv as
// cluster.env.
func writeIstioVMFiles(t *testing.T, dir string, layout map[string]string, clusterEnv string) {
	t.Helper()
	ca, err := devca.New("cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"cluster.env":   clusterEnv,
		"mesh.yaml":     "defaultConfig:\n  discoveryAddress: istiod.istio-system.svc:15012\n  proxyMetadata:\n    POD_NAMESPACE: vm\n",
		"root-cert.pem": string(ca.PEM()),
		"istio-token":   "eyJhbGciOiJSUzI1NiJ9.e30.c2ln\n",
		"hosts":         "192.0.2.10 istiod.istio-system.svc\n",
	}
	for name, data := range files {
		p := filepath.Join(dir, layout[name])
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

var (
	flatLayout = map[string]string{"cluster.env": "cluster.env", "mesh.yaml": "mesh.yaml", "root-cert.pem": "root-cert.pem",
		"istio-token": "istio-token", "hosts": "hosts"}
	installedLayout = map[string]string{"cluster.env": "var/lib/istio/envoy/cluster.env", "mesh.yaml": "etc/istio/config/mesh",
		"root-cert.pem": "etc/certs/root-cert.pem", "istio-token": "var/run/secrets/tokens/istio-token", "hosts": "etc/hosts"}
)

// What istioctl writes for a WorkloadGroup web-vm in namespace vm, with
// --internalIP 10.0.0.5, a network and DNS capture, values quoted as its
// shell quoting does.
const vmClusterEnv = `CANONICAL_REVISION='v1'
CANONICAL_SERVICE='web'
ISTIO_INBOUND_PORTS='*'
ISTIO_LOCAL_EXCLUDE_PORTS='22,15090,15021,15020'
ISTIO_METAJSON_LABELS='{"app":"web","note":"it'"'"'s"}'
ISTIO_META_CLUSTER_ID='cluster-1'
ISTIO_META_DNS_CAPTURE='true'
ISTIO_META_NETWORK='vm-net'
ISTIO_META_WORKLOAD_NAME='web-vm'
ISTIO_NAMESPACE='vm'
ISTIO_SERVICE='web-vm.vm'
ISTIO_SERVICE_CIDR='10.96.0.0/12,10.244.0.0/16'
ISTIO_SVC_IP='10.0.0.5'
POD_NAMESPACE='vm'
SERVICE_ACCOUNT='vm-sa'
TRUST_DOMAIN='example.org'
`

func TestInitIstio(t *testing.T) {
	for _, tt := range []struct {
		name   string
		layout map[string]string
	}{{"istioctl's directory", flatLayout}, {"where Istio's VM guide installs them", installedLayout}} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			writeIstioVMFiles(t, dir, tt.layout, vmClusterEnv)
			out := filepath.Join(t.TempDir(), "gateway.toml")
			var stdout, stderr bytes.Buffer
			if code := runMain([]string{"init", "--istio", dir, "--out", out}, &stdout, &stderr); code != 0 {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, &stdout, &stderr)
			}
			if !strings.Contains(stdout.String(), "ok; start it with meshtun run --config "+out) {
				t.Errorf("stdout: %s", &stdout)
			}
			cfg, err := config.Load(out)
			if err != nil {
				t.Fatal(err)
			}
			m := cfg.Mesh
			if m.XDSAddress != "192.0.2.10:15012" || m.ServerName != "istiod.istio-system.svc" || m.Namespace != "vm" ||
				m.ServiceAccount != "vm-sa" || m.ClusterID != "cluster-1" || !slices.Equal(m.InstanceIPs, []netip.Addr{netip.MustParseAddr("10.0.0.5")}) ||
				m.RootCert != filepath.Join(dir, tt.layout["root-cert.pem"]) || m.TokenFile != filepath.Join(dir, tt.layout["istio-token"]) {
				t.Errorf("[mesh]: %+v", m)
			}
			g := cfg.Gateway
			if g.Name != "web-vm" || g.TrustDomain != "example.org" || g.WorkloadNamespace != "vm" || g.WorkloadName != "web-vm" ||
				g.CanonicalService != "web" || g.CanonicalRevision != "v1" || g.Cluster != "cluster-1" {
				t.Errorf("[gateway]: %+v", g)
			}
			if cfg.MeshIdentity() != "spiffe://example.org/ns/vm/sa/vm-sa" {
				t.Errorf("identity %s", cfg.MeshIdentity())
			}
			want := []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("10.244.0.0/16")}
			if !slices.Equal(cfg.TUN.Routes, want) || !cfg.DNS.Enabled {
				t.Errorf("tun.routes %v, dns.enabled %v", cfg.TUN.Routes, cfg.DNS.Enabled)
			}
			text, _ := os.ReadFile(out)
			if !strings.Contains(string(text), `network is "vm-net"`) {
				t.Errorf("the network istiod sends is not noted:\n%s", text)
			}

			// Not overwritten without --force.
			stdout.Reset()
			stderr.Reset()
			if code := runMain([]string{"init", "--istio", dir, "--out", out}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "exists: not overwritten") {
				t.Errorf("a second init: exit %d, stderr %q", code, &stderr)
			}
			if code := runMain([]string{"init", "--istio", dir, "--out", out, "--force"}, &stdout, &stderr); code != 0 {
				t.Errorf("--force: exit %d, stderr %q", code, &stderr)
			}
		})
	}
}

// What init cannot infer it says, and it refuses what is not Istio's.
func TestInitIstioIncomplete(t *testing.T) {
	dir := t.TempDir()
	env := strings.NewReplacer("ISTIO_SERVICE_CIDR='10.96.0.0/12,10.244.0.0/16'", "ISTIO_SERVICE_CIDR='*'", "ISTIO_SVC_IP='10.0.0.5'\n", "").Replace(vmClusterEnv)
	writeIstioVMFiles(t, dir, flatLayout, env)
	os.Remove(filepath.Join(dir, "hosts"))
	var stdout, stderr bytes.Buffer
	code := runMain([]string{"init", "--istio", dir, "--out", "-"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, &stderr)
	}
	text := stdout.String()
	for _, want := range []string{`xds_address = "istiod.istio-system.svc:15012"`, "# instance_ips", `ISTIO_SERVICE_CIDR is "*"`, "routes = []"} {
		if !strings.Contains(text, want) {
			t.Errorf("lacks %q:\n%s", want, text)
		}
	}

	for _, tt := range []struct {
		name, env string
		want      string
	}{
		{"not KEY=VALUE", "POD_NAMESPACE='vm'\nthis is not\n", "cluster.env:2: not KEY=VALUE"},
		{"an open quote", "POD_NAMESPACE='vm\n", "cluster.env:1: POD_NAMESPACE: a single quote is not closed"},
		{"no service account", "POD_NAMESPACE='vm'\n", "names no namespace (POD_NAMESPACE, ISTIO_NAMESPACE) or SERVICE_ACCOUNT"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := t.TempDir()
			writeIstioVMFiles(t, d, flatLayout, tt.env)
			var stdout, stderr bytes.Buffer
			if code := runMain([]string{"init", "--istio", d, "--out", "-"}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), tt.want) {
				t.Errorf("exit %d, stderr %q, want 1 and %q", code, &stderr, tt.want)
			}
		})
	}
	var so, se bytes.Buffer
	if code := runMain([]string{"init", "--istio", t.TempDir()}, &so, &se); code != 1 || !strings.Contains(se.String(), "holds no cluster.env") {
		t.Errorf("an empty directory: exit %d, %q", code, &se)
	}
	if code := runMain([]string{"init"}, &so, &se); code != 2 {
		t.Errorf("no --istio: exit %d", code)
	}
}

func TestShellUnquote(t *testing.T) {
	for in, want := range map[string]string{
		`'a b'`: "a b", `plain`: "plain", `'it'"'"'s'`: "it's", `"x\"y"`: `x"y`, `''`: "", `a\ b`: "a b",
	} {
		if got, err := shellUnquote(in); err != nil || got != want {
			t.Errorf("shellUnquote(%s) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{`'open`, `"open`, `two words`} {
		if _, err := shellUnquote(in); err == nil {
			t.Errorf("shellUnquote(%s): no error", in)
		}
	}
}
