package gateway

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"istio.io/istio/pkg/workloadapi"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/hbone"
	"github.com/meshtun/meshtun/mesh"
)

// describeAs sets the [gateway] keys that describe a node's workload.
func describeAs(cfg *config.Config, cluster, namespace, workload, service, revision string) {
	g := &cfg.Gateway
	g.Cluster, g.WorkloadNamespace, g.WorkloadName, g.CanonicalService, g.CanonicalRevision = cluster, namespace, workload, service, revision
}

// sideLabels are the labels Istio's metrics describe one end with.
func sideLabels(side, workload, namespace, service, revision, cluster string) map[string]string {
	return map[string]string{
		side + "_workload": workload, side + "_workload_namespace": namespace,
		side + "_canonical_service": service, side + "_canonical_revision": revision, side + "_cluster": cluster,
	}
}

func merged(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// A flow from gateway A to gateway B over real HBONE: A's CONNECT carries
// its [gateway] description as baggage, and B's /metrics labels the flow
// with it as the source and with B's own as the destination; A's labels
// the source the same way. The keys are put in force by a reload.
func TestMetricsBaggageLabels(t *testing.T) {
	e := newOutboundEnv(t, "")
	cfgA, err := config.Load(filepath.Join(e.dir, "gateway-a.toml"))
	if err != nil {
		t.Fatal(err)
	}
	describeAs(cfgA, "c-a", "vm", "client-vm", "client", "v3")
	if _, _, err := e.a.Reload(cfgA); err != nil {
		t.Fatal(err)
	}
	cfgB := e.load("")
	describeAs(cfgB, "c-b", "data", "db-vm", "", "") // Istio's defaults: the workload's name, "latest"
	if changed, restart, err := e.g.Reload(cfgB); err != nil || len(restart) != 0 || !strings.Contains(strings.Join(changed, ","), "gateway.workload_name") {
		t.Fatalf("reload of B's description: changed %q, restart %q, %v; want applied, no restart", changed, restart, err)
	}

	target := echo(t)
	r := newFakeRequest(t, target)
	e.a.serveOutbound(r)
	if acc, _ := r.decisions(); acc != 1 {
		t.Fatal("the flow was not accepted")
	}
	r.app.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := r.app.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	r.app.CloseWrite()
	if back, err := io.ReadAll(r.app); err != nil || string(back) != "ping" {
		t.Fatalf("app read %q, %v", back, err)
	}
	accessLine(t, e.aLogs, target) // both ends closed: the counts are final
	accessLine(t, e.logs, target)

	source := sideLabels("source", "client-vm", "vm", "client", "v3", "c-a")
	atB := merged(source, sideLabels("destination", "db-vm", "data", "db-vm", "latest", "c-b"), map[string]string{
		"reporter": "destination", "source_principal": reloadClientID, "destination_principal": reloadServerID,
	})
	atA := merged(source, sideLabels("destination", "unknown", "unknown", "unknown", "unknown", "unknown"), map[string]string{
		"reporter": "source", "destination_principal": reloadServerID,
	})
	for _, c := range []struct {
		name   string
		g      *Gateway
		labels map[string]string
	}{{"B", e.g, atB}, {"A", e.a, atA}} {
		srv := httptest.NewServer(c.g.metricsHandler())
		samples := scrape(t, srv.URL, "/metrics")
		srv.Close()
		for _, family := range []string{"istio_tcp_connections_opened_total", "istio_tcp_connections_closed_total"} {
			if v, _ := find(t, samples, family, c.labels); v != 1 {
				t.Errorf("gateway %s: %s%v = %v, want 1", c.name, family, c.labels, v)
			}
		}
		for _, family := range []string{"istio_tcp_received_bytes_total", "istio_tcp_sent_bytes_total"} {
			if v, _ := find(t, samples, family, c.labels); v != 4 {
				t.Errorf("gateway %s: %s%v = %v, want 4", c.name, family, c.labels, v)
			}
		}
	}
}

// With no description configured anywhere, each node describes itself
// by what it knows (nodeDescription): gateway.name as its workload, the
// namespace of its SPIFFE identity. A's CONNECT carries it as baggage,
// so B's metrics name the source; B names itself as the destination.
func TestMetricsBaggageSelfDescribed(t *testing.T) {
	e := newOutboundEnv(t, "")
	target := echo(t)
	r := newFakeRequest(t, target)
	e.a.serveOutbound(r)
	if acc, _ := r.decisions(); acc != 1 {
		t.Fatal("the flow was not accepted")
	}
	r.app.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := r.app.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	r.app.CloseWrite()
	if back, err := io.ReadAll(r.app); err != nil || string(back) != "ping" {
		t.Fatalf("app read %q, %v", back, err)
	}
	accessLine(t, e.aLogs, target)
	accessLine(t, e.logs, target)

	source := sideLabels("source", "node-a", "meshtun", "node-a", "latest", "unknown")
	for _, c := range []struct {
		name   string
		g      *Gateway
		labels map[string]string
	}{
		{"B", e.g, merged(source, sideLabels("destination", "node-b", "meshtun", "node-b", "latest", "unknown"), map[string]string{"reporter": "destination"})},
		{"A", e.a, merged(source, map[string]string{"reporter": "source", "destination_workload": "unknown"})},
	} {
		srv := httptest.NewServer(c.g.metricsHandler())
		samples := scrape(t, srv.URL, "/metrics")
		srv.Close()
		if v, _ := find(t, samples, "istio_tcp_connections_opened_total", c.labels); v != 1 {
			t.Errorf("gateway %s: istio_tcp_connections_opened_total%v = %v, want 1", c.name, c.labels, v)
		}
	}
}

// With the mesh's state, each node's own workload as istiod describes it
// names it, in its baggage and its labels; a [gateway] key set in the
// file wins over istiod's value.
func TestMetricsBaggageFromMesh(t *testing.T) {
	e := newOutboundEnv(t, "")
	target := echo(t) // on 127.0.0.1: node B's own workload's address
	ip := func(s string) []byte { return netip.MustParseAddr(s).AsSlice() }
	wl := func(w *workloadapi.Workload) *workloadapi.Address {
		return &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: w}}
	}
	// Each node's state holds its own workload only: node A routes to
	// node B by its peer entry, and node B reads the source from the
	// baggage (a workload of its state at the source address would win).
	state := func(key string, w *workloadapi.Workload, n mesh.Node) mesh.State {
		return mesh.Convert(mesh.Snapshot{AddressesReady: true, AuthorizationsReady: true, Addresses: map[string]*workloadapi.Address{key: wl(w)}}, n)
	}
	e.a.ApplyMesh(state("vm-a", &workloadapi.Workload{Name: "vm-a-0", Namespace: "meshtun", ServiceAccount: "node-a", Addresses: [][]byte{ip("10.0.0.7")},
		TunnelProtocol: workloadapi.TunnelProtocol_HBONE, WorkloadName: "vm-a", CanonicalName: "vm-svc", CanonicalRevision: "v5", ClusterId: "c-mesh"},
		mesh.Node{Name: "node-a", Namespace: "meshtun", ServiceAccount: "node-a", InstanceIPs: []netip.Addr{netip.MustParseAddr("10.0.0.7")}}))
	e.g.ApplyMesh(state("vm-b", &workloadapi.Workload{Name: "vm-b-0", Namespace: "meshtun", ServiceAccount: "node-b", Addresses: [][]byte{ip("127.0.0.1")},
		TunnelProtocol: workloadapi.TunnelProtocol_HBONE, WorkloadName: "vm-b", CanonicalName: "b-svc", ClusterId: "c-mesh"},
		mesh.Node{Name: "node-b", Namespace: "meshtun", ServiceAccount: "node-b", InstanceIPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}}))
	cfgA, err := config.Load(filepath.Join(e.dir, "gateway-a.toml"))
	if err != nil {
		t.Fatal(err)
	}
	cfgA.Gateway.Cluster = "file-cluster"
	if _, _, err := e.a.Reload(cfgA); err != nil {
		t.Fatal(err)
	}

	r := newFakeRequest(t, target) // from 10.0.0.7, node A's own workload
	e.a.serveOutbound(r)
	if acc, _ := r.decisions(); acc != 1 {
		t.Fatal("the flow was not accepted")
	}
	r.app.Close()
	accessLine(t, e.logs, target)

	source := sideLabels("source", "vm-a", "meshtun", "vm-svc", "v5", "file-cluster")
	for _, c := range []struct {
		name   string
		g      *Gateway
		labels map[string]string
	}{
		{"B", e.g, merged(source, sideLabels("destination", "vm-b", "meshtun", "b-svc", "latest", "c-mesh"), map[string]string{"reporter": "destination"})},
		{"A", e.a, merged(source, sideLabels("destination", "unknown", "unknown", "unknown", "unknown", "unknown"), map[string]string{"reporter": "source"})},
	} {
		srv := httptest.NewServer(c.g.metricsHandler())
		samples := scrape(t, srv.URL, "/metrics")
		srv.Close()
		if v, _ := find(t, samples, "istio_tcp_connections_opened_total", c.labels); v != 1 {
			t.Errorf("gateway %s: istio_tcp_connections_opened_total%v = %v, want 1", c.name, c.labels, v)
		}
	}
}

// A peer's baggage is its claim: malformed, oversized or hostile values
// read as unknown, and one principal puts at most maxClaimsPerPrincipal
// descriptions on the series. The CONNECTs are real ones to gateway B; a
// closed port makes each a short flow, labelled when it opens.
func TestMetricsBaggageHostile(t *testing.T) {
	e := newReloadEnv(t, "")
	srv := httptest.NewServer(e.g.metricsHandler())
	defer srv.Close()
	closed := closedPort(t)
	var source netip.AddrPort // the forwarded client
	send := func(baggage string) {
		t.Helper()
		req := hbone.ConnectRequest{Address: e.addr, Authority: closed, Identities: []string{reloadServerID}, Baggage: baggage, Source: source}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := e.pool.Connect(ctx, req); err == nil {
			t.Fatal("CONNECT to a closed port answered 200")
		}
	}
	opened := func(labels map[string]string) float64 {
		t.Helper()
		v, _ := find(t, scrape(t, srv.URL, "/metrics"), "istio_tcp_connections_opened_total", merged(labels, map[string]string{"reporter": "destination"}))
		return v
	}
	unknownSource := sideLabels("source", "unknown", "unknown", "unknown", "unknown", "unknown")

	for _, b := range []string{
		"k8s.namespace.name=a b,service.name=x%2Cy,k8s.pod.name=" + strings.Repeat("w", 300),
		"garbage;;;===,,,%%%",
		strings.Repeat("other=x,", 2000) + "service.name=late", // past 64 members and 8192 bytes
		"service.name=" + strings.Repeat("%41", 3000),          // 3000 bytes once decoded: not a name
	} {
		send(b)
	}
	if v := opened(unknownSource); v != 4 {
		t.Errorf("hostile baggage: %v flows with an unknown source, want 4", v)
	}

	// A peer's description is taken as sent, without Istio's defaults
	// (as ztunnel does): no service.name, no canonical service.
	for i := range maxClaimsPerPrincipal + 1 {
		send(fmt.Sprintf("k8s.namespace.name=ns,k8s.deployment.name=w%d", i))
	}
	for i := range maxClaimsPerPrincipal {
		w := fmt.Sprintf("w%d", i)
		if v := opened(map[string]string{"source_workload": w, "source_workload_namespace": "ns", "source_canonical_service": "unknown", "source_canonical_revision": "unknown"}); v != 1 {
			t.Errorf("claim %d of the principal: %v flows labelled %s, want 1", i, v, w)
		}
	}
	if v := opened(unknownSource); v != 5 {
		t.Errorf("the claim past %d: %v flows with an unknown source, want 5 (4 hostile + 1)", maxClaimsPerPrincipal, v)
	}
	// A description already admitted still is.
	send("k8s.namespace.name=ns,k8s.deployment.name=w0")
	if v := opened(map[string]string{"source_workload": "w0"}); v != 2 {
		t.Errorf("an admitted description sent again: %v flows, want 2", v)
	}

	// A workload configured at the forwarded source wins over the claim,
	// field by field. What the config does not say (the cluster) the
	// baggage could, but this principal's claims are used up.
	e.reload(`
[[workloads]]
name = "known"
namespace = "data"
addresses = ["10.9.9.9"]
`)
	source = netip.MustParseAddrPort("10.9.9.9:1000")
	send("k8s.cluster.name=c9,k8s.namespace.name=liar,k8s.deployment.name=liar,service.name=liar")
	if v := opened(sideLabels("source", "known", "data", "known", "latest", "unknown")); v != 1 {
		t.Errorf("a configured source: %v flows labelled by the config, want 1", v)
	}
}

// closedPort is a loopback address nothing listens on.
func closedPort(t *testing.T) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().(*net.TCPAddr).AddrPort()
	ln.Close()
	return a
}

// A mesh workload whose labels leave its workload name "" (a pod that is
// its own workload, sharing its labels with its service's other pods) is
// labelled by its own name, each pod by its own.
func TestDescribeWorkloadOwnName(t *testing.T) {
	shared := &config.WorkloadLabels{WorkloadKind: "pod", CanonicalService: "web", CanonicalRevision: "v1", Cluster: "c1"}
	for _, name := range []string{"web-3", "web-4"} {
		b := describeWorkload(&config.Workload{Name: name, Namespace: "default", Labels: shared})
		if b.WorkloadName != name || b.Service != "web" || b.Revision != "v1" || b.Cluster != "c1" {
			t.Errorf("%s is described as %+v, want its own name with the shared labels", name, b)
		}
	}
}
