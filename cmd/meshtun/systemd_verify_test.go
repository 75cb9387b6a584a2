package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// systemdAnalyze finds systemd-analyze (package systemd).
func systemdAnalyze(t *testing.T) string { return needTool(t, "systemd-analyze", "systemd") }

// systemdVersion is the major version systemd-analyze reports
// ("systemd 252 (252.38-1~deb12u1)").
func systemdVersion(t *testing.T, analyze string) int {
	t.Helper()
	out, err := exec.Command(analyze, "--version").Output()
	if err != nil {
		t.Fatalf("systemd-analyze --version: %v", err)
	}
	f := strings.Fields(string(out))
	if len(f) < 2 || f[0] != "systemd" {
		t.Fatalf("systemd-analyze --version: %q", out)
	}
	v, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatalf("systemd-analyze --version: %q: %v", out, err)
	}
	return v
}

// verifyUnit copies examples/systemd/meshtun.service into a directory of
// its own, with /usr/local/bin/meshtun replaced by this test's own
// executable (verify checks that every Exec*= command exists and is
// executable, and meshtun is not installed here; the command lines
// themselves go through the CLI in TestSystemdUnit), and with the drop-in
// of dropIn, if not empty, in meshtun.service.d/. It runs `systemd-analyze
// verify` on it and returns everything it printed.
func verifyUnit(t *testing.T, analyze, dropIn string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	unit, err := os.ReadFile(filepath.Join("..", "..", "examples", "systemd", "meshtun.service"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "meshtun.service")
	if err := os.WriteFile(path, bytes.ReplaceAll(unit, []byte("/usr/local/bin/meshtun"), []byte(self)), 0o644); err != nil {
		t.Fatal(err)
	}
	if dropIn != "" {
		b, err := os.ReadFile(filepath.Join("..", "..", "examples", "systemd", dropIn))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(path+".d", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(path+".d", dropIn), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(analyze, "verify", path)
	// The unit's directory first, then systemd's own (the trailing ':'):
	// verify reads drop-ins from <dir>/meshtun.service.d/ of the search
	// path, and finds the targets the unit names in the system's.
	cmd.Env = append(os.Environ(), "SYSTEMD_UNIT_PATH="+dir+":", "SYSTEMD_LOG_COLOR=0")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out.String())
	}
	return strings.ReplaceAll(out.String(), dir, "<dir>")
}

// TestSystemdVerify runs `systemd-analyze verify` on the shipped unit:
// the unit works on the systemd of today's fleets (249 and later), so
// any complaint at all fails the test.
func TestSystemdVerify(t *testing.T) {
	analyze := systemdAnalyze(t)
	if out := verifyUnit(t, analyze, ""); out != "" {
		t.Errorf("systemd-analyze verify meshtun.service (systemd %d) is not clean:\n%s", systemdVersion(t, analyze), out)
	}
}

// notifyReloadRejected is what systemd before 253 says of the drop-in's
// two keys, and nothing else.
var notifyReloadRejected = []*regexp.Regexp{
	regexp.MustCompile(`^<dir>/meshtun\.service\.d/meshtun-notify-reload\.conf:\d+: Failed to parse service type, ignoring: notify-reload$`),
	regexp.MustCompile(`^<dir>/meshtun\.service\.d/meshtun-notify-reload\.conf:\d+: Unknown key 'ReloadSignal' in section \[Service\], ignoring\.$`),
}

// TestSystemdVerifyDropIn verifies the unit with the notify-reload
// drop-in: clean on systemd 253 and later; before, systemd must read the
// drop-in (it complains of exactly its two keys, which it does not know)
// and find nothing else wrong.
func TestSystemdVerifyDropIn(t *testing.T) {
	analyze := systemdAnalyze(t)
	out := verifyUnit(t, analyze, "meshtun-notify-reload.conf")
	v := systemdVersion(t, analyze)
	if v >= 253 {
		if out != "" {
			t.Errorf("systemd-analyze verify with the drop-in (systemd %d) is not clean:\n%s", v, out)
		}
		return
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) != len(notifyReloadRejected) {
		t.Fatalf("systemd %d, verify with the drop-in: want exactly its two unknown keys reported, got:\n%s", v, out)
	}
	for i, re := range notifyReloadRejected {
		if !re.MatchString(lines[i]) {
			t.Errorf("systemd %d, line %d: %q, want %v", v, i, lines[i], re)
		}
	}
}

// TestSystemdDropIn checks the drop-in's settings: notify-reload with
// SIGHUP, and the unit's ExecReload= cleared.
func TestSystemdDropIn(t *testing.T) {
	d := parseUnit(t, filepath.Join("..", "..", "examples", "systemd", "meshtun-notify-reload.conf"))
	for k, want := range map[string]string{"Type": "notify-reload", "ReloadSignal": "SIGHUP", "ExecReload": ""} {
		if got := d.one(t, "Service", k); got != want {
			t.Errorf("[Service] %s=%q, want %q", k, got, want)
		}
	}
	if len(d) != 1 {
		t.Errorf("the drop-in has sections %v, want [Service] only", d)
	}
}

// TestSystemdReadme keeps examples/systemd/README.md true to the code:
// each STATUS= line it lists is one the gateway sends (its text up to the
// first <placeholder> is in the source that sends it), and each meshtun
// command of its shell blocks runs through the CLI: certs makes its
// files, the others go as far as reading a config that does not exist
// here (a wrong command or flag fails before).
func TestSystemdReadme(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "examples", "systemd", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var src []byte
	for _, f := range []string{"run.go", "watchdog.go"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src = append(src, b...)
	}
	statuses := regexp.MustCompile("`STATUS=([^`]*)`").FindAllSubmatch(readme, -1)
	if len(statuses) < 6 {
		t.Fatalf("README lists %d STATUS= lines", len(statuses))
	}
	for _, m := range statuses {
		literal, _, _ := strings.Cut(string(m[1]), "<")
		if !bytes.Contains(src, []byte(literal)) {
			t.Errorf("README's STATUS=%s: %q is in no string the gateway sends", m[1], literal)
		}
	}

	tls := t.TempDir()
	missing := filepath.Join(t.TempDir(), "gateway.toml")
	ran := map[string]bool{}
	inSh := false
	for _, line := range strings.Split(string(readme), "\n") {
		switch {
		case strings.HasPrefix(line, "```sh"):
			inSh = true
			continue
		case strings.HasPrefix(line, "```"):
			inSh = false
			continue
		}
		cmd, _, _ := strings.Cut(line, "#")
		args := strings.Fields(cmd)
		if !inSh || len(args) == 0 {
			continue
		}
		if len(args) > 3 && args[0] == "sudo" && args[1] == "-u" {
			args = args[3:]
		}
		if args[0] != "meshtun" {
			continue
		}
		args = args[1:]
		for i, a := range args {
			switch {
			case a == "/etc/meshtun/gateway.toml":
				args[i] = missing
			case a == "/etc/meshtun/tls":
				args[i] = tls
			case strings.HasPrefix(a, "/"):
				t.Errorf("README: meshtun %s: unexpected path %s", strings.Join(args, " "), a)
			}
		}
		var out bytes.Buffer
		code := runMain(args, &out, &out)
		if args[0] == "certs" {
			if _, err := os.Stat(filepath.Join(tls, "node-a-key.pem")); code != 0 || err != nil {
				t.Errorf("README: meshtun %s: exit %d, %v:\n%s", strings.Join(args, " "), code, err, out.String())
			}
		} else if code != 1 || !strings.Contains(out.String(), "no such file") {
			t.Errorf("README: meshtun %s: exit %d, want 1 with the missing config reported:\n%s", strings.Join(args, " "), code, out.String())
		}
		ran[args[0]] = true
	}
	for _, c := range []string{"certs", "validate", "route"} {
		if !ran[c] {
			t.Errorf("README runs no `meshtun %s`", c)
		}
	}
}
