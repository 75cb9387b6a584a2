package packaging_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// repoRoot is where make runs.
const repoRoot = ".."

// built runs `make package` and returns the .deb and the .rpm.
func built(t *testing.T) (deb, rpm string) {
	t.Helper()
	if out, err := exec.Command("make", "-C", repoRoot, "package").CombinedOutput(); err != nil {
		t.Fatalf("make package: %v\n%s", err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(repoRoot, "bin", "pkg", "*.deb"))
	rpms, _ := filepath.Glob(filepath.Join(repoRoot, "bin", "pkg", "*.rpm"))
	if len(debs) != 1 || len(rpms) != 1 {
		t.Fatalf("make package left %q and %q, want one of each", debs, rpms)
	}
	return debs[0], rpms[0]
}

func tool(t *testing.T, name, pkg string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		t.Fatalf("%s is not on PATH: install Debian's %s (make test-tools does, as root)", name, pkg)
	}
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// The files both packages install.
var installed = []string{
	"/usr/bin/meshtun",
	"/usr/lib/systemd/system/meshtun.service",
	"/usr/lib/systemd/system/meshtun.service.d/notify-reload.conf",
	"/usr/lib/sysusers.d/meshtun.conf",
	"/etc/meshtun/gateway.toml",
	"/etc/meshtun/tls",
	"/usr/share/doc/meshtun/README.md",
	"/usr/share/doc/meshtun/copyright",
}

func TestPackages(t *testing.T) {
	tool(t, "dpkg-deb", "dpkg")
	tool(t, "lintian", "lintian")
	tool(t, "rpm", "rpm")
	deb, rpm := built(t)

	// The .deb, as dpkg and lintian read it.
	list := run(t, "dpkg-deb", "-c", deb)
	for _, f := range installed {
		if !strings.Contains(list, " ."+f) {
			t.Errorf("the .deb lacks %s:\n%s", f, list)
		}
	}
	for _, f := range []string{"/usr/share/man/man1/meshtun.1.gz", "/usr/share/doc/meshtun/changelog.Debian.gz"} {
		if !strings.Contains(list, " ."+f) {
			t.Errorf("the .deb lacks %s", f)
		}
	}
	if cf := run(t, "dpkg-deb", "-f", deb, "Package", "Architecture"); !strings.Contains(cf, "Package: meshtun") || !strings.Contains(cf, "Architecture: amd64") {
		t.Errorf("control: %s", cf)
	}
	dir := t.TempDir()
	run(t, "dpkg-deb", "-e", deb, dir)
	if b, _ := os.ReadFile(filepath.Join(dir, "conffiles")); strings.TrimSpace(string(b)) != "/etc/meshtun/gateway.toml" {
		t.Errorf("conffiles: %q, want the config file kept on upgrade", b)
	}
	out, _ := exec.Command("lintian", "--tag-display-limit", "0", deb).CombinedOutput()
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "E: ") {
			t.Errorf("lintian: %s", l)
		}
	}

	// The .rpm, as rpm reads it.
	files := strings.Fields(run(t, "rpm", "-qlp", rpm))
	for _, f := range installed {
		if !slices.Contains(files, f) {
			t.Errorf("the .rpm lacks %s: %q", f, files)
		}
	}
	if cfg := strings.Fields(run(t, "rpm", "-qp", "--configfiles", rpm)); !slices.Equal(cfg, []string{"/etc/meshtun/gateway.toml"}) {
		t.Errorf("the .rpm's config files: %q", cfg)
	}
	scripts := run(t, "rpm", "-qp", "--scripts", rpm)
	for _, want := range []string{"postinstall scriptlet", "systemd-sysusers /usr/lib/sysusers.d/meshtun.conf", "preuninstall scriptlet",
		"systemctl disable --now meshtun.service", "postuninstall scriptlet"} {
		if !strings.Contains(scripts, want) {
			t.Errorf("the .rpm's scriptlets lack %q:\n%s", want, scripts)
		}
	}
	if strings.Contains(scripts, "systemctl start") || strings.Contains(scripts, "enable --now meshtun\n") {
		t.Errorf("a scriptlet starts the gateway:\n%s", scripts)
	}
	if name := run(t, "rpm", "-qp", "--queryformat", "%{NAME} %{ARCH}", rpm); name != "meshtun x86_64" {
		t.Errorf("rpm name and arch: %q", name)
	}

	t.Run("dpkg install, validate, remove, purge", func(t *testing.T) { testInstall(t, deb) })
}

// testInstall installs the .deb on this machine, as an operator would,
// and takes it away again.
func testInstall(t *testing.T, deb string) {
	if os.Geteuid() != 0 {
		t.Skip("installing the .deb needs root (CI runs as root)")
	}
	tool(t, "dpkg", "dpkg")
	if out, err := exec.Command("dpkg-query", "-W", "meshtun").CombinedOutput(); err == nil {
		t.Fatalf("meshtun is installed on this machine already (%s): not touching it", strings.TrimSpace(string(out)))
	}
	_, userErr := exec.Command("getent", "passwd", "meshtun").Output()
	t.Cleanup(func() {
		exec.Command("dpkg", "--purge", "meshtun").Run()
		if userErr != nil { // the test made the user: it goes too
			exec.Command("userdel", "meshtun").Run()
		}
	})
	out := run(t, "dpkg", "-i", deb)
	if !strings.Contains(out, "installed, not started") {
		t.Errorf("dpkg -i did not say it started nothing:\n%s", out)
	}
	if _, err := exec.Command("getent", "passwd", "meshtun").Output(); err != nil {
		t.Error("no meshtun user after the install")
	}
	if v := run(t, "/usr/bin/meshtun", "version"); !strings.HasPrefix(v, "meshtun ") {
		t.Errorf("meshtun version: %q", v)
	}
	if _, err := exec.LookPath("systemd-analyze"); err == nil {
		// Verified as installed: the unit, its drop-in, the binary it runs.
		vout, err := exec.Command("systemd-analyze", "verify", "/usr/lib/systemd/system/meshtun.service").CombinedOutput()
		for _, l := range strings.Split(string(vout), "\n") {
			if strings.Contains(l, "meshtun.service") && !strings.Contains(l, "notify-reload") && !strings.Contains(l, "ReloadSignal") {
				t.Errorf("systemd-analyze verify: %s", l)
			}
		}
		if err != nil && !strings.Contains(string(vout), "notify-reload") {
			t.Errorf("systemd-analyze verify: %v\n%s", err, vout)
		}
	}
	if out, _ := exec.Command("systemctl", "is-enabled", "meshtun.service").Output(); strings.TrimSpace(string(out)) == "enabled" {
		t.Error("the install enabled the service")
	}

	// validate runs as installed: first it names what is missing, then,
	// with certificates where the config reads them, it passes.
	vout, err := exec.Command("/usr/bin/meshtun", "validate", "--config", "/etc/meshtun/gateway.toml").CombinedOutput()
	if err == nil || !strings.Contains(string(vout), "/etc/meshtun/tls/") {
		t.Errorf("validate with no certificates: %v\n%s", err, vout)
	}
	certs := t.TempDir()
	run(t, "/usr/bin/meshtun", "certs", "--out", certs, "node")
	for src, dst := range map[string]string{"node.pem": "cert.pem", "node-key.pem": "key.pem", "ca.pem": "ca.pem"} {
		b, err := os.ReadFile(filepath.Join(certs, src))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join("/etc/meshtun/tls", dst), b, 0o640); err != nil {
			t.Fatal(err)
		}
	}
	if out := run(t, "/usr/bin/meshtun", "validate", "--config", "/etc/meshtun/gateway.toml"); !strings.Contains(out, "ok") {
		t.Errorf("validate: %s", out)
	}

	// Remove keeps the config; purge takes it.
	run(t, "dpkg", "-r", "meshtun")
	if _, err := os.Stat("/usr/bin/meshtun"); err == nil {
		t.Error("/usr/bin/meshtun is still there after dpkg -r")
	}
	if _, err := os.Stat("/etc/meshtun/gateway.toml"); err != nil {
		t.Errorf("dpkg -r removed the config: %v", err)
	}
	run(t, "dpkg", "--purge", "meshtun")
	if _, err := os.Stat("/etc/meshtun"); err == nil {
		t.Error("/etc/meshtun is still there after dpkg --purge")
	}
}
