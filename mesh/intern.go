package mesh

import (
	"hash/maphash"
	"maps"
	"slices"

	"github.com/meshtun/meshtun/config"
)

// stringTable is the Tracker's table of the strings its workloads repeat:
// the pods of one mesh share a few namespaces, service accounts,
// identities, networks, clusters, workload kinds and revisions, and each
// decoded message carries its own copy of each. An entry kept shares one
// copy among all of them (issue "Scale with the mesh": memory per
// workload).
//
// The table holds no counts: when it outgrows what the mesh can share
// (limit), it is dropped and begun again. Strings already handed out stay
// valid; only the sharing with later ones is lost.
type stringTable struct {
	m     map[string]string
	limit int
}

// minStringTable is the smallest limit: a small mesh never drops it.
const minStringTable = 4096

func (t *stringTable) intern(s string) string {
	if s == "" {
		return ""
	}
	if v, ok := t.m[s]; ok {
		return v
	}
	if t.m == nil || len(t.m) >= max(t.limit, minStringTable) {
		t.m = make(map[string]string, len(t.m)/2)
	}
	t.m[s] = s
	return s
}

// workload shares c's repeated strings through the table, and sets its
// limit from the number of workloads held: few distinct values a
// workload, many workloads.
func (t *stringTable) workload(c *config.Workload, workloads int) {
	t.limit = 2 * workloads
	for _, p := range []*string{&c.Namespace, &c.ServiceAccount, &c.Identity, &c.Network} {
		*p = t.intern(*p)
	}
	if l := c.Labels; l != nil {
		// A Deployment's own names (its workload name and canonical
		// service) are shared with its labels (shareLabels): an entry
		// here for each would cost more than it saves.
		for _, p := range []*string{&l.WorkloadKind, &l.CanonicalRevision, &l.Cluster} {
			*p = t.intern(*p)
		}
	}
}

// shareTable is a table of values the Tracker's workloads share, by
// hash: the labels of one Deployment's pods, the services the pods of one
// service name. It is keyed by the values' hash, not by them: an entry
// then costs 16 B, a sixth of one keyed by a workload's five labels,
// which for a Deployment of few pods would cost more than the sharing
// saves. A value is shared only with an equal one, so two whose hashes
// meet merely share less. Like stringTable, it holds no counts, and is
// dropped and begun again when it outgrows what the mesh can share
// (limit, one entry a workload); values handed out stay valid.
type shareTable[T any] struct {
	m     map[uint64]*T
	limit int
}

// shareSeed seeds the hashes of the share tables.
var shareSeed = maphash.MakeSeed()

// share is the value held with hash h if it is equal to v, else v, which
// is held if nothing is.
func (t *shareTable[T]) share(h uint64, v *T, equal func(a, b *T) bool) *T {
	if held, ok := t.m[h]; ok {
		if equal(held, v) {
			return held
		}
		return v
	}
	if t.m == nil || len(t.m) >= max(t.limit, minStringTable) {
		t.m = make(map[uint64]*T, len(t.m)/2)
	}
	t.m[h] = v
	return v
}

// shareLabels shares c's labels with the workloads held that have the
// same, and sets the table's limit from their number.
func (t *Tracker) shareLabels(c *config.Workload) {
	t.labels.limit = len(t.wls)
	if c.Labels == nil {
		return
	}
	// A pod not owned by a Deployment is its own workload, named after
	// itself: its labels say so with "" (read as the workload's Name),
	// and are then the same as its service's other pods'. c's labels are
	// convertWorkload's, its own until shared.
	if c.Labels.WorkloadName == c.Name {
		c.Labels.WorkloadName = ""
	}
	c.Labels = t.labels.share(maphash.Comparable(shareSeed, *c.Labels), c.Labels,
		func(a, b *config.WorkloadLabels) bool { return *a == *b })
}

// shareServices is the services a workload names, l, as shared with the
// workloads held that name the same with the same ports: the pods of a
// service. l is sorted by service.
func (t *Tracker) shareServices(l []memberOf) *[]memberOf {
	t.services.limit = len(t.wls)
	var h maphash.Hash
	h.SetSeed(shareSeed)
	for _, ms := range l {
		h.WriteString(ms.key)
		// The ports in no order: the sum of each one's hash.
		var sum uint64
		for p, target := range ms.ports {
			sum += maphash.Comparable(shareSeed, [2]uint16{p, target})
		}
		maphash.WriteComparable(&h, sum)
	}
	return t.services.share(h.Sum64(), &l, func(a, b *[]memberOf) bool {
		return slices.EqualFunc(*a, *b, func(x, y memberOf) bool { return x.key == y.key && maps.Equal(x.ports, y.ports) })
	})
}
