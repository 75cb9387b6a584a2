package mesh

import (
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"google.golang.org/protobuf/proto"
	"istio.io/istio/pkg/workloadapi"

	"github.com/meshtun/meshtun/config"
)

// Equal strings from two decoded messages come out as one copy; a
// workload's name stays out of the table (labelTable shares a
// Deployment's); a table past its limit begins again, and what it handed
// out before stays intact.
func TestStringTable(t *testing.T) {
	var st stringTable
	copyOf := func(s string) string { return strings.Clone(s) }
	labels := func(name string) *config.WorkloadLabels {
		return &config.WorkloadLabels{WorkloadName: copyOf(name), Cluster: copyOf("c1")}
	}
	a := config.Workload{Name: copyOf("p1"), Namespace: copyOf("default"), ServiceAccount: copyOf("sa"), Labels: labels("p1")}
	b := config.Workload{Name: copyOf("p2"), Namespace: copyOf("default"), ServiceAccount: copyOf("sa"), Labels: labels("web")}
	c := config.Workload{Name: copyOf("p3"), Namespace: copyOf("default"), ServiceAccount: copyOf("sa"), Labels: labels("web")}
	for _, w := range []*config.Workload{&a, &b, &c} {
		st.workload(w, 3)
	}
	same := func(x, y string) bool { return unsafe.StringData(x) == unsafe.StringData(y) }
	if !same(a.Namespace, b.Namespace) || !same(b.ServiceAccount, c.ServiceAccount) || !same(a.Labels.Cluster, c.Labels.Cluster) {
		t.Error("equal strings of two workloads are not one copy")
	}
	for _, name := range []string{"p1", "web"} {
		if _, held := st.m[name]; held {
			t.Errorf("workload name %s went into the table", name)
		}
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

// The pods of one Deployment share one copy of their labels; a pod named
// after itself keeps its own, out of the table; a pod replaced with other
// labels takes new ones and leaves the others' as they were.
func TestLabelTable(t *testing.T) {
	pod := func(name, workload, revision string) *workloadapi.Address {
		// Through the wire, so that every string is its own copy.
		b, err := proto.Marshal(wlAddr(&workloadapi.Workload{Uid: name, Name: name, Namespace: "default",
			Addresses: [][]byte{ip("10.1.0." + strings.TrimPrefix(name, "web-"))}, TunnelProtocol: workloadapi.TunnelProtocol_HBONE,
			WorkloadName: workload, WorkloadType: workloadapi.WorkloadType_DEPLOYMENT, CanonicalName: "web", CanonicalRevision: revision, ClusterId: "c1"}))
		if err != nil {
			t.Fatal(err)
		}
		a := new(workloadapi.Address)
		if err := proto.Unmarshal(b, a); err != nil {
			t.Fatal(err)
		}
		return a
	}
	tr := NewTracker(convNode)
	labelsOf := func(name string) *config.WorkloadLabels {
		w := tr.wls[name]
		if w == nil || w.out == nil || w.out.Labels == nil {
			t.Fatalf("%s: no labels emitted", name)
		}
		return w.out.Labels
	}
	tr.Apply(Delta{Addresses: map[string]*workloadapi.Address{
		"web-1": pod("web-1", "web", "v1"), "web-2": pod("web-2", "web", "v1"),
		"web-3": pod("web-3", "web-3", "v1"), "web-4": pod("web-4", "web-4", "v1")}})
	one, two, own, own4 := labelsOf("web-1"), labelsOf("web-2"), labelsOf("web-3"), labelsOf("web-4")
	want := config.WorkloadLabels{WorkloadName: "web", WorkloadKind: "deployment", CanonicalService: "web", CanonicalRevision: "v1", Cluster: "c1"}
	if *one != want || one != two {
		t.Errorf("two pods of one Deployment have labels %+v at %p and %+v at %p, want %+v once", *one, one, *two, two, want)
	}
	// Pods named after themselves: "" (their Name), shared, apart from
	// the Deployment's.
	wantOwn := want
	wantOwn.WorkloadName = ""
	if *own != wantOwn || own != own4 || own == one {
		t.Errorf("two pods named after themselves have labels %+v at %p and %+v at %p, want %+v once", *own, own, *own4, own4, wantOwn)
	}

	tr.Apply(Delta{Addresses: map[string]*workloadapi.Address{"web-2": pod("web-2", "web", "v2")}})
	if two := labelsOf("web-2"); two.CanonicalRevision != "v2" || two == one {
		t.Errorf("the replaced pod's labels are %+v at %p, want revision v2 of their own", *two, two)
	}
	if got := labelsOf("web-1"); got != one || *got != want {
		t.Errorf("the other pod's labels became %+v at %p, want %+v at %p", *got, got, want, one)
	}

	// Past its limit, the table begins again; what it handed out stays.
	for i := range minStringTable + 10 {
		c := config.Workload{Name: "p", Labels: &config.WorkloadLabels{WorkloadName: strconv.Itoa(i)}}
		tr.shareLabels(&c)
	}
	if len(tr.labels.m) > minStringTable {
		t.Errorf("the table holds %d labels, past its limit %d", len(tr.labels.m), minStringTable)
	}
	if got := labelsOf("web-1"); got != one || *got != want {
		t.Errorf("labels handed out became %+v when the table began again", *got)
	}
}

// The pods of one service share the list of the services they name; a
// pod that names other ports has its own, and the others' stay as they
// were. A value whose hash meets another's is not shared with it.
func TestShareServices(t *testing.T) {
	pod := func(name string, pl *workloadapi.PortList) *workloadapi.Address {
		return wlAddr(&workloadapi.Workload{Uid: name, Name: name, Namespace: "default",
			Addresses: [][]byte{ip("10.1.0." + strings.TrimPrefix(name, "web-"))}, TunnelProtocol: workloadapi.TunnelProtocol_HBONE,
			Services: map[string]*workloadapi.PortList{"default/web.default.svc.cluster.local": pl, "default/all.default.svc.cluster.local": ports(80, 8080)}})
	}
	tr := NewTracker(convNode)
	tr.Apply(Delta{Addresses: map[string]*workloadapi.Address{
		"web-1": pod("web-1", ports(80, 8080)), "web-2": pod("web-2", ports(80, 8080)), "web-3": pod("web-3", ports(80, 9090))}})
	one, two, other := tr.wls["web-1"].services, tr.wls["web-2"].services, tr.wls["web-3"].services
	if one != two || len(*one) != 2 || (*one)[0].key != "default/all.default.svc.cluster.local" {
		t.Errorf("two pods of one service name %v at %p and %v at %p, want one list, sorted", *one, one, *two, two)
	}
	if other == one || (*other)[1].ports[80] != 9090 {
		t.Errorf("a pod with a port of its own names %v at %p", *other, other)
	}
	tr.Apply(Delta{Addresses: map[string]*workloadapi.Address{"web-2": pod("web-2", ports(80, 7070))}})
	if got := tr.wls["web-2"].services; got == one || (*got)[1].ports[80] != 7070 {
		t.Errorf("the replaced pod names %v", *got)
	}
	if got := tr.wls["web-1"].services; got != one || (*got)[1].ports[80] != 8080 {
		t.Errorf("the other pod's services became %v", *got)
	}

	var tab shareTable[string]
	eq := func(a, b *string) bool { return *a == *b }
	a, b, c := "a", "b", "a"
	if got := tab.share(1, &a, eq); got != &a {
		t.Error("the first value is not held")
	}
	if got := tab.share(1, &b, eq); got != &b || *tab.m[1] != "a" {
		t.Errorf("a value whose hash meets another's came out as %q, the table holds %q", *got, *tab.m[1])
	}
	if got := tab.share(1, &c, eq); got != &a {
		t.Error("an equal value is not shared")
	}
}
