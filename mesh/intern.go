package mesh

import "github.com/meshtun/meshtun/config"

// stringTable is the Tracker's table of the strings its workloads repeat:
// the pods of one mesh share a few namespaces, service accounts,
// identities, clusters, networks and workload names, and each decoded
// message carries its own copy of each. An entry kept shares one copy
// among all of them (issue "Scale with the mesh": memory per workload).
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
	for _, p := range []*string{&c.Namespace, &c.ServiceAccount, &c.Identity, &c.Network,
		&c.WorkloadKind, &c.CanonicalService, &c.CanonicalRevision, &c.Cluster} {
		*p = t.intern(*p)
	}
	// A Deployment's pods share its name; a pod of its own is named
	// after itself, which nothing shares.
	if c.WorkloadName != c.Name {
		c.WorkloadName = t.intern(c.WorkloadName)
	}
}
