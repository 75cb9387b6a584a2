package pmap

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// check compares m with want entry by entry, both ways.
func check[K comparable, V comparable](t *testing.T, m Map[K, V], want map[K]V) {
	t.Helper()
	if m.Len() != len(want) {
		t.Fatalf("Len = %d, want %d", m.Len(), len(want))
	}
	for k, v := range want {
		if got, ok := m.Get(k); !ok || got != v {
			t.Fatalf("Get(%v) = %v, %v; want %v", k, got, ok, v)
		}
	}
	n := 0
	for k, v := range m.All() {
		if w, ok := want[k]; !ok || w != v {
			t.Fatalf("All yields %v=%v, want %v (held: %v)", k, v, w, ok)
		}
		n++
	}
	if n != len(want) {
		t.Fatalf("All yields %d entries, want %d", n, len(want))
	}
}

// Random sets and deletes against a Go map, with the full hash and with
// hashes narrowed to a few bits (deep paths and collision buckets); every
// old version stays as it was.
func TestAgainstMap(t *testing.T) {
	for _, tc := range []struct {
		name string
		mask uint64
	}{{"full hash", ^uint64(0)}, {"8-bit hash", 0xff}, {"2-bit hash", 0x3}, {"high bits only", 0xf << 58}} {
		t.Run(tc.name, func(t *testing.T) {
			hashMask = tc.mask
			defer func() { hashMask = ^uint64(0) }()
			r := rand.New(rand.NewPCG(1, uint64(tc.mask)))
			var m Map[int, int]
			want := map[int]int{}
			type version struct {
				m    Map[int, int]
				want map[int]int
			}
			var kept []version
			for i := 0; i < 4000; i++ {
				k := r.IntN(300)
				if r.IntN(3) == 0 {
					m = m.Delete(k)
					delete(want, k)
				} else {
					m = m.Set(k, i)
					want[k] = i
				}
				if i%500 == 0 {
					cp := make(map[int]int, len(want))
					for k, v := range want {
						cp[k] = v
					}
					kept = append(kept, version{m, cp})
				}
			}
			check(t, m, want)
			for _, v := range kept {
				check(t, v.m, v.want)
			}
			for k := range want {
				m = m.Delete(k)
			}
			if m.Len() != 0 || m.root != nil {
				t.Fatalf("after deleting everything: Len %d, root %v", m.Len(), m.root)
			}
		})
	}
}

func TestDeleteMissingAndReplace(t *testing.T) {
	var m Map[netip.Addr, string]
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")
	m = m.Set(a, "a").Set(b, "b")
	same := m.Delete(netip.MustParseAddr("10.0.0.2"))
	if same.Len() != 2 || same.root != m.root {
		t.Fatalf("deleting a missing key changed the map")
	}
	r := m.Set(a, "A")
	if v, _ := r.Get(a); v != "A" || r.Len() != 2 {
		t.Fatalf("replace: %v, Len %d", v, r.Len())
	}
	if v, _ := m.Get(a); v != "a" {
		t.Fatalf("the old version changed: %v", v)
	}
	var empty Map[string, int]
	if _, ok := empty.Get("x"); ok || empty.Delete("x").Len() != 0 {
		t.Fatal("zero Map not empty")
	}
}

// A write copies a path, not the map: the allocations of one Set in a map
// of 100,000 stay those of a few nodes.
func TestSetAllocatesAPath(t *testing.T) {
	var m Map[int, int]
	for i := range 100_000 {
		m = m.Set(i, i)
	}
	allocs := testing.AllocsPerRun(100, func() { m.Set(-1, 1).Delete(7) })
	if allocs > 30 {
		t.Errorf("Set+Delete in a map of 100,000: %.0f allocations, want a path's (≤ 30)", allocs)
	}
}

func BenchmarkGet(b *testing.B) {
	var m Map[netip.Addr, int]
	var keys []netip.Addr
	for i := range 20_000 {
		k := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		keys = append(keys, k)
		m = m.Set(k, i)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		m.Get(keys[i%len(keys)])
	}
}

func BenchmarkSet(b *testing.B) {
	var m Map[int, int]
	for i := range 20_000 {
		m = m.Set(i, i)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		m.Set(i%20_000, i)
	}
}

// The trie holds the same shape whatever order its writes came in: a
// subtree left with one entry moves up, so deletions leave no chain of
// nodes behind (the memory of a mesh that churned is that of the mesh).
func TestShapeIndependentOfOrder(t *testing.T) {
	for _, mask := range []uint64{^uint64(0), 0xff, 0x3} {
		hashMask = mask
		r := rand.New(rand.NewPCG(7, mask))
		var a, b Map[int, int]
		for i := range 2000 {
			a = a.Set(i, i)
		}
		for _, i := range r.Perm(3000) { // 2,000 kept, 1,000 set and then deleted
			b = b.Set(i, i)
		}
		for i := 2000; i < 3000; i++ {
			b = b.Delete(i)
		}
		if sa, sb := shape(a.root), shape(b.root); sa != sb {
			t.Errorf("hash mask %#x: shapes differ after the same keys in another order:\n%s\n%s", mask, sa, sb)
		}
	}
	hashMask = ^uint64(0)
}

// shape writes n's bitmaps and, for a bucket, how many entries it holds.
func shape[K comparable, V any](n *node[K, V]) string {
	if n == nil {
		return "-"
	}
	s := fmt.Sprintf("(%x/%x/%d", n.datamap, n.nodemap, len(n.entries))
	for _, sub := range n.subs {
		s += shape(sub)
	}
	return s + ")"
}
