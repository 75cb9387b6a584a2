package dnsproxy

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fakeResolvectl puts a resolvectl on PATH that appends its arguments to
// a log file, and fails when its first argument is fail.
func fakeResolvectl(t *testing.T, fail string) (log string) {
	dir := t.TempDir()
	log = filepath.Join(dir, "calls")
	script := "#!/bin/sh\necho \"$*\" >> " + log + "\n[ \"$1\" = \"" + fail + "\" ] && { echo 'Failed to set DNS configuration: no such link' >&2; exit 1; }\nexit 0\n"
	if err := os.WriteFile(filepath.Join(dir, "resolvectl"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
	return log
}

func calls(t *testing.T, log string) []string {
	b, err := os.ReadFile(log)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

func TestRegisterResolved(t *testing.T) {
	log := fakeResolvectl(t, "none")
	r, err := RegisterResolved("meshtun0", netip.MustParseAddrPort("100.64.0.1:53"), []string{"cluster.local", "mesh.example."})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"dns meshtun0 100.64.0.1", "domain meshtun0 ~cluster.local ~mesh.example", "default-route meshtun0 false"}
	if got := calls(t, log); !slices.Equal(got, want) {
		t.Errorf("calls %q, want %q", got, want)
	}
	r.Close()
	r.Close()
	if got := calls(t, log); !slices.Equal(got, append(want, "revert meshtun0")) {
		t.Errorf("after Close twice: calls %q, want one revert", got)
	}

	// Another port is written ADDRESS:PORT.
	log = fakeResolvectl(t, "none")
	r, err = RegisterResolved("mt1", netip.MustParseAddrPort("[fd00::1]:5353"), []string{"cluster.local"})
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	if got := calls(t, log); len(got) == 0 || got[0] != "dns mt1 [fd00::1]:5353" {
		t.Errorf("calls %q, want dns mt1 [fd00::1]:5353 first", got)
	}
}

func TestRegisterResolvedFails(t *testing.T) {
	log := fakeResolvectl(t, "domain")
	_, err := RegisterResolved("meshtun0", netip.MustParseAddrPort("100.64.0.1:53"), []string{"cluster.local"})
	if err == nil || !strings.Contains(err.Error(), "resolvectl domain meshtun0 ~cluster.local") || !strings.Contains(err.Error(), "no such link") {
		t.Fatalf("error %v: want the failed call and resolvectl's own words", err)
	}
	if got := calls(t, log); got[len(got)-1] != "revert meshtun0" {
		t.Errorf("calls %q: a failure must revert what was set", got)
	}
}

func TestNoResolved(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	if _, err := RegisterResolved("meshtun0", netip.MustParseAddrPort("100.64.0.1:53"), []string{"cluster.local"}); !errors.Is(err, ErrNoResolved) {
		t.Errorf("without resolvectl: %v, want ErrNoResolved", err)
	}
	if err := RevertResolved("meshtun0"); err != nil {
		t.Errorf("RevertResolved without resolvectl: %v, want nothing to do", err)
	}
	if got := ResolvConfLine(netip.MustParseAddrPort("100.64.0.1:53")); got != "nameserver 100.64.0.1" {
		t.Errorf("ResolvConfLine = %q", got)
	}
}

func TestNameservers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "resolv.conf")
	os.WriteFile(path, []byte("# comment\nsearch corp.example\nnameserver 192.0.2.53\nnameserver 100.64.0.1\nnameserver fd00::53\nnameserver not-an-ip\noptions ndots:5\n"), 0o644)
	got, err := Nameservers(path, netip.MustParseAddrPort("100.64.0.1:53"))
	want := []netip.AddrPort{netip.MustParseAddrPort("192.0.2.53:53"), netip.MustParseAddrPort("[fd00::53]:53")}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("Nameservers = %v, %v; want %v (our own address left out)", got, err, want)
	}
	if _, err := Nameservers(filepath.Join(t.TempDir(), "none"), netip.AddrPort{}); err == nil {
		t.Error("a missing file must be an error")
	}
}
