package vminambientmesh_test

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/meshtun/meshtun/config"
)

// The files gateway.toml names exist on a VM (README.md, steps 2 and 3),
// not here.
const (
	rootCertPath = "/etc/meshtun/istio/root-cert.pem"
	tokenPath    = "/etc/meshtun/istio/istio-token"
)

// withPlaceholders writes gateway.toml into a temporary directory with its
// root certificate and token paths pointing at placeholder files there, and
// returns the new file's path.
func withPlaceholders(t *testing.T) string {
	t.Helper()
	text, err := os.ReadFile("gateway.toml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	out := string(text)
	for _, p := range []string{rootCertPath, tokenPath} {
		quoted := strconv.Quote(p)
		if n := strings.Count(out, quoted); n != 1 {
			t.Fatalf("gateway.toml names %s %d times, want once (README.md shows that path)", quoted, n)
		}
		placeholder := filepath.Join(dir, filepath.Base(p))
		if err := os.WriteFile(placeholder, []byte("placeholder\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		out = strings.Replace(out, quoted, strconv.Quote(placeholder), 1)
	}
	path := filepath.Join(dir, "gateway.toml")
	if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// The walkthrough's gateway.toml goes through the gateway's own load path
// (every key known and valid, [mesh] on, [tls] left out) and says what
// README.md says it does.
func TestGatewayTOMLLoads(t *testing.T) {
	cfg, err := config.Load(withPlaceholders(t))
	if err != nil {
		t.Fatalf("config.Load: %v", err)
	}
	if !cfg.Mesh.Enabled() {
		t.Fatal("[mesh] is off")
	}
	if got, want := cfg.MeshIdentity(), "spiffe://cluster.local/ns/vm/sa/vm-sa"; got != want {
		t.Errorf("identity %s, want %s (vm.yaml's WorkloadEntry)", got, want)
	}
	if cfg.Mesh.ServerName != "istiod.istio-system.svc" {
		t.Errorf("mesh.server_name %q, want istiod's certificate name", cfg.Mesh.ServerName)
	}
	if cfg.Mesh.CAAddress != cfg.Mesh.XDSAddress {
		t.Errorf("mesh.ca_address %q, want the xDS address %q (istiod serves both)", cfg.Mesh.CAAddress, cfg.Mesh.XDSAddress)
	}
	if want := []netip.Addr{netip.MustParseAddr("10.0.0.5")}; !slices.Equal(cfg.Mesh.InstanceIPs, want) {
		t.Errorf("mesh.instance_ips %v, want %v (vm.yaml's spec.address)", cfg.Mesh.InstanceIPs, want)
	}
	if cfg.TLS.Cert != "" || cfg.TLS.Key != "" {
		t.Errorf("[tls] cert %q key %q: with [mesh] the certificate comes from Istio's CA", cfg.TLS.Cert, cfg.TLS.Key)
	}
	wantRoutes := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.96.0.0/12")}
	if !slices.Equal(cfg.TUN.Routes, wantRoutes) {
		t.Errorf("tun.routes %v, want the pod and service CIDRs %v", cfg.TUN.Routes, wantRoutes)
	}
	xds, err := netip.ParseAddrPort(cfg.Mesh.XDSAddress)
	if err != nil {
		t.Fatalf("mesh.xds_address: %v", err)
	}
	for _, r := range cfg.TUN.Routes {
		if r.Contains(xds.Addr()) {
			t.Errorf("mesh.xds_address %s is inside tun.routes %s: istiod must be reachable by the VM's own routes (a ClusterIP is not)", xds, r)
		}
	}
	if n := len(cfg.Workloads) + len(cfg.Services) + len(cfg.Policies) + len(cfg.Peers); n != 0 {
		t.Errorf("%d entries in the file: the walkthrough takes them all from istiod", n)
	}
}

// Without the two files, loading fails and names both keys: the check the
// test above passes is a real one.
func TestGatewayTOMLNeedsItsFiles(t *testing.T) {
	_, err := config.Load("gateway.toml")
	if err == nil {
		_, rootErr := os.Stat(rootCertPath)
		_, tokenErr := os.Stat(tokenPath)
		if rootErr == nil && tokenErr == nil {
			t.Skipf("%s and %s exist on this machine", rootCertPath, tokenPath)
		}
		t.Fatal("config.Load accepted gateway.toml without its root certificate and token")
	}
	for _, key := range []string{"mesh.root_cert", "mesh.token_file"} {
		if !strings.Contains(err.Error(), key) {
			t.Errorf("error does not name %s: %v", key, err)
		}
	}
}

// README.md's commands make the token and name the files gateway.toml
// reads, for the identity gateway.toml joins as.
func TestREADMEMatches(t *testing.T) {
	cfg, err := config.Load(withPlaceholders(t))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	for _, want := range []string{
		"kubectl create token " + cfg.Mesh.ServiceAccount + " -n " + cfg.Mesh.Namespace + " --audience istio-ca",
		"kubectl get configmap istio-ca-root-cert -n " + cfg.Mesh.Namespace,
		rootCertPath, tokenPath,
		"kubectl apply -f vm.yaml",
		"sudo make demo-mesh",
	} {
		if !strings.Contains(readme, want) {
			t.Errorf("README.md does not say %q", want)
		}
	}
}
