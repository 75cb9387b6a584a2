package gateway

import (
	"testing"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/hbone"
)

// The node's description: each [gateway] key wins over the mesh's own
// workload, the rest comes from it, then from [mesh], then from the
// node's own identity and gateway.name; Istio's defaults fill the
// canonical service and revision.
func TestNodeDescription(t *testing.T) {
	const id = "spiffe://cluster.local/ns/edge/sa/gw"
	self := &config.Workload{Name: "vm-1", Namespace: "vm", Labels: &config.WorkloadLabels{WorkloadName: "db-vm", CanonicalService: "db", CanonicalRevision: "v2", Cluster: "c-mesh"}}
	named := hbone.Baggage{Namespace: "edge", WorkloadKind: "pod", WorkloadName: "node-a", Service: "node-a", Revision: "latest"}
	for _, c := range []struct {
		name string
		id   string
		cfg  func(*config.Config)
		want hbone.Baggage
	}{
		{"nothing known", "", func(c *config.Config) { c.Gateway.Name = "" }, hbone.Baggage{}},
		{"the node's name alone", "", func(*config.Config) {},
			hbone.Baggage{WorkloadKind: "pod", WorkloadName: "node-a", Service: "node-a", Revision: "latest"}},
		{"the node's name and identity", id, func(*config.Config) {}, named},
		{"an identity not of Istio's form", "spiffe://cluster.local/gateways/a", func(*config.Config) {},
			hbone.Baggage{WorkloadKind: "pod", WorkloadName: "node-a", Service: "node-a", Revision: "latest"}},
		{"a name that is no label value", id, func(c *config.Config) { c.Gateway.Name = "node a" },
			hbone.Baggage{Namespace: "edge"}},
		{"the file alone", id, func(c *config.Config) { describeAs(c, "c1", "ns", "w", "", "") },
			hbone.Baggage{Cluster: "c1", Namespace: "ns", WorkloadKind: "pod", WorkloadName: "w", Service: "w", Revision: "latest"}},
		{"the file in part", id, func(c *config.Config) { c.Gateway.CanonicalRevision, c.Gateway.Cluster = "v7", "c1" },
			hbone.Baggage{Cluster: "c1", Namespace: "edge", WorkloadKind: "pod", WorkloadName: "node-a", Service: "node-a", Revision: "v7"}},
		{"the mesh without its workload", "spiffe://cluster.local/ns/vm/sa/gw", func(c *config.Config) { c.Mesh.XDSAddress, c.Mesh.Namespace = "istiod:15012", "vm" },
			hbone.Baggage{Cluster: "Kubernetes", Namespace: "vm", WorkloadKind: "pod", WorkloadName: "node-a", Service: "node-a", Revision: "latest"}},
		{"the mesh's workload", "spiffe://cluster.local/ns/vm/sa/gw", func(c *config.Config) { c.Mesh.XDSAddress, c.Mesh.Namespace, c.Self = "istiod:15012", "vm", self },
			hbone.Baggage{Cluster: "c-mesh", Namespace: "vm", WorkloadKind: "pod", WorkloadName: "db-vm", Service: "db", Revision: "v2"}},
		{"the mesh's workload without labels", "spiffe://cluster.local/ns/vm/sa/gw", func(c *config.Config) {
			c.Mesh.XDSAddress, c.Mesh.Namespace, c.Self = "istiod:15012", "vm", &config.Workload{Name: "vm-1", Namespace: "vm-ns"}
		}, hbone.Baggage{Cluster: "Kubernetes", Namespace: "vm-ns", WorkloadKind: "pod", WorkloadName: "vm-1", Service: "vm-1", Revision: "latest"}},
		{"the file wins", "spiffe://cluster.local/ns/vm/sa/gw", func(c *config.Config) {
			c.Mesh.XDSAddress, c.Mesh.Namespace, c.Self = "istiod:15012", "vm", self
			c.Gateway.WorkloadName, c.Gateway.CanonicalRevision, c.Gateway.WorkloadKind = "db-vm-2", "v9", "deployment"
		}, hbone.Baggage{Cluster: "c-mesh", Namespace: "vm", WorkloadKind: "deployment", WorkloadName: "db-vm-2", Service: "db", Revision: "v9"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.Gateway.Name = "node-a"
			c.cfg(cfg)
			if got := nodeDescription(cfg, c.id); got != c.want {
				t.Errorf("nodeDescription = %+v, want %+v", got, c.want)
			}
		})
	}
}
