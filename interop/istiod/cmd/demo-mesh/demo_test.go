package main

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"istio.io/istio/pkg/workloadapi"

	"github.com/meshtun/meshtun/interop/istiod/controlplane"
)

// exampleDir is the walkthrough, from this package's directory.
const exampleDir = "../../../../examples/vm-in-ambient-mesh"

func TestMain(m *testing.M) {
	if err := controlplane.ReexecWithAmbient(); err != nil {
		panic(err)
	}
	os.Exit(m.Run())
}

// The walkthrough's files decode strictly into Kubernetes' and Istio's
// types and agree with each other: the VM's WorkloadEntry speaks HBONE,
// runs as the ServiceAccount, and is the identity and address gateway.toml
// joins with.
func TestExampleAgrees(t *testing.T) {
	ex, err := loadExample(exampleDir)
	if err != nil {
		t.Fatal(err)
	}
	if ex.vm.Namespace != "vm" || ex.vm.Name != "vm-1" || ex.vm.Spec.ServiceAccount != "vm-sa" {
		t.Errorf("WorkloadEntry %s/%s as %s, want vm/vm-1 as vm-sa (README.md names them)", ex.vm.Namespace, ex.vm.Name, ex.vm.Spec.ServiceAccount)
	}
	addr, err := netip.ParseAddr(ex.vm.Spec.Address)
	if err != nil {
		t.Fatalf("WorkloadEntry spec.address: %v", err)
	}
	ips, err := getKey(ex.gatewayTOML, "mesh", "instance_ips")
	if err != nil {
		t.Fatal(err)
	}
	if want := tomlStrings([]netip.Addr{addr}); ips != want {
		t.Errorf("gateway.toml mesh.instance_ips = %s, want %s (the WorkloadEntry's spec.address)", ips, want)
	}
}

// writeExample writes a copy of the walkthrough with edit applied to one
// of its files, and returns its directory.
func writeExample(t *testing.T, file string, edit func(string) string) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{exampleYAML, exampleTOML} {
		b, err := os.ReadFile(filepath.Join(exampleDir, name))
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		if name == file {
			edited := edit(text)
			if edited == text {
				t.Fatalf("the edit changed nothing in %s", name)
			}
			text = edited
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// A walkthrough that went wrong is refused with the reason, so the demo
// and the test above check something.
func TestLoadExampleRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		edit       func(string) string
		want       string
	}{
		{"no tunnel label", exampleYAML, func(s string) string {
			return strings.Replace(s, "    networking.istio.io/tunnel: http\n", "", 1)
		}, "networking.istio.io/tunnel"},
		{"unknown field", exampleYAML, func(s string) string {
			return strings.Replace(s, "  serviceAccount: vm-sa", "  serviceAcount: vm-sa", 1)
		}, "serviceAcount"},
		{"no address", exampleYAML, func(s string) string {
			return strings.Replace(s, "  address: 10.0.0.5\n", "", 1)
		}, "address is required"},
		{"unknown metadata field", exampleYAML, func(s string) string {
			return strings.Replace(s, "  name: vm-1\n", "  name: vm-1\n  lables: {}\n", 1)
		}, "lables"},
		{"other service account", exampleYAML, func(s string) string {
			return strings.Replace(s, "  serviceAccount: vm-sa", "  serviceAccount: other", 1)
		}, "ServiceAccount is vm/vm-sa"},
		{"toml joins as another namespace", exampleTOML, func(s string) string {
			return strings.Replace(s, `namespace = "vm"`, `namespace = "vms"`, 1)
		}, "joins as vms/vm-sa"},
		{"toml without service_account", exampleTOML, func(s string) string {
			return strings.Replace(s, `service_account = "vm-sa"`, `# service_account = "vm-sa"`, 1)
		}, "mesh.service_account: not in the file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadExample(writeExample(t, tc.file, tc.edit))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("loadExample: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// The demo's line-by-line rewrite changes exactly the values it is given,
// keeps every other line and each rewritten line's comment, and refuses a
// key the file does not have.
func TestRender(t *testing.T) {
	const text = `version = 1
[gateway]
name = "a"   # the name
[mesh]
xds_address = "x:1"  # where "#" is
namespace = "vm#1"
[[peers]]
name = "p"
`
	n := &nodeConfig{}
	n.set("mesh", "xds_address", tomlString("192.0.2.1:15012"))
	n.set("gateway", "name", tomlString("b"))
	n.set("mesh", "namespace", tomlString("vm#1"))
	got, changes, err := n.render(text)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Replace(strings.Replace(text, `"x:1"`, `"192.0.2.1:15012"`, 1), `name = "a"`, `name = "b"`, 1)
	if got != want {
		t.Errorf("rendered:\n%s\nwant:\n%s", got, want)
	}
	if len(changes) != 2 || changes[0] != (change{"mesh.xds_address", `"x:1"`, `"192.0.2.1:15012"`}) ||
		changes[1] != (change{"gateway.name", `"a"`, `"b"`}) {
		t.Errorf("changes %+v, want xds_address and name (namespace is unchanged)", changes)
	}
	if v, err := stringKey(got, "mesh", "namespace"); err != nil || v != "vm#1" {
		t.Errorf(`mesh.namespace = %q, %v; want "vm#1"`, v, err)
	}
	for _, missing := range [][2]string{{"mesh", "token_file"}, {"tun", "name"}, {"peers", "name"}} {
		if _, err := setKey(text, missing[0], missing[1], `"v"`); err == nil {
			t.Errorf("setKey %s.%s: no error for a key the file does not have", missing[0], missing[1])
		}
	}
	if _, err := setKey("[tun]\nroutes = [\n  \"10.0.0.0/8\",\n]\n", "tun", "routes", `[]`); err == nil {
		t.Error("setKey rewrote a value that spans lines")
	}

	// add inserts a key the file does not have under its table, and
	// refuses one it has.
	a := &nodeConfig{}
	a.add("gateway", "east_west", tomlString("0.0.0.0:15009"))
	got, changes, err = a.render(text)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := stringKey(got, "gateway", "east_west"); err != nil || v != "0.0.0.0:15009" {
		t.Errorf("added gateway.east_west = %q, %v", v, err)
	}
	if len(changes) != 1 || changes[0].key != "gateway.east_west" || changes[0].was != "(unset)" {
		t.Errorf("changes %+v", changes)
	}
	dup := &nodeConfig{}
	dup.add("mesh", "namespace", tomlString("x"))
	if _, _, err := dup.render(text); err == nil {
		t.Error("add of a key the file has: no error")
	}
}

// Applied to Istio's own control plane, vm.yaml makes the VM an ambient
// workload that speaks HBONE itself (native tunnel), as the walkthrough's
// identity, at the address given; and each node's config renders from the
// walkthrough's gateway.toml with the control plane's values in it.
func TestExampleInIstio(t *testing.T) {
	ex, err := loadExample(exampleDir)
	if err != nil {
		t.Fatal(err)
	}
	cp, err := controlplane.Start(controlplane.Options{Dir: t.TempDir(), Logf: t.Logf, IstioLogLevel: "none"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Close)
	const vmAddr = "192.0.2.1"
	if err := ex.apply(cp, vmAddr); err != nil {
		t.Fatal(err)
	}
	uid := workloadUID(cp, ex.vm.Namespace, ex.vm.Name)
	ctx, cancel := context.WithTimeout(context.Background(), indexTimeout)
	defer cancel()
	index, err := cp.WaitIndex(ctx, func(x controlplane.Index) bool { return x.Workloads()[uid] != nil })
	if err != nil {
		t.Fatalf("the VM's workload %s never reached the index: %v", uid, err)
	}
	w := index.Workloads()[uid]
	if w.GetTunnelProtocol() != workloadapi.TunnelProtocol_HBONE || !w.GetNativeTunnel() {
		t.Errorf("tunnel %v native %v, want HBONE, native (the VM terminates HBONE itself)", w.GetTunnelProtocol(), w.GetNativeTunnel())
	}
	if w.GetNamespace() != ex.namespace || w.GetServiceAccount() != ex.serviceAccountName {
		t.Errorf("workload runs as %s/%s, want gateway.toml's %s/%s", w.GetNamespace(), w.GetServiceAccount(), ex.namespace, ex.serviceAccountName)
	}
	if got := ips(w.GetAddresses()); len(got) != 1 || got[0].String() != vmAddr {
		t.Errorf("workload addresses %v, want [%s]", got, vmAddr)
	}
	sa, err := cp.KubeClient().Kube().CoreV1().ServiceAccounts(ex.namespace).Get(ctx, ex.serviceAccountName, metav1.GetOptions{})
	if err != nil || sa.Name != ex.serviceAccountName {
		t.Errorf("service account %s/%s: %v", ex.namespace, ex.serviceAccountName, err)
	}

	token, err := cp.Token(ex.namespace, ex.serviceAccountName)
	if err != nil {
		t.Fatal(err)
	}
	text, _, err := meshConfig(cp, ex.vm.Name, ex.namespace, ex.serviceAccountName, token,
		netip.MustParseAddr(vmAddr), netip.MustParsePrefix("100.64.0.1/32")).render(ex.gatewayTOML)
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{
		"xds_address": cp.Addr(), "root_cert": cp.RootCertFile(), "server_name": cp.ServerName(),
		"token_file": token, "cluster_id": cp.ClusterID(), "namespace": ex.namespace,
	} {
		if got, err := stringKey(text, "mesh", key); err != nil || got != want {
			t.Errorf("rendered mesh.%s = %q, %v; want %q", key, got, err, want)
		}
	}
	if got, err := getKey(text, "mesh", "instance_ips"); err != nil || got != `["`+vmAddr+`"]` {
		t.Errorf("rendered mesh.instance_ips = %s, %v", got, err)
	}
}
