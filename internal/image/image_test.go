package image

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/meshtun/meshtun/hbone/devca"
)

// staticMeshtun builds the meshtun binary as `make image` does.
func staticMeshtun(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "meshtun")
	cmd := exec.Command("go", "build", "-trimpath", "-tags", "grpcnotrace", "-o", bin, "github.com/meshtun/meshtun/cmd/meshtun")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func caBundle(t *testing.T, dir string) string {
	t.Helper()
	ca, err := devca.New("cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(p, ca.PEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// The image as a registry or `docker load` reads it back: its config
// (entrypoint, command, user), its files (the binary, static, runs; the
// CA bundle; the user), one digest for two builds, another for another
// creation time.
func TestImage(t *testing.T) {
	dir := t.TempDir()
	opts := Options{Binary: staticMeshtun(t, dir), CA: caBundle(t, dir), Version: "v0.0.0-test", Source: "https://example.com/meshtun"}
	img, err := Build(opts)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Build(opts)
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := img.Digest()
	d2, _ := again.Digest()
	if d1 != d2 {
		t.Fatalf("two builds of the same inputs: %s and %s", d1, d2)
	}
	later := opts
	later.Created = time.Unix(1_700_000_000, 0)
	if img3, err := Build(later); err != nil {
		t.Fatal(err)
	} else if d3, _ := img3.Digest(); d3 == d1 {
		t.Fatal("another creation time gave the same digest")
	}

	lay, tarFile := filepath.Join(dir, "oci"), filepath.Join(dir, "meshtun.tar")
	if err := WriteLayout(lay, "meshtun:test", img); err != nil {
		t.Fatal(err)
	}
	if err := WriteTarball(tarFile, "meshtun:test", img); err != nil {
		t.Fatal(err)
	}

	// Read back from the layout, as a registry tool would.
	idx, err := layout.ImageIndexFromPath(lay)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 || im.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "meshtun:test" {
		t.Fatalf("layout index: %+v, %v", im, err)
	}
	if im.Manifests[0].Digest != d1 || !strings.Contains(string(im.Manifests[0].MediaType), "oci") {
		t.Fatalf("layout holds %s (%s), want %s, an OCI manifest", im.Manifests[0].Digest, im.Manifests[0].MediaType, d1)
	}
	back, err := idx.Image(d1)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := back.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if !slices.Equal(c.Entrypoint, []string{BinaryPath}) || !slices.Equal(c.Cmd, []string{"run", "--config", ConfigPath}) ||
		c.User != "65532:65532" || cf.OS != "linux" || cf.Architecture != "amd64" || c.Labels["org.opencontainers.image.version"] != "v0.0.0-test" {
		t.Errorf("config: %+v (os %s, arch %s)", c, cf.OS, cf.Architecture)
	}

	files := map[string]*tar.Header{}
	contents := map[string][]byte{}
	tr := tar.NewReader(mutate.Extract(back))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = h
		contents[h.Name], _ = io.ReadAll(tr)
		if h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(time.Unix(0, 0)) {
			t.Errorf("%s: owner %d:%d, time %v; want root's, at the epoch", h.Name, h.Uid, h.Gid, h.ModTime)
		}
	}
	bin, _ := os.ReadFile(opts.Binary)
	ca, _ := os.ReadFile(opts.CA)
	if h := files["usr/local/bin/meshtun"]; h == nil || h.Mode != 0o755 || !bytes.Equal(contents[h.Name], bin) {
		t.Fatalf("the image's binary: %+v", h)
	}
	if !bytes.Equal(contents["etc/ssl/certs/ca-certificates.crt"], ca) {
		t.Error("the image's CA bundle is not the one given")
	}
	if !strings.Contains(string(contents["etc/passwd"]), "meshtun:x:65532:65532:") || !strings.Contains(string(contents["etc/group"]), "meshtun:x:65532:") {
		t.Errorf("the image's user: %q, %q", contents["etc/passwd"], contents["etc/group"])
	}
	if h := files[strings.TrimSuffix(ConfigPath[1:], "/gateway.toml")]; h == nil && files["etc/meshtun/"] == nil {
		t.Error("no /etc/meshtun for the config to be mounted on")
	}

	// The binary is static (an image from scratch has no loader) and runs.
	extracted := filepath.Join(dir, "from-image")
	if err := os.WriteFile(extracted, contents["usr/local/bin/meshtun"], 0o755); err != nil {
		t.Fatal(err)
	}
	ef, err := elf.Open(extracted)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the image's binary asks for a dynamic loader: build it with CGO_ENABLED=0")
		}
	}
	ef.Close()
	if out, err := exec.Command(extracted, "version").CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "meshtun ") {
		t.Errorf("the image's meshtun version: %q, %v", out, err)
	}

	// The tarball docker load takes holds the same image: Docker's
	// manifest is its own, the config and the layer are the same.
	tag, _ := name.NewTag("meshtun:test")
	fromTar, err := tarball.ImageFromPath(tarFile, &tag)
	if err != nil {
		t.Fatal(err)
	}
	c1, _ := img.ConfigName()
	c2, err := fromTar.ConfigName()
	l1, _ := img.Layers()
	l2, _ := fromTar.Layers()
	if err != nil || c1 != c2 || len(l2) != 1 {
		t.Fatalf("the tarball's config %s (%v), %d layers; the layout's %s", c2, err, len(l2), c1)
	}
	a, _ := l1[0].DiffID()
	b, _ := l2[0].DiffID()
	if a != b {
		t.Errorf("the tarball's layer %s, the layout's %s", b, a)
	}
}

func TestImageRefusesBadInput(t *testing.T) {
	dir := t.TempDir()
	notELF := filepath.Join(dir, "script")
	os.WriteFile(notELF, []byte("#!/bin/sh\n"), 0o755)
	noPEM := filepath.Join(dir, "empty.pem")
	os.WriteFile(noPEM, []byte("nothing"), 0o644)
	elfBin, _ := os.Executable() // this test binary: an ELF file
	for _, tt := range []struct {
		opts Options
		want string
	}{
		{Options{Binary: notELF, CA: noPEM}, "is not an ELF executable"},
		{Options{Binary: filepath.Join(dir, "missing"), CA: noPEM}, "missing"},
		{Options{Binary: elfBin, CA: noPEM}, "hold no PEM certificate"},
	} {
		if _, err := Build(tt.opts); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Build(%+v) = %v, want an error saying %q", tt.opts, err, tt.want)
		}
	}
	if err := WriteTarball(filepath.Join(dir, "x.tar"), "Not A Tag!", nil); err == nil || !strings.Contains(err.Error(), "tag") {
		t.Errorf("a bad tag: %v", err)
	}
}
