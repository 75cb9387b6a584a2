// Package multinet runs Istio's control plane with two networks
// (AMBIENT_ENABLE_MULTI_NETWORK) and checks that meshtun reads what
// istiod says of them as ztunnel does: a VM in vm-net, a server pod in
// cluster-net, and cluster-net's east-west gateway as istiod models one
// (a Gateway of class istio-remote with an HBONE listener); the VM's flow
// to the server's VIP is planned as double HBONE through the gateway.
package multinet

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshtun/meshtun/config"
	meshtungw "github.com/meshtun/meshtun/gateway"
	"github.com/meshtun/meshtun/interop/istiod/controlplane"
	"github.com/meshtun/meshtun/mesh"
)

// TestMain runs the tests in a process that has both of istiod's flags
// from its start: Istio's features read them while the program
// initializes.
func TestMain(m *testing.M) {
	if os.Getenv("AMBIENT_ENABLE_MULTI_NETWORK") != "true" || os.Getenv("PILOT_ENABLE_AMBIENT") != "true" {
		exe, err := os.Executable()
		if err == nil {
			env := append(os.Environ(), "AMBIENT_ENABLE_MULTI_NETWORK=true", "PILOT_ENABLE_AMBIENT=true")
			err = syscall.Exec(exe, os.Args, env)
		}
		fmt.Fprintln(os.Stderr, "multinet: re-exec with AMBIENT_ENABLE_MULTI_NETWORK:", err)
		os.Exit(2)
	}
	os.Exit(m.Run())
}

const (
	gwIP     = "203.0.113.10"
	serverIP = "10.244.1.7"
	vmIP     = "10.0.0.5"
	vip      = "10.96.0.10"
)

func TestTwoNetworks(t *testing.T) {
	level := os.Getenv("ISTIO_LOG")
	if level == "" {
		level = "none"
	}
	cp, err := controlplane.Start(controlplane.Options{Dir: t.TempDir(), Logf: t.Logf, IstioLogLevel: level})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Close)

	// cluster-net is the network of the cluster's own namespace; the
	// server pod lives in it.
	for _, ns := range []*corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: "istio-system", Labels: map[string]string{"topology.istio.io/network": "cluster-net"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "default", Labels: map[string]string{"istio.io/dataplane-mode": "ambient"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "vm"}},
	} {
		if err := cp.ApplyNamespace(ns); err != nil {
			t.Fatal(err)
		}
	}
	if err := cp.ApplyPod(controlplane.NewPod("default", "server-1", "server", serverIP,
		map[string]string{"app": "server", "topology.istio.io/network": "cluster-net"})); err != nil {
		t.Fatal(err)
	}
	if err := cp.ApplyService(controlplane.NewService("default", "server", vip, map[string]string{"app": "server"},
		controlplane.ServicePort{Port: 80, TargetPort: 8080})); err != nil {
		t.Fatal(err)
	}
	we := controlplane.NewWorkloadEntry("vm", "vm-a", "vm-sa", vmIP, map[string]string{"app": "vm"})
	we.Spec.Network = "vm-net"
	if err := cp.ApplyWorkloadEntry(we); err != nil {
		t.Fatal(err)
	}
	// cluster-net's gateway, as istiod models a remote network's one.
	if err := cp.ApplyGateway(controlplane.NewNetworkGateway("istio-system", "istio-eastwestgateway", "cluster-net", gwIP, 15008)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	idx, err := cp.WaitIndex(ctx, func(x controlplane.Index) bool {
		server, gw := false, false
		for name, w := range x.Workloads() {
			server = server || w.GetName() == "server-1" && w.GetNetworkGateway() != nil
			gw = gw || strings.HasPrefix(name, "NetworkGateway/cluster-net/")
		}
		return server && gw
	})
	if err != nil {
		for name, w := range idx.Workloads() {
			t.Logf("%s: network %q gateway %v", name, w.GetNetwork(), w.GetNetworkGateway())
		}
		t.Fatalf("istiod never gave the server pod a network gateway, and the gateway its workload: %v", err)
	}
	for name, w := range idx.Workloads() {
		t.Logf("istiod sends %s: network %q, addresses %v, identity ns %s sa %s, network_gateway %v",
			name, w.GetNetwork(), w.GetAddresses(), w.GetNamespace(), w.GetServiceAccount(), w.GetNetworkGateway())
	}
	for name, a := range idx.Addresses {
		if svc := a.GetService(); svc != nil {
			t.Logf("istiod sends service %s: addresses %v", name, svc.GetAddresses())
		}
	}
	// istiod sends the workloads of its own network (cluster-net) and
	// the network gateways; a workload of another network, the VM's
	// WorkloadEntry included, only inside a split-horizon workload per
	// service. So the VM does not learn its own network from istiod: to
	// it, every cluster-net workload is of another network, behind the
	// gateway istiod names.
	for _, w := range idx.Workloads() {
		if w.GetName() == "vm-a" {
			t.Logf("istiod sent the VM's own WorkloadEntry too (network %q)", w.GetNetwork())
		}
	}

	// meshtun reads istiod's state as the VM would, its network set as
	// ztunnel's NETWORK is (mesh.network).
	node := mesh.Node{Name: "vm-a", Namespace: "vm", ServiceAccount: "vm-sa", InstanceIPs: []netip.Addr{netip.MustParseAddr(vmIP)},
		Network: "vm-net"}
	st := mesh.Convert(mesh.Snapshot{Addresses: idx.Addresses, Authorizations: idx.Authorizations,
		AddressesReady: true, AuthorizationsReady: true}, node)
	if st.Network != "vm-net" {
		t.Fatalf("our network %q, want vm-net (mesh.network)", st.Network)
	}
	var server *config.Workload
	for i := range st.Workloads {
		if st.Workloads[i].Name == "server-1" {
			server = &st.Workloads[i]
		}
	}
	if server == nil || server.Network != "cluster-net" || server.NetworkGateway == nil {
		t.Fatalf("server workload %+v, want cluster-net with its network gateway", server)
	}
	t.Logf("istiod's network gateway for cluster-net, as meshtun resolved it: %+v", *server.NetworkGateway)
	if !slices.ContainsFunc(server.NetworkGateway.Endpoints, func(e config.WaypointEndpoint) bool {
		return e.Address == netip.MustParseAddrPort(gwIP+":15008")
	}) {
		t.Errorf("gateway instances %+v, want %s:15008", server.NetworkGateway.Endpoints, gwIP)
	}

	cfg := config.Default()
	cfg.Network = st.Network
	cfg.Workloads, cfg.Services = st.Workloads, st.Services
	plan := meshtungw.NewRouter(cfg).Route(netip.MustParseAddrPort(vip+":80"), nil)
	t.Logf("plan: %s", plan)
	if plan.Gateway == nil || plan.Gateway.Address != netip.MustParseAddrPort(gwIP+":15008") {
		t.Fatalf("plan %s: want double HBONE through %s:15008", plan, gwIP)
	}
	if plan.Authority != "server.default.svc.cluster.local:80" {
		t.Errorf("authority %q, want ztunnel's server.default.svc.cluster.local:80", plan.Authority)
	}
	if !slices.Contains(plan.Identities, "spiffe://cluster.local/ns/default/sa/server") {
		t.Errorf("inner identities %v lack the server's", plan.Identities)
	}
}
