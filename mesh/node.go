package mesh

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// Node is this gateway as istiod sees it: a ztunnel-shaped node whose
// workload identity is the node's own (for a VM, its WorkloadEntry).
type Node struct {
	// Name is the workload's name (NAME; for a VM, the WorkloadEntry's).
	Name string
	// Namespace and ServiceAccount are the workload identity (NAMESPACE,
	// SERVICE_ACCOUNT); istiod checks them against the token.
	Namespace      string
	ServiceAccount string
	// NodeName is the machine's name (NODE_NAME); optional.
	NodeName string
	// InstanceIPs are the workload's addresses (INSTANCE_IPS, comma
	// separated); the first also goes into the node id. At least one.
	InstanceIPs []netip.Addr
	// ClusterID is sent as CLUSTER_ID; NewXDSClient fills it from
	// ControlPlane.ClusterID when empty.
	ClusterID string
	// Network, if set, is this node's network, as ztunnel's NETWORK
	// setting: it wins over the network of the node's own workload, and
	// stands when istiod sends none (a multi-network istiod sends only
	// the workloads of its own network, so a VM in another network never
	// gets its own WorkloadEntry).
	Network string
}

func (n Node) check() error {
	for _, f := range []struct{ name, v string }{
		{"name", n.Name}, {"namespace", n.Namespace}, {"service account", n.ServiceAccount},
	} {
		if f.v == "" {
			return fmt.Errorf("xds: node %s is required", f.name)
		}
		if strings.ContainsAny(f.v, "~,/ ") {
			return fmt.Errorf("xds: node %s %q holds a character istiod's node id parser splits on", f.name, f.v)
		}
	}
	if len(n.InstanceIPs) == 0 {
		return errors.New("xds: node needs at least one instance IP")
	}
	for _, ip := range n.InstanceIPs {
		if !ip.IsValid() {
			return errors.New("xds: node instance IP is not a valid address")
		}
	}
	return nil
}

// ID is the node id ztunnel sends: ztunnel~<ip>~<name>.<ns>~<ns>.svc.cluster.local.
func (n Node) ID() string {
	return "ztunnel~" + n.InstanceIPs[0].String() + "~" + n.Name + "." + n.Namespace + "~" + n.Namespace + ".svc.cluster.local"
}

// Metadata is the node metadata istiod reads into its proxy model; the keys
// are the JSON names of Istio's NodeMetadata fields. Empty optional fields
// are left out.
func (n Node) Metadata() map[string]string {
	ips := make([]string, len(n.InstanceIPs))
	for i, ip := range n.InstanceIPs {
		ips[i] = ip.String()
	}
	md := map[string]string{
		"NAME":            n.Name,
		"NAMESPACE":       n.Namespace,
		"SERVICE_ACCOUNT": n.ServiceAccount,
		"INSTANCE_IPS":    strings.Join(ips, ","),
	}
	if n.NodeName != "" {
		md["NODE_NAME"] = n.NodeName
	}
	if n.ClusterID != "" {
		md["CLUSTER_ID"] = n.ClusterID
	}
	return md
}

func (n Node) proto() *core.Node {
	fields := map[string]*structpb.Value{}
	for k, v := range n.Metadata() {
		fields[k] = structpb.NewStringValue(v)
	}
	return &core.Node{Id: n.ID(), Metadata: &structpb.Struct{Fields: fields}}
}

// HostAddresses returns the host's global unicast addresses (interfaces up,
// no loopback or link-local), the default for Node.InstanceIPs.
func HostAddresses() ([]netip.Addr, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("list interfaces: %w", err)
	}
	var out []netip.Addr
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			return nil, fmt.Errorf("addresses of %s: %w", ifc.Name, err)
		}
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip, ok := netip.AddrFromSlice(ipn.IP)
			if ok && ip.Unmap().IsGlobalUnicast() {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}
