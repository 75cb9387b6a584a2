package config

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
)

// Parse decodes a gateway.toml held in data, fills in the defaults and
// validates the result. source names the file in messages. It touches no
// files: the TLS paths are checked by Load.
//
// Decoding is strict: unknown keys (with a "did you mean" when one is
// close), wrong types and malformed addresses are errors, reported together
// with what Validate finds as one *Errors.
func Parse(data []byte, source string) (*Config, error) {
	c, d := decode(data)
	if c != nil {
		d.merge(c.check())
	}
	sortByOrder(d.list, d.order)
	if err := d.errs(source); err != nil {
		return nil, err
	}
	return c, nil
}

// decode turns data into a defaulted Config. It returns a nil Config only
// for a syntax error; otherwise the Config holds what could be decoded and
// d lists what could not.
//
// The TOML is first parsed into a tree and then walked against the schema
// (the tags of Config, schema.go), rather than decoded into the structs by
// toml.Decode and checked with toml.MetaData.Undecoded: the walk knows the
// index of every entry of an array of tables ("peers[1].adress"), matches
// keys exactly (toml.Decode accepts "MTU" for "mtu"), reports every wrong
// type rather than stopping at the first, and keeps going past a bad
// value, so one run lists every problem of a file.
func decode(data []byte) (*Config, *decoder) {
	d := &decoder{order: make(map[string]int)}
	var tree map[string]any
	if _, err := toml.Decode(string(data), &tree); err != nil {
		e := &Error{Msg: "syntax error: " + err.Error()}
		var pe toml.ParseError
		if errors.As(err, &pe) {
			e.Line, e.Column = pe.Position.Line, pe.Position.Col
			e.Msg = "syntax error: " + pe.Message
		}
		d.list = append(d.list, e)
		return nil, d
	}
	c := Default()
	d.decodeTable(&table{d: d, m: tree}, reflect.ValueOf(c).Elem(), root)
	c.setDefaults()
	return c, d
}

// defaulter is a table, or an entry of an array of tables, with defaults
// derived from its other keys.
type defaulter interface{ setDefaults() }

var (
	_ defaulter = (*Workload)(nil)
	_ defaulter = (*Mesh)(nil)
	_ defaulter = (*Config)(nil)
)

// decoder walks the parsed TOML tree into a Config, collecting problems.
type decoder struct {
	problems
	order map[string]int // key path → when the walk met it, to sort problems
}

// merge adds the problems Validate found, leaving out those at or under a
// path that already failed to decode: a value that could not be read is
// zero in the Config, and "required" beside "invalid CIDR" would mislead.
// For the same reason it leaves out problems with keys whose requirement
// hangs on a condition (if:"…", unless:"…") whose key failed to decode.
func (d *decoder) merge(checked []*Error) {
	failed := d.list
	unknown := map[string]bool{} // conditions whose key failed to decode
	for name, cond := range conditions {
		for _, f := range failed {
			unknown[name] = unknown[name] || f.Path != "" && within(f.Path, cond.key)
		}
	}
	for _, e := range checked {
		dup := false
		for _, f := range failed {
			if f.Path != "" && within(e.Path, f.Path) {
				dup = true
				break
			}
		}
		if k, ok := lookup(schemaPath(e.Path)); ok && unknown[k.when] {
			dup = true
		}
		if !dup {
			d.list = append(d.list, e)
		}
	}
}

func (d *decoder) see(path string) {
	if _, ok := d.order[path]; !ok {
		d.order[path] = len(d.order)
	}
}

// decodeTable decodes the keys of s from t into v, a struct of s's type, then
// reports t's unknown keys. Keys the file leaves out keep v's values.
func (d *decoder) decodeTable(t *table, v reflect.Value, s *tableSchema) {
	for _, k := range s.keys {
		dst := v.Field(k.field)
		switch {
		case k.array:
			entries := t.tables(k.name)
			if len(entries) == 0 {
				continue
			}
			out := reflect.MakeSlice(k.typ, 0, len(entries))
			for _, e := range entries {
				// An entry's keys left out or written empty take their
				// defaults, then those derived from its other keys.
				ev := reflect.New(k.typ.Elem()).Elem()
				d.decodeTable(e, ev, k.sub)
				fillDefaults(ev, k.sub, true)
				setDerived(ev)
				out = reflect.Append(out, ev)
			}
			dst.Set(out)
		case k.sub != nil:
			d.decodeTable(t.sub(k.name), dst, k.sub)
			setDerived(dst)
		default:
			if raw, path, ok := t.get(k.name); ok {
				if val, ok := d.value(path, raw, k.typ); ok {
					dst.Set(val)
				}
			}
		}
	}
	t.finish()
}

// setDerived fills the derived defaults of v, a table or an entry, if it
// has any.
func setDerived(v reflect.Value) {
	if f, ok := v.Addr().Interface().(defaulter); ok {
		f.setDefaults()
	}
}

var (
	typeDuration = reflect.TypeFor[Duration]()
	typePrefix   = reflect.TypeFor[netip.Prefix]()
	typeAddr     = reflect.TypeFor[netip.Addr]()
	typeAddrPort = reflect.TypeFor[netip.AddrPort]()
	typePortMap  = reflect.TypeFor[map[uint16]uint16]()
)

// value converts raw, the TOML value at path, to a value of type typ,
// reporting why it cannot. Every type of the schema's values is here.
func (d *decoder) value(path string, raw any, typ reflect.Type) (reflect.Value, bool) {
	var (
		v  any
		ok bool
	)
	switch typ {
	case typeDuration:
		v, ok = d.duration(path, raw)
	case typePrefix:
		v, ok = d.prefix(path, raw)
	case typeAddr:
		v, ok = d.addr(path, raw)
	case typeAddrPort:
		v, ok = d.addrPort(path, raw)
	case typePortMap:
		v, ok = d.portMap(path, raw)
	default:
		switch typ.Kind() {
		case reflect.String:
			v, ok = d.str(path, raw)
		case reflect.Int:
			v, ok = d.integer(path, raw)
		case reflect.Bool:
			v, ok = d.boolean(path, raw)
		case reflect.Uint16:
			v, ok = d.port(path, raw)
		case reflect.Slice:
			return d.array(path, raw, typ)
		default:
			panic("config: the decoder has no rule for " + typ.String() + " at " + path)
		}
	}
	if !ok {
		return reflect.Value{}, false
	}
	return reflect.ValueOf(v), true
}

// array decodes an array of values of typ's element type. An entry that
// fails to convert is reported and kept as a zero value, so that the
// indexes Validate reports are those of the file.
func (d *decoder) array(path string, raw any, typ reflect.Type) (reflect.Value, bool) {
	arr, ok := raw.([]any)
	if !ok {
		d.add(path, "must be an array, not %s", describe(raw))
		return reflect.Value{}, false
	}
	out := reflect.MakeSlice(typ, len(arr), len(arr))
	for i, e := range arr {
		p := indexPath(path, i)
		d.see(p)
		if v, ok := d.value(p, e, typ.Elem()); ok {
			out.Index(i).Set(v)
		}
	}
	return out, true
}

// table is one TOML table being decoded. Every key the decoder asks for is
// remembered, so finish can report the rest as unknown, with the asked-for
// keys as the candidates for "did you mean".
type table struct {
	d     *decoder
	path  string
	m     map[string]any // nil: absent, or not a table (already reported)
	known []string
}

func (t *table) get(key string) (v any, path string, ok bool) {
	t.known = append(t.known, key)
	path = joinPath(t.path, key)
	t.d.see(path)
	v, ok = t.m[key]
	return v, path, ok
}

// finish reports the keys of t that no one asked for.
func (t *table) finish() {
	var unknown []string
	for k := range t.m {
		if !slices.Contains(t.known, k) {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	for _, k := range unknown {
		path := joinPath(t.path, k)
		t.d.see(path) // after the table's known keys
		if s, ok := closest(k, t.known); ok {
			t.d.add(path, "unknown key (did you mean %q?)", s)
		} else {
			t.d.add(path, "unknown key (this table has: %s)", strings.Join(t.known, ", "))
		}
	}
}

// sub returns the table under key; an absent one is empty.
func (t *table) sub(key string) *table {
	v, path, ok := t.get(key)
	s := &table{d: t.d, path: path}
	if !ok {
		return s
	}
	if m, ok := v.(map[string]any); ok {
		s.m = m
	} else {
		t.d.add(path, "must be a table ([%s]), not %s", key, describe(v))
	}
	return s
}

// tables returns the entries of the array of tables under key. An entry
// that is not a table is reported and stands in as an empty table, so the
// indexes of the others stay those of the file.
func (t *table) tables(key string) []*table {
	v, path, ok := t.get(key)
	if !ok {
		return nil
	}
	var entries []any
	switch v := v.(type) {
	case []map[string]any: // [[key]] sections
		for _, m := range v {
			entries = append(entries, m)
		}
	case []any: // key = [{...}, {...}]
		entries = v
	default:
		t.d.add(path, "must be an array of tables ([[%s]]), not %s", key, describe(v))
		return nil
	}
	out := make([]*table, len(entries))
	for i, e := range entries {
		p := indexPath(path, i)
		t.d.see(p)
		out[i] = &table{d: t.d, path: p}
		if m, ok := e.(map[string]any); ok {
			out[i].m = m
		} else {
			t.d.add(p, "must be a table, not %s", describe(e))
		}
	}
	return out
}

func (d *decoder) integer(path string, v any) (int, bool) {
	n, ok := v.(int64)
	if !ok {
		d.add(path, "must be an integer, not %s", describe(v))
	}
	return int(n), ok
}

func (d *decoder) boolean(path string, v any) (bool, bool) {
	b, ok := v.(bool)
	if !ok {
		d.add(path, "must be true or false, not %s", describe(v))
	}
	return b, ok
}

func (d *decoder) duration(path string, v any) (Duration, bool) {
	var dur Duration
	s, ok := v.(string)
	if !ok {
		d.add(path, "must be a duration string like \"5s\", not %s", describe(v))
		return dur, false
	}
	if err := dur.UnmarshalText([]byte(s)); err != nil {
		d.add(path, "%v", err)
		return dur, false
	}
	return dur, true
}

// portMap decodes an inline table of service port = target port.
func (d *decoder) portMap(path string, v any) (map[uint16]uint16, bool) {
	m, ok := v.(map[string]any)
	if !ok {
		d.add(path, "must be a table of service port = target port, like { 80 = 8080 }, not %s", describe(v))
		return nil, false
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make(map[uint16]uint16, len(m))
	for _, k := range keys {
		p := joinPath(path, k)
		d.see(p)
		sp, err := strconv.ParseUint(k, 10, 16)
		if err != nil {
			d.add(p, "service port %q must be a number 1..65535", k)
			continue
		}
		tp, ok := d.port(p, m[k])
		if !ok {
			continue
		}
		if _, dup := out[uint16(sp)]; dup {
			d.add(p, "service port %d is mapped twice", sp)
			continue
		}
		out[uint16(sp)] = tp
	}
	return out, true
}

func (d *decoder) str(path string, v any) (string, bool) {
	s, ok := v.(string)
	if !ok {
		d.add(path, "must be a string, not %s", describe(v))
	}
	return s, ok
}

// prefix reads a CIDR such as "10.244.0.0/16" or "fd00::/64"; a bare IP
// stands for its host prefix (/32 or /128).
func (d *decoder) prefix(path string, v any) (netip.Prefix, bool) {
	s, ok := d.str(path, v)
	if !ok {
		return netip.Prefix{}, false
	}
	p, err := parsePrefix(s)
	if err != nil {
		d.add(path, "invalid CIDR %q (%s): write an address with an optional /length, like \"10.244.0.0/16\", \"10.0.0.5\" or \"fd00::/64\"", s, err)
		return netip.Prefix{}, false
	}
	return p, true
}

func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		return p, reason(err)
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, reason(err)
	}
	if a.Zone() != "" {
		return netip.Prefix{}, errors.New("IPv6 zones are not allowed")
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

func (d *decoder) addr(path string, v any) (netip.Addr, bool) {
	s, ok := d.str(path, v)
	if !ok {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(s)
	if err == nil && a.Zone() != "" {
		err = errors.New("IPv6 zones are not allowed")
	}
	if err != nil {
		d.add(path, "invalid IP address %q (%s)", s, reason(err))
		return netip.Addr{}, false
	}
	return a, true
}

func (d *decoder) addrPort(path string, v any) (netip.AddrPort, bool) {
	s, ok := d.str(path, v)
	if !ok {
		return netip.AddrPort{}, false
	}
	ap, err := netip.ParseAddrPort(s)
	if err == nil && ap.Addr().Zone() != "" {
		err = errors.New("IPv6 zones are not allowed")
	}
	if err != nil {
		d.add(path, "invalid ip:port %q (%s): write it like \"192.0.2.2:15008\" or \"[fd00::2]:15008\"", s, reason(err))
		return netip.AddrPort{}, false
	}
	return ap, true
}

// port reads a TCP port number; 0 is let through for Validate to report.
func (d *decoder) port(path string, v any) (uint16, bool) {
	n, ok := v.(int64)
	if !ok {
		d.add(path, "must be a port number, not %s", describe(v))
		return 0, false
	}
	if n < 0 || n > 65535 {
		d.add(path, "port %d is out of range (1..65535)", n)
		return 0, false
	}
	return uint16(n), true
}

// reason strips the `netip.ParsePrefix("..."): ParseAddr("..."): `
// prefixes from a netip error: our message already quotes the input.
func reason(err error) error {
	if err == nil {
		return nil
	}
	s := err.Error()
	for {
		open := strings.Index(s, "(\"")
		if open <= 0 || strings.ContainsAny(s[:open], " :") {
			break
		}
		// %q escapes quotes, so the first unescaped `"): ` ends the input.
		end := -1
		for k := open + 2; k+3 < len(s); k++ {
			if s[k] == '\\' {
				k++
				continue
			}
			if s[k] == '"' {
				if strings.HasPrefix(s[k:], "\"): ") {
					end = k + 4
				}
				break
			}
		}
		if end < 0 {
			break
		}
		s = s[end:]
	}
	return errors.New(s)
}

// describe names the TOML type of v for messages, quoting short scalars.
func describe(v any) string {
	switch v := v.(type) {
	case string:
		if len(v) > 40 {
			return "a string"
		}
		return fmt.Sprintf("a string (%q)", v)
	case int64:
		return fmt.Sprintf("an integer (%d)", v)
	case float64:
		return fmt.Sprintf("a float (%v)", v)
	case bool:
		return fmt.Sprintf("a boolean (%v)", v)
	case []any:
		return "an array"
	case []map[string]any:
		return "an array of tables"
	case map[string]any:
		return "a table"
	default:
		return "a date/time"
	}
}
