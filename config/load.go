package config

import (
	"fmt"
	"os"
	"path/filepath"
)

// Load reads the gateway.toml at path, parses and validates it as Parse
// does, resolves the paths of [tls] and [mesh] against the file's
// directory (the Config holds them absolute) and checks that each file the
// gateway will read can be read: with the mesh off the three TLS files;
// with it on mesh.root_cert, mesh.token_file and tls.trust_bundle if set.
// It reads no file's content: the token in particular is read anew on
// every call to istiod. It is the one load path of both `meshtun run` and
// `meshtun validate`.
//
// Problems with the content, the files included, come back together as
// an *Errors; a file that cannot be read at all gives a wrapped I/O error.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	dir, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c, d := decode(data)
	if c != nil {
		d.merge(c.check())
		files := problems{keys: indexKeys(c), cfg: c}
		for _, f := range c.files() {
			if *f.path == "" {
				continue // already reported as required, if it is
			}
			if !filepath.IsAbs(*f.path) {
				*f.path = filepath.Join(dir, *f.path)
			}
			if !f.read {
				continue
			}
			if err := readable(*f.path, f.kind); err != nil {
				files.at(f.path, "%v", err)
			}
		}
		d.merge(files.list)
	}
	sortByOrder(d.list, d.order)
	if err := d.errs(path); err != nil {
		return nil, err
	}
	return c, nil
}

// file is a path key of c, for Load.
type file struct {
	path *string
	kind string // what the file holds, for messages
	read bool   // the gateway reads it, as c is set up
}

// files lists the path keys of c.
func (c *Config) files() []file {
	on := c.Mesh.Enabled()
	return []file{
		{&c.TLS.Cert, "PEM file", !on},
		{&c.TLS.Key, "PEM file", !on},
		{&c.TLS.TrustBundle, "PEM file", true},
		{&c.Mesh.RootCert, "PEM file", on},
		{&c.Mesh.TokenFile, "token file", on},
	}
}

// readable checks that the file at path can be opened for reading and is
// not a directory; kind is what it should be, for the message.
func readable(path, kind string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return &os.PathError{Op: "open", Path: path, Err: fmt.Errorf("is a directory, not a %s", kind)}
	}
	return nil
}
