package gateway

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"
	"istio.io/istio/pkg/workloadapi"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/mesh"
)

// meshTestTOML has a file workload and service for the mesh's entries to
// clash with.
const meshTestTOML = `version = 1
[tls]
cert = "/etc/meshtun/tls/cert.pem"
key = "/etc/meshtun/tls/key.pem"
trust_bundle = "/etc/meshtun/tls/ca.pem"
[dns]
domains = ["cluster.local"]

[[workloads]]
name = "a"
namespace = "file"
addresses = ["10.1.0.3"]

[[services]]
name = "pinned"
namespace = "file"
hostname = "pinned.file.svc.cluster.local"
vips = ["10.96.0.1"]
ports = { 80 = 8080 }
endpoints = ["file/a"]
`

// newMeshTestGateway is a Gateway that is not run, for applying states.
func newMeshTestGateway(t testing.TB) *Gateway {
	t.Helper()
	cfg, err := config.Parse([]byte(meshTestTOML), "mesh.toml")
	if err != nil {
		t.Fatal(err)
	}
	g := &Gateway{cfg: cfg, file: cfg, log: hclog.NewNullLogger(), metrics: newMetrics(), meshReady: make(chan struct{}),
		keys: fileKeysOf(cfg), clashes: map[string]string{}}
	g.cur.Store(newSnapshot(cfg, nil))
	return g
}

func gwIP(s string) []byte { return netip.MustParseAddr(s).AsSlice() }

// randomMeshAddress is an Address from small pools of names, addresses,
// VIPs and networks, so that clashes (among istiod's entries and with the
// file's), shared services and waypoints occur.
func randomMeshAddress(r *rand.Rand, name string) *workloadapi.Address {
	pick := func(l ...string) string { return l[r.IntN(len(l))] }
	if r.IntN(4) == 0 {
		h := pick("web", "api", "wp")
		s := &workloadapi.Service{Name: h, Namespace: pick("default", "file"), Hostname: h + ".default.svc.cluster.local",
			Ports:     []*workloadapi.Port{{ServicePort: uint32(80 + r.IntN(2)), TargetPort: uint32(8080 * r.IntN(2))}},
			Addresses: []*workloadapi.NetworkAddress{{Network: pick("net-1", "net-1", "net-2"), Address: gwIP(fmt.Sprintf("10.96.0.%d", r.IntN(4)))}}}
		if r.IntN(3) == 0 {
			s.Waypoint = &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Hostname{Hostname: &workloadapi.NamespacedHostname{Namespace: "default", Hostname: "wp.default.svc.cluster.local"}}}
		}
		return &workloadapi.Address{Type: &workloadapi.Address_Service{Service: s}}
	}
	w := &workloadapi.Workload{Uid: name, Name: pick("a", "b", "c", "d"), Namespace: pick("default", "file"), ServiceAccount: "sa",
		Addresses: [][]byte{gwIP(fmt.Sprintf("10.1.0.%d", r.IntN(8)))}, TunnelProtocol: workloadapi.TunnelProtocol(r.IntN(2)),
		Network: pick("net-1", "net-1", "net-2"), Services: map[string]*workloadapi.PortList{}}
	if r.IntN(5) == 0 {
		w.Addresses, w.Namespace, w.ServiceAccount, w.Network = [][]byte{gwIP("10.0.0.9")}, "vm", "vm-sa", pick("net-1", "net-2")
	}
	if r.IntN(6) == 0 {
		w.Status = workloadapi.WorkloadStatus_UNHEALTHY
	}
	for range r.IntN(3) {
		pl := &workloadapi.PortList{Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: uint32(9000 + r.IntN(2))}}}
		w.Services[pick("default", "file")+"/"+pick("web", "api", "wp")+".default.svc.cluster.local"] = pl
	}
	if r.IntN(4) == 0 {
		w.Waypoint = &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Address{Address: &workloadapi.NetworkAddress{Address: gwIP(fmt.Sprintf("10.1.0.%d", r.IntN(8)))}}}
	}
	return &workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: w}}
}

// An update applied as a change (ApplyMeshChanges, the XDSClient's path)
// leaves the gateway routing, naming and labelling exactly as the same
// state applied whole (ApplyMesh, which rebuilds every route): after each
// of a random series of deltas, for every destination of the pools, both
// round-robin choices, the zone's names, the metrics' descriptions, the
// clashes and /config_dump's entries.
func TestMeshChangesMatchRebuild(t *testing.T) {
	node := mesh.Node{Name: "vm-1", Namespace: "vm", ServiceAccount: "vm-sa", InstanceIPs: []netip.Addr{netip.MustParseAddr("10.0.0.9")}}
	var dsts []netip.AddrPort
	for i := range 8 {
		for _, p := range []uint16{80, 81, 9000} {
			dsts = append(dsts, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, 0, byte(i)}), p))
		}
	}
	for i := range 4 {
		for _, p := range []uint16{80, 81} {
			dsts = append(dsts, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 0, byte(i)}), p))
		}
	}
	dsts = append(dsts, netip.MustParseAddrPort("10.0.0.9:80"))
	hosts := []string{"web.default.svc.cluster.local", "api.default.svc.cluster.local", "wp.default.svc.cluster.local", "pinned.file.svc.cluster.local"}

	for seed := range uint64(25) {
		r := rand.New(rand.NewPCG(seed, 11))
		tr := mesh.NewTracker(node)
		inc, whole := newMeshTestGateway(t), newMeshTestGateway(t)
		for step := range 40 {
			d := mesh.Delta{Addresses: map[string]*workloadapi.Address{}}
			for range 1 + r.IntN(3) {
				name := fmt.Sprintf("r%d", r.IntN(12))
				if r.IntN(4) == 0 {
					d.RemovedAddresses = append(d.RemovedAddresses, name)
					delete(d.Addresses, name)
				} else {
					d.Addresses[name] = randomMeshAddress(r, name)
				}
			}
			inc.ApplyMeshChanges(tr.Apply(d), true, uint64(step))
			st := tr.State()
			st.Ready = true
			whole.ApplyMesh(st)

			a, b := inc.snapshot(), whole.snapshot()
			// The router of the merged entries as one config, as the
			// gateway built it before it kept the mesh's apart: the same
			// plans, where one service holds the VIP.
			merged := *a.cfg
			merged.Workloads = append(slices.Clone(merged.Workloads), a.meshWorkloads()...)
			merged.Services = append(slices.Clone(merged.Services), a.meshServices()...)
			one := NewRouter(&merged)
			for _, dst := range dsts {
				// (One config's router kept the last service of a VIP: where
				// the file's and the mesh's share one, the file's now wins.)
				ss, _ := a.router.mesh.services.Get(dst.Addr())
				if _, file := a.router.services[dst.Addr()]; file {
					ss = append(ss, nil)
				}
				// (And it found a mesh service's endpoint among the file's
				// workloads by name: now the mesh's of that name is dropped.)
				nameClash := false
				for _, c := range inc.clashes {
					nameClash = nameClash || strings.Contains(c, "of that namespace and name")
				}
				if len(ss) < 2 && !nameClash {
					if pa, po := a.router.Route(dst, nil), one.Route(dst, nil); !reflect.DeepEqual(pa, po) {
						t.Fatalf("seed %d step %d: %s: the change routes %s, one config's router %s", seed, step, dst, pa, po)
					}
				}
				for n := range 2 {
					pick := func(string, int) int { return n }
					if pa, pb := a.router.Route(dst, pick), b.router.Route(dst, pick); !reflect.DeepEqual(pa, pb) {
						t.Fatalf("seed %d step %d: %s (pick %d): the change routes %s, the rebuild %s", seed, step, dst, n, pa, pb)
					}
				}
				da, oka := inc.metrics.indexFor(a).workload(dst.Addr())
				db, okb := whole.metrics.indexFor(b).workload(dst.Addr())
				if da != db || oka != okb {
					t.Fatalf("seed %d step %d: %s described as %+v by the change, %+v by the rebuild", seed, step, dst.Addr(), da, db)
				}
			}
			for _, h := range hosts {
				// Several services may share a name: the order of their
				// addresses is the keys' (resource names here, positions there).
				aa, oka := a.zone.Resolve(h)
				ab, okb := b.zone.Resolve(h)
				slices.SortFunc(aa, netip.Addr.Compare)
				slices.SortFunc(ab, netip.Addr.Compare)
				if !reflect.DeepEqual(aa, ab) || oka != okb || inc.metrics.indexFor(a).host(h) != whole.metrics.indexFor(b).host(h) {
					t.Fatalf("seed %d step %d: %s resolves to %v by the change, %v by the rebuild", seed, step, h, aa, ab)
				}
				// Both share the code that builds them: hold it to the
				// entries in force too.
				named := slices.ContainsFunc(append(a.meshServices(), a.cfg.Services...), func(s config.Service) bool { return s.Hostname == h })
				if inc.metrics.indexFor(a).host(h) != named || oka != named {
					t.Fatalf("seed %d step %d: %s: a service's hostname %v, known to the metrics %v, to the zone %v", seed, step, h, named, inc.metrics.indexFor(a).host(h), oka)
				}
			}
			if ma, mb := inc.MeshStats(), whole.MeshStats(); ma.Clashes != mb.Clashes || ma.Rejected != mb.Rejected {
				t.Fatalf("seed %d step %d: stats %+v by the change, %+v by the rebuild", seed, step, ma, mb)
			}
			if !sameAsSets(a.meshWorkloads(), b.meshWorkloads()) || !sameAsSets(a.meshServices(), b.meshServices()) {
				t.Fatalf("seed %d step %d: the entries in force differ", seed, step)
			}
			// The count of workloads routed (status) is kept as they change.
			if n := len(a.meshWorkloads()); a.routed.workloads != n || b.routed.workloads != n {
				t.Fatalf("seed %d step %d: %d workloads in force, counted %d by the change, %d by the rebuild", seed, step, n, a.routed.workloads, b.routed.workloads)
			}
			if !reflect.DeepEqual(a.cfg.Policies, b.cfg.Policies) || !reflect.DeepEqual(a.cfg.HBONE.Serve, b.cfg.HBONE.Serve) || a.cfg.Network != b.cfg.Network {
				t.Fatalf("seed %d step %d: the merged configs differ", seed, step)
			}
		}
	}
}

// sameAsSets compares two lists of entries regardless of order (the
// change keys entries by resource name, the rebuild by namespace/name).
func sameAsSets[T any](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	used := make([]bool, len(b))
outer:
	for _, x := range a {
		for j, y := range b {
			if !used[j] && reflect.DeepEqual(x, y) {
				used[j] = true
				continue outer
			}
		}
		return false
	}
	return true
}

// scaleDelta is a mesh of n pods, a service for every 10, as one Delta,
// and the pod of index i as a Delta of its own (for a replacement).
func scalePod(i int, ipBase byte) (string, *workloadapi.Address) {
	name := fmt.Sprintf("Kubernetes//Pod/default/pod-%d", i)
	svc := fmt.Sprintf("default/svc-%d.default.svc.cluster.local", i/10)
	return name, decoded(&workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{
		Uid: name, Name: fmt.Sprintf("pod-%d", i), Namespace: "default", ServiceAccount: "sa", Node: "node-1",
		Addresses:      [][]byte{netip.AddrFrom4([4]byte{10, ipBase, byte(i >> 8), byte(i)}).AsSlice()},
		TunnelProtocol: workloadapi.TunnelProtocol_HBONE, WorkloadName: fmt.Sprintf("deploy-%d", i/10), CanonicalName: fmt.Sprintf("svc-%d", i/10),
		CanonicalRevision: "v1", ClusterId: "Kubernetes", WorkloadType: workloadapi.WorkloadType_POD,
		Services: map[string]*workloadapi.PortList{svc: {Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}}},
	}}})
}

// decoded is a as the gateway holds it off the wire: every string its
// own, as protobuf decodes them, none a constant of the program's.
func decoded(a *workloadapi.Address) *workloadapi.Address {
	b, err := proto.Marshal(a)
	if err != nil {
		panic(err)
	}
	out := new(workloadapi.Address)
	if err := proto.Unmarshal(b, out); err != nil {
		panic(err)
	}
	return out
}

func scaleService(i int) (string, *workloadapi.Address) {
	name := fmt.Sprintf("default/svc-%d.default.svc.cluster.local", i)
	return name, decoded(&workloadapi.Address{Type: &workloadapi.Address_Service{Service: &workloadapi.Service{
		Name: fmt.Sprintf("svc-%d", i), Namespace: "default", Hostname: fmt.Sprintf("svc-%d.default.svc.cluster.local", i),
		Addresses: []*workloadapi.NetworkAddress{{Address: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}).AsSlice()}},
		Ports:     []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}},
	}}})
}

// BenchmarkMeshPush is the cost of one istiod push that replaces one pod
// (its service's endpoints change with it), through the Tracker and the
// gateway's change, in meshes of 1,000 and 20,000 pods (a service per
// 10). It reports the heap per address of the mesh held.
func BenchmarkMeshPush(b *testing.B) {
	for _, pods := range []int{1000, 20000} {
		b.Run(fmt.Sprintf("pods=%d", pods), func(b *testing.B) {
			node := mesh.Node{Name: "vm-1", Namespace: "vm", ServiceAccount: "vm-sa", InstanceIPs: []netip.Addr{netip.MustParseAddr("10.0.0.9")}}
			var before runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			tr := mesh.NewTracker(node)
			g := newMeshTestGateway(b)
			d := mesh.Delta{Addresses: map[string]*workloadapi.Address{}}
			for i := range pods {
				name, a := scalePod(i, 1)
				d.Addresses[name] = a
				if i%10 == 0 {
					name, a := scaleService(i / 10)
					d.Addresses[name] = a
				}
			}
			g.ApplyMeshChanges(tr.Apply(d), true, 1)
			d = mesh.Delta{}
			var after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&after)
			perAddress := float64(after.HeapAlloc-before.HeapAlloc) / float64(pods+pods/10)
			b.ResetTimer()
			for n := 0; n < b.N; n++ {
				i := n % pods
				name, a := scalePod(i, byte(1+(n/pods+1)%2)) // the pod again, at a new address
				g.ApplyMeshChanges(tr.Apply(mesh.Delta{Addresses: map[string]*workloadapi.Address{name: a}}), true, uint64(n+2))
			}
			b.ReportMetric(perAddress, "heap-B/address")
		})
	}
}

// A mesh workload's name in its route is the end of its resource name
// when that ends with it (a pod's), else a string of its own.
func TestMeshName(t *testing.T) {
	w := &config.Workload{Name: "web-1", Namespace: "default"}
	for _, c := range []struct {
		res    string
		shared bool
	}{
		{"Kubernetes//Pod/default/web-1", true},
		{"default/web-1", true},
		{"web-1-uid", false},
		{"Kubernetes//Pod/other/web-1", false},
		{"Kubernetes//Pod/default/xweb-1", false},
		{"default/web-1#0", false},
	} {
		got := meshName(c.res, w)
		shared := strings.HasSuffix(c.res, got) && unsafe.StringData(got) == unsafe.StringData(c.res[len(c.res)-len(got):])
		if got != "default/web-1" || shared != c.shared {
			t.Errorf("meshName(%q) = %q, sharing its bytes %v, want default/web-1, %v", c.res, got, shared, c.shared)
		}
	}
}
