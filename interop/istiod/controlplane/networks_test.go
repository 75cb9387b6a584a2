package controlplane_test

import (
	"testing"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshtun/meshtun/interop/istiod/controlplane"
)

// TestNetworkGateway: the cluster in network cluster-net (the label on
// istio-system), a VM's WorkloadEntry in vm-net, and the east-west
// gateway of cluster-net declared as istiod reads one (NewNetworkGateway).
// The pods' workloads then carry their network and that gateway as their
// network_gateway, the VM's its own network and none; deleting the
// gateway takes it off the pods again. This is what a client in another
// network (double HBONE) is told, from Istio's own index.
func TestNetworkGateway(t *testing.T) {
	cp := start(t)
	if err := cp.ApplyNamespace(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: "istio-system", Labels: map[string]string{controlplane.NetworkLabel: "cluster-net"},
	}}); err != nil {
		t.Fatal(err)
	}
	applyMesh(t, cp)
	vm := controlplane.NewWorkloadEntry("vm", "vm-a", "vm-sa", "10.0.0.5", map[string]string{"app": "vm", controlplane.TunnelLabel: "http"})
	vm.Spec.Network = "vm-net"
	if err := cp.ApplyWorkloadEntry(vm); err != nil {
		t.Fatal(err)
	}
	const gwIP = "172.16.0.9"
	if err := cp.ApplyGateway(controlplane.NewNetworkGateway("istio-system", "eastwest", "cluster-net", gwIP, 15008)); err != nil {
		t.Fatal(err)
	}

	conn := dial(t, cp, token(t, cp, "vm", "vm-sa"), cp.ClusterID())
	wds := openWDS(t, conn, vmNode(t, cp, "vm-a", "vm", "vm-sa", "10.0.0.5"), nil)
	gatewayOf := func(s map[string]map[string]*discovery.Resource, name string) (network, addr string, port uint32) {
		r := s[addressType][name]
		if r == nil {
			return "", "", 0
		}
		w := decodeAddress(t, r).GetWorkload()
		gw := w.GetNetworkGateway()
		if gw == nil {
			return w.GetNetwork(), "", 0
		}
		if a := gw.GetAddress(); a != nil {
			addr = ip(t, a.GetAddress())
		}
		return w.GetNetwork(), addr, gw.GetHboneMtlsPort()
	}
	const gwName = "NetworkGateway/cluster-net/" + gwIP + "/15008"
	wds.waitFor("the pod behind cluster-net's gateway, the VM in vm-net", pushTimeout, func(s map[string]map[string]*discovery.Resource) bool {
		_, addr, _ := gatewayOf(s, podName)
		vmNet, _, _ := gatewayOf(s, vmAName)
		return addr == gwIP && vmNet == "vm-net" && s[addressType][gwName] != nil
	})
	s := map[string]map[string]*discovery.Resource{addressType: wds.snapshot(addressType)}
	if nw, addr, port := gatewayOf(s, podName); nw != "cluster-net" || addr != gwIP || port != 15008 {
		t.Errorf("pod: network %q, gateway %s port %d; want cluster-net, %s, 15008", nw, addr, port, gwIP)
	}
	if nw, addr, _ := gatewayOf(s, vmAName); nw != "vm-net" || addr != "" {
		t.Errorf("VM: network %q, gateway %q; want vm-net and none (vm-net has no gateway)", nw, addr)
	}
	// The gateway itself is sent as a workload at its address: where a
	// client takes the identity the gateway must present from.
	gw := decodeAddress(t, s[addressType][gwName]).GetWorkload()
	if gw == nil {
		t.Fatalf("no workload %s for the gateway; have %v", gwName, wds.names()[addressType])
	}
	if gw.Namespace != "istio-system" || gw.ServiceAccount != "eastwest-istio-remote" || gw.Network != "cluster-net" ||
		len(gw.Addresses) != 1 || ip(t, gw.Addresses[0]) != gwIP {
		t.Errorf("gateway workload: %s/%s network %q addresses %d", gw.Namespace, gw.ServiceAccount, gw.Network, len(gw.Addresses))
	}

	if err := cp.DeleteGateway("istio-system", "eastwest"); err != nil {
		t.Fatal(err)
	}
	wds.waitFor("the gateway gone from the pod", pushTimeout, func(s map[string]map[string]*discovery.Resource) bool {
		nw, addr, _ := gatewayOf(s, podName)
		return nw == "cluster-net" && addr == ""
	})
}
