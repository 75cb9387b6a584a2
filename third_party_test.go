package meshtun_test

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestGVisorCopy checks that third_party/gvisor, which go.mod puts in
// place of gVisor, is exactly what scripts/gvisor-patch.sh makes of the
// version go.mod requires: upstream's files, the packages the build needs
// and no others, with third_party/gvisor-patches applied. It fails when
// gVisor is moved to a version the copy was not rebuilt from, when a patch
// no longer applies to upstream (the patched code changed there), and when
// the copy was edited by hand.
func TestGVisorCopy(t *testing.T) {
	// In CI (.ci/run installs patch) neither need is a reason to skip.
	inCI := os.Getenv("CI") != "" || os.Getenv("MESHTUN_REQUIRE_INTEROP") != ""
	if _, err := exec.LookPath("patch"); err != nil {
		if inCI {
			t.Fatal("needs patch(1) (package patch):", err)
		}
		t.Skip("needs patch(1) (package patch):", err)
	}
	version := goOutput(t, "list", "-m", "-f", "{{.Version}}", "gvisor.dev/gvisor")
	// The test never fetches: upstream must be in the module cache, as
	// `make test` leaves it.
	cmd := exec.Command("go", "mod", "download", "gvisor.dev/gvisor@"+version)
	cmd.Env = append(os.Environ(), "GOPROXY=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		msg := "gVisor " + version + " is not in the module cache (make test downloads it): " + strings.TrimSpace(string(out))
		if inCI {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}

	want := t.TempDir()
	cmd = exec.Command("bash", "scripts/gvisor-patch.sh", "-o", want, version)
	cmd.Env = append(os.Environ(), "GOPROXY=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/gvisor-patch.sh: %v\n%s", err, out)
	}
	wantFiles, haveFiles := treeOf(t, want), treeOf(t, "third_party/gvisor")
	for name, w := range wantFiles {
		h, ok := haveFiles[name]
		switch {
		case !ok:
			t.Errorf("third_party/gvisor/%s is missing: run scripts/gvisor-patch.sh", name)
		case !bytes.Equal(h, w):
			t.Errorf("third_party/gvisor/%s is not upstream %s with the patches: run scripts/gvisor-patch.sh, and mend a patch rather than the copy", name, version)
		}
	}
	for name := range haveFiles {
		if _, ok := wantFiles[name]; !ok {
			t.Errorf("third_party/gvisor/%s is not in upstream %s, or not a package the build needs: run scripts/gvisor-patch.sh", name, version)
		}
	}
}

func goOutput(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		t.Fatalf("go %s: %v", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out))
}

// treeOf is every file under dir, by its path there.
func treeOf(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		files[rel] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("%s holds no files", dir)
	}
	return files
}
