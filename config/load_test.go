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

// With the mesh on, Load resolves and checks mesh.root_cert and
// mesh.token_file (and tls.trust_bundle if set), not tls.cert or tls.key;
// with it off, the mesh's files are not checked at all.
func TestLoadMesh(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"istio/root-cert.pem": "root",
		"istio/token":         "jwt",
		"tls/cert.pem":        "cert",
		"tls/key.pem":         "key",
		"tls/ca.pem":          "ca",
	})
	if err := os.Mkdir(filepath.Join(dir, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	const on = "xds_address = \"istiod.istio-system.svc:15012\"\nnamespace = \"vm\"\nservice_account = \"vm-sa\"\n"
	const files = "root_cert = \"istio/root-cert.pem\"\ntoken_file = \"DIR/istio/token\"\n"
	const tlsFiles = "[tls]\ncert = \"tls/cert.pem\"\nkey = \"tls/key.pem\"\ntrust_bundle = \"tls/ca.pem\"\n"
	for _, tc := range []struct {
		name     string
		doc      string   // after version = 1, with DIR for dir
		want     []string // whole lines of the error; none: success
		wantMesh Mesh     // on success: root_cert, token_file
		wantTLS  TLS
	}{
		{
			name:     "mesh on, files present",
			doc:      "[mesh]\n" + on + files,
			wantMesh: Mesh{RootCert: "DIR/istio/root-cert.pem", TokenFile: "DIR/istio/token"},
		},
		{
			name:     "mesh on, extra roots",
			doc:      "[tls]\ntrust_bundle = \"tls/ca.pem\"\n[mesh]\n" + on + files,
			wantMesh: Mesh{RootCert: "DIR/istio/root-cert.pem", TokenFile: "DIR/istio/token"},
			wantTLS:  TLS{TrustBundle: "DIR/tls/ca.pem"},
		},
		{
			name: "mesh on, files missing",
			doc:  "[tls]\ntrust_bundle = \"gone.pem\"\n[mesh]\n" + on + "root_cert = \"missing.pem\"\ntoken_file = \"dir\"\n",
			want: []string{
				"DIR/gateway.toml: tls.trust_bundle: open DIR/gone.pem: no such file or directory",
				"DIR/gateway.toml: mesh.root_cert: open DIR/missing.pem: no such file or directory",
				"DIR/gateway.toml: mesh.token_file: open DIR/dir: is a directory, not a token file",
			},
		},
		{
			name: "mesh on, absolute paths",
			doc:  "[mesh]\n" + on + "root_cert = \"/nonexistent/root-cert.pem\"\ntoken_file = \"/nonexistent/istio-token\"\n",
			want: []string{
				"DIR/gateway.toml: mesh.root_cert: open /nonexistent/root-cert.pem: no such file or directory",
				"DIR/gateway.toml: mesh.token_file: open /nonexistent/istio-token: no such file or directory",
			},
		},
		{
			name: "mesh on, tls cert and key named are not read",
			doc:  "[tls]\ncert = \"gone.pem\"\nkey = \"gone.pem\"\n[mesh]\n" + on + files,
			want: []string{
				"DIR/gateway.toml: tls.cert: with [mesh] on, this gateway's certificate comes from Istio's CA (mesh.ca_address): remove tls.cert",
				"DIR/gateway.toml: tls.key: with [mesh] on, this gateway's key is made in memory for the certificate Istio's CA issues: remove tls.key",
			},
		},
		{
			name:     "mesh off, its files are not checked",
			doc:      tlsFiles + "[mesh]\nnamespace = \"vm\"\nroot_cert = \"missing.pem\"\ntoken_file = \"dir\"\n",
			wantMesh: Mesh{RootCert: "DIR/missing.pem", TokenFile: "DIR/dir"},
			wantTLS:  TLS{Cert: "DIR/tls/cert.pem", Key: "DIR/tls/key.pem", TrustBundle: "DIR/tls/ca.pem"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dirOf := func(s string) string { return strings.ReplaceAll(s, "DIR", dir) }
			path := filepath.Join(dir, "gateway.toml")
			writeFiles(t, dir, map[string]string{"gateway.toml": "version = 1\n" + dirOf(tc.doc)})
			c, err := Load(path)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Load: %v", err)
				}
				if want := dirOf(tc.wantMesh.RootCert); c.Mesh.RootCert != want {
					t.Errorf("mesh.root_cert = %q, want %q", c.Mesh.RootCert, want)
				}
				if want := dirOf(tc.wantMesh.TokenFile); c.Mesh.TokenFile != want {
					t.Errorf("mesh.token_file = %q, want %q", c.Mesh.TokenFile, want)
				}
				want := TLS{Cert: dirOf(tc.wantTLS.Cert), Key: dirOf(tc.wantTLS.Key), TrustBundle: dirOf(tc.wantTLS.TrustBundle)}
				if c.TLS != want {
					t.Errorf("tls = %+v, want %+v", c.TLS, want)
				}
				return
			}
			var errs *Errors
			if !errors.As(err, &errs) {
				t.Fatalf("Load = %v, want *Errors", err)
			}
			var want []string
			for _, w := range tc.want {
				want = append(want, dirOf(w))
			}
			if got := errs.Error(); got != strings.Join(want, "\n") {
				t.Errorf("errors:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
			}
		})
	}
}

// The mesh on and its paths left out, Load checks Istio's default places:
// each one missing on this machine is an error naming its key and path,
// one that exists is none.
func TestLoadMeshDefaultPaths(t *testing.T) {
	d := Default().Mesh
	path := filepath.Join(t.TempDir(), "gateway.toml")
	writeFiles(t, filepath.Dir(path), map[string]string{"gateway.toml": meshFile()})
	var want []string
	for _, f := range []struct{ key, path string }{{"mesh.root_cert", d.RootCert}, {"mesh.token_file", d.TokenFile}} {
		if _, err := os.Stat(f.path); err != nil {
			want = append(want, path+": "+f.key+": open "+f.path+": no such file or directory")
		}
	}
	_, err := Load(path)
	if len(want) == 0 {
		if err != nil {
			t.Fatalf("Load with both default files present = %v, want nil", err)
		}
		return
	}
	var errs *Errors
	if !errors.As(err, &errs) {
		t.Fatalf("Load = %v, want *Errors", err)
	}
	if got := errs.Error(); got != strings.Join(want, "\n") {
		t.Errorf("errors:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
}
