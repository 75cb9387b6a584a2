package config

import (
	"encoding"
	"reflect"
	"strconv"
)

// Dump is c as a tree keyed exactly like gateway.toml, for /config_dump:
// tables and entries are map[string]any, arrays []any, values written as
// text where they have a text form (addresses, prefixes, durations),
// service ports as decimal keys. Written back as TOML it parses to c. A
// Config holds the paths of the TLS files, never their contents, so no
// key material can appear in it.
func Dump(c *Config) map[string]any {
	return dumpTable(reflect.ValueOf(c).Elem(), root)
}

func dumpTable(v reflect.Value, s *tableSchema) map[string]any {
	out := make(map[string]any, len(s.keys))
	for _, k := range s.keys {
		f := v.Field(k.field)
		switch {
		case k.array:
			entries := make([]any, f.Len())
			for i := range f.Len() {
				entries[i] = dumpTable(f.Index(i), k.sub)
			}
			out[k.name] = entries
		case k.sub != nil:
			out[k.name] = dumpTable(f, k.sub)
		default:
			out[k.name] = dumpValue(f)
		}
	}
	return out
}

// dumpValue writes one value of the schema's value types (see
// decoder.value).
func dumpValue(v reflect.Value) any {
	if tm, ok := v.Interface().(encoding.TextMarshaler); ok {
		b, err := tm.MarshalText()
		if err != nil {
			return "invalid: " + err.Error()
		}
		return string(b)
	}
	switch v.Kind() {
	case reflect.Slice:
		out := make([]any, v.Len())
		for i := range v.Len() {
			out[i] = dumpValue(v.Index(i))
		}
		return out
	case reflect.Map: // ports: uint16 → uint16
		out := make(map[string]any, v.Len())
		for it := v.MapRange(); it.Next(); {
			out[strconv.FormatUint(it.Key().Uint(), 10)] = dumpValue(it.Value())
		}
		return out
	case reflect.String:
		return v.String()
	case reflect.Bool:
		return v.Bool()
	case reflect.Int:
		return v.Int()
	case reflect.Uint16:
		return v.Uint()
	}
	panic("config: Dump has no rule for " + v.Type().String())
}
