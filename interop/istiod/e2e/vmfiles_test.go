package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"istio.io/istio/istioctl/pkg/cli"
	"istio.io/istio/istioctl/pkg/workload"

	"github.com/meshtun/meshtun/internal/xfer"
)

// Istio's VM onboarding, with Istio's own code: istioctl's `x workload
// entry configure` (istio.io/istio/istioctl/pkg/workload, run as its
// command runs) writes the VM's files for node A's WorkloadGroup, `meshtun
// init --istio` turns them into a gateway.toml, and node A joins the mesh
// with it in its gateway's place: its certificate from Istio's CA, the
// mesh from istiod, a flow to node B's service.
//
// istioctl reads the cluster through a Kubernetes client; here that is
// istioctl's fake one, holding what a cluster would (the istio ConfigMap
// with the mesh config, the namespace's root-cert ConfigMap with the
// control plane's root, the service account). Its token request gets no
// token from a fake API server, so the token file is then written with
// one the control plane's TokenReview knows, as `kubectl create token`
// would give.
func TestIstioctlVMFilesJoin(t *testing.T) {
	m := setup(t)
	serve(t, m.topo.B)
	dir := t.TempDir()
	a := m.topo.A

	wg := fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: WorkloadGroup
metadata:
  name: %s
  namespace: %s
spec:
  metadata:
    labels:
      app: %s
  template:
    serviceAccount: %s
`, a.Name, meshNS, a.Name, a.Name)
	wgFile := filepath.Join(dir, "workloadgroup.yaml")
	must(t, os.WriteFile(wgFile, []byte(wg), 0o644))
	out := filepath.Join(dir, "vm-files")
	ctx := cli.NewFakeContext(&cli.NewFakeContextOption{
		IstioNamespace: "istio-system",
		Objects: []runtime.Object{
			&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "istio-system", Name: "istio"},
				Data: map[string]string{"mesh": "trustDomain: cluster.local\ndefaultConfig:\n  discoveryAddress: " + m.cp.ServerName() + ":15012\n"}},
			&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: meshNS, Name: "istio-ca-root-cert"},
				Data: map[string]string{"root-cert.pem": string(m.cp.RootCertPEM())}},
			&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: meshNS, Name: a.Name}},
		},
	})
	cmd := workload.Cmd(ctx)
	var log bytes.Buffer
	cmd.SetOut(&log)
	cmd.SetErr(&log)
	// The control plane listens in node A's namespace, at its veth
	// address: what the VM reaches istiod by (--ingressIP).
	cmd.SetArgs([]string{"entry", "configure", "-f", wgFile, "-o", out, "--clusterID", m.cp.ClusterID(),
		"--internalIP", a.VethIP4.String(), "--ingressIP", netip.MustParseAddrPort(m.cp.Addr()).Addr().String()})
	if err := cmd.Execute(); err != nil {
		t.Fatalf("istioctl x workload entry configure: %v\n%s", err, &log)
	}
	for _, f := range []string{"cluster.env", "mesh.yaml", "root-cert.pem", "istio-token", "hosts"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Fatalf("istioctl wrote no %s: %v\n%s", f, err, &log)
		}
	}
	tok, err := m.cp.Token(meshNS, a.Name)
	must(t, err)
	b, err := os.ReadFile(tok)
	must(t, err)
	must(t, os.WriteFile(filepath.Join(out, "istio-token"), b, 0o600))

	cfgPath := filepath.Join(dir, "gateway.toml")
	initOut, err := exec.Command(m.bin, "init", "--istio", out, "--out", cfgPath).CombinedOutput()
	if err != nil {
		t.Fatalf("meshtun init --istio: %v\n%s", err, initOut)
	}
	t.Logf("meshtun init --istio:\n%s", initOut)
	text, err := os.ReadFile(cfgPath)
	must(t, err)
	gen := string(text)
	for _, want := range []string{
		`xds_address = "` + m.cp.Addr() + `"`, `server_name = "` + m.cp.ServerName() + `"`,
		`namespace = "` + meshNS + `"`, `service_account = "` + a.Name + `"`, `cluster_id = "` + m.cp.ClusterID() + `"`,
		`instance_ips = ["` + a.VethIP4.String() + `"]`, `root_cert = "` + filepath.Join(out, "root-cert.pem") + `"`,
	} {
		if !strings.Contains(gen, want) {
			t.Errorf("the generated gateway.toml lacks %s:\n%s", want, gen)
		}
	}
	// What init could not infer, the operator writes, as its note says:
	// the capture routes (istioctl's ISTIO_SERVICE_CIDR is "*") and, in
	// this topology, the device's address and where the test looks for
	// the metrics and readiness.
	if !strings.Contains(gen, "routes = []") {
		t.Fatalf("routes not left for the operator:\n%s", gen)
	}
	gen = strings.Replace(gen, "routes = []", fmt.Sprintf("routes = [%q]", svcCIDR), 1)
	gen = strings.Replace(gen, `addresses = ["100.64.0.1/32"]`, fmt.Sprintf("addresses = [%q]", a.TUNAddr4.String()), 1)
	gen = strings.Replace(gen, "[admin]\n", fmt.Sprintf("[admin]\nmetrics = %q\nreadiness = %q\n", metricsAddr, readinessAddr), 1)
	must(t, os.WriteFile(cfgPath, []byte(gen), 0o644))
	if vout, err := exec.Command(m.bin, "validate", "--config", cfgPath).CombinedOutput(); err != nil {
		t.Fatalf("meshtun validate: %v\n%s\n%s", err, vout, gen)
	}

	// Node A joins with it, in its gateway's place.
	if err := m.gwA.Stop(15 * time.Second); err != nil {
		t.Fatalf("stop node A's gateway: %v", err)
	}
	g := m.start(t, a, cfgPath)
	wctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if err := g.WaitReady(wctx, readinessAddr); err != nil {
		t.Fatalf("node A with the generated config never got ready: %v\n%s", err, strings.Join(g.Logs(), "\n"))
	}
	_, dump := configDump(t, a)
	if !strings.Contains(string(dump["certificate"]), identity(a.Name)) {
		t.Errorf("node A's certificate: %s, want %s from Istio's CA", dump["certificate"], identity(a.Name))
	}
	dst := vipB + ":" + fmt.Sprint(svcPort)
	conn, err := dial(a, dst)
	if err != nil {
		t.Fatalf("node A → %s: %v", dst, err)
	}
	if _, err := xfer.Run(conn, 1<<20, 1<<20); err != nil {
		t.Fatalf("node A → %s with the generated config: %v", dst, err)
	}
}
