// Command meshtun-image builds meshtun's container image without a Docker
// daemon (internal/image): an OCI image layout and a tarball for
// `docker load`, and prints the image's digest. `make image` runs it.
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/meshtun/meshtun/internal/image"
)

func main() {
	var opts image.Options
	var ref, layoutDir, tarFile, epoch string
	flag.StringVar(&opts.Binary, "bin", "bin/meshtun-static", "the static meshtun binary (CGO_ENABLED=0)")
	flag.StringVar(&opts.CA, "ca", "/etc/ssl/certs/ca-certificates.crt", "the CA certificates to put in the image, PEM")
	flag.StringVar(&opts.Version, "version", "dev", "the image's version label")
	flag.StringVar(&opts.Source, "source", "https://github.com/meshtun/meshtun", "the image's source label")
	flag.StringVar(&opts.Arch, "arch", "amd64", "GOARCH of the binary")
	flag.StringVar(&ref, "ref", image.DefaultRef, "the image's name and tag")
	flag.StringVar(&layoutDir, "layout", "bin/image/oci", "where to write the OCI image layout (emptied first)")
	flag.StringVar(&tarFile, "tar", "bin/image/meshtun.tar", "where to write the tarball for docker load (empty: none)")
	flag.StringVar(&epoch, "created", os.Getenv("SOURCE_DATE_EPOCH"), "the creation time, Unix seconds (default $SOURCE_DATE_EPOCH, else 0)")
	flag.Parse()
	if flag.NArg() > 0 {
		fail("unexpected arguments %q", flag.Args())
	}
	if epoch != "" {
		s, err := strconv.ParseInt(epoch, 10, 64)
		if err != nil || s < 0 {
			fail("-created %q: want Unix seconds", epoch)
		}
		opts.Created = time.Unix(s, 0)
	}
	img, err := image.Build(opts)
	if err != nil {
		fail("%v", err)
	}
	if err := image.WriteLayout(layoutDir, ref, img); err != nil {
		fail("%v", err)
	}
	if tarFile != "" {
		if err := image.WriteTarball(tarFile, ref, img); err != nil {
			fail("%v", err)
		}
	}
	d, err := img.Digest()
	if err != nil {
		fail("%v", err)
	}
	fmt.Printf("%s %s\n  OCI layout: %s\n", ref, d, layoutDir)
	if tarFile != "" {
		fmt.Printf("  docker load -i %s\n", tarFile)
	}
}

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "meshtun-image: "+format+"\n", a...)
	os.Exit(1)
}
