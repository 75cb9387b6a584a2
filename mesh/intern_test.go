package mesh

import (
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/meshtun/meshtun/config"
)

// Equal strings from two decoded messages come out as one copy; a pod's
// own name stays its own; a table past its limit begins again, and what
// it handed out before stays intact.
func TestStringTable(t *testing.T) {
	var st stringTable
	copyOf := func(s string) string { return strings.Clone(s) }
	a := config.Workload{Name: copyOf("p1"), Namespace: copyOf("default"), ServiceAccount: copyOf("sa"), WorkloadName: copyOf("p1")}
	b := config.Workload{Name: copyOf("p2"), Namespace: copyOf("default"), ServiceAccount: copyOf("sa"), WorkloadName: copyOf("web")}
	c := config.Workload{Name: copyOf("p3"), Namespace: copyOf("default"), ServiceAccount: copyOf("sa"), WorkloadName: copyOf("web")}
	for _, w := range []*config.Workload{&a, &b, &c} {
		st.workload(w, 3)
	}
	same := func(x, y string) bool { return unsafe.StringData(x) == unsafe.StringData(y) }
	if !same(a.Namespace, b.Namespace) || !same(b.ServiceAccount, c.ServiceAccount) || !same(b.WorkloadName, c.WorkloadName) {
		t.Error("equal strings of two workloads are not one copy")
	}
	if _, held := st.m["p1"]; held {
		t.Error("a pod's own name went into the table")
	}

	before := b.Namespace
	for i := range minStringTable + 10 {
		st.intern(strconv.Itoa(i))
	}
	if len(st.m) > minStringTable {
		t.Errorf("the table holds %d strings, past its limit %d", len(st.m), minStringTable)
	}
	if before != "default" || b.Namespace != "default" {
		t.Error("a string handed out changed when the table began again")
	}
}
