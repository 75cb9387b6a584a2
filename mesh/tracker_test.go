package mesh

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	"istio.io/istio/pkg/workloadapi"
	"istio.io/istio/pkg/workloadapi/security"

	"github.com/meshtun/meshtun/config"
)

// randomAddress is one Address of a small random mesh whose names,
// addresses, VIPs and networks are drawn from small pools, so clashes,
// shared services, waypoints and this node's own workload all occur.
func randomAddress(r *rand.Rand, name string) *workloadapi.Address {
	pick := func(list ...string) string { return list[r.IntN(len(list))] }
	addr := func() []byte { return ip(fmt.Sprintf("10.1.0.%d", r.IntN(12))) }
	network := pick("net-1", "net-1", "net-2")
	if r.IntN(4) == 0 {
		s := &workloadapi.Service{Name: pick("web", "api", "wp"), Namespace: "default", Hostname: pick("web", "api", "wp") + ".default.svc.cluster.local",
			Ports: []*workloadapi.Port{{ServicePort: uint32(80 + r.IntN(2)), TargetPort: 8080}}}
		for range 1 + r.IntN(2) {
			s.Addresses = append(s.Addresses, &workloadapi.NetworkAddress{Network: pick("net-1", "net-2"), Address: ip(fmt.Sprintf("10.96.0.%d", r.IntN(4)))})
		}
		if r.IntN(3) == 0 {
			s.Waypoint = &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Hostname{Hostname: &workloadapi.NamespacedHostname{Namespace: "default", Hostname: "wp.default.svc.cluster.local"}}}
		}
		if r.IntN(8) == 0 {
			s.Ports = append(s.Ports, &workloadapi.Port{ServicePort: 70000}) // rejected
		}
		return svcAddr(s)
	}
	w := &workloadapi.Workload{Uid: name, Name: pick("a", "b", "c", "d", "e", "f"), Namespace: pick("default", "vm"), ServiceAccount: pick("vm-sa", "web"),
		Addresses: [][]byte{addr()}, TunnelProtocol: workloadapi.TunnelProtocol_HBONE, Network: network,
		AuthorizationPolicies: []string{pick("vm/selected", "vm/other")}}
	if r.IntN(3) == 0 {
		w.Addresses = append(w.Addresses, addr())
	}
	if r.IntN(5) == 0 {
		w.Addresses = [][]byte{ip("10.0.0.9")} // this node's instance IP
		w.Namespace, w.ServiceAccount = "vm", "vm-sa"
	}
	if r.IntN(6) == 0 {
		w.Status = workloadapi.WorkloadStatus_UNHEALTHY
	}
	if r.IntN(10) == 0 {
		w.Addresses = [][]byte{{1, 2, 3}} // rejected
	}
	w.Services = map[string]*workloadapi.PortList{}
	for range r.IntN(3) {
		w.Services["default/"+pick("web", "api", "wp")+".default.svc.cluster.local"] = ports(80, uint32(8000+r.IntN(3)))
	}
	if network == "net-2" {
		switch r.IntN(3) {
		case 0:
			w.NetworkGateway = &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Address{Address: &workloadapi.NetworkAddress{Network: "net-2", Address: addr()}}}
		case 1:
			w.NetworkGateway = &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Hostname{Hostname: &workloadapi.NamespacedHostname{Namespace: "default", Hostname: pick("web", "wp") + ".default.svc.cluster.local"}}}
		}
	}
	switch r.IntN(5) {
	case 0:
		w.Waypoint = &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Address{Address: &workloadapi.NetworkAddress{Network: "net-1", Address: addr()}}}
	case 1:
		w.Waypoint = &workloadapi.GatewayAddress{Destination: &workloadapi.GatewayAddress_Hostname{Hostname: &workloadapi.NamespacedHostname{Namespace: "default", Hostname: "wp.default.svc.cluster.local"}}}
	}
	return wlAddr(w)
}

func randomPolicy(r *rand.Rand, name string) *security.Authorization {
	scopes := []security.Scope{security.Scope_GLOBAL, security.Scope_NAMESPACE, security.Scope_WORKLOAD_SELECTOR}
	a := &security.Authorization{Name: name, Namespace: []string{"vm", "default"}[r.IntN(2)], Scope: scopes[r.IntN(3)], Action: security.Action_DENY, DryRun: r.IntN(5) == 0}
	if r.IntN(6) == 0 {
		a.Action = security.Action(9) // rejected
	}
	return a
}

// A Tracker fed random Deltas — adds, replacements and removals, one or
// several at a time — holds after each one exactly the State Convert
// gives for the resources held then, and the Changes it returned, applied
// one after the other, rebuild that State's entries.
func TestTrackerAgainstConvert(t *testing.T) {
	for seed := range uint64(40) {
		r := rand.New(rand.NewPCG(seed, 7))
		tr := NewTracker(convNode)
		snap := Snapshot{Addresses: map[string]*workloadapi.Address{}, Authorizations: map[string]*security.Authorization{}}
		replayW, replayS := map[string]config.Workload{}, map[string]config.Service{}
		for step := range 60 {
			d := Delta{Addresses: map[string]*workloadapi.Address{}, Authorizations: map[string]*security.Authorization{}}
			for range 1 + r.IntN(4) {
				name := fmt.Sprintf("r%d", r.IntN(16))
				switch r.IntN(6) {
				case 0:
					d.RemovedAddresses = append(d.RemovedAddresses, name)
					delete(d.Addresses, name)
				case 1:
					p := fmt.Sprintf("p%d", r.IntN(4))
					if r.IntN(2) == 0 {
						d.RemovedAuthorizations = append(d.RemovedAuthorizations, p)
						delete(d.Authorizations, p)
					} else {
						d.Authorizations[p] = randomPolicy(r, []string{"selected", "other", "ns-wide", "x"}[r.IntN(4)])
					}
				default:
					d.Addresses[name] = randomAddress(r, name)
				}
			}
			for _, n := range d.RemovedAddresses {
				if _, again := d.Addresses[n]; !again {
					delete(snap.Addresses, n)
				}
			}
			for _, n := range d.RemovedAuthorizations {
				if _, again := d.Authorizations[n]; !again {
					delete(snap.Authorizations, n)
				}
			}
			maps.Copy(snap.Addresses, d.Addresses)
			maps.Copy(snap.Authorizations, d.Authorizations)
			// A name both removed and added in one Delta ends added:
			// removals are applied first.
			ch := tr.Apply(d)

			want := Convert(snap, convNode)
			got := tr.State()
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("seed %d step %d: the Tracker's state differs from Convert's\n got %+v\nwant %+v", seed, step, got, want)
			}
			if ch.Full {
				replayW, replayS = map[string]config.Workload{}, map[string]config.Service{}
			}
			for res, w := range ch.Workloads {
				if w == nil {
					delete(replayW, res)
				} else {
					replayW[res] = *w
				}
			}
			for res, s := range ch.Services {
				if s == nil {
					delete(replayS, res)
				} else {
					replayS[res] = *s
				}
			}
			if !sameEntries(slices.Collect(maps.Values(replayW)), want.Workloads) || !sameEntries(slices.Collect(maps.Values(replayS)), want.Services) {
				t.Fatalf("seed %d step %d: the Changes replayed give\n%+v\n%+v\nwant\n%+v\n%+v", seed, step, replayW, replayS, want.Workloads, want.Services)
			}
			if !reflect.DeepEqual(ch.Rejections, want.Rejections) || ch.Network != want.Network || !reflect.DeepEqual(ch.Self, want.Self) {
				t.Fatalf("seed %d step %d: Changes' rejections, network or self differ", seed, step)
			}
			if ch.PoliciesChanged && !reflect.DeepEqual(ch.Policies, want.Policies) {
				t.Fatalf("seed %d step %d: Changes' policies %v, want %v", seed, step, ch.Policies, want.Policies)
			}
		}
	}
}

// sameEntries compares two lists of entries regardless of order.
func sameEntries[T any](got, want []T) bool {
	sorted := func(l []T) []string {
		var out []string
		for _, e := range l {
			b, err := json.Marshal(e)
			if err != nil {
				panic(err)
			}
			out = append(out, string(b))
		}
		slices.Sort(out)
		return out
	}
	return slices.Equal(sorted(got), sorted(want))
}

// One changed pod in a mesh of thousands changes one workload and the
// services it is in, nothing else.
func TestTrackerChangesWhatChanged(t *testing.T) {
	tr := NewTracker(convNode)
	d := Delta{Addresses: map[string]*workloadapi.Address{}}
	for i := range 2000 {
		svc := fmt.Sprintf("default/s%d.default.svc.cluster.local", i/10)
		name := fmt.Sprintf("pod-%d", i)
		d.Addresses[name] = wlAddr(&workloadapi.Workload{Uid: name, Name: name, Namespace: "default",
			Addresses: [][]byte{netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}).AsSlice()}, TunnelProtocol: workloadapi.TunnelProtocol_HBONE,
			Services: map[string]*workloadapi.PortList{svc: ports(80, 8080)}})
		if i%10 == 0 {
			d.Addresses[svc] = svcAddr(&workloadapi.Service{Name: fmt.Sprintf("s%d", i/10), Namespace: "default", Hostname: fmt.Sprintf("s%d.default.svc.cluster.local", i/10),
				Addresses: []*workloadapi.NetworkAddress{{Address: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}).AsSlice()}}, Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}})
		}
	}
	if ch := tr.Apply(d); len(ch.Workloads) != 2000 || len(ch.Services) != 200 {
		t.Fatalf("first push: %d workloads, %d services changed", len(ch.Workloads), len(ch.Services))
	}
	pod := d.Addresses["pod-15"].GetWorkload()
	moved := wlAddr(&workloadapi.Workload{Uid: pod.Uid, Name: pod.Name, Namespace: pod.Namespace, Addresses: [][]byte{ip("10.2.0.1")},
		TunnelProtocol: workloadapi.TunnelProtocol_HBONE, Services: pod.Services})
	ch := tr.Apply(Delta{Addresses: map[string]*workloadapi.Address{"pod-15": moved}, RemovedAddresses: []string{"pod-3"}})
	if !slices.Equal(slices.Sorted(maps.Keys(ch.Workloads)), []string{"pod-15", "pod-3"}) || ch.Workloads["pod-3"] != nil ||
		ch.Workloads["pod-15"].Addresses[0] != netip.MustParseAddr("10.2.0.1") {
		t.Errorf("workloads changed: %v", ch.Workloads)
	}
	if !slices.Equal(slices.Sorted(maps.Keys(ch.Services)), []string{"default/s0.default.svc.cluster.local", "default/s1.default.svc.cluster.local"}) {
		t.Errorf("services changed: %v", slices.Sorted(maps.Keys(ch.Services)))
	}
	if ch.Full || ch.PoliciesChanged {
		t.Errorf("Full %v, PoliciesChanged %v", ch.Full, ch.PoliciesChanged)
	}

	// The same pod pushed again: its entry is emitted anew (equal, not
	// the same), so that nothing holds the replaced one.
	before := tr.wls["pod-16"].out
	ch = tr.Apply(Delta{Addresses: map[string]*workloadapi.Address{"pod-16": d.Addresses["pod-16"]}})
	if got := ch.Workloads["pod-16"]; got == nil || got == before || !reflect.DeepEqual(got, before) {
		t.Errorf("pod-16 pushed again unchanged: emitted %p (%v), before %p", got, got, before)
	}
	if tr.wls["pod-16"].out != ch.Workloads["pod-16"] {
		t.Errorf("the Tracker's record of what it emitted for pod-16 is not what it emitted")
	}
}

// A workload's key is the end of its resource name when that ends with
// namespace/name (a pod's), else a string of its own; either way the
// claims, the rejections and the services' endpoints read it the same.
func TestTrackerWorkloadKey(t *testing.T) {
	pod := func(uid, name string, addr string) *workloadapi.Address {
		return wlAddr(&workloadapi.Workload{Uid: uid, Name: name, Namespace: "default", Addresses: [][]byte{ip(addr)},
			TunnelProtocol: workloadapi.TunnelProtocol_HBONE, Services: map[string]*workloadapi.PortList{"default/web.default.svc.cluster.local": ports(80, 8080)}})
	}
	tr := NewTracker(convNode)
	ch := tr.Apply(Delta{Addresses: map[string]*workloadapi.Address{
		"Kubernetes//Pod/default/web-1": pod("Kubernetes//Pod/default/web-1", "web-1", "10.1.0.1"),
		"web-2-uid":                     pod("web-2-uid", "web-2", "10.1.0.2"),
		"Kubernetes//Pod/other/web-2":   pod("Kubernetes//Pod/other/web-2", "web-2", "10.1.0.3"),   // default/web-2 again
		"Kubernetes//Pod/default/web-3": pod("Kubernetes//Pod/default/web-3", "web-3", "10.1.0.1"), // web-1's address
		"web": svcAddr(&workloadapi.Service{Name: "web", Namespace: "default", Hostname: "web.default.svc.cluster.local",
			Addresses: []*workloadapi.NetworkAddress{{Address: ip("10.96.0.1")}}, Ports: []*workloadapi.Port{{ServicePort: 80, TargetPort: 8080}}}),
	}})
	for res, want := range map[string]string{
		"Kubernetes//Pod/default/web-1": "default/web-1", "web-2-uid": "default/web-2",
		"Kubernetes//Pod/other/web-2": "default/web-2", "Kubernetes//Pod/default/web-3": "default/web-3",
	} {
		w := tr.wls[res]
		if got := w.key(); got != want {
			t.Errorf("%s: key %q, want %q", res, got, want)
		}
		if ownKey := w.refs != nil && w.refs.key != ""; ownKey != (res == "web-2-uid" || res == "Kubernetes//Pod/other/web-2") {
			t.Errorf("%s: a key of its own is %v", res, ownKey)
		}
	}
	if got := ch.Services["web"].Endpoints; !slices.Equal(got, []string{"default/web-1", "default/web-2"}) {
		t.Errorf("web's endpoints = %v", got)
	}
	want := []Rejection{
		{"Kubernetes//Pod/default/web-3", "workload default/web-3: address 10.1.0.1 is also workload default/web-1's"},
		{"web-2-uid", "workload default/web-2: another workload of that namespace and name is held"},
	}
	if !reflect.DeepEqual(ch.Rejections, want) {
		t.Errorf("Rejections = %v, want %v", ch.Rejections, want)
	}
}
