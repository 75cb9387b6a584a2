// Package e2e runs the real meshtun binary against Istio's own control
// plane (package controlplane): two meshtun nodes in the network namespaces
// of internal/topo join the mesh istiod serves from inside node A, take
// their certificates from Istio's CA and their workloads, services and
// policies from its ambient index, and carry traffic between each other.
// The tests skip without root.
package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "istio.io/api/security/v1alpha1"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshtun/meshtun/internal/topo"
	"github.com/meshtun/meshtun/interop/istiod/controlplane"
)

func TestMain(m *testing.M) {
	if err := controlplane.ReexecWithAmbient(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Exit(m.Run())
}

// The mesh of the tests: namespace vm, one WorkloadEntry per meshtun node
// at its veth address, a Service in front of each, and an ambient Pod
// behind a third Service. The VIPs are in svcCIDR, which both nodes
// capture into their TUN.
const (
	meshNS   = "vm"
	svcCIDR  = "10.96.0.0/16"
	vipA     = "10.96.0.10" // svc-a: node A's WorkloadEntry
	vipB     = "10.96.0.20" // svc-b: node B's WorkloadEntry
	vipWeb   = "10.96.0.30" // web: the Pod
	vipLate  = "10.96.0.40" // late: made while istiod is down
	podIP    = "10.244.9.5"
	podIPNew = "10.244.9.6"

	// Service port → target port on the nodes: xfer on 8080, an echo on
	// 8081.
	svcPort, xferPort     = 80, 8080
	echoSvcPort, echoPort = 81, 8081

	adminAddr     = "127.0.0.1:15000"
	metricsAddr   = "127.0.0.1:15020"
	readinessAddr = "127.0.0.1:15021"
)

// Bounds of the waits. Generous: the machine is shared, and each bound
// only ends a wait that would otherwise hang.
const (
	readyTimeout = 60 * time.Second // a gateway's first certificate and xDS push
	planTimeout  = 10 * time.Second // a change in istiod reaching a node's plan
	pollEvery    = 10 * time.Millisecond
)

// mesh is the running setup every test of the package shares: one
// control plane per process is all Istio allows.
type mesh struct {
	topo     *topo.Topology
	cp       *controlplane.ControlPlane
	bin, dir string
	gwA, gwB *topo.Gateway
	// caFault, if set, answers Istio's CA calls in its place (the CA
	// fault tests); nil: the CA answers.
	caFault atomic.Pointer[controlplane.CAHook]
	// tokenA is node A's token file, which meshtun reads anew on every
	// call to istiod.
	tokenA string
}

// certTTL is the lifetime of the certificates Istio's CA issues in these
// tests, whatever meshtun asks for (mesh.cert_ttl cannot go below 10
// minutes): each node renews every 13-17 s, so the CA fault tests see
// renewals within seconds, and a renewal that fails leaves the old
// certificate in force for that long again.
const certTTL = 30 * time.Second

// caHook shortens what every CSR asks for to certTTL, then runs the
// fault in force, if any.
func (m *mesh) caHook(ctx context.Context, req *pb.IstioCertificateRequest) error {
	if ttl := int64(certTTL / time.Second); req.ValidityDuration == 0 || req.ValidityDuration > ttl {
		req.ValidityDuration = ttl
	}
	if f := m.caFault.Load(); f != nil {
		return (*f)(ctx, req)
	}
	return nil
}

func workloadEntryName(n *topo.Node) string { return n.Name } // node-a, node-b
func identity(sa string) string             { return "spiffe://cluster.local/ns/" + meshNS + "/sa/" + sa }

// meshtunBinary builds cmd/meshtun of the project (two directories up)
// into dir, or returns $MESHTUN_BIN if that is set: the scale test's
// figures for an earlier build are measured that way.
func meshtunBinary(t *testing.T, dir string) string {
	t.Helper()
	if bin := os.Getenv("MESHTUN_BIN"); bin != "" {
		abs, err := filepath.Abs(bin)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(abs); err != nil {
			t.Fatalf("MESHTUN_BIN: %v", err)
		}
		return abs
	}
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "meshtun")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/meshtun")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/meshtun: %v\n%s", err, out)
	}
	return bin
}

// setupOptions changes what setupWith builds.
type setupOptions struct {
	// noDebounce makes istiod push every change on its own
	// (controlplane.Options.NoDebounce).
	noDebounce bool
}

// setup builds the topology, starts istiod in node A, applies the mesh's
// objects and starts meshtun in node B, then node A, each waited ready.
// Everything is undone at t's cleanup.
func setup(t *testing.T) *mesh { return setupWith(t, setupOptions{}) }

// setupWith is setup with options.
func setupWith(t *testing.T, opts setupOptions) *mesh {
	t.Helper()
	if err := topo.Available(); err != nil {
		t.Skipf("needs network namespaces: %v", err)
	}
	m := &mesh{dir: t.TempDir()}
	m.bin = meshtunBinary(t, m.dir)
	tp, err := topo.New("mtist")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tp.Close(); err != nil {
			t.Errorf("remove topology: %v", err)
		}
	})
	m.topo = tp
	level := os.Getenv("ISTIO_LOG")
	if level == "" {
		level = "none"
	}
	cp, err := controlplane.Start(controlplane.Options{
		Addr: netip.AddrPortFrom(tp.A.VethIP4, 15012).String(), Dir: filepath.Join(m.dir, "istiod"),
		Logf: t.Logf, IstioLogLevel: level, NoDebounce: opts.noDebounce,
		Listen: func(addr string) (net.Listener, error) { return tp.A.Listen("tcp", addr) },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Close)
	m.cp = cp
	cp.SetCAHook(m.caHook)

	must(t, cp.ApplyNamespace(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: meshNS}}))
	for _, n := range []*topo.Node{tp.A, tp.B} {
		must(t, cp.ApplyWorkloadEntry(controlplane.NewWorkloadEntry(meshNS, workloadEntryName(n), n.Name, n.VethIP4.String(),
			map[string]string{"app": n.Name})))
	}
	ports := []controlplane.ServicePort{{Name: "xfer", Port: svcPort, TargetPort: xferPort}, {Name: "echo", Port: echoSvcPort, TargetPort: echoPort}}
	must(t, cp.ApplyService(controlplane.NewService(meshNS, "svc-a", vipA, map[string]string{"app": tp.A.Name}, ports...)))
	must(t, cp.ApplyService(controlplane.NewService(meshNS, "svc-b", vipB, map[string]string{"app": tp.B.Name}, ports...)))
	must(t, cp.ApplyPod(controlplane.NewPod(meshNS, "web", "web", podIP, map[string]string{"app": "web"})))
	must(t, cp.ApplyService(controlplane.NewService(meshNS, "web", vipWeb, map[string]string{"app": "web"},
		controlplane.ServicePort{Name: "http", Port: svcPort, TargetPort: xferPort})))
	ctx, cancel := context.WithTimeout(context.Background(), planTimeout)
	defer cancel()
	if _, err := cp.WaitIndex(ctx, func(x controlplane.Index) bool {
		w := x.Workloads()[weUID(tp.B)]
		return w != nil && len(w.GetServices()) > 0 && x.Services()[serviceKey("svc-b")] != nil && x.Services()[serviceKey("web")] != nil
	}); err != nil {
		t.Fatal(err)
	}

	for _, n := range []*topo.Node{tp.B, tp.A} {
		tok, err := cp.Token(meshNS, n.Name)
		if err != nil {
			t.Fatal(err)
		}
		if n == tp.A {
			m.tokenA = tok
		}
		path := m.writeConfig(t, n, n.Name, tok, "")
		g := m.start(t, n, path)
		ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
		err = g.WaitReady(ctx, readinessAddr)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if n == tp.A {
			m.gwA = g
		} else {
			m.gwB = g
		}
	}
	return m
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// weUID is the xDS name of a node's WorkloadEntry; serviceKey that of a
// service of namespace vm.
func weUID(n *topo.Node) string {
	return controlplane.DefaultClusterID + "/networking.istio.io/WorkloadEntry/" + meshNS + "/" + workloadEntryName(n)
}
func serviceKey(name string) string { return meshNS + "/" + name + "." + meshNS + ".svc.cluster.local" }

// writeConfig writes node n's gateway.toml with [mesh] for service
// account sa and token file tok. A variant ("" for the node's own
// gateway) names another gateway of the node, in a file of its own, with
// the same device and ports: it runs in the node's gateway's place, never
// beside it (two gateways in one network namespace would install the
// same capture rule, tun.RulePriority, and the second is refused). It
// returns the path, checked by `meshtun validate`.
func (m *mesh) writeConfig(t *testing.T, n *topo.Node, sa, tok, variant string) string {
	t.Helper()
	tunName, hboneListen, admin, metrics, ready := "meshtun0", "0.0.0.0:15008", adminAddr, metricsAddr, readinessAddr
	text := fmt.Sprintf(`version = 1
[gateway]
name = %q
[log]
level = "info"
[tun]
name = %q
addresses = [%q]
routes = [%q]
[hbone]
listen = %q
[admin]
listen = %q
metrics = %q
readiness = %q
[mesh]
xds_address = %q
root_cert = %q
server_name = %q
token_file = %q
cluster_id = %q
namespace = %q
service_account = %q
instance_ips = [%q]
`, n.Name+variant, tunName, n.TUNAddr4.String(), svcCIDR, hboneListen, admin, metrics, ready,
		m.cp.Addr(), m.cp.RootCertFile(), m.cp.ServerName(), tok, m.cp.ClusterID(), meshNS, sa, n.VethIP4.String())
	path := filepath.Join(m.dir, n.Name+variant+".toml")
	must(t, os.WriteFile(path, []byte(text), 0o644))
	if out, err := exec.Command(m.bin, "validate", "--config", path).CombinedOutput(); err != nil {
		t.Fatalf("meshtun validate %s: %v\n%s", path, err, out)
	}
	return path
}

// start runs meshtun in n with the config at path, stopped at cleanup
// (a gateway that does not exit cleanly fails the test).
func (m *mesh) start(t *testing.T, n *topo.Node, path string) *topo.Gateway {
	t.Helper()
	g, err := n.StartGateway(m.bin, path, logWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := g.Stop(15 * time.Second); err != nil {
			t.Errorf("meshtun in %s: %v", n.Name, err)
		}
	})
	return g
}

type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// httpIn is an HTTP client whose connections start inside node n.
func httpIn(n *topo.Node) *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return n.Dial(ctx, network, addr)
		},
		DisableKeepAlives: true,
	}}
}

// get fetches http://addr+path inside n and returns the body of a 200.
func get(n *topo.Node, addr, path string) ([]byte, error) {
	resp, err := httpIn(n).Get("http://" + addr + path)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return b, fmt.Errorf("GET %s%s: %s: %.300s", addr, path, resp.Status, b)
	}
	return b, nil
}

// routeAnswer is the JSON of GET /route (gateway.RouteAnswer).
type routeAnswer struct {
	Destination  string   `json:"destination"`
	Kind         string   `json:"kind"`
	Via          string   `json:"via"`
	Service      string   `json:"service"`
	Endpoint     string   `json:"endpoint"`
	Endpoints    int      `json:"endpoints"`
	Target       string   `json:"target"`
	HBONEAddress string   `json:"hbone_address"`
	Identities   []string `json:"identities"`
	Reason       string   `json:"reason"`
	Captured     bool     `json:"captured"`
}

// route asks n's gateway for its plan of dst.
func route(n *topo.Node, dst string) (routeAnswer, error) {
	var a routeAnswer
	b, err := get(n, adminAddr, "/route?dst="+dst)
	if err != nil {
		return a, err
	}
	if err := json.Unmarshal(b, &a); err != nil {
		return a, fmt.Errorf("GET /route: %w: %s", err, b)
	}
	return a, nil
}

// waitRoute polls n's plan of dst until ok accepts it, up to planTimeout;
// it returns the plan accepted and when, or fails the test with the last
// plan seen.
func waitRoute(t *testing.T, n *topo.Node, dst string, ok func(routeAnswer) bool) (routeAnswer, time.Time) {
	t.Helper()
	deadline := time.Now().Add(planTimeout)
	var last routeAnswer
	var lastErr error
	for time.Now().Before(deadline) {
		last, lastErr = route(n, dst)
		if lastErr == nil && ok(last) {
			return last, time.Now()
		}
		time.Sleep(pollEvery)
	}
	t.Fatalf("%s's plan of %s did not change as expected within %v: last %+v (error %v)", n.Name, dst, planTimeout, last, lastErr)
	return last, time.Time{}
}

// routeCommand runs `meshtun route --admin` in n and returns its output.
func (m *mesh) routeCommand(t *testing.T, n *topo.Node, dst string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := n.Command(ctx, m.bin, "route", "--admin", adminAddr, dst).CombinedOutput()
	if err != nil {
		t.Fatalf("meshtun route --admin %s %s in %s: %v\n%s", adminAddr, dst, n.Name, err, out)
	}
	return string(out)
}

// metric reads one unlabelled sample of n's /metrics.
func metric(n *topo.Node, name string) (float64, error) {
	b, err := get(n, metricsAddr, "/metrics")
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == name {
			return strconv.ParseFloat(f[1], 64)
		}
	}
	return 0, fmt.Errorf("/metrics has no sample %s", name)
}
