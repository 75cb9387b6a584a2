package gateway

import (
	"cmp"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/hbone"
	"github.com/meshtun/meshtun/identity"
)

// nodeDescription is this node's workload, as the baggage of its outbound
// CONNECTs and its metrics' labels (source_* outbound, destination_*
// inbound) describe it, for the node whose SPIFFE ID is id. Each field
// is the first that is known of:
//
//  1. the [gateway] key (cluster, workload_namespace, workload_name,
//     workload_kind, canonical_service, canonical_revision): the
//     operator named it;
//  2. the node's own workload as istiod describes it (cfg.Self);
//  3. [mesh]'s namespace and cluster_id, with the mesh on;
//  4. what the node knows of itself: the namespace of its identity
//     (spiffe://<td>/ns/<ns>/sa/<sa>) and, as the workload's name,
//     gateway.name (Istio's defaults then make it the canonical service,
//     at revision "latest").
//
// So a node with no description configured is never "unknown" to its
// peers' metrics: it is gateway.name in the namespace of its
// certificate. The service account has no field of its own in a
// description; it is the principal (source_principal) already. The
// snapshot's label index resolves it once per snapshot (indexFor), not
// per flow.
func nodeDescription(cfg *config.Config, id string) hbone.Baggage {
	g := &cfg.Gateway
	var self config.WorkloadLabels
	var selfNamespace string
	if cfg.Self != nil {
		if cfg.Self.Labels != nil {
			self = *cfg.Self.Labels
		}
		self.WorkloadName = cmp.Or(self.WorkloadName, cfg.Self.Name)
		selfNamespace = cfg.Self.Namespace
	}
	var meshNamespace, meshCluster string
	if cfg.Mesh.Enabled() {
		meshNamespace, meshCluster = cfg.Mesh.Namespace, cfg.Mesh.ClusterID
	}
	var idNamespace string
	if parsed, err := identity.Parse(id); err == nil {
		idNamespace = parsed.Namespace()
	}
	return describe(hbone.Baggage{
		Cluster:      cmp.Or(g.Cluster, self.Cluster, meshCluster),
		Namespace:    cmp.Or(g.WorkloadNamespace, selfNamespace, meshNamespace, idNamespace),
		WorkloadKind: g.WorkloadKind,
		WorkloadName: cmp.Or(g.WorkloadName, self.WorkloadName, g.Name),
		Service:      cmp.Or(g.CanonicalService, self.CanonicalService),
		Revision:     cmp.Or(g.CanonicalRevision, self.CanonicalRevision),
	})
}
