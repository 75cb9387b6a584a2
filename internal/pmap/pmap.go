// Package pmap is a persistent hash map: Set and Delete return a new Map
// that shares all but the path to the changed entry with the old one,
// which stays as it was. A Map is a value, safe for any number of
// concurrent readers; writers hold their own versions.
//
// It is the gateway's routing state under istiod's pushes (issue "Scale
// with the mesh"): a push that changes one pod of a mesh of 20,000 must
// cost what it changes, while every flow keeps reading the version it
// took, without a lock. A Go map copied on every write costs what the
// mesh holds; this costs O(log₃₂ n) node copies of at most 32 slots.
//
// The structure is a hash array mapped trie: each level takes five bits
// of the key's 64-bit hash, a node keeps only the slots in use (a bitmap
// and a packed slice), and keys whose whole hashes collide share a bucket
// at the bottom.
package pmap

import (
	"hash/maphash"
	"math/bits"
)

// seed is one per process: hashes never leave it.
var seed = maphash.MakeSeed()

// Map is a persistent map from K to V. The zero Map is empty and ready.
type Map[K comparable, V any] struct {
	root *node[K, V]
	n    int
}

type node[K comparable, V any] struct {
	bitmap uint32 // slot i is in use when bit i is set
	slots  []slot[K, V]
}

// slot is a subtree or, with sub nil, the entries of one full hash (one,
// or more when their hashes collide).
type slot[K comparable, V any] struct {
	sub     *node[K, V]
	entries []entry[K, V]
}

type entry[K comparable, V any] struct {
	hash uint64
	key  K
	val  V
}

const (
	bitsPerLevel = 5
	maxShift     = 64 // past it every bit of the hash is used: a collision bucket
)

// hashMask is all ones; the tests narrow it to make hashes collide.
var hashMask = ^uint64(0)

func hashOf[K comparable](k K) uint64 { return maphash.Comparable(seed, k) & hashMask }

// Len is the number of entries.
func (m Map[K, V]) Len() int { return m.n }

// Get returns the value of k and whether m holds k.
func (m Map[K, V]) Get(k K) (V, bool) {
	h := hashOf(k)
	n := m.root
	for shift := uint(0); n != nil; shift += bitsPerLevel {
		bit := uint32(1) << ((h >> shift) & 31)
		if n.bitmap&bit == 0 {
			break
		}
		s := &n.slots[bits.OnesCount32(n.bitmap&(bit-1))]
		if s.sub != nil {
			n = s.sub
			continue
		}
		for i := range s.entries {
			if e := &s.entries[i]; e.hash == h && e.key == k {
				return e.val, true
			}
		}
		break
	}
	var zero V
	return zero, false
}

// Set returns m with k mapped to v.
func (m Map[K, V]) Set(k K, v V) Map[K, V] {
	h := hashOf(k)
	root, added := set(m.root, 0, entry[K, V]{h, k, v})
	m.root = root
	if added {
		m.n++
	}
	return m
}

func set[K comparable, V any](n *node[K, V], shift uint, e entry[K, V]) (*node[K, V], bool) {
	if n == nil {
		n = &node[K, V]{}
	}
	bit := uint32(1) << ((e.hash >> shift) & 31)
	pos := bits.OnesCount32(n.bitmap & (bit - 1))
	if n.bitmap&bit == 0 {
		c := &node[K, V]{bitmap: n.bitmap | bit, slots: make([]slot[K, V], len(n.slots)+1)}
		copy(c.slots, n.slots[:pos])
		c.slots[pos] = slot[K, V]{entries: []entry[K, V]{e}}
		copy(c.slots[pos+1:], n.slots[pos:])
		return c, true
	}
	s := n.slots[pos]
	added := false
	switch {
	case s.sub != nil:
		s.sub, added = set(s.sub, shift+bitsPerLevel, e)
	case s.entries[0].hash == e.hash || shift+bitsPerLevel >= maxShift:
		// Same full hash: replace the key's entry or join the bucket.
		i := 0
		for i < len(s.entries) && s.entries[i].key != e.key {
			i++
		}
		entries := make([]entry[K, V], len(s.entries), len(s.entries)+1)
		copy(entries, s.entries)
		if i == len(entries) {
			entries, added = append(entries, e), true
		} else {
			entries[i] = e
		}
		s.entries = entries
	default:
		// Another hash in this slot: push both a level down.
		var sub *node[K, V]
		for _, old := range s.entries {
			sub, _ = set(sub, shift+bitsPerLevel, old)
		}
		s.sub, _ = set(sub, shift+bitsPerLevel, e)
		s.entries, added = nil, true
	}
	c := &node[K, V]{bitmap: n.bitmap, slots: make([]slot[K, V], len(n.slots))}
	copy(c.slots, n.slots)
	c.slots[pos] = s
	return c, added
}

// Delete returns m without k.
func (m Map[K, V]) Delete(k K) Map[K, V] {
	root, removed := del(m.root, 0, hashOf(k), k)
	if removed {
		m.root = root
		m.n--
	}
	return m
}

// del returns n without k (nil when nothing is left) and whether k was
// there; n itself is not changed.
func del[K comparable, V any](n *node[K, V], shift uint, h uint64, k K) (*node[K, V], bool) {
	if n == nil {
		return nil, false
	}
	bit := uint32(1) << ((h >> shift) & 31)
	if n.bitmap&bit == 0 {
		return n, false
	}
	pos := bits.OnesCount32(n.bitmap & (bit - 1))
	s := n.slots[pos]
	if s.sub != nil {
		sub, removed := del(s.sub, shift+bitsPerLevel, h, k)
		if !removed {
			return n, false
		}
		s.sub = sub
		if sub != nil && len(sub.slots) == 1 && sub.slots[0].sub == nil {
			s = sub.slots[0] // one bucket left below: it moves up
		}
		if s.sub == nil && len(s.entries) == 0 {
			return without(n, bit, pos), true
		}
	} else {
		i := 0
		for i < len(s.entries) && !(s.entries[i].hash == h && s.entries[i].key == k) {
			i++
		}
		if i == len(s.entries) {
			return n, false
		}
		if len(s.entries) == 1 {
			return without(n, bit, pos), true
		}
		entries := make([]entry[K, V], 0, len(s.entries)-1)
		entries = append(entries, s.entries[:i]...)
		s.entries = append(entries, s.entries[i+1:]...)
	}
	c := &node[K, V]{bitmap: n.bitmap, slots: make([]slot[K, V], len(n.slots))}
	copy(c.slots, n.slots)
	c.slots[pos] = s
	return c, true
}

// without is n less the slot at pos (bit of the bitmap), nil when none is
// left.
func without[K comparable, V any](n *node[K, V], bit uint32, pos int) *node[K, V] {
	if len(n.slots) == 1 {
		return nil
	}
	c := &node[K, V]{bitmap: n.bitmap &^ bit, slots: make([]slot[K, V], 0, len(n.slots)-1)}
	c.slots = append(c.slots, n.slots[:pos]...)
	c.slots = append(c.slots, n.slots[pos+1:]...)
	return c
}

// All calls yield for each entry, in no particular order, until it
// returns false. It is an iterator: for k, v := range m.All() { … }.
func (m Map[K, V]) All() func(yield func(K, V) bool) {
	return func(yield func(K, V) bool) { walk(m.root, yield) }
}

func walk[K comparable, V any](n *node[K, V], yield func(K, V) bool) bool {
	if n == nil {
		return true
	}
	for i := range n.slots {
		s := &n.slots[i]
		if s.sub != nil {
			if !walk(s.sub, yield) {
				return false
			}
			continue
		}
		for j := range s.entries {
			if !yield(s.entries[j].key, s.entries[j].val) {
				return false
			}
		}
	}
	return true
}
