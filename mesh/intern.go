package mesh

import (
	"hash/maphash"

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
		// service) are shared with its labels (labelTable): an entry
		// here for each would cost more than it saves.
		for _, p := range []*string{&l.WorkloadKind, &l.CanonicalRevision, &l.Cluster} {
			*p = t.intern(*p)
		}
	}
}

// labelTable is the Tracker's table of its workloads' labels: the pods of
// one Deployment have the same, and share one copy. It is keyed by the
// labels' hash, not by them: an entry then costs a sixth of one keyed by
// its five strings, which for a Deployment of few pods would cost more
// than the sharing saves. Labels are shared only when equal, so two
// whose hashes meet merely share less. Like stringTable, it holds no
// counts, and is dropped and begun again when it outgrows what the mesh
// can share; labels handed out stay valid.
type labelTable struct {
	m     map[uint64]*config.WorkloadLabels
	seed  maphash.Seed
	limit int
}

// workload shares c's labels with the workloads held that have the same,
// and sets the table's limit from their number: one entry at most a
// workload.
func (t *labelTable) workload(c *config.Workload, workloads int) {
	t.limit = workloads
	// A pod named after itself has labels of its own, which nothing
	// shares: they stay out of the table.
	if c.Labels == nil || c.Labels.WorkloadName == c.Name {
		return
	}
	if t.m == nil {
		t.seed = maphash.MakeSeed()
	}
	h := maphash.Comparable(t.seed, *c.Labels)
	if l, ok := t.m[h]; ok {
		if *l == *c.Labels {
			c.Labels = l
		}
		return
	}
	if t.m == nil || len(t.m) >= max(t.limit, minStringTable) {
		t.m = make(map[uint64]*config.WorkloadLabels, len(t.m)/2)
	}
	t.m[h] = c.Labels
}
