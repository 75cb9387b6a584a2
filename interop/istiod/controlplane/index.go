package controlplane

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"istio.io/istio/pkg/workloadapi"
	"istio.io/istio/pkg/workloadapi/security"
)

// indexPoll is how often WaitIndex looks at the ambient index: the index is
// a set of krt collections without a change feed for outsiders, and a few
// milliseconds is far below the push latency a test is looking at.
const indexPoll = 5 * time.Millisecond

// Index is a copy of what Istio's ambient index holds, keyed by the xDS
// resource names istiod uses for them: workloads by uid
// ("Kubernetes//Pod/ns/name", "Kubernetes/networking.istio.io/WorkloadEntry/ns/name"),
// services by "ns/hostname", authorizations by "ns/name".
type Index struct {
	Addresses      map[string]*workloadapi.Address
	Authorizations map[string]*security.Authorization
}

// Workloads returns the workloads of the index by resource name.
func (x Index) Workloads() map[string]*workloadapi.Workload {
	out := map[string]*workloadapi.Workload{}
	for name, a := range x.Addresses {
		if w := a.GetWorkload(); w != nil {
			out[name] = w
		}
	}
	return out
}

// Services returns the services of the index by resource name.
func (x Index) Services() map[string]*workloadapi.Service {
	out := map[string]*workloadapi.Service{}
	for name, a := range x.Addresses {
		if s := a.GetService(); s != nil {
			out[name] = s
		}
	}
	return out
}

// Index returns a copy of what the ambient index holds now: the same
// addresses and authorizations a wildcard WDS subscriber is sent.
func (c *ControlPlane) Index() Index {
	idx := c.fake.AmbientIndex
	out := Index{Addresses: map[string]*workloadapi.Address{}, Authorizations: map[string]*security.Authorization{}}
	for _, a := range idx.All() {
		// A multi-network index (AMBIENT_ENABLE_MULTI_NETWORK) can hold
		// entries without an address while it builds them; such an entry
		// is not sent either.
		if a.Address == nil {
			continue
		}
		out.Addresses[a.ResourceName()] = proto.Clone(a.Address).(*workloadapi.Address)
	}
	for _, p := range idx.Policies(nil) {
		out.Authorizations[p.ResourceName()] = proto.Clone(p.Authorization).(*security.Authorization)
	}
	return out
}

// WaitIndex waits until cond holds for the index, or ctx ends; it returns
// the index cond accepted.
func (c *ControlPlane) WaitIndex(ctx context.Context, cond func(Index) bool) (Index, error) {
	tick := time.NewTicker(indexPoll)
	defer tick.Stop()
	for {
		x := c.Index()
		if cond(x) {
			return x, nil
		}
		select {
		case <-ctx.Done():
			return x, fmt.Errorf("controlplane: wait for index: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// HoldsPod reports whether Istio's ambient index holds pod namespace/name
// as a workload: one lookup by its resource name, for a caller that paces
// itself by the index (the in-memory Kubernetes client's watch channels
// hold 100 events, and a writer that runs ahead of Istio's informers
// makes the client panic).
func (c *ControlPlane) HoldsPod(namespace, name string) bool {
	idx := c.fake.AmbientIndex
	if idx == nil {
		return false
	}
	return len(idx.Lookup(c.opts.ClusterID+"//Pod/"+namespace+"/"+name)) > 0
}
