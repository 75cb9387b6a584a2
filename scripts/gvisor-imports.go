//go:build ignore

// gvisor-imports prints the gVisor packages a copy of gVisor must hold for
// the modules under the given directories: those their Go files import,
// and what those import in turn, under every build constraint (go mod
// tidy looks at all of them), tests of gVisor's own packages aside.
//
//	go run scripts/gvisor-imports.go GVISOR_DIR DIR...
package main

import (
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

const module = "gvisor.dev/gvisor"

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: go run gvisor-imports.go GVISOR_DIR DIR...")
		os.Exit(2)
	}
	upstream := os.Args[1]
	want := map[string]bool{}
	var queue []string
	add := func(imports []string) {
		for _, p := range imports {
			if (p == module || strings.HasPrefix(p, module+"/")) && !want[p] {
				want[p] = true
				queue = append(queue, p)
			}
		}
	}
	for _, dir := range os.Args[2:] {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && path != dir && (d.Name() == "third_party" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			if !d.IsDir() && strings.HasSuffix(path, ".go") {
				add(importsOf(path))
			}
			return nil
		})
		if err != nil {
			fail(err)
		}
	}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		dir := filepath.Join(upstream, strings.TrimPrefix(strings.TrimPrefix(p, module), "/"))
		entries, err := os.ReadDir(dir)
		if err != nil {
			fail(fmt.Errorf("%s: %w", p, err))
		}
		for _, e := range entries {
			if n := e.Name(); !e.IsDir() && strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go") {
				add(importsOf(filepath.Join(dir, n)))
			}
		}
	}
	for _, p := range slices.Sorted(maps.Keys(want)) {
		fmt.Println(p)
	}
}

func importsOf(path string) []string {
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
	if err != nil {
		fail(err)
	}
	var out []string
	for _, s := range f.Imports {
		p, err := strconv.Unquote(s.Path.Value)
		if err != nil {
			fail(fmt.Errorf("%s: %w", path, err))
		}
		out = append(out, p)
	}
	return out
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "gvisor-imports:", err)
	os.Exit(1)
}
