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
// The structure is a hash array mapped trie in the compressed layout of
// Steindorfer and Vinju's CHAMP: each level takes five bits of the key's
// 64-bit hash; a node keeps its entries and its subtrees in two packed
// slices, each with a bitmap of the slots it fills, so an entry costs its
// own size in its node and nothing more (a slot of pointers per entry
// cost as much again: issue "Scale with the mesh", memory per address).
// Keys whose whole hashes collide share a bucket below the last level.
// Slices are never changed once a node is built: a new version shares
// every slice it did not change.
package pmap

import (
	"hash/maphash"
	"math/bits"
	"slices"
)

// seed is one per process: hashes never leave it.
var seed = maphash.MakeSeed()

// Map is a persistent map from K to V. The zero Map is empty and ready.
type Map[K comparable, V any] struct {
	root *node[K, V]
	n    int
}

// node is a level of the trie, or, at maxShift, a bucket of entries
// whose hashes are all the same (datamap and nodemap unused).
type node[K comparable, V any] struct {
	datamap uint32 // slot i holds an entry when bit i is set
	nodemap uint32 // slot i holds a subtree when bit i is set
	entries []entry[K, V]
	subs    []*node[K, V]
}

type entry[K comparable, V any] struct {
	hash uint64
	key  K
	val  V
}

const (
	bitsPerLevel = 5
	maxShift     = 64 // a node this deep is a bucket: every bit of the hash is used
)

// hashMask is all ones; the tests narrow it to make hashes collide.
var hashMask = ^uint64(0)

func hashOf[K comparable](k K) uint64 { return maphash.Comparable(seed, k) & hashMask }

func slotBit(h uint64, shift uint) uint32 { return uint32(1) << ((h >> shift) & 31) }

// index is the position in a packed slice of the slot bit among bitmap's.
func index(bitmap, bit uint32) int { return bits.OnesCount32(bitmap & (bit - 1)) }

// Len is the number of entries.
func (m Map[K, V]) Len() int { return m.n }

// Get returns the value of k and whether m holds k.
func (m Map[K, V]) Get(k K) (V, bool) {
	h := hashOf(k)
	n := m.root
	for shift := uint(0); n != nil; shift += bitsPerLevel {
		if shift >= maxShift {
			for i := range n.entries {
				if n.entries[i].key == k {
					return n.entries[i].val, true
				}
			}
			break
		}
		bit := slotBit(h, shift)
		if n.datamap&bit != 0 {
			if e := &n.entries[index(n.datamap, bit)]; e.hash == h && e.key == k {
				return e.val, true
			}
			break
		}
		if n.nodemap&bit == 0 {
			break
		}
		n = n.subs[index(n.nodemap, bit)]
	}
	var zero V
	return zero, false
}

// Set returns m with k mapped to v.
func (m Map[K, V]) Set(k K, v V) Map[K, V] {
	root, added := set(m.root, 0, entry[K, V]{hashOf(k), k, v})
	m.root = root
	if added {
		m.n++
	}
	return m
}

// set returns n (nil: empty) with e in it, and whether e's key is new;
// n itself is not changed.
func set[K comparable, V any](n *node[K, V], shift uint, e entry[K, V]) (*node[K, V], bool) {
	if n == nil {
		n = &node[K, V]{}
	}
	if shift >= maxShift {
		i := slices.IndexFunc(n.entries, func(o entry[K, V]) bool { return o.key == e.key })
		if i < 0 {
			return &node[K, V]{entries: inserted(n.entries, len(n.entries), e)}, true
		}
		return &node[K, V]{entries: replaced(n.entries, i, e)}, false
	}
	bit := slotBit(e.hash, shift)
	c := *n
	switch {
	case n.datamap&bit != 0:
		i := index(n.datamap, bit)
		if o := n.entries[i]; o.hash == e.hash && o.key == e.key {
			c.entries = replaced(n.entries, i, e)
			return &c, false
		}
		// Another key in this slot: both go a level down.
		sub, _ := set(nil, shift+bitsPerLevel, n.entries[i])
		sub, _ = set(sub, shift+bitsPerLevel, e)
		c.datamap &^= bit
		c.entries = deleted(n.entries, i)
		c.nodemap |= bit
		c.subs = inserted(n.subs, index(c.nodemap, bit), sub)
		return &c, true
	case n.nodemap&bit != 0:
		i := index(n.nodemap, bit)
		sub, added := set(n.subs[i], shift+bitsPerLevel, e)
		c.subs = replaced(n.subs, i, sub)
		return &c, added
	default:
		c.datamap |= bit
		c.entries = inserted(n.entries, index(c.datamap, bit), e)
		return &c, true
	}
}

// inserted is a copy of s with v inserted at i, of exactly the length it
// needs: a node's slices are never appended to, so the room append
// leaves for growth would be held for good (a third of the maps' memory).
func inserted[T any](s []T, i int, v T) []T {
	c := make([]T, len(s)+1)
	copy(c, s[:i])
	c[i] = v
	copy(c[i+1:], s[i:])
	return c
}

// deleted is a copy of s without s[i], of exactly its length.
func deleted[T any](s []T, i int) []T {
	c := make([]T, len(s)-1)
	copy(c, s[:i])
	copy(c[i:], s[i+1:])
	return c
}

// replaced is a copy of s with s[i] = v.
func replaced[T any](s []T, i int, v T) []T {
	c := slices.Clone(s)
	c[i] = v
	return c
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
// there; n itself is not changed. A subtree left with one entry and no
// subtree of its own moves up into its parent as an entry, so the trie
// a sequence of writes leaves is the same whatever their order.
func del[K comparable, V any](n *node[K, V], shift uint, h uint64, k K) (*node[K, V], bool) {
	if n == nil {
		return nil, false
	}
	if shift >= maxShift {
		i := slices.IndexFunc(n.entries, func(o entry[K, V]) bool { return o.key == k })
		if i < 0 {
			return n, false
		}
		if len(n.entries) == 1 {
			return nil, true
		}
		return &node[K, V]{entries: deleted(n.entries, i)}, true
	}
	bit := slotBit(h, shift)
	c := *n
	switch {
	case n.datamap&bit != 0:
		i := index(n.datamap, bit)
		if o := n.entries[i]; o.hash != h || o.key != k {
			return n, false
		}
		c.datamap &^= bit
		c.entries = deleted(n.entries, i)
	case n.nodemap&bit != 0:
		i := index(n.nodemap, bit)
		sub, removed := del(n.subs[i], shift+bitsPerLevel, h, k)
		if !removed {
			return n, false
		}
		switch {
		case sub == nil:
			c.nodemap &^= bit
			c.subs = deleted(n.subs, i)
		case len(sub.subs) == 0 && len(sub.entries) == 1:
			c.nodemap &^= bit
			c.subs = deleted(n.subs, i)
			c.datamap |= bit
			c.entries = inserted(n.entries, index(c.datamap, bit), sub.entries[0])
		default:
			c.subs = replaced(n.subs, i, sub)
		}
	default:
		return n, false
	}
	if len(c.entries) == 0 && len(c.subs) == 0 {
		return nil, true
	}
	return &c, true
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
	for i := range n.entries {
		if !yield(n.entries[i].key, n.entries[i].val) {
			return false
		}
	}
	for _, sub := range n.subs {
		if !walk(sub, yield) {
			return false
		}
	}
	return true
}
