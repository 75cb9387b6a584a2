// Package image builds meshtun's container image without a Docker daemon:
// an OCI image from scratch holding the static binary, CA certificates
// and a non-root user, written as an OCI image layout (a directory any
// registry tool can push: crane, skopeo, oras) and as a tarball that
// `docker load` and `ctr images import` take.
//
// The build is reproducible: every file in the layer has a fixed owner
// and time, the config's creation time is fixed (Options.Created), and
// nothing of the building machine but the files given goes in, so two
// builds from one commit and one CA bundle give one digest.
//
// It uses go-containerregistry (crane's library) for the formats: the
// manifest, config and layout are its, the layer's tar is ours.
package image

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Where the image puts things, and who runs it.
const (
	// DefaultRef is the name and tag `make image` gives the image, which
	// examples/kubernetes/meshtun.yaml runs.
	DefaultRef = "meshtun:dev"

	BinaryPath = "/usr/local/bin/meshtun"
	CAPath     = "/etc/ssl/certs/ca-certificates.crt"
	ConfigPath = "/etc/meshtun/gateway.toml"
	// UID and GID are the image's user, meshtun (distroless' nonroot
	// number): what runs when nothing says otherwise. The gateway
	// itself needs CAP_NET_ADMIN, which a Kubernetes pod grants to root
	// only (runAsUser: 0, capabilities drop ALL, add NET_ADMIN: the
	// DaemonSet in examples/kubernetes); validate, route, status and
	// flows run as this user.
	UID = 65532
	GID = 65532
)

// Options is what goes into the image.
type Options struct {
	Binary  string // the static meshtun binary (CGO_ENABLED=0)
	CA      string // a PEM bundle of CA certificates
	Version string // the image's version label
	Source  string // the repository's address, for the source label
	Arch    string // GOARCH of Binary; default amd64
	// Created is the config's creation time; the zero time is the Unix
	// epoch, as reproducible builds have it (SOURCE_DATE_EPOCH).
	Created time.Time
}

// Build returns the image of opts.
func Build(opts Options) (v1.Image, error) {
	bin, err := os.ReadFile(opts.Binary)
	if err != nil {
		return nil, fmt.Errorf("image: binary: %w", err)
	}
	if len(bin) < 4 || string(bin[:4]) != "\x7fELF" {
		return nil, fmt.Errorf("image: binary %s is not an ELF executable", opts.Binary)
	}
	ca, err := os.ReadFile(opts.CA)
	if err != nil {
		return nil, fmt.Errorf("image: CA certificates: %w", err)
	}
	if !bytes.Contains(ca, []byte("-----BEGIN CERTIFICATE-----")) {
		return nil, fmt.Errorf("image: CA certificates %s hold no PEM certificate", opts.CA)
	}
	created := opts.Created
	if created.IsZero() {
		created = time.Unix(0, 0)
	}
	created = created.UTC()
	layerTar, err := rootfs(bin, ca, created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("image: layer: %w", err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{Created: v1.Time{Time: created}, CreatedBy: "meshtun internal/image", Comment: "meshtun " + opts.Version},
	})
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image: config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = opts.Arch, "linux"
	if cf.Architecture == "" {
		cf.Architecture = "amd64"
	}
	cf.Created = v1.Time{Time: created}
	cf.Config = v1.Config{
		Entrypoint: []string{BinaryPath},
		Cmd:        []string{"run", "--config", ConfigPath},
		User:       fmt.Sprintf("%d:%d", UID, GID),
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin", "SSL_CERT_FILE=" + CAPath},
		WorkingDir: "/",
		Labels: map[string]string{
			"org.opencontainers.image.title":   "meshtun",
			"org.opencontainers.image.version": opts.Version,
			"org.opencontainers.image.source":  opts.Source,
			"org.opencontainers.image.created": created.Format(time.RFC3339),
		},
		ExposedPorts: map[string]struct{}{"15008/tcp": {}, "15020/tcp": {}, "15021/tcp": {}},
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("image: config: %w", err)
	}
	return img, nil
}

// rootfs is the image's one layer: the directories, the user's files, the
// CA bundle and the binary, each owned by root and dated created.
func rootfs(bin, ca []byte, created time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	var dir func(p string) error
	dir = func(p string) error {
		if p == "/" || p == "." || dirs[p] {
			return nil
		}
		if err := dir(path.Dir(p)); err != nil {
			return err
		}
		dirs[p] = true
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: p[1:] + "/", Mode: 0o755, ModTime: created, Format: tar.FormatPAX})
	}
	file := func(p string, mode int64, data []byte) error {
		if err := dir(path.Dir(p)); err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: p[1:], Mode: mode, Size: int64(len(data)), ModTime: created, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nmeshtun:x:%d:%d:meshtun:/nonexistent:/sbin/nologin\n", UID, GID)
	group := fmt.Sprintf("root:x:0:\nmeshtun:x:%d:\n", GID)
	for _, f := range []struct {
		path string
		mode int64
		data []byte
	}{
		{"/etc/passwd", 0o644, []byte(passwd)},
		{"/etc/group", 0o644, []byte(group)},
		{"/etc/nsswitch.conf", 0o644, []byte("hosts: files dns\n")},
		{CAPath, 0o644, ca},
		{BinaryPath, 0o755, bin},
	} {
		if err := file(f.path, f.mode, f.data); err != nil {
			return nil, fmt.Errorf("image: layer: %s: %w", f.path, err)
		}
	}
	// Writable by nobody but root: the config is mounted there.
	if err := dir(path.Dir(ConfigPath)); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteLayout writes img as an OCI image layout in dir (made empty
// first), tagged ref.
func WriteLayout(dir, ref string, img v1.Image) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("image: layout: %w", err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref})); err != nil {
		return fmt.Errorf("image: layout: %w", err)
	}
	return nil
}

// WriteTarball writes img as a tarball `docker load` takes, tagged ref.
func WriteTarball(file, ref string, img v1.Image) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("image: tag %q: %w", ref, err)
	}
	if err := tarball.WriteToFile(file, tag, img); err != nil {
		return fmt.Errorf("image: tarball: %w", err)
	}
	return nil
}
