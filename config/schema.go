package config

import (
	"encoding"
	"fmt"
	"reflect"
	"strings"
)

// The schema, read once from the tags of Config (see Config's comment).

// key is one key of a table of the schema.
type key struct {
	name  string // the TOML key
	field int    // index of its struct field
	typ   reflect.Type

	def      string // default:"…", the default's text
	hasDef   bool
	required bool     // toml:"…,required": no default, the file must say it
	when     string   // if:"cond" or unless:"cond": required only while cond holds, or does not; "" always
	unless   bool     // when came from unless:"…"
	derived  bool     // toml:"…,derived": the default is worked out from other keys
	reload   bool     // reload:"apply": a reload puts it in force
	values   []string // values:"a|b": the values a string key may take; nil: any

	// sub is the schema of a [table] or of the entries of an [[array of
	// tables]] (array set); nil for a value.
	sub   *tableSchema
	array bool
}

// tableSchema is the schema of one table: its keys in file order.
type tableSchema struct {
	keys  []key
	names []string // the keys' names, for "did you mean" and messages
}

// condition is a state of a whole file that a key's requirement may
// depend on (the tags if:"name" and unless:"name").
type condition struct {
	holds func(*Config) bool
	doc   string // how gateway.toml writes it: "required if <doc>", "required unless <doc>"
	// The key holds reads. When its value cannot be decoded, whether the
	// condition holds is not known, and the keys that hang on it are not
	// reported (decoder.merge): "tls.cert: required" beside a bad
	// mesh.xds_address would mislead.
	key string
}

// conditions are the conditions the schema's tags may name.
var conditions = map[string]condition{
	"mesh": {holds: func(c *Config) bool { return c.Mesh.Enabled() }, doc: "[mesh] is on", key: "mesh.xds_address"},
}

// applies reports whether k's condition, if it has one, asks for k in c:
// a key tagged if:"mesh" applies with the mesh on, unless:"mesh" with it
// off, a key with neither always.
func (k *key) applies(c *Config) bool {
	return k.when == "" || conditions[k.when].holds(c) != k.unless
}

// root is the schema of a whole file. Reading it at start makes a struct
// without tags a crash of every test rather than a silent gap.
var root = mustSchema(reflect.TypeFor[Config]())

var textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()

// isTable reports whether a struct type is a table, rather than a value
// written as text (Duration, netip.Prefix, …).
func isTable(t reflect.Type) bool {
	return t.Kind() == reflect.Struct && !reflect.PointerTo(t).Implements(textUnmarshaler)
}

func mustSchema(t reflect.Type) *tableSchema {
	s := &tableSchema{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag, ok := f.Tag.Lookup("toml")
		if !ok || tag == "" {
			panic(fmt.Sprintf("config: %s.%s has no toml tag", t.Name(), f.Name))
		}
		if tag == "-" {
			// Not a key: state the program sets (from the mesh), which
			// the file cannot write, Dump does not show and Diff does
			// not compare key by key.
			if len(f.Tag) != len(`toml:"-"`) {
				panic(fmt.Sprintf("config: %s.%s: toml:\"-\" takes no other tag", t.Name(), f.Name))
			}
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		k := key{name: name, field: i, typ: f.Type}
		k.def, k.hasDef = f.Tag.Lookup("default")
		switch opts {
		case "":
		case "required":
			k.required = true
		case "derived":
			k.derived = true
		default:
			panic(fmt.Sprintf("config: %s.%s: unknown toml tag option %q", t.Name(), f.Name, opts))
		}
		if k.hasDef && (k.required || k.derived) {
			panic(fmt.Sprintf("config: %s.%s: a default and %q", t.Name(), f.Name, opts))
		}
		for _, tag := range []string{"if", "unless"} {
			cond, ok := f.Tag.Lookup(tag)
			if !ok {
				continue
			}
			if _, known := conditions[cond]; !known || !k.required || k.when != "" {
				panic(fmt.Sprintf("config: %s.%s: %s:%q needs \"required\", one condition, and one of the schema's conditions", t.Name(), f.Name, tag, cond))
			}
			k.when, k.unless = cond, tag == "unless"
		}
		if v, ok := f.Tag.Lookup("values"); ok {
			if f.Type.Kind() != reflect.String {
				panic(fmt.Sprintf("config: %s.%s: values on a %s", t.Name(), f.Name, f.Type))
			}
			k.values = strings.Split(v, "|")
		}
		switch r := f.Tag.Get("reload"); r {
		case "":
		case "apply":
			k.reload = true
		default:
			panic(fmt.Sprintf("config: %s.%s: unknown reload tag %q", t.Name(), f.Name, r))
		}
		switch {
		case isTable(f.Type):
			k.sub = mustSchema(f.Type)
		case f.Type.Kind() == reflect.Slice && isTable(f.Type.Elem()):
			k.sub, k.array = mustSchema(f.Type.Elem()), true
		}
		s.keys = append(s.keys, k)
		s.names = append(s.names, name)
	}
	return s
}

// Key paths of the schema, for the reload difference and the tests:
// "tun.mtu" for a key of a table, "peers" for an array of tables taken
// whole, "peers.cidrs" for a key of its entries.

// keyPaths lists every key of the schema: tables' keys under their table,
// the keys of arrays of tables' entries under the array, the arrays
// themselves too. Tables themselves are not keys.
func keyPaths() []string {
	var out []string
	var walk func(prefix string, s *tableSchema)
	walk = func(prefix string, s *tableSchema) {
		for _, k := range s.keys {
			p := joinPath(prefix, k.name)
			if k.sub == nil || k.array {
				out = append(out, p)
			}
			if k.sub != nil {
				walk(p, k.sub)
			}
		}
	}
	walk("", root)
	return out
}

// schemaPath is the path of the key of the schema at a concrete path:
// "peers.cidrs" for "peers[1].cidrs[0]".
func schemaPath(path string) string {
	var b strings.Builder
	depth := 0
	for _, r := range path {
		switch {
		case r == '[':
			depth++
		case r == ']':
			depth--
		case depth == 0:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// lookup finds the key at a path of keyPaths, and the table holding it.
func lookup(path string) (*key, bool) {
	s := root
	var found *key
	for name := range strings.SplitSeq(path, ".") {
		if s == nil {
			return nil, false
		}
		found = nil
		for i := range s.keys {
			if s.keys[i].name == name {
				found = &s.keys[i]
			}
		}
		if found == nil {
			return nil, false
		}
		s = found.sub
	}
	return found, found != nil
}

// keyIndex maps a pointer to a value inside one Config (a key, an entry of
// an array of tables, an element of a list) to its key path, so that the
// checks of Validate name the field they check and the schema supplies
// its path: &c.TUN.MTU is "tun.mtu", &c.Peers[1].CIDRs[0] is
// "peers[1].cidrs[0]". Pointers of different types to one address (a
// struct and its first field) are different keys of the map.
type keyIndex map[any]indexed

// indexed is what keyIndex knows of a value: its path and, for a key,
// its schema.
type indexed struct {
	path string
	key  *key // nil for a table, an entry or an element of a list
}

// indexKeys indexes every key of c. Two lists of c sharing one backing
// array (which Parse never builds) would share paths too: the later wins.
func indexKeys(c *Config) keyIndex {
	m := keyIndex{}
	var walk func(v reflect.Value, path string, s *tableSchema)
	walk = func(v reflect.Value, path string, s *tableSchema) {
		m[v.Addr().Interface()] = indexed{path: path}
		for i := range s.keys {
			k := &s.keys[i]
			f := v.Field(k.field)
			p := joinPath(path, k.name)
			m[f.Addr().Interface()] = indexed{path: p, key: k}
			switch {
			case k.array:
				for i := range f.Len() {
					walk(f.Index(i), indexPath(p, i), k.sub)
				}
			case k.sub != nil:
				walk(f, p, k.sub)
			case f.Kind() == reflect.Slice:
				for i := range f.Len() {
					m[f.Index(i).Addr().Interface()] = indexed{path: indexPath(p, i)}
				}
			}
		}
	}
	walk(reflect.ValueOf(c).Elem(), "", root)
	return m
}
