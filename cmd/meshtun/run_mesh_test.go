package main

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/meshtun/meshtun/config"
)

func TestMeshNode(t *testing.T) {
	cfg := config.Default()
	cfg.Gateway.Name = "vm-1"
	cfg.Mesh.XDSAddress = "istiod.istio-system.svc:15012"
	cfg.Mesh.Namespace, cfg.Mesh.ServiceAccount, cfg.Mesh.ClusterID = "vm", "vm-sa", "Kubernetes"
	host := []netip.Addr{netip.MustParseAddr("192.0.2.7")}
	asked := 0
	hostAddrs := func() ([]netip.Addr, error) { asked++; return host, nil }

	n, err := meshNode(cfg, hostAddrs)
	if err != nil {
		t.Fatal(err)
	}
	if n.Name != "vm-1" || n.Namespace != "vm" || n.ServiceAccount != "vm-sa" || n.ClusterID != "Kubernetes" || !slices.Equal(n.InstanceIPs, host) || asked != 1 {
		t.Errorf("node %+v (host asked %d times), want the config's identity and the host's addresses", n, asked)
	}
	if got, want := n.ID(), "ztunnel~192.0.2.7~vm-1.vm~vm.svc.cluster.local"; got != want {
		t.Errorf("ID = %q, want %q", got, want)
	}

	cfg.Mesh.InstanceIPs = []netip.Addr{netip.MustParseAddr("10.0.0.9")}
	if n, err = meshNode(cfg, hostAddrs); err != nil || !slices.Equal(n.InstanceIPs, cfg.Mesh.InstanceIPs) || asked != 1 {
		t.Errorf("with mesh.instance_ips: %+v, %v (host asked %d times)", n.InstanceIPs, err, asked)
	}

	cfg.Mesh.InstanceIPs = nil
	if _, err := meshNode(cfg, func() ([]netip.Addr, error) { return nil, nil }); err == nil || !strings.Contains(err.Error(), "mesh.instance_ips") {
		t.Errorf("no host address: %v, want an error naming mesh.instance_ips", err)
	}
	if _, err := meshNode(cfg, func() ([]netip.Addr, error) { return nil, errors.New("boom") }); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("host addresses failing: %v", err)
	}
}

// validate takes the same path as run with [mesh] on: no [tls] needed, the
// certificate comes from the CA at run time.
func TestValidateMesh(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"root-cert.pem", "istio-token"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, "gateway.toml")
	text := `version = 1
[gateway]
name = "vm-1"
[mesh]
xds_address = "istiod.istio-system.svc:15012"
root_cert = "root-cert.pem"
token_file = "istio-token"
namespace = "vm"
service_account = "vm-sa"
`
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr strings.Builder
	if err := cmdValidate([]string{"--config", path}, &stdout, &stderr); err != nil {
		t.Fatalf("validate: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stdout.String(), "ok") {
		t.Errorf("validate said %q", stdout.String())
	}
	// A missing token is an error at its key path.
	os.Remove(filepath.Join(dir, "istio-token"))
	stdout.Reset()
	stderr.Reset()
	if err := cmdValidate([]string{"--config", path}, &stdout, &stderr); err == nil || !strings.Contains(stderr.String(), "mesh.token_file") {
		t.Errorf("validate without the token: %v, %q", err, stderr.String())
	}
}

func TestMeshGCPercent(t *testing.T) {
	unset := func(string) (string, bool) { return "", false }
	if p, ok := meshGCPercent(unset); !ok || p != 50 {
		t.Errorf("GOGC unset: %d, %v; want 50, true", p, ok)
	}
	for _, v := range []string{"100", "off", ""} {
		set := func(k string) (string, bool) { return v, k == "GOGC" }
		if p, ok := meshGCPercent(set); ok {
			t.Errorf("GOGC=%q: the gateway would set %d over the operator's choice", v, p)
		}
	}
}
