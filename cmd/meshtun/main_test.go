package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// validConfig is a minimal config whose certificate files exist in dir.
func validConfig(t *testing.T, dir string) string {
	t.Helper()
	var out bytes.Buffer
	if code := runMain([]string{"certs", "--out", dir, "node-a"}, &out, &out); code != 0 {
		t.Fatalf("certs: exit %d: %s", code, out.String())
	}
	return `version = 1
[gateway]
name = "node-a"
[tls]
cert = "node-a.pem"
key = "node-a-key.pem"
trust_bundle = "ca.pem"
[tun]
routes = ["10.244.2.0/24"]
[[peers]]
name = "node-b"
cidrs = ["10.244.2.0/24"]
address = "192.0.2.2:15008"
identity = "spiffe://cluster.local/ns/meshtun/sa/node-b"
`
}

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	good := validConfig(t, dir)
	tests := []struct {
		name     string
		config   string
		wantCode int
		want     []string // substrings of the output
	}{
		{name: "valid", config: good, wantCode: 0, want: []string{"ok (1 peers"}},
		{name: "unknown key with suggestion", config: strings.Replace(good, "[tun]\n", "[tun]\nmtuu = 1500\n", 1),
			wantCode: 1, want: []string{`tun.mtuu: unknown key (did you mean "mtu"?)`}},
		{name: "syntax error has line and column", config: strings.Replace(good, "[gateway]\n", "[gateway]\nname = = 1\n", 1),
			wantCode: 1, want: []string{".toml:3:8: syntax error"}},
		{name: "all semantic errors at once", config: strings.NewReplacer(
			`routes = ["10.244.2.0/24"]`, "routes = [\"10.244.2.0/33\"]\nmtu = 70000",
			"version = 1", "version = 1",
		).Replace(good), wantCode: 1, want: []string{"tun.routes[0]", "tun.mtu", "576..65535"}},
		{name: "version missing", config: strings.Replace(good, "version = 1\n", "", 1),
			wantCode: 1, want: []string{"version: required"}},
		{name: "version unknown", config: strings.Replace(good, "version = 1\n", "version = 7\n", 1),
			wantCode: 1, want: []string{"version: unsupported version 7"}},
		{name: "missing cert file", config: strings.Replace(good, `cert = "node-a.pem"`, `cert = "nope.pem"`, 1),
			wantCode: 1, want: []string{"tls.cert", "nope.pem", "no such file"}},
		{name: "certificate of another trust domain", config: strings.NewReplacer(
			"[gateway]\n", "[gateway]\ntrust_domain = \"other.example\"\n",
			"spiffe://cluster.local/", "spiffe://other.example/").Replace(good),
			wantCode: 1, want: []string{"not in gateway.trust_domain"}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, "case"+string(rune('a'+i))+".toml")
			if err := os.WriteFile(path, []byte(tt.config), 0o644); err != nil {
				t.Fatal(err)
			}
			var stdout, stderr bytes.Buffer
			code := runMain([]string{"validate", "--config", path}, &stdout, &stderr)
			out := stdout.String() + stderr.String()
			if code != tt.wantCode {
				t.Fatalf("exit %d, want %d; output:\n%s", code, tt.wantCode, out)
			}
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("output does not contain %q:\n%s", w, out)
				}
			}
		})
	}
}

func TestUsage(t *testing.T) {
	var out bytes.Buffer
	if code := runMain(nil, &out, &out); code != 2 || !strings.Contains(out.String(), "validate") {
		t.Fatalf("no args: exit %d, output %q", code, out.String())
	}
	out.Reset()
	if code := runMain([]string{"frobnicate"}, &out, &out); code != 2 || !strings.Contains(out.String(), `unknown command "frobnicate"`) {
		t.Fatalf("unknown command: exit %d, output %q", code, out.String())
	}
	out.Reset()
	if code := runMain([]string{"certs", "--out", t.TempDir(), "x=https://not-spiffe"}, &out, &out); code == 0 {
		t.Fatalf("certs accepted a non-SPIFFE identity: %s", out.String())
	}
}
