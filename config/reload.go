package config

import "reflect"

// What a reload may change, read from the reload:"apply" tags of the
// schema: today [[peers]], [[workloads]], [[services]], [[policies]],
// hbone.serve, gateway.drain_timeout, gateway.max_flows_per_source,
// log.level, dns.ttl and the [gateway] keys describing this node's
// workload (gateway.cluster, .workload_namespace, .workload_name,
// .workload_kind, .canonical_service, .canonical_revision). Every other
// key is bound to something a gateway builds once at start.

// Diff lists the key paths whose values differ between a and b, in schema
// order: "tun.mtu" for a key of a table, "version" for a top-level value,
// and "peers" for an array of tables, which is compared whole.
func Diff(a, b *Config) []string {
	var out []string
	eachKey(reflect.ValueOf(a).Elem(), reflect.ValueOf(b).Elem(), "", root, func(path string, _ *key, av, bv reflect.Value) {
		if !reflect.DeepEqual(av.Interface(), bv.Interface()) {
			out = append(out, path)
		}
	})
	return out
}

// ReloadApplied reports whether a reload puts the key at path (a path as
// Diff gives them) in force for new flows; the others need a restart.
func ReloadApplied(path string) bool {
	k, ok := lookup(path)
	return ok && k.reload
}

// InForce is the config in force after reloading next over running: next,
// with every key a reload does not apply holding its value in running. It
// changes neither argument; the result shares their lists, which no one
// changes.
func InForce(running, next *Config) *Config {
	c := *next
	eachKey(reflect.ValueOf(running).Elem(), reflect.ValueOf(&c).Elem(), "", root, func(_ string, k *key, rv, cv reflect.Value) {
		if !k.reload {
			cv.Set(rv)
		}
	})
	return &c
}

// eachKey calls fn with the values of each key of the tables a and b (of
// schema s), and of each of their arrays of tables as a whole.
func eachKey(a, b reflect.Value, prefix string, s *tableSchema, fn func(path string, k *key, av, bv reflect.Value)) {
	for i := range s.keys {
		k := &s.keys[i]
		path := joinPath(prefix, k.name)
		av, bv := a.Field(k.field), b.Field(k.field)
		if k.sub != nil && !k.array {
			eachKey(av, bv, path, k.sub, fn)
			continue
		}
		fn(path, k, av, bv)
	}
}
