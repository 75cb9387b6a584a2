package config

import (
	"fmt"
	"net/netip"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
)

// shippedFile is the documented example at the repository's root.
const shippedFile = "../gateway.toml"

// docLine is one key line of the shipped file: `key = value # comment`,
// or the same commented out, `# key = value # comment`.
type docLine struct {
	n         int    // line number, 1-based
	path      string // key path: "tun.mtu", "peers.cidrs"
	value     string // the value as written
	comment   string // the comment after the value, without '#'
	commented bool   // the whole line is a comment
}

var (
	// A header may be commented out, with its table: `# [mesh]`.
	headerRE  = regexp.MustCompile(`^\s*(#\s*)?(\[\[?)([a-z_.]+)\]\]?\s*(#.*)?$`)
	keyLineRE = regexp.MustCompile(`^\s*(#\s*)?([a-z_]+)\s*=\s*(.*)$`)
	// "default <value>" up to the next ';': a default stated as a value.
	// "default: …" is a default described in words (a derived key).
	defaultRE = regexp.MustCompile(`\bdefault ([^:;\s][^;]*)`)
)

// readDoc returns the table headers ("tun", "peers") and key lines of the
// shipped file.
func readDoc(t *testing.T) (headers map[string]bool, lines []docLine) {
	t.Helper()
	data, err := os.ReadFile(shippedFile)
	if err != nil {
		t.Fatal(err)
	}
	headers = map[string]bool{}
	section := ""
	for i, l := range strings.Split(string(data), "\n") {
		if m := headerRE.FindStringSubmatch(l); m != nil {
			section = m[3]
			headers[section] = true
			continue
		}
		m := keyLineRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		value, comment := splitComment(m[3])
		lines = append(lines, docLine{
			n: i + 1, path: joinPath(section, m[2]), value: strings.TrimSpace(value),
			comment: strings.TrimSpace(comment), commented: m[1] != "",
		})
	}
	return headers, lines
}

// splitComment cuts s at its first '#' outside a string.
func splitComment(s string) (value, comment string) {
	quoted := false
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			if quoted {
				i++
			}
		case '"':
			quoted = !quoted
		case '#':
			if !quoted {
				return s[:i], s[i+1:]
			}
		}
	}
	return s, ""
}

// decodeDoc decodes a value written in the file as the value of key k.
func decodeDoc(k *key, text string) (any, error) {
	var m map[string]any
	if _, err := toml.Decode("v = "+text, &m); err != nil {
		return nil, err
	}
	d := decoder{order: make(map[string]int)}
	v, ok := d.value(k.name, m["v"], k.typ)
	if !ok {
		return nil, fmt.Errorf("%v", d.list[0])
	}
	return dumpValue(v), nil
}

// TestShippedFileDocumentsSchema holds gateway.toml, the documented
// example, to the schema: every table has its header, every key of the
// schema has a line (set, or commented out) whose comment says "required",
// "default <value>" with the schema's default, or "default: <how>" for a
// derived one; a commented-out line may instead show the default as its
// value. No line documents a key the schema lacks.
func TestShippedFileDocumentsSchema(t *testing.T) {
	headers, lines := readDoc(t)
	byPath := map[string][]docLine{}
	for _, l := range lines {
		if _, ok := lookup(l.path); !ok {
			t.Errorf("%s:%d documents %s, which the schema (config.go) does not have", shippedFile, l.n, l.path)
			continue
		}
		byPath[l.path] = append(byPath[l.path], l)
	}
	var walk func(prefix string, s *tableSchema)
	walk = func(prefix string, s *tableSchema) {
		for i := range s.keys {
			k := &s.keys[i]
			path := joinPath(prefix, k.name)
			if k.sub != nil {
				if !headers[path] {
					t.Errorf("%s: no [%s] header documents the table %s", shippedFile, path, path)
				}
				walk(path, k.sub)
				continue
			}
			ls := byPath[path]
			if len(ls) == 0 {
				t.Errorf("%s: key %s is not documented: add a line `%s = …  # %s`", shippedFile, path, k.name, wantDoc(k))
				continue
			}
			for _, l := range ls {
				if err := checkDoc(k, l); err != nil {
					t.Errorf("%s:%d: %s: %v", shippedFile, l.n, path, err)
				}
			}
		}
	}
	walk("", root)
}

// wantDoc is what the comment of k's line must say.
func wantDoc(k *key) string {
	switch {
	case k.required:
		return requiredDoc(k) + "; …"
	case k.derived:
		return "default: <how it is worked out>; …"
	}
	return "default " + defaultText(k) + "; …"
}

// defaultText writes k's default as a TOML value, for messages.
func defaultText(k *key) string {
	v := reflect.New(k.typ).Elem()
	if k.hasDef {
		v = defaultValue(k)
	}
	var b strings.Builder
	if err := toml.NewEncoder(&b).Encode(map[string]any{"v": dumpValue(v)}); err != nil {
		return fmt.Sprintf("%v", dumpValue(v))
	}
	return strings.TrimSpace(strings.TrimPrefix(b.String(), "v = "))
}

// requiredDoc is how the comment of a required key begins: "required",
// or with its condition, "required unless [mesh] is on".
func requiredDoc(k *key) string {
	switch {
	case k.when == "":
		return "required"
	case k.unless:
		return "required unless " + conditions[k.when].doc
	}
	return "required if " + conditions[k.when].doc
}

func checkDoc(k *key, l docLine) error {
	if vs := strings.Join(k.values, " | "); vs != "" && !strings.Contains(l.comment, vs) {
		return fmt.Errorf("the comment must list the values, %q, not %q", vs, l.comment)
	}
	switch {
	case k.required:
		want := requiredDoc(k)
		if !strings.HasPrefix(l.comment, want) {
			return fmt.Errorf("the key has no default: its comment must begin with %q, not %q", want, l.comment)
		}
		return nil
	case k.derived:
		if !strings.Contains(l.comment, "default:") {
			return fmt.Errorf("the key's default is derived: its comment must say \"default: <how>\", not %q", l.comment)
		}
		return nil
	}
	want := dumpValue(reflect.New(k.typ).Elem())
	if k.hasDef {
		want = dumpValue(defaultValue(k))
	}
	stated, how := "", ""
	if m := defaultRE.FindStringSubmatch(l.comment); m != nil {
		stated, how = strings.TrimSpace(m[1]), "says default"
	} else if l.commented {
		stated, how = l.value, "shows the value"
	} else {
		return fmt.Errorf("the comment must say `default %s`, not %q", defaultText(k), l.comment)
	}
	got, err := decodeDoc(k, stated)
	if err != nil {
		return fmt.Errorf("%s %s, which does not decode: %v", how, stated, err)
	}
	if !reflect.DeepEqual(got, want) {
		return fmt.Errorf("%s %s, but the schema's default is %s", how, stated, defaultText(k))
	}
	return nil
}

// The file's opening says which keys a reload applies: all of them, and
// only those.
func TestShippedFileNamesReloadKeys(t *testing.T) {
	data, err := os.ReadFile(shippedFile)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	start := strings.Index(text, "# SIGHUP")
	if start < 0 {
		t.Fatalf("%s has no paragraph on SIGHUP", shippedFile)
	}
	para := text[start:]
	if end := strings.Index(para, "\n\n"); end >= 0 {
		para = para[:end]
	}
	for _, p := range keyPaths() {
		k, _ := lookup(p)
		name := p
		if k.array {
			name = "[[" + p + "]]"
		}
		if mentioned := strings.Contains(para, name); mentioned != k.reload {
			t.Errorf("%s's SIGHUP paragraph: names %s %v, but ReloadApplied(%q) is %v", shippedFile, name, mentioned, p, k.reload)
		}
	}
}

// The rules above must be able to fail: each broken line is caught.
func TestCheckDocFails(t *testing.T) {
	k := func(path string) *key {
		t.Helper()
		k, ok := lookup(path)
		if !ok {
			t.Fatalf("no key %s", path)
		}
		return k
	}
	for _, tc := range []struct {
		path string
		line docLine
		ok   bool
	}{
		{"tun.mtu", docLine{value: "1500", comment: "default 65000; 576..65535"}, true},
		{"tun.mtu", docLine{value: "1500", comment: "default 1500; 576..65535"}, false},
		{"tun.mtu", docLine{value: "65000", comment: "576..65535"}, false},
		{"gateway.drain_timeout", docLine{value: `"5s"`, comment: `default "5000ms"; on SIGTERM`}, true},
		{"gateway.drain_timeout", docLine{value: `"5s"`, comment: `default 5; on SIGTERM`}, false},
		{"policies.rules.not_principals", docLine{value: "[]", commented: true, comment: "none of these"}, true},
		{"policies.rules.namespaces", docLine{value: `["default"]`, commented: true, comment: "the peer's namespace"}, false},
		{"policies.rules.namespaces", docLine{value: `["default"]`, commented: true, comment: "default []; the peer's namespace"}, true},
		{"tls.cert", docLine{value: `"c"`, comment: "the chain"}, false},
		{"tls.cert", docLine{value: `"c"`, comment: "required; the chain"}, false},
		{"tls.cert", docLine{value: `"c"`, comment: "required if [mesh] is on; the chain"}, false},
		{"tls.cert", docLine{value: `"c"`, comment: "required unless [mesh] is on; the chain"}, true},
		{"mesh.namespace", docLine{value: `"vm"`, commented: true, comment: "required; the namespace"}, false},
		{"mesh.namespace", docLine{value: `"vm"`, commented: true, comment: "required if [mesh] is on; the namespace"}, true},
		{"mesh.ca_address", docLine{value: `""`, commented: true, comment: "Istio's CA"}, false},
		{"mesh.ca_address", docLine{value: `""`, commented: true, comment: "default: xds_address"}, true},
		{"mesh.root_cert", docLine{value: `"/root.pem"`, commented: true, comment: "the default; roots"}, false},
		{"mesh.root_cert", docLine{value: `"/var/run/secrets/istio/root-cert.pem"`, commented: true, comment: "the default; roots"}, true},
		{"mesh.cert_ttl", docLine{value: `"24h"`, commented: true, comment: `default "12h"; lifetime`}, false},
		{"mesh.cert_ttl", docLine{value: `"1h"`, commented: true, comment: `default "1440m"; lifetime`}, true},
		{"gateway.name", docLine{value: `"a"`, comment: "the host name"}, false},
		{"gateway.name", docLine{value: `"a"`, comment: "default: the host name"}, true},
		{"log.level", docLine{value: `"info"`, comment: `default "info"; trace | debug | info | warn | error`}, true},
		{"log.level", docLine{value: `"info"`, comment: `default "info"; trace | debug | info`}, false},
	} {
		if err := checkDoc(k(tc.path), tc.line); (err == nil) != tc.ok {
			t.Errorf("checkDoc(%s, %+v) = %v, want ok %v", tc.path, tc.line, err, tc.ok)
		}
	}
	if p := slices.Index(keyPaths(), "tun.mtu"); p < 0 {
		t.Fatal("tun.mtu is not a key path")
	}
}

// shippedMeshOn is the shipped file with its commented-out [mesh] section
// turned on, as an operator would: the header and key lines of [mesh]
// uncommented, tls.cert and tls.key commented out.
func shippedMeshOn(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(shippedFile)
	if err != nil {
		t.Fatal(err)
	}
	_, lines := readDoc(t)
	text := strings.Split(string(data), "\n")
	uncommented := 0
	for _, l := range lines {
		switch {
		case l.commented && strings.HasPrefix(l.path, "mesh."):
			text[l.n-1] = strings.TrimPrefix(strings.TrimLeft(text[l.n-1], " "), "# ")
			uncommented++
		case l.path == "tls.cert" || l.path == "tls.key":
			text[l.n-1] = "# " + text[l.n-1]
		}
	}
	header := slices.Index(text, "# [mesh]")
	if header < 0 || uncommented == 0 {
		t.Fatalf("%s has no commented-out [mesh] section (a line `# [mesh]` and its keys)", shippedFile)
	}
	text[header] = "[mesh]"
	return strings.Join(text, "\n")
}

// The [mesh] section of the shipped file, turned on, is a working mesh
// setup: it parses, with the derived keys worked out and [tls] down to
// its trust bundle.
func TestShippedMeshSection(t *testing.T) {
	c, err := Parse([]byte(shippedMeshOn(t)), "mesh-on")
	if err != nil {
		t.Fatalf("the shipped file with [mesh] turned on: %v", err)
	}
	want := Mesh{
		XDSAddress:     "istiod.istio-system.svc:15012",
		CAAddress:      "istiod.istio-system.svc:15012",
		RootCert:       "/var/run/secrets/istio/root-cert.pem",
		ServerName:     "istiod.istio-system.svc",
		TokenFile:      "/var/run/secrets/tokens/istio-token",
		ClusterID:      "Kubernetes",
		Namespace:      "vm",
		ServiceAccount: "vm-sa",
		CertTTL:        Duration{24 * time.Hour},
		InstanceIPs:    []netip.Addr{},
	}
	if !reflect.DeepEqual(c.Mesh, want) {
		t.Errorf("mesh = %+v\nwant %+v", c.Mesh, want)
	}
	if want := (TLS{TrustBundle: "/etc/meshtun/tls/ca.pem"}); c.TLS != want {
		t.Errorf("tls = %+v, want %+v", c.TLS, want)
	}
	if got, want := c.MeshIdentity(), "spiffe://cluster.local/ns/vm/sa/vm-sa"; got != want {
		t.Errorf("MeshIdentity = %q, want %q", got, want)
	}
}

// A key tagged required is one Validate asks for: taken out of the
// shipped file, each key required in that file's state, and only such a
// key, gives an error at its path. The file is tried as shipped (the mesh
// off) and with its [mesh] section on, so a key tagged if:"mesh" or
// unless:"mesh" is tried where it is required and where it is not.
func TestRequiredKeys(t *testing.T) {
	data, err := os.ReadFile(shippedFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, state := range []struct{ name, doc string }{
		{"mesh off", string(data)},
		{"mesh on", shippedMeshOn(t)},
	} {
		whole, err := Parse([]byte(state.doc), state.name)
		if err != nil {
			t.Fatalf("%s, %s: %v", shippedFile, state.name, err)
		}
		for _, path := range keyPaths() {
			k, _ := lookup(path)
			req := k.requiredIn(whole)
			t.Run(state.name+"/"+path, func(t *testing.T) {
				var tree map[string]any
				if _, err := toml.Decode(state.doc, &tree); err != nil {
					t.Fatal(err)
				}
				at, ok := remove(tree, strings.Split(path, "."), "")
				if !ok {
					if req {
						t.Fatalf("%s (%s) does not set required key %s", shippedFile, state.name, path)
					}
					return // an optional key the file leaves out: nothing to take away
				}
				var out strings.Builder
				if err := toml.NewEncoder(&out).Encode(tree); err != nil {
					t.Fatal(err)
				}
				_, err := Parse([]byte(out.String()), "without")
				var reported bool
				if errs, ok := err.(*Errors); ok {
					for _, e := range errs.List {
						reported = reported || within(e.Path, at)
					}
				} else if err != nil {
					t.Fatal(err)
				}
				switch {
				case req && !reported:
					t.Errorf("without %s the file parses (err %v), but the schema tags the key required here", at, err)
				case !req && reported:
					t.Errorf("without %s: %v; but the schema does not require the key here", at, err)
				}
			})
		}
	}
}

// requiredIn reports whether c must set k.
func (k *key) requiredIn(c *Config) bool {
	return k.required && k.applies(c)
}

// remove deletes the key at path from tree, taking the first entry of an
// array of tables, and returns the concrete path it removed
// ("peers[0].cidrs").
func remove(tree map[string]any, path []string, prefix string) (string, bool) {
	name := path[0]
	here := joinPath(prefix, name)
	v, ok := tree[name]
	if !ok {
		return "", false
	}
	if len(path) == 1 {
		delete(tree, name)
		return here, true
	}
	switch v := v.(type) {
	case map[string]any:
		return remove(v, path[1:], here)
	case []map[string]any:
		if len(v) == 0 {
			return "", false
		}
		return remove(v[0], path[1:], indexPath(here, 0))
	}
	return "", false
}
