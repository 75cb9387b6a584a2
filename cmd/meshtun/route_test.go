package main

import (
	"bytes"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshtun/meshtun/gateway"
)

// routeConfig is validConfig with services, workloads and an IPv6 peer.
func routeConfig(t *testing.T, dir string) string {
	t.Helper()
	return strings.Replace(validConfig(t, dir), `routes = ["10.244.2.0/24"]`, `routes = ["10.244.2.0/24", "10.96.0.0/16", "fd00:10:244:2::/64"]`, 1) +
		`
[[peers]]
name = "node-b6"
cidrs = ["fd00:10:244:2::/64"]
address = "[2001:db8::2]:15008"
identity = "spiffe://cluster.local/ns/meshtun/sa/node-b"

[[workloads]]
name = "web"
namespace = "default"
service_account = "web"
addresses = ["10.244.2.5"]
hbone_address = "192.0.2.2:15008"

[[workloads]]
name = "web2"
namespace = "default"
service_account = "web"
addresses = ["10.244.2.6"]

[[workloads]]
name = "legacy"
namespace = "default"
service_account = "legacy"
addresses = ["10.244.2.7"]
protocol = "TCP"

[[services]]
name = "web"
namespace = "default"
hostname = "web.default.svc.cluster.local"
vips = ["10.96.0.10"]
ports = { 80 = 8080 }
endpoints = ["default/web", "default/web2"]
subject_alt_names = ["spiffe://cluster.local/ns/default/sa/web-canary"]

[[services]]
name = "db"
namespace = "default"
vips = ["10.96.0.20"]
ports = { 5432 = 5432 }
endpoints = ["default/legacy"]
`
}

func TestRouteCommand(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gateway.toml")
	if err := os.WriteFile(cfg, []byte(routeConfig(t, dir)), 0o644); err != nil {
		t.Fatal(err)
	}
	broken := filepath.Join(dir, "broken.toml")
	if err := os.WriteFile(broken, []byte("version = 1\n[tun]\nmtuu = 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		args     []string
		wantCode int
		want     []string // substrings of stdout+stderr
		dont     []string
	}{
		{name: "service, first endpoint", args: []string{"--config", cfg, "10.96.0.10:80"}, wantCode: 0, want: []string{
			"destination: 10.96.0.10:80", "service:     default/web (web.default.svc.cluster.local)",
			"endpoint:    default/web (1 of 2; the gateway takes them in turn)", "mode:        HBONE",
			"hbone:       192.0.2.2:15008", "authority:   10.244.2.5:8080",
			"identities:  spiffe://cluster.local/ns/default/sa/web, spiffe://cluster.local/ns/default/sa/web-canary",
			`forwarded:   for="<client ip:port>";host=web.default.svc.cluster.local`}, dont: []string{"note:"}},
		{name: "service, second endpoint, flag after the destination", args: []string{"--config", cfg, "10.96.0.10:80", "--endpoint", "1"}, wantCode: 0, want: []string{
			"endpoint:    default/web2 (2 of 2", "hbone:       10.244.2.6:15008", "authority:   10.244.2.6:8080"}},
		{name: "service port not declared", args: []string{"--config", cfg, "10.96.0.10:81"}, wantCode: 1, want: []string{
			"service:     default/web", "denied:      service default/web has no port 81 (its ports: 80)"}, dont: []string{"authority:"}},
		{name: "TCP workload behind a service is direct", args: []string{"--config", cfg, "10.96.0.20:5432"}, wantCode: 0, want: []string{
			"endpoint:    default/legacy (1 of 1)", "mode:        direct TCP", "target:      10.244.2.7:5432"}, dont: []string{"hbone:"}},
		{name: "workload", args: []string{"--config", cfg, "10.244.2.5:9000"}, wantCode: 0, want: []string{
			"via:         workload default/web", "authority:   10.244.2.5:9000", "identities:  spiffe://cluster.local/ns/default/sa/web\n", `forwarded:   for="<client ip:port>"` + "\n"}},
		{name: "peer CIDR", args: []string{"--config", cfg, "10.244.2.77:443"}, wantCode: 0, want: []string{
			"via:         peer node-b", "hbone:       192.0.2.2:15008", "authority:   10.244.2.77:443"}},
		{name: "IPv6 peer", args: []string{"--config", cfg, "[fd00:10:244:2::9]:80"}, wantCode: 0, want: []string{
			"via:         peer node-b6", "hbone:       [2001:db8::2]:15008", "authority:   [fd00:10:244:2::9]:80"}},
		{name: "no route", args: []string{"--config", cfg, "172.16.0.1:80"}, wantCode: 1, want: []string{
			"denied:      no service, workload or peer route matches", "note:        172.16.0.1 is in none of tun.routes"}},
		{name: "no destination", args: []string{"--config", cfg}, wantCode: 2, want: []string{"want one destination", "usage: meshtun route"}},
		{name: "two destinations", args: []string{"--config", cfg, "10.96.0.10:80", "10.96.0.10:81"}, wantCode: 2, want: []string{"got 2 arguments"}},
		{name: "service by name", args: []string{"--config", cfg, "web.default.svc.cluster.local:80"}, wantCode: 0, want: []string{
			"name:        web.default.svc.cluster.local\ndestination: 10.96.0.10:80\n", "endpoint:    default/web (1 of 2"}},
		{name: "service by short name", args: []string{"--config", cfg, "web.default:80"}, wantCode: 0, want: []string{
			"name:        web.default\ndestination: 10.96.0.10:80\n"}},
		{name: "name of no service", args: []string{"--config", cfg, "nope.default:80"}, wantCode: 1, want: []string{
			`no service in force has the hostname "nope.default"`}},
		{name: "not IP:PORT", args: []string{"--config", cfg, "web.default"}, wantCode: 2, want: []string{`"web.default" is not IP:PORT or NAME:PORT`}},
		{name: "no port", args: []string{"--config", cfg, "10.96.0.10"}, wantCode: 2, want: []string{"is not IP:PORT"}},
		{name: "port 0", args: []string{"--config", cfg, "10.96.0.10:0"}, wantCode: 2, want: []string{"is not IP:PORT"}},
		{name: "unknown flag", args: []string{"--confg", cfg, "10.96.0.10:80"}, wantCode: 2, want: []string{"flag provided but not defined"}},
		{name: "negative endpoint", args: []string{"--config", cfg, "--endpoint", "-1", "10.96.0.10:80"}, wantCode: 2, want: []string{"must be 0 or more"}},
		{name: "config that does not load", args: []string{"--config", broken, "10.96.0.10:80"}, wantCode: 1, want: []string{"tun.mtuu: unknown key"}},
		{name: "missing config", args: []string{"--config", filepath.Join(dir, "nope.toml"), "10.96.0.10:80"}, wantCode: 1, want: []string{"nope.toml"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			code := runMain(append([]string{"route"}, tt.args...), &out, &out)
			if code != tt.wantCode {
				t.Fatalf("exit %d, want %d; output:\n%s", code, tt.wantCode, out.String())
			}
			for _, w := range tt.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output does not contain %q:\n%s", w, out.String())
				}
			}
			for _, d := range tt.dont {
				if strings.Contains(out.String(), d) {
					t.Errorf("output contains %q:\n%s", d, out.String())
				}
			}
		})
	}
}

// route --admin prints, for a running gateway's admin handler, exactly
// what route --config prints for the same config, with the same status.
// adminTestServer serves the admin handler of a gateway made (not
// started) from routeConfig in dir, and returns the config's path and
// the server's host:port.
func adminTestServer(t *testing.T, dir string) (path, admin string) {
	t.Helper()
	path = filepath.Join(dir, "gateway.toml")
	if err := os.WriteFile(path, []byte(routeConfig(t, dir)), 0o644); err != nil {
		t.Fatal(err)
	}
	g, _, err := check(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(g.AdminHandler())
	t.Cleanup(srv.Close)
	return path, strings.TrimPrefix(srv.URL, "http://")
}

func TestRouteAdmin(t *testing.T) {
	path, admin := adminTestServer(t, t.TempDir())

	run := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := runMain(append([]string{"route"}, args...), &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}
	for _, dst := range [][]string{
		{"10.96.0.10:80"}, {"10.96.0.10:80", "--endpoint", "1"}, {"10.96.0.10:80", "--endpoint", "3"},
		{"10.96.0.10:81"}, {"10.96.0.20:5432"}, {"10.244.2.5:9000"}, {"10.244.2.77:443"},
		{"[fd00:10:244:2::9]:80"}, {"172.16.0.1:80"}, {"web.default.svc.cluster.local:80"}, {"web.default:80", "--endpoint", "1"},
	} {
		t.Run(strings.Join(dst, " "), func(t *testing.T) {
			fileCode, fileOut, fileErr := run(append([]string{"--config", path}, dst...)...)
			adminCode, adminOut, adminErr := run(append([]string{"--admin", admin}, dst...)...)
			if fileErr != "" || adminErr != "" {
				t.Fatalf("stderr: --config %q, --admin %q", fileErr, adminErr)
			}
			if fileOut == "" || adminOut != fileOut || adminCode != fileCode {
				t.Errorf("--admin (exit %d):\n%s\n--config (exit %d):\n%s", adminCode, adminOut, fileCode, fileOut)
			}
		})
	}

	// Answers that are not a plan.
	notFound := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(notFound.Close)
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/route" || r.URL.Query().Get("dst") != "10.96.0.10:80" || r.URL.Query().Get("endpoint") != "0" {
			http.Error(w, "unexpected request "+r.URL.String(), http.StatusTeapot)
			return
		}
		w.Write([]byte(`{"destination": "10.96.0.10:80", "kind": `))
	}))
	t.Cleanup(broken.Close)
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "route: something broke", http.StatusInternalServerError)
	}))
	t.Cleanup(failing.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := ln.Addr().String()
	ln.Close()
	host := func(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }

	for _, tt := range []struct {
		name string
		args []string
		want []string // substrings of stderr
	}{
		{"both --admin and --config", []string{"--admin", admin, "--config", path, "10.96.0.10:80"}, []string{"--admin and --config exclude each other"}},
		{"--config after the destination, too", []string{"--admin", admin, "10.96.0.10:80", "--config", path}, []string{"--admin and --config exclude each other"}},
		{"no port", []string{"--admin", "127.0.0.1", "10.96.0.10:80"}, []string{`--admin "127.0.0.1": not host:port`}},
		{"a URL", []string{"--admin", "http://127.0.0.1:15000", "10.96.0.10:80"}, []string{`--admin "http://127.0.0.1:15000"`}},
		{"port out of range", []string{"--admin", "127.0.0.1:99999", "10.96.0.10:80"}, []string{`port "99999" is not a number from 1 to 65535`}},
		{"empty", []string{"--admin", "", "10.96.0.10:80"}, []string{`--admin "": not host:port`}},
		{"listener down", []string{"--admin", down, "10.96.0.10:80"}, []string{"admin listener " + down + ": cannot ask it", "connection refused"}},
		{"404", []string{"--admin", host(notFound), "10.96.0.10:80"}, []string{"admin listener " + host(notFound) + ": GET /route answered 404 Not Found (not a meshtun admin listener"}},
		{"500", []string{"--admin", host(failing), "10.96.0.10:80"}, []string{"admin listener " + host(failing) + ": GET /route answered 500 Internal Server Error: route: something broke"}},
		{"not a plan", []string{"--admin", host(broken), "10.96.0.10:80"}, []string{"admin listener " + host(broken) + ": the answer to GET /route is not a plan"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := run(tt.args...)
			if code != 2 || stdout != "" {
				t.Errorf("exit %d, stdout %q; want 2 and nothing", code, stdout)
			}
			for _, w := range tt.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr does not contain %q:\n%s", w, stderr)
				}
			}
		})
	}
}

// TestRouteWithoutCertificates runs the real binary: `meshtun route
// --config` answers from the config alone, while the certificate files it
// names do not exist (validate, which needs them, refuses the same file).
func TestRouteWithoutCertificates(t *testing.T) {
	dir := t.TempDir()
	bin := buildMeshtun(t, dir)
	certs := t.TempDir()
	cfg := routeConfig(t, certs) // certificates made in a directory the config does not point to
	path := filepath.Join(dir, "gateway.toml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"node-a.pem", "node-a-key.pem", "ca.pem"} {
		if _, err := os.Stat(filepath.Join(dir, f)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s beside the config: %v, want none", f, err)
		}
	}
	out, err := exec.Command(bin, "route", "--config", path, "10.96.0.10:80").CombinedOutput()
	if err != nil {
		t.Fatalf("meshtun route without the certificate files: %v\n%s", err, out)
	}
	for _, w := range []string{"service:     default/web", "hbone:       192.0.2.2:15008", "authority:   10.244.2.5:8080"} {
		if !strings.Contains(string(out), w) {
			t.Errorf("route output does not contain %q:\n%s", w, out)
		}
	}
	out, err = exec.Command(bin, "validate", "--config", path).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "tls.cert") {
		t.Errorf("meshtun validate of the same file: %v, want exit 1 naming tls.cert:\n%s", err, out)
	}
	// A config with an error is still refused, with its key path.
	bad := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(bad, []byte(strings.Replace(cfg, `cidrs = ["10.244.2.0/24"]`, `cidrs = ["10.244.2.0/33"]`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command(bin, "route", "--config", bad, "10.96.0.10:80").CombinedOutput()
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "peers[0].cidrs[0]") {
		t.Errorf("meshtun route of a broken config: %v, want exit 1 naming peers[0].cidrs[0]:\n%s", err, out)
	}
}

// A plan through a network gateway prints both hops.
func TestPrintPlanDoubleHBONE(t *testing.T) {
	ap := netip.MustParseAddrPort
	var out bytes.Buffer
	printPlan(&out, gateway.RouteAnswer{Plan: gateway.Plan{
		Kind: gateway.HBONE, Dst: ap("10.96.0.40:80"), Target: ap("10.9.0.2:8080"), HBONEAddress: ap("10.9.0.2:15008"),
		Identities: []string{"spiffe://cluster.local/ns/default/sa/web"}, Via: "service default/web", Service: "default/web",
		Host: "web.default.svc.cluster.local", Authority: "web.default.svc.cluster.local:80",
		Gateway: &gateway.GatewayHop{Name: "istio-system/ew", Network: "net-2", Address: ap("203.0.113.10:15008"),
			Identities: []string{"spiffe://cluster.local/ns/istio-system/sa/ew"}, Instances: 1},
	}})
	for _, want := range []string{
		`mode:        double HBONE, through network "net-2"'s gateway`,
		"gateway:     istio-system/ew (1 of 1)",
		"outer hbone: 203.0.113.10:15008",
		"outer ids:   spiffe://cluster.local/ns/istio-system/sa/ew",
		"authority:   web.default.svc.cluster.local:80 (outer and inner)",
		"inner ids:   spiffe://cluster.local/ns/default/sa/web",
		"target:      10.9.0.2:8080 (its HBONE at 10.9.0.2:15008, reached by the gateway)",
	} {
		if !strings.Contains(out.String(), want+"\n") {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
