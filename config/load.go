package config

import (
	"fmt"
	"os"
	"path/filepath"
)

// Load reads the gateway.toml at path, parses and validates it as Parse
// does, resolves the TLS paths against the file's directory (the Config
// holds them absolute) and checks each can be read. It is the one load path
// of both `meshtun run` and `meshtun validate`.
//
// Problems with the content, the TLS files included, come back together as
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
		files := problems{keys: indexKeys(c)}
		for _, file := range []*string{&c.TLS.Cert, &c.TLS.Key, &c.TLS.TrustBundle} {
			if *file == "" {
				continue // already reported as required
			}
			if !filepath.IsAbs(*file) {
				*file = filepath.Join(dir, *file)
			}
			if err := readable(*file); err != nil {
				files.at(file, "%v", err)
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

// readable checks that the regular file at path can be opened for reading.
func readable(path string) error {
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
		return &os.PathError{Op: "open", Path: path, Err: fmt.Errorf("is a directory, not a PEM file")}
	}
	return nil
}
