package main

import (
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// status and flows against a gateway's admin handler (not started: no
// pool, no flows), and every way of asking wrong.
func TestStatusFlowsCommands(t *testing.T) {
	dir := t.TempDir()
	path, admin := adminTestServer(t, dir)
	run := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := runMain(args, &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}

	code, out, errOut := run("status", "--admin", admin)
	if code != 0 || errOut != "" {
		t.Fatalf("status: exit %d, stderr %q", code, errOut)
	}
	for _, want := range []string{"identity:", "certificate: from file, expires in", "istiod:      off",
		"workloads:", "file ", "flows:       0 outbound, 0 inbound open", "hbone pool:  0 connections"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	code, out, errOut = run("flows", "--admin", admin)
	if code != 0 || errOut != "" || !strings.Contains(out, "no flows listed: 0 relayed, 0 being set up") {
		t.Errorf("flows: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if code, out, _ = run("status", "--admin", admin, "--json"); code != 0 || !strings.HasPrefix(out, "{") || !strings.Contains(out, `"identity"`) {
		t.Errorf("status --json: exit %d:\n%s", code, out)
	}

	notFound := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(notFound.Close)
	garbage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("[1, 2")) }))
	t.Cleanup(garbage.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := ln.Addr().String()
	ln.Close()
	host := func(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }
	noAdmin := filepath.Join(dir, "no-admin.toml")
	if err := os.WriteFile(noAdmin, []byte(routeConfig(t, dir)+"\n[admin]\nlisten = \"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"both", []string{"status", "--admin", admin, "--config", path}, 2, "--admin and --config exclude each other"},
		{"an argument", []string{"flows", "--admin", admin, "extra"}, 2, `unexpected argument "extra"`},
		{"limit out of range", []string{"flows", "--admin", admin, "--limit", "5000"}, 2, "--limit 5000"},
		{"bad address", []string{"status", "--admin", "127.0.0.1"}, 2, `admin listener "127.0.0.1": not host:port`},
		{"listener down", []string{"status", "--admin", down}, 2, "admin listener " + down + ": cannot ask it"},
		{"404", []string{"flows", "--admin", host(notFound)}, 2, "GET /flows answered 404 Not Found (not a meshtun admin listener, or one too old to have /flows)"},
		{"garbage", []string{"status", "--admin", host(garbage)}, 2, "the answer to GET /status is not a status"},
		{"no config file", []string{"status", "--config", filepath.Join(dir, "missing.toml")}, 2, "missing.toml"},
		{"admin off", []string{"status", "--config", noAdmin}, 2, "admin.listen is empty"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := run(tt.args...)
			if code != tt.code || stdout != "" || !strings.Contains(stderr, tt.want) {
				t.Errorf("exit %d (want %d), stdout %q, stderr %q (want %q)", code, tt.code, stdout, stderr, tt.want)
			}
		})
	}
}
