package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
		{name: "not IP:PORT", args: []string{"--config", cfg, "web.default:80"}, wantCode: 2, want: []string{`"web.default:80" is not IP:PORT`}},
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
