package gateway

import (
	"encoding"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/pprof"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"unicode"

	"github.com/hashicorp/go-hclog"

	"github.com/meshtun/meshtun/config"
)

// adminHandler serves the admin listener, which binds to localhost by
// default:
//
//   - GET /config_dump: the configuration in force (after any reload), as JSON
//     with gateway.toml's key names. The config holds only the paths of the
//     certificate and key files, never their contents, so no key material
//     can appear here.
//   - GET /logging shows the log level; POST or PUT /logging?level=debug
//     changes it at once for every logger of the process (the access log
//     too, which writes at INFO and WARN).
//   - /debug/pprof/: Go's profiler, to see where a gateway's CPU and memory
//     go (the bench's missed targets were diagnosed with it).
func (g *Gateway) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /config_dump", func(w http.ResponseWriter, r *http.Request) {
		b, err := json.MarshalIndent(configDump(g.snapshot().cfg), "", "  ")
		if err != nil {
			http.Error(w, "config dump: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(append(b, '\n'))
	})
	mux.HandleFunc("/logging", g.serveLogging)
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// logLevels are the levels /logging accepts: log.level's values.
var logLevels = []string{"trace", "debug", "info", "warn", "error"}

// serveLogging shows or sets the level of the process's loggers. The
// gateway's logger is a Named child of the root logger and shares its
// level (hclog's default), so setting it here sets it everywhere.
func (g *Gateway) serveLogging(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
	case http.MethodPost, http.MethodPut:
		v := r.URL.Query().Get("level")
		lvl := hclog.LevelFromString(v)
		if v == "" || lvl == hclog.NoLevel || lvl == hclog.Off {
			http.Error(w, fmt.Sprintf("logging: level %q: want one of %s, as in /logging?level=debug",
				v, strings.Join(logLevels, ", ")), http.StatusBadRequest)
			return
		}
		old := g.log.GetLevel()
		g.log.SetLevel(lvl)
		g.log.Info("log level changed", "from", levelName(old), "to", levelName(lvl))
	default:
		w.Header().Set("Allow", "GET, HEAD, POST, PUT")
		http.Error(w, "logging: use GET to read the level, POST or PUT ?level=LEVEL to set it", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "level: %s\n", levelName(g.log.GetLevel()))
}

func levelName(l hclog.Level) string {
	return strings.ToLower(l.String())
}

// configDump turns cfg into a JSON-ready tree keyed like gateway.toml: a
// struct field's key is its name in snake case (TrustDomain →
// trust_domain, HBONEAddress → hbone_address, CIDRs → cidrs), which is the
// convention config.go's field comments record. Values that know their
// text form (addresses, prefixes, durations) are written as text.
func configDump(cfg *config.Config) any {
	return dumpValue(reflect.ValueOf(cfg).Elem())
}

func dumpValue(v reflect.Value) any {
	if v.CanInterface() {
		if tm, ok := v.Interface().(encoding.TextMarshaler); ok {
			b, err := tm.MarshalText()
			if err != nil {
				return "invalid: " + err.Error()
			}
			return string(b)
		}
	}
	switch v.Kind() {
	case reflect.Struct:
		out := make(map[string]any, v.NumField())
		t := v.Type()
		for i := range v.NumField() {
			if f := t.Field(i); f.IsExported() {
				out[snakeCase(f.Name)] = dumpValue(v.Field(i))
			}
		}
		return out
	case reflect.Slice, reflect.Array:
		out := make([]any, v.Len())
		for i := range v.Len() {
			out[i] = dumpValue(v.Index(i))
		}
		return out
	case reflect.Map:
		out := make(map[string]any, v.Len())
		keys := v.MapKeys()
		sort.Slice(keys, func(i, j int) bool { return fmt.Sprint(keys[i]) < fmt.Sprint(keys[j]) })
		for _, k := range keys {
			out[fmt.Sprint(k)] = dumpValue(v.MapIndex(k))
		}
		return out
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return nil
		}
		return dumpValue(v.Elem())
	case reflect.String:
		return v.String()
	case reflect.Bool:
		return v.Bool()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return v.Int()
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return v.Uint()
	case reflect.Float32, reflect.Float64:
		return v.Float()
	}
	return "unsupported " + v.Kind().String() + " " + strconv.Quote(v.Type().String())
}

// snakeCase turns a Go field name into its TOML key: words split where a
// lower-case letter meets an upper-case one, and where an acronym meets
// the next word (HBONEAddress → hbone_address); a plural acronym keeps its
// s (CIDRs, VIPs).
func snakeCase(name string) string {
	r := []rune(name)
	var b strings.Builder
	for i, c := range r {
		if i > 0 && unicode.IsUpper(c) {
			prev := r[i-1]
			nextLower := i+1 < len(r) && unicode.IsLower(r[i+1])
			pluralAcronym := i+2 == len(r) && r[i+1] == 's' || i+2 < len(r) && r[i+1] == 's' && unicode.IsUpper(r[i+2])
			if unicode.IsLower(prev) || unicode.IsDigit(prev) || (nextLower && !pluralAcronym) {
				b.WriteByte('_')
			}
		}
		b.WriteRune(unicode.ToLower(c))
	}
	return b.String()
}
