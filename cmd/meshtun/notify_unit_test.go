package main

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshtun/meshtun/config"
)

// unitFile is a parsed systemd unit: section → key → values, in order
// (keys may repeat).
type unitFile map[string]map[string][]string

// parseUnit reads the subset of systemd.syntax(7) a unit needs: [Section]
// headers, Key=Value lines, '#' and ';' comments, and lines continued with
// a trailing backslash.
func parseUnit(t *testing.T, path string) unitFile {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	u := unitFile{}
	section, cont := "", ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if cont != "" {
			line, cont = cont+" "+line, ""
		}
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		if strings.HasSuffix(line, `\`) {
			cont = strings.TrimSuffix(line, `\`)
			continue
		}
		if line[0] == '[' && line[len(line)-1] == ']' {
			section = line[1 : len(line)-1]
			if u[section] == nil {
				u[section] = map[string][]string{}
			}
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || section == "" {
			t.Fatalf("%s:%d: not a Key=Value line in a section: %q", path, n, line)
		}
		u[section][strings.TrimSpace(k)] = append(u[section][strings.TrimSpace(k)], strings.TrimSpace(v))
	}
	if cont != "" {
		t.Fatalf("%s: ends inside a continued line", path)
	}
	return u
}

func (u unitFile) one(t *testing.T, section, key string) string {
	t.Helper()
	v := u[section][key]
	if len(v) != 1 {
		t.Errorf("[%s] %s: %d values %q, want exactly one", section, key, len(v), v)
		return ""
	}
	return v[0]
}

// TestSystemdUnit checks examples/systemd/meshtun.service without systemd:
// the settings the service depends on, and every meshtun command line in
// it through the CLI's real flag parsing.
func TestSystemdUnit(t *testing.T) {
	u := parseUnit(t, filepath.Join("..", "..", "examples", "systemd", "meshtun.service"))

	want := []struct{ section, key, value string }{
		{"Unit", "After", "network-online.target"},
		{"Unit", "Wants", "network-online.target"},
		// systemd 249+: READY=1 and the reload protocol (cmd/meshtun/notify.go),
		// the reload signal sent by ExecReload; notify-reload is a drop-in.
		{"Service", "Type", "notify"},
		{"Service", "NotifyAccess", "main"},
		{"Service", "ExecReload", "/bin/kill -HUP $MAINPID"},
		{"Service", "Restart", "on-failure"},
		{"Service", "User", "meshtun"},
		{"Service", "AmbientCapabilities", "CAP_NET_ADMIN"},
		{"Service", "CapabilityBoundingSet", "CAP_NET_ADMIN"},
		{"Service", "NoNewPrivileges", "yes"},
		{"Service", "DevicePolicy", "closed"},
		{"Service", "DeviceAllow", "/dev/net/tun rw"},
		{"Service", "ProtectSystem", "strict"},
		{"Install", "WantedBy", "multi-user.target"},
	}
	for _, w := range want {
		if got := u.one(t, w.section, w.key); got != w.value {
			t.Errorf("[%s] %s=%q, want %q", w.section, w.key, got, w.value)
		}
	}
	// The watchdog is on, and a stop outlasts the drain by the default
	// drain timeout at least.
	if d, err := time.ParseDuration(u.one(t, "Service", "WatchdogSec")); err != nil || d <= 0 {
		t.Errorf("WatchdogSec: %v, %v; want a positive duration", d, err)
	}
	drain := config.Default().Gateway.DrainTimeout.Duration
	if d, err := time.ParseDuration(u.one(t, "Service", "TimeoutStopSec")); err != nil || d < 2*drain {
		t.Errorf("TimeoutStopSec: %v, %v; want at least twice the default drain_timeout %v", d, err, drain)
	}
	// Families the gateway uses: notify socket, TCP, netlink.
	fams := strings.Fields(u.one(t, "Service", "RestrictAddressFamilies"))
	for _, f := range []string{"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"} {
		if !slices.Contains(fams, f) {
			t.Errorf("RestrictAddressFamilies lacks %s: %q", f, fams)
		}
	}
	// /proc/sys must stay writable for net.ipv6.conf.<tun>.disable_ipv6.
	if v := u["Service"]["ProtectKernelTunables"]; len(v) > 0 && v[0] != "no" {
		t.Errorf("ProtectKernelTunables=%s makes /proc/sys read-only; tun.Open may need to enable IPv6 on the device", v[0])
	}
	if v := u["Service"]["PrivateNetwork"]; len(v) > 0 && v[0] != "no" {
		t.Error("PrivateNetwork would put the gateway in a namespace of its own")
	}

	// Every meshtun command line: the command exists, its flags parse,
	// and it gets as far as reading its config (a path that does not
	// exist here, so nothing is started or removed).
	missing := filepath.Join(t.TempDir(), "gateway.toml")
	cmds := map[string]bool{}
	for _, key := range []string{"ExecStartPre", "ExecStart", "ExecStopPost", "ExecReload"} {
		for _, line := range u["Service"][key] {
			args := strings.Fields(strings.TrimLeft(line, "-@:+!"))
			if len(args) == 0 || filepath.Base(args[0]) != "meshtun" {
				continue
			}
			if args[0] != "/usr/local/bin/meshtun" {
				t.Errorf("%s runs %s; the README installs /usr/local/bin/meshtun", key, args[0])
			}
			args = args[1:]
			for i, a := range args {
				if a == "/etc/meshtun/gateway.toml" {
					args[i] = missing
				} else if strings.HasPrefix(a, "/etc/") {
					t.Errorf("%s: unexpected path %s", key, a)
				}
			}
			var out bytes.Buffer
			code := runMain(args, &out, &out)
			if code != 1 || !strings.Contains(out.String(), "no such file") {
				t.Errorf("%s: meshtun %s: exit %d, want 1 with the missing config reported (a bad command or flag fails before reading it):\n%s",
					key, strings.Join(args, " "), code, out.String())
			}
			cmds[args[0]] = true
		}
	}
	for _, c := range []string{"validate", "run", "cleanup"} {
		if !cmds[c] {
			t.Errorf("the unit never runs `meshtun %s`", c)
		}
	}
	if ex := u["Service"]["ExecStopPost"]; len(ex) != 1 || !strings.HasPrefix(ex[0], "-") {
		t.Errorf("ExecStopPost=%q: a failing cleanup must not fail the unit (prefix -)", ex)
	}
}
