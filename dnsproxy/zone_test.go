package dnsproxy

import (
	"net/netip"
	"slices"
	"testing"
	"time"
)

func testZone(namespace string) *Zone {
	return NewZone(ZoneOptions{Domains: []string{"cluster.local", "mesh.example."}, Namespace: namespace, TTL: 30 * time.Second}, []Host{
		{Name: "web.default.svc.cluster.local", Addrs: []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:96::10")}},
		{Name: "DB.Data.svc.cluster.local.", Addrs: []netip.Addr{netip.MustParseAddr("::ffff:10.96.0.20")}},
		{Name: "api.mesh.example", Addrs: []netip.Addr{netip.MustParseAddr("10.96.0.30")}},
		{Name: "api.mesh.example", Addrs: []netip.Addr{netip.MustParseAddr("10.96.0.31"), netip.MustParseAddr("10.96.0.30")}},
		{Name: "payments.example.com", Addrs: []netip.Addr{netip.MustParseAddr("10.96.0.40")}},
		{Name: "not a name..", Addrs: []netip.Addr{netip.MustParseAddr("10.96.0.50")}},
		{Name: "", Addrs: []netip.Addr{netip.MustParseAddr("10.96.0.60")}},
	})
}

func TestZoneLookup(t *testing.T) {
	web := []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:96::10")}
	for _, tc := range []struct {
		ns, name string
		want     match
		addrs    []netip.Addr
		domain   string
	}{
		{"", "web.default.svc.cluster.local.", found, web, "cluster.local."},
		{"", "WEB.default.SVC.cluster.local.", found, web, "cluster.local."},
		{"", "web.default.svc.", found, web, ""},
		{"", "web.default.", found, web, ""},
		{"", "web.", notOurs, nil, ""}, // no namespace: one label is not expanded
		{"default", "web.", found, web, ""},
		{"data", "web.", notOurs, nil, ""},
		{"data", "db.", found, []netip.Addr{netip.MustParseAddr("10.96.0.20")}, ""},
		{"", "db.data.svc.cluster.local.", found, []netip.Addr{netip.MustParseAddr("10.96.0.20")}, "cluster.local."},
		{"", "api.mesh.example.", found, []netip.Addr{netip.MustParseAddr("10.96.0.30"), netip.MustParseAddr("10.96.0.31")}, "mesh.example."},
		{"", "payments.example.com.", found, []netip.Addr{netip.MustParseAddr("10.96.0.40")}, ""},
		{"", "nope.default.svc.cluster.local.", noSuch, nil, "cluster.local."},
		{"", "web.default.svc.cluster.local.other.", notOurs, nil, ""},
		{"", "nope.mesh.example.", noSuch, nil, "mesh.example."},
		{"", "default.svc.cluster.local.", exists, nil, "cluster.local."},
		{"", "svc.cluster.local.", exists, nil, "cluster.local."},
		{"", "cluster.local.", exists, nil, "cluster.local."},
		{"", "other.svc.cluster.local.", noSuch, nil, "cluster.local."},
		{"", "example.org.", notOurs, nil, ""},
		{"", "web.default.svc.local.", notOurs, nil, ""},
		{"", "local.", notOurs, nil, ""},
		{"", "x.web.default.svc.cluster.local.", noSuch, nil, "cluster.local."},
	} {
		fq, _ := canonical(tc.name)
		m, addrs, domain := testZone(tc.ns).lookup(fq)
		if m != tc.want || !slices.Equal(addrs, tc.addrs) || domain != tc.domain {
			t.Errorf("namespace %q: lookup(%q) = %v %v %q, want %v %v %q", tc.ns, tc.name, m, addrs, domain, tc.want, tc.addrs, tc.domain)
		}
	}
	if n := testZone("").Len(); n != 4 {
		t.Errorf("Len = %d, want 4 (names that are not domain names left out, one name given twice once)", n)
	}
}

func TestZoneResolve(t *testing.T) {
	z := testZone("default")
	for _, tc := range []struct {
		name string
		ok   bool
		want []netip.Addr
	}{
		{"web.default.svc.cluster.local", true, []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:96::10")}},
		{"web", true, []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:96::10")}},
		{"nope.default.svc.cluster.local", false, nil},
		{"example.org", false, nil},
		{"", false, nil},
		{"a..b", false, nil},
	} {
		got, ok := z.Resolve(tc.name)
		if ok != tc.ok || !slices.Equal(got, tc.want) {
			t.Errorf("Resolve(%q) = %v %v, want %v %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

func TestLimiter(t *testing.T) {
	l := newLimiter(10, 3)
	a, b := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	now := time.Unix(1000, 0)
	for i := range 3 {
		if !l.allow(a, now) {
			t.Fatalf("query %d of the burst refused", i+1)
		}
	}
	if l.allow(a, now) {
		t.Fatal("a query past the burst was allowed")
	}
	if !l.allow(b, now) {
		t.Fatal("another source shares the first one's bucket")
	}
	if !l.allow(a, now.Add(100*time.Millisecond)) || l.allow(a, now.Add(100*time.Millisecond)) {
		t.Fatal("100ms at 10/s must give back exactly one token")
	}
	// Past maxSources, idle (refilled) sources are forgotten; while none
	// is, new sources share the overflow bucket.
	l = newLimiter(1, 1)
	for i := range maxSources {
		l.allow(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), now)
	}
	if len(l.sources) != maxSources {
		t.Fatalf("%d sources remembered, want %d", len(l.sources), maxSources)
	}
	if !l.allow(a, now) || l.allow(b, now) {
		t.Fatal("past maxSources with none idle, new sources must share one bucket of burst 1")
	}
	if !l.allow(b, now.Add(time.Hour)) || len(l.sources) > 1 {
		t.Fatalf("an hour on, the idle sources must be swept (%d left)", len(l.sources))
	}
}

// With changes what its keys gave and nothing else; the old zone stays.
func TestZoneWith(t *testing.T) {
	ad := netip.MustParseAddr
	z := NewZone(ZoneOptions{Domains: []string{"cluster.local"}}, []Host{{Name: "web.default.svc.cluster.local", Addrs: []netip.Addr{ad("10.96.0.1")}}})
	z2 := z.With(map[string]Host{
		"svc/a": {Name: "db.data.svc.cluster.local", Addrs: []netip.Addr{ad("10.96.0.2")}},
		"svc/b": {Name: "DB.data.svc.cluster.local.", Addrs: []netip.Addr{ad("10.96.0.3"), ad("10.96.0.2")}},
	})
	if addrs, ok := z2.Resolve("db.data"); !ok || !slices.Equal(addrs, []netip.Addr{ad("10.96.0.2"), ad("10.96.0.3")}) {
		t.Errorf("db from two keys: %v %v", addrs, ok)
	}
	if _, ok := z.Resolve("db.data.svc.cluster.local"); ok || z.Len() != 1 {
		t.Errorf("the old zone changed")
	}
	if m, _, _ := z2.lookup("data.svc.cluster.local."); m != exists {
		t.Errorf("the name above a host: %v, want exists", m)
	}
	z3 := z2.With(map[string]Host{"svc/a": {}})
	if addrs, _ := z3.Resolve("db.data.svc.cluster.local"); !slices.Equal(addrs, []netip.Addr{ad("10.96.0.3"), ad("10.96.0.2")}) {
		t.Errorf("db after one key left: %v", addrs)
	}
	z4 := z3.With(map[string]Host{"svc/b": {}})
	if _, ok := z4.Resolve("db.data.svc.cluster.local"); ok || z4.Len() != 1 {
		t.Errorf("db still answered after both keys left")
	}
	if m, _, _ := z4.lookup("data.svc.cluster.local."); m != noSuch {
		t.Errorf("the name above no host any more: %v, want noSuch", m)
	}
	if addrs, ok := z4.Resolve("web.default"); !ok || !slices.Equal(addrs, []netip.Addr{ad("10.96.0.1")}) {
		t.Errorf("web: %v %v", addrs, ok)
	}
}
