package main

import (
	"os/exec"
	"testing"
)

// needTool returns the path of a program a test runs, and fails the test
// without it: `make test` installs each (the Makefile's test-tools), so a
// missing one is a broken machine, not a reason to prove nothing.
func needTool(t *testing.T, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is not on PATH: install Debian's %s (make test-tools does, as root): %v", name, pkg, err)
	}
	return p
}
