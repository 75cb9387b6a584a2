package controlplane_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	securityapi "istio.io/api/security/v1beta1"
	typeapi "istio.io/api/type/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	"istio.io/istio/pkg/workloadapi"
	"istio.io/istio/pkg/workloadapi/security"

	"github.com/meshtun/meshtun/interop/istiod/controlplane"
)

// pushTimeout bounds the wait for istiod to push a change: pushes take
// milliseconds, the margin is for a loaded machine.
const pushTimeout = 15 * time.Second

func TestMain(m *testing.M) {
	if err := controlplane.ReexecWithAmbient(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Exit(m.Run())
}

func start(t *testing.T) *controlplane.ControlPlane {
	t.Helper()
	// Istio's own logs are off unless ISTIO_LOG names a level: its fake
	// CRDs log errors that say nothing about the test.
	level := os.Getenv("ISTIO_LOG")
	if level == "" {
		level = "none"
	}
	cp, err := controlplane.Start(controlplane.Options{Dir: t.TempDir(), Logf: t.Logf, IstioLogLevel: level})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Close)
	return cp
}

func token(t *testing.T, cp *controlplane.ControlPlane, ns, sa string) string {
	t.Helper()
	path, err := cp.Token(ns, sa)
	if err != nil {
		t.Fatal(err)
	}
	return path
}

func TestCreateCertificate(t *testing.T) {
	cp := start(t)
	conn := dial(t, cp, token(t, cp, "vm", "vm-sa"), cp.ClusterID())
	resp, err := createCertificate(t, conn, "spiffe://cluster.local/ns/vm/sa/vm-sa")
	if err != nil {
		t.Fatalf("CreateCertificate: %v", err)
	}
	chain := parseChain(t, resp.CertChain)
	if len(chain) < 2 {
		t.Fatalf("chain has %d certificates, want leaf and root", len(chain))
	}
	leaf, root := chain[0], chain[len(chain)-1]
	if got := uris(leaf); !slices.Equal(got, []string{"spiffe://cluster.local/ns/vm/sa/vm-sa"}) {
		t.Errorf("leaf URI SANs %v", got)
	}
	if !bytes.Equal(pemBody(t, []byte(resp.CertChain[len(resp.CertChain)-1])), pemBody(t, cp.RootCertPEM())) {
		t.Error("last element of the chain is not the root the control plane publishes")
	}
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	roots.AddCert(root)
	for _, c := range chain[1 : len(chain)-1] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	}); err != nil {
		t.Errorf("leaf does not chain to the root: %v", err)
	}
	if left := time.Until(leaf.NotAfter); left > time.Hour || left < time.Hour-5*time.Minute {
		t.Errorf("leaf expires in %v, asked for 1h", left)
	}

	// The CA signs for the caller's identity, not the CSR's: a CSR naming
	// another service account still gets the token's identity.
	resp, err = createCertificate(t, conn, "spiffe://cluster.local/ns/default/sa/other")
	if err != nil {
		t.Fatalf("CreateCertificate (other SAN): %v", err)
	}
	if got := uris(parseChain(t, resp.CertChain)[0]); !slices.Equal(got, []string{"spiffe://cluster.local/ns/vm/sa/vm-sa"}) {
		t.Errorf("CSR for another identity: leaf URI SANs %v, want the token's", got)
	}
}

func TestRefusesBadCallers(t *testing.T) {
	cp := start(t)
	bad, err := cp.BadToken()
	if err != nil {
		t.Fatal(err)
	}
	wrongAud, err := cp.TokenWithAudience("vm", "vm-sa", "https://kubernetes.default.svc")
	if err != nil {
		t.Fatal(err)
	}
	good := token(t, cp, "vm", "vm-sa")
	for _, tc := range []struct {
		name, token, clusterID string
	}{
		{"unknown token", bad, cp.ClusterID()},
		{"wrong audience", wrongAud, cp.ClusterID()},
		{"unknown cluster", good, "elsewhere"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn := dial(t, cp, tc.token, tc.clusterID)
			_, err := createCertificate(t, conn, "spiffe://cluster.local/ns/vm/sa/vm-sa")
			if status.Code(err) != codes.Unauthenticated {
				t.Errorf("CreateCertificate: %v, want Unauthenticated", err)
			}
			wds := openWDS(t, conn, vmNode(t, cp, "vm-a", "vm", "vm-sa", "10.0.0.5"), nil)
			if err := wds.waitEnd(pushTimeout); status.Code(err) != codes.Unauthenticated {
				t.Errorf("delta ADS: %v, want Unauthenticated", err)
			}
		})
	}
	for _, tc := range []struct{ name, ns, sa string }{
		{"node namespace not the token's", "other", "vm-sa"},
		{"node service account not the token's", "vm", "other-sa"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn := dial(t, cp, good, cp.ClusterID())
			wds := openWDS(t, conn, vmNode(t, cp, "vm-a", tc.ns, tc.sa, "10.0.0.5"), nil)
			if err := wds.waitEnd(pushTimeout); status.Code(err) != codes.PermissionDenied {
				t.Errorf("delta ADS: %v, want PermissionDenied", err)
			}
		})
	}
}

// The mesh every WDS test starts from: a Pod behind a Service in "default",
// and two VMs (WorkloadEntries speaking HBONE) behind a Service in "vm".
const (
	podName   = "Kubernetes//Pod/default/web-1"
	webSvc    = "default/web.default.svc.cluster.local"
	vmSvc     = "vm/vm-svc.vm.svc.cluster.local"
	vmAName   = "Kubernetes/networking.istio.io/WorkloadEntry/vm/vm-a"
	vmBName   = "Kubernetes/networking.istio.io/WorkloadEntry/vm/vm-b"
	denyName  = "vm/deny-web"
	podIP     = "10.1.0.11"
	podIPNext = "10.1.0.12"
)

func applyMesh(t *testing.T, cp *controlplane.ControlPlane) {
	t.Helper()
	web := map[string]string{"app": "web"}
	vm := map[string]string{"app": "vm"}
	for _, err := range []error{
		cp.ApplyPod(controlplane.NewPod("default", "web-1", "web", podIP, web)),
		cp.ApplyService(controlplane.NewService("default", "web", "10.96.0.10", web,
			controlplane.ServicePort{Name: "http", Port: 80, TargetPort: 8080})),
		cp.ApplyWorkloadEntry(controlplane.NewWorkloadEntry("vm", "vm-a", "vm-sa", "10.0.0.5", vm)),
		cp.ApplyWorkloadEntry(controlplane.NewWorkloadEntry("vm", "vm-b", "vm-sa", "10.0.0.6", vm)),
		cp.ApplyService(controlplane.NewService("vm", "vm-svc", "10.96.0.20", vm,
			controlplane.ServicePort{Name: "tcp", Port: 9000, TargetPort: 9000})),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
}

func hasAll(typeURL string, names ...string) func(map[string]map[string]*discovery.Resource) bool {
	return func(s map[string]map[string]*discovery.Resource) bool {
		for _, n := range names {
			if s[typeURL][n] == nil {
				return false
			}
		}
		return true
	}
}

func TestWorkloadDiscovery(t *testing.T) {
	cp := start(t)
	applyMesh(t, cp)
	conn := dial(t, cp, token(t, cp, "vm", "vm-sa"), cp.ClusterID())
	wds := openWDS(t, conn, vmNode(t, cp, "vm-a", "vm", "vm-sa", "10.0.0.5"), nil)
	wds.waitFor("initial state", pushTimeout, hasAll(addressType, podName, webSvc, vmSvc, vmAName, vmBName))

	got := decodeAddresses(t, wds.snapshot(addressType))
	pod := got[podName].GetWorkload()
	if pod == nil {
		t.Fatalf("%s is not a workload: %v", podName, got[podName])
	}
	checkWorkload(t, pod, "default", "web", podIP, workloadapi.TunnelProtocol_HBONE, false)
	checkPorts(t, pod.Services[webSvc].GetPorts(), 80, 8080)

	svc := got[webSvc].GetService()
	if svc == nil {
		t.Fatalf("%s is not a service: %v", webSvc, got[webSvc])
	}
	if svc.Hostname != "web.default.svc.cluster.local" || svc.Namespace != "default" || svc.Name != "web" {
		t.Errorf("service identity %s/%s %s", svc.Namespace, svc.Name, svc.Hostname)
	}
	if len(svc.Addresses) != 1 || ip(t, svc.Addresses[0].Address) != "10.96.0.10" {
		t.Errorf("service addresses %v, want VIP 10.96.0.10", svc.Addresses)
	}
	checkPorts(t, svc.Ports, 80, 8080)

	for name, addr := range map[string]string{vmAName: "10.0.0.5", vmBName: "10.0.0.6"} {
		w := got[name].GetWorkload()
		if w == nil {
			t.Fatalf("%s is not a workload: %v", name, got[name])
		}
		checkWorkload(t, w, "vm", "vm-sa", addr, workloadapi.TunnelProtocol_HBONE, true)
		// A Kubernetes Service selects WorkloadEntries by label too.
		checkPorts(t, w.Services[vmSvc].GetPorts(), 9000, 9000)
	}
	compareWithIndex(t, cp, wds)

	// A Pod deleted and created again with a new IP: removed, then sent again.
	// The latencies are logged for the record, never asserted.
	wds.takeEvents()
	began := time.Now()
	if err := cp.DeletePod("default", "web-1"); err != nil {
		t.Fatal(err)
	}
	wds.waitFor("pod removed", pushTimeout, func(s map[string]map[string]*discovery.Resource) bool {
		return s[addressType][podName] == nil
	})
	t.Logf("pod deletion to removal seen by the client: %v", time.Since(began))
	began = time.Now()
	if err := cp.ApplyPod(controlplane.NewPod("default", "web-1", "web", podIPNext, map[string]string{"app": "web"})); err != nil {
		t.Fatal(err)
	}
	wds.waitFor("pod back with its new IP", pushTimeout, func(s map[string]map[string]*discovery.Resource) bool {
		r := s[addressType][podName]
		return r != nil && ip(t, decodeAddress(t, r).GetWorkload().GetAddresses()[0]) == podIPNext
	})
	t.Logf("pod creation to the new address seen by the client: %v", time.Since(began))
	if ev := wds.takeEvents(); !slices.Contains(ev, "-"+podName) || !slices.Contains(ev, "+"+podName) {
		t.Errorf("events %v, want the pod removed and added", ev)
	}
	compareWithIndex(t, cp, wds)

	// A DENY policy selecting the VMs: an Authorization resource, and the
	// VMs' workloads name it.
	if err := cp.ApplyAuthorizationPolicy(&securityv1.AuthorizationPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-web", Namespace: "vm"},
		Spec: securityapi.AuthorizationPolicy{
			Selector: &typeapi.WorkloadSelector{MatchLabels: map[string]string{"app": "vm"}},
			Action:   securityapi.AuthorizationPolicy_DENY,
			Rules: []*securityapi.Rule{{From: []*securityapi.Rule_From{{Source: &securityapi.Source{
				Principals: []string{"cluster.local/ns/default/sa/web"},
			}}}}},
		},
	}); err != nil {
		t.Fatal(err)
	}
	wds.waitFor("policy and the workloads naming it", pushTimeout, func(s map[string]map[string]*discovery.Resource) bool {
		if s[authorizationType][denyName] == nil || s[addressType][vmAName] == nil {
			return false
		}
		return slices.Contains(decodeAddress(t, s[addressType][vmAName]).GetWorkload().GetAuthorizationPolicies(), denyName)
	})
	pol := decodeAuthorization(t, wds.snapshot(authorizationType)[denyName])
	if pol.Name != "deny-web" || pol.Namespace != "vm" || pol.Action != security.Action_DENY ||
		pol.Scope != security.Scope_WORKLOAD_SELECTOR {
		t.Errorf("policy %s/%s action %v scope %v", pol.Namespace, pol.Name, pol.Action, pol.Scope)
	}
	if !matchesSource(pol, "default", "web") {
		t.Errorf("policy groups %v do not name the web principal", pol.Groups)
	}
	compareWithIndex(t, cp, wds)

	if err := cp.DeleteAuthorizationPolicy("vm", "deny-web"); err != nil {
		t.Fatal(err)
	}
	wds.waitFor("policy removed", pushTimeout, func(s map[string]map[string]*discovery.Resource) bool {
		return s[authorizationType][denyName] == nil
	})
}

func TestRestart(t *testing.T) {
	cp := start(t)
	applyMesh(t, cp)
	addr := cp.Addr()
	conn := dial(t, cp, token(t, cp, "vm", "vm-sa"), cp.ClusterID())
	node := vmNode(t, cp, "vm-a", "vm", "vm-sa", "10.0.0.5")
	wds := openWDS(t, conn, node, nil)
	wds.waitFor("initial state", pushTimeout, hasAll(addressType, podName, webSvc, vmSvc, vmAName, vmBName))

	cp.Stop()
	if err := wds.waitEnd(pushTimeout); status.Code(err) != codes.Unavailable {
		t.Errorf("stream ended with %v, want Unavailable", err)
	}
	// While istiod is away, vm-b goes away.
	if err := cp.DeleteWorkloadEntry("vm", "vm-b"); err != nil {
		t.Fatal(err)
	}
	if err := cp.Restart(); err != nil {
		t.Fatal(err)
	}
	if cp.Addr() != addr {
		t.Fatalf("restarted on %s, was %s", cp.Addr(), addr)
	}

	// Reconnect as ztunnel does, telling istiod what it holds: it is sent
	// what changed (vm-b removed), not what it already has.
	before := map[string]map[string]*discovery.Resource{}
	held := map[string]map[string]string{}
	for _, typeURL := range []string{addressType, authorizationType} {
		before[typeURL] = wds.snapshot(typeURL)
		held[typeURL] = map[string]string{}
		for name, r := range before[typeURL] {
			held[typeURL][name] = r.Version
		}
	}
	waitReady(t, conn)
	again := openWDS(t, conn, node, held)
	for typeURL, rs := range before {
		for name, r := range rs {
			again.state[typeURL][name] = r
		}
	}
	again.waitFor("vm-b removed after restart", pushTimeout, func(s map[string]map[string]*discovery.Resource) bool {
		return s[addressType][vmBName] == nil
	})
	for name, r := range again.snapshot(addressType) {
		if old := before[addressType][name]; old != nil && r != old && r.Version == old.Version {
			t.Errorf("%s resent although the client held its version %q", name, old.Version)
		}
	}
	compareWithIndex(t, cp, again)

	// A fresh client gets the whole state.
	fresh := openWDS(t, conn, node, nil)
	fresh.waitFor("full state", pushTimeout, hasAll(addressType, podName, webSvc, vmSvc, vmAName))
	compareWithIndex(t, cp, fresh)
}

// waitReady waits, bounded, until conn is connected again: after a restart
// the client connection reconnects with backoff, and a stream opened before
// that would fail at once.
func waitReady(t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer cancel()
	for {
		s := conn.GetState()
		if s == connectivity.Ready {
			return
		}
		conn.Connect()
		if !conn.WaitForStateChange(ctx, s) {
			t.Fatalf("connection not ready within %v (state %v)", rpcTimeout, s)
		}
	}
}

func checkWorkload(t *testing.T, w *workloadapi.Workload, ns, sa, addr string, tunnel workloadapi.TunnelProtocol, native bool) {
	t.Helper()
	// Istio elides the trust domain when it is the default, cluster.local.
	if w.Namespace != ns || w.ServiceAccount != sa || w.TrustDomain != "" {
		t.Errorf("%s: identity %s/%s in %q, want %s/%s in the default trust domain", w.Uid, w.Namespace,
			w.ServiceAccount, w.TrustDomain, ns, sa)
	}
	if len(w.Addresses) != 1 || ip(t, w.Addresses[0]) != addr {
		t.Errorf("%s: addresses %v, want %s", w.Uid, w.Addresses, addr)
	}
	if w.TunnelProtocol != tunnel || w.NativeTunnel != native {
		t.Errorf("%s: tunnel %v native %v, want %v native %v", w.Uid, w.TunnelProtocol, w.NativeTunnel, tunnel, native)
	}
	if w.Status != workloadapi.WorkloadStatus_HEALTHY {
		t.Errorf("%s: status %v", w.Uid, w.Status)
	}
	if w.ClusterId != controlplane.DefaultClusterID {
		t.Errorf("%s: cluster %q", w.Uid, w.ClusterId)
	}
}

func checkPorts(t *testing.T, ports []*workloadapi.Port, service, target uint32) {
	t.Helper()
	if len(ports) != 1 || ports[0].ServicePort != service || ports[0].TargetPort != target {
		t.Errorf("ports %v, want %d->%d", ports, service, target)
	}
}

// compareWithIndex checks that the client holds exactly what Istio's ambient
// index holds, resource by resource.
func compareWithIndex(t *testing.T, cp *controlplane.ControlPlane, wds *wdsClient) {
	t.Helper()
	idx := cp.Index()
	got := decodeAddresses(t, wds.snapshot(addressType))
	if a, b := keys(got), keys(idx.Addresses); !slices.Equal(a, b) {
		t.Errorf("addresses held %v, index %v", a, b)
	}
	for name, want := range idx.Addresses {
		if g := got[name]; g != nil && !proto.Equal(g, want) {
			t.Errorf("%s: held %v, index %v", name, g, want)
		}
	}
	pols := map[string]*security.Authorization{}
	for name, r := range wds.snapshot(authorizationType) {
		pols[name] = decodeAuthorization(t, r)
	}
	if a, b := keys(pols), keys(idx.Authorizations); !slices.Equal(a, b) {
		t.Errorf("authorizations held %v, index %v", a, b)
	}
	for name, want := range idx.Authorizations {
		if g := pols[name]; g != nil && !proto.Equal(g, want) {
			t.Errorf("%s: held %v, index %v", name, g, want)
		}
	}
}

func decodeAddresses(t *testing.T, rs map[string]*discovery.Resource) map[string]*workloadapi.Address {
	t.Helper()
	out := map[string]*workloadapi.Address{}
	for name, r := range rs {
		out[name] = decodeAddress(t, r)
	}
	return out
}

func decodeAddress(t *testing.T, r *discovery.Resource) *workloadapi.Address {
	t.Helper()
	a := &workloadapi.Address{}
	if err := r.Resource.UnmarshalTo(a); err != nil {
		t.Fatalf("%s: %v", r.Name, err)
	}
	return a
}

func decodeAuthorization(t *testing.T, r *discovery.Resource) *security.Authorization {
	t.Helper()
	if r == nil {
		t.Fatal("no such authorization")
	}
	a := &security.Authorization{}
	if err := r.Resource.UnmarshalTo(a); err != nil {
		t.Fatalf("%s: %v", r.Name, err)
	}
	return a
}

// matchesSource reports whether a rule of p matches the caller ns/sa, as a
// principal or as a service-account match (Istio converts the former into
// the latter where it can).
func matchesSource(p *security.Authorization, ns, sa string) bool {
	principal := controlplane.TrustDomain + "/ns/" + ns + "/sa/" + sa
	for _, g := range p.Groups {
		for _, rule := range g.Rules {
			for _, m := range rule.Matches {
				for _, sm := range m.Principals {
					if sm.GetExact() == principal || sm.GetExact() == "spiffe://"+principal {
						return true
					}
				}
				for _, sam := range m.ServiceAccounts {
					if sam.Namespace == ns && sam.ServiceAccount == sa {
						return true
					}
				}
			}
		}
	}
	return false
}

func ip(t *testing.T, b []byte) string {
	t.Helper()
	a, ok := netip.AddrFromSlice(b)
	if !ok {
		t.Fatalf("address %x is not an IP", b)
	}
	return a.String()
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func parseChain(t *testing.T, chain []string) []*x509.Certificate {
	t.Helper()
	var out []*x509.Certificate
	for _, p := range chain {
		c, err := x509.ParseCertificate(pemBody(t, []byte(p)))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	return out
}

func pemBody(t *testing.T, p []byte) []byte {
	t.Helper()
	b, _ := pem.Decode(p)
	if b == nil || b.Type != "CERTIFICATE" {
		t.Fatalf("not a PEM certificate: %q", p)
	}
	return b.Bytes
}

func uris(c *x509.Certificate) []string {
	var out []string
	for _, u := range c.URIs {
		out = append(out, u.String())
	}
	return out
}

// A client certificate the CA issued authenticates a caller with no token,
// as istiod accepts for renewals.
func TestClientCertificateAuthenticates(t *testing.T) {
	cp := start(t)
	conn := dial(t, cp, token(t, cp, "vm", "vm-sa"), cp.ClusterID())
	key, csrPEM := keyAndCSR(t, "spiffe://cluster.local/ns/vm/sa/vm-sa")
	resp, err := requestCertificate(conn, csrPEM)
	if err != nil {
		t.Fatalf("CreateCertificate: %v", err)
	}
	cert := tls.Certificate{PrivateKey: key}
	for _, c := range parseChain(t, resp.CertChain[:len(resp.CertChain)-1]) {
		cert.Certificate = append(cert.Certificate, c.Raw)
	}

	withCert := dialCert(t, cp, cert)
	renewed, err := createCertificate(t, withCert, "spiffe://cluster.local/ns/vm/sa/vm-sa")
	if err != nil {
		t.Fatalf("CreateCertificate with a client certificate: %v", err)
	}
	if got := uris(parseChain(t, renewed.CertChain)[0]); !slices.Equal(got, []string{"spiffe://cluster.local/ns/vm/sa/vm-sa"}) {
		t.Errorf("renewed leaf URI SANs %v", got)
	}
	// Without a certificate or token the CA refuses.
	if _, err := createCertificate(t, dialCert(t, cp, tls.Certificate{}), "spiffe://cluster.local/ns/vm/sa/vm-sa"); status.Code(err) != codes.Unauthenticated {
		t.Errorf("CreateCertificate without credentials: %v, want Unauthenticated", err)
	}
}

// Options.Listen opens the listener at Start and again at Restart, on the
// address Start resolved.
func TestListenHook(t *testing.T) {
	var addrs []string
	cp, err := controlplane.Start(controlplane.Options{
		Dir: t.TempDir(), Logf: t.Logf, IstioLogLevel: "none",
		Listen: func(addr string) (net.Listener, error) {
			addrs = append(addrs, addr)
			return net.Listen("tcp", addr)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Close)
	if err := cp.Restart(); err != nil {
		t.Fatal(err)
	}
	if want := []string{"127.0.0.1:0", cp.Addr()}; !slices.Equal(addrs, want) {
		t.Errorf("listened on %v, want %v", addrs, want)
	}
	cp.Close()
	cp.Close() // idempotent
	if err := cp.Restart(); err == nil {
		t.Error("Restart after Close succeeded")
	}
}

const meshYAML = `
apiVersion: v1
kind: Namespace
metadata:
  name: vm
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata:
  name: vm-a
  namespace: vm
  labels:
    app: vm
    networking.istio.io/tunnel: http
spec:
  address: 10.0.0.5
  serviceAccount: vm-sa
---
apiVersion: v1
kind: Service
metadata:
  name: vm-svc
  namespace: vm
spec:
  clusterIP: 10.96.0.20
  selector:
    app: vm
  ports:
  - name: tcp
    port: 9000
    targetPort: 9000
`

func TestApplyYAML(t *testing.T) {
	cp := start(t)
	if err := cp.ApplyYAML([]byte(meshYAML)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), pushTimeout)
	defer cancel()
	idx, err := cp.WaitIndex(ctx, func(x controlplane.Index) bool {
		w := x.Workloads()[vmAName]
		return w != nil && w.Services[vmSvc] != nil && x.Services()[vmSvc] != nil
	})
	if err != nil {
		t.Fatalf("%v; index %v", err, keys(idx.Addresses))
	}
	w := idx.Workloads()[vmAName]
	checkWorkload(t, w, "vm", "vm-sa", "10.0.0.5", workloadapi.TunnelProtocol_HBONE, true)

	err = cp.ApplyYAML([]byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n"))
	if err == nil || !strings.Contains(err.Error(), "document 1") || !strings.Contains(err.Error(), "ConfigMap") {
		t.Errorf("ConfigMap: %v, want an error naming the document and kind", err)
	}
}

// Close ends every goroutine Start began and closes the listener.
func TestCloseReleasesEverything(t *testing.T) {
	before := runtime.NumGoroutine()
	cp, err := controlplane.Start(controlplane.Options{Dir: t.TempDir(), IstioLogLevel: "none"})
	if err != nil {
		t.Fatal(err)
	}
	addr := cp.Addr()
	if runtime.NumGoroutine() <= before {
		t.Fatal("Start began no goroutines; the check below would prove nothing")
	}
	cp.Close()
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		_ = c.Close()
		t.Errorf("%s still accepts after Close", addr)
	}
	deadline := time.Now().Add(pushTimeout)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 64<<10)
			t.Fatalf("%d goroutines after Close, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond) // goroutines end on their own schedule; nothing to wait on
	}
}

// A NACK (error_detail set) does not end the stream: istiod logs it and
// keeps pushing changes.
func TestNACKKeepsStream(t *testing.T) {
	cp := start(t)
	applyMesh(t, cp)
	conn := dial(t, cp, token(t, cp, "vm", "vm-sa"), cp.ClusterID())
	wds := openWDS(t, conn, vmNode(t, cp, "vm-a", "vm", "vm-sa", "10.0.0.5"), nil)
	first := wds.nackNext(addressType, "cannot use these", pushTimeout)
	if len(first.Resources) == 0 {
		t.Fatal("first Address response is empty")
	}
	if err := cp.ApplyPod(controlplane.NewPod("default", "web-2", "web", "10.1.0.13", map[string]string{"app": "web"})); err != nil {
		t.Fatal(err)
	}
	wds.waitFor("a change pushed after the NACK", pushTimeout, hasAll(addressType, "Kubernetes//Pod/default/web-2"))
	if err := wds.streamErr(); err != nil {
		t.Fatalf("stream ended: %v", err)
	}
}
