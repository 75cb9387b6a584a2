package config

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeFiles creates name → content under dir.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"tls/cert.pem": "cert",
		"tls/key.pem":  "key",
		"tls/ca.pem":   "ca",
	})
	for _, tc := range []struct {
		name string
		tls  string
		want []string // whole lines of the error, with DIR for dir; none: success
	}{
		{
			name: "relative paths",
			tls:  "cert = \"tls/cert.pem\"\nkey = \"./tls/key.pem\"\ntrust_bundle = \"tls/ca.pem\"\n",
		},
		{
			name: "absolute paths",
			tls:  "cert = \"DIR/tls/cert.pem\"\nkey = \"DIR/tls/key.pem\"\ntrust_bundle = \"DIR/tls/ca.pem\"\n",
		},
		{
			name: "missing cert",
			tls:  "cert = \"tls/missing.pem\"\nkey = \"tls/key.pem\"\ntrust_bundle = \"tls/ca.pem\"\n",
			want: []string{"DIR/gateway.toml: tls.cert: open DIR/tls/missing.pem: no such file or directory"},
		},
		{
			name: "all missing, with other problems",
			tls:  "cert = \"a.pem\"\nkey = \"/nonexistent/b.pem\"\ntrust_bundle = \"tls\"\n[tun]\nmtu = 1\n",
			want: []string{
				"DIR/gateway.toml: tls.cert: open DIR/a.pem: no such file or directory",
				"DIR/gateway.toml: tls.key: open /nonexistent/b.pem: no such file or directory",
				"DIR/gateway.toml: tls.trust_bundle: open DIR/tls: is a directory, not a PEM file",
				"DIR/gateway.toml: tun.mtu: 1 is out of range (576..65535)",
			},
		},
		{
			name: "empty path is reported once",
			tls:  "cert = \"\"\nkey = \"tls/key.pem\"\ntrust_bundle = \"tls/ca.pem\"\n",
			want: []string{"DIR/gateway.toml: tls.cert: required: the path of this gateway's certificate chain (PEM)"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, "gateway.toml")
			doc := "version = 1\n[tls]\n" + strings.ReplaceAll(tc.tls, "DIR", dir)
			writeFiles(t, dir, map[string]string{"gateway.toml": doc})
			c, err := Load(path)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Load: %v", err)
				}
				want := TLS{
					Cert:        filepath.Join(dir, "tls/cert.pem"),
					Key:         filepath.Join(dir, "tls/key.pem"),
					TrustBundle: filepath.Join(dir, "tls/ca.pem"),
				}
				if c.TLS != want {
					t.Errorf("tls = %+v, want %+v", c.TLS, want)
				}
				return
			}
			var errs *Errors
			if !errors.As(err, &errs) {
				t.Fatalf("Load = %v, want *Errors", err)
			}
			got := strings.Split(errs.Error(), "\n")
			var want []string
			for _, w := range tc.want {
				want = append(want, strings.ReplaceAll(w, "DIR", dir))
			}
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}

func TestLoadUnreadableConfig(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "absent.toml"))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Load of a missing file = %v, want fs.ErrNotExist", err)
	}
}
