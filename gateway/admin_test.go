package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	"github.com/hashicorp/go-hclog"

	"github.com/meshtun/meshtun/config"
)

func adminServer(t *testing.T, cfg *config.Config, log hclog.Logger) *httptest.Server {
	t.Helper()
	g := &Gateway{cfg: cfg, log: log, metrics: newMetrics()}
	g.cur.Store(newSnapshot(cfg, nil))
	srv := httptest.NewServer(g.adminHandler())
	t.Cleanup(srv.Close)
	return srv
}

func do(t *testing.T, method, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// The dump uses gateway.toml's keys: written back as TOML, it parses
// (strictly: an unknown key is an error) to the very config it came from.
func TestConfigDumpRoundTrip(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "config", "testdata", "gateway-example.toml"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	keyPath := filepath.Join(dir, "key.pem")
	const keyPEM = "-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n"
	if err := os.WriteFile(keyPath, []byte(keyPEM), 0o600); err != nil {
		t.Fatal(err)
	}
	data = bytes.Replace(data, []byte(`"/etc/meshtun/tls/key.pem"`), []byte(`"`+keyPath+`"`), 1)
	cfg, err := config.Parse(data, "gateway-example.toml")
	if err != nil {
		t.Fatal(err)
	}
	srv := adminServer(t, cfg, hclog.NewNullLogger())

	code, body := do(t, http.MethodGet, srv.URL+"/config_dump")
	if code != http.StatusOK {
		t.Fatalf("GET /config_dump: %d %s", code, body)
	}
	if strings.Contains(body, "PRIVATE KEY") || strings.Contains(body, "c2VjcmV0") {
		t.Fatalf("the dump contains key material:\n%s", body)
	}
	if !strings.Contains(body, keyPath) {
		t.Errorf("the dump lacks the key's path %s", keyPath)
	}

	dec := json.NewDecoder(strings.NewReader(body))
	dec.UseNumber()
	var tree map[string]any
	if err := dec.Decode(&tree); err != nil {
		t.Fatalf("the dump is not JSON: %v\n%s", err, body)
	}
	var out bytes.Buffer
	if err := toml.NewEncoder(&out).Encode(tomlTree(tree)); err != nil {
		t.Fatal(err)
	}
	back, err := config.Parse(out.Bytes(), "dump")
	if err != nil {
		t.Fatalf("the dump, written as TOML, does not parse: %v\n%s", err, out.String())
	}
	// Compared through the dump: the decoder gives an absent list as
	// nil, an empty one as [].
	if !reflect.DeepEqual(config.Dump(back), config.Dump(cfg)) {
		t.Errorf("the dump parses to another config:\n got %+v\nwant %+v", back, cfg)
	}
}

// tomlTree makes a decoded dump encodable as TOML: JSON numbers become
// integers, and empty strings (unset addresses) and nulls are left out,
// as an operator's file would leave them out.
func tomlTree(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range v {
			if s, ok := e.(string); (ok && s == "") || e == nil {
				continue
			}
			out[k] = tomlTree(e)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = tomlTree(e)
		}
		// A list of tables is an array of tables for the encoder.
		if len(out) > 0 {
			if _, ok := out[0].(map[string]any); ok {
				ts := make([]map[string]any, len(out))
				for i, e := range out {
					ts[i] = e.(map[string]any)
				}
				return ts
			}
		}
		return out
	case json.Number:
		n, err := v.Int64()
		if err != nil {
			return v.String()
		}
		return n
	}
	return v
}

func TestLogging(t *testing.T) {
	var out bytes.Buffer
	root := hclog.New(&hclog.LoggerOptions{Name: "meshtun", Level: hclog.Info, Output: &out})
	access := root.Named("access")
	srv := adminServer(t, config.Default(), root.Named("gateway"))

	if code, body := do(t, http.MethodGet, srv.URL+"/logging"); code != http.StatusOK || body != "level: info\n" {
		t.Fatalf("GET /logging: %d %q, want 200 \"level: info\"", code, body)
	}
	if access.IsDebug() {
		t.Fatal("debug enabled before the change")
	}
	for _, method := range []string{http.MethodPost, http.MethodPut} {
		if code, body := do(t, method, srv.URL+"/logging?level=debug"); code != http.StatusOK || body != "level: debug\n" {
			t.Fatalf("%s /logging?level=debug: %d %q", method, code, body)
		}
	}
	// Every logger of the process follows, not only the gateway's.
	if !root.IsDebug() || !access.IsDebug() {
		t.Error("after level=debug the root and the access logger are not at debug")
	}
	if !strings.Contains(out.String(), "log level changed") {
		t.Errorf("the change was not logged: %q", out.String())
	}
	if code, body := do(t, http.MethodGet, srv.URL+"/logging"); body != "level: debug\n" {
		t.Errorf("GET /logging after the change: %d %q", code, body)
	}

	for _, bad := range []string{"", "?level=", "?level=loud", "?level=off"} {
		code, body := do(t, http.MethodPost, srv.URL+"/logging"+bad)
		if code != http.StatusBadRequest || !strings.Contains(body, "trace, debug, info, warn, error") {
			t.Errorf("POST /logging%s: %d %q, want 400 naming the levels", bad, code, body)
		}
	}
	if code, _ := do(t, http.MethodDelete, srv.URL+"/logging"); code != http.StatusMethodNotAllowed {
		t.Errorf("DELETE /logging: %d, want 405", code)
	}
	if root.GetLevel() != hclog.Debug {
		t.Errorf("a refused change moved the level to %s", root.GetLevel())
	}
}

func TestAdminKeepsPprof(t *testing.T) {
	srv := adminServer(t, config.Default(), hclog.NewNullLogger())
	if code, body := do(t, http.MethodGet, srv.URL+"/debug/pprof/"); code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Errorf("GET /debug/pprof/: %d", code)
	}
}
