package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshtun/meshtun/internal/topo"
)

// TestDemoNetworks runs the walkthrough's second part as `make demo-mesh`
// does: this command, built, with -networks, against the project's
// meshtun. Istio's control plane with AMBIENT_ENABLE_MULTI_NETWORK puts
// the VM (node A) in vm-net and the server (node B) in cluster-net behind
// node B as that network's east-west gateway; the demo fails unless node
// A plans the service as double HBONE through the gateway, a transfer
// through the VIP is intact both ways, and node B logs the flow both as
// the gateway and as its destination, naming the VM's identity.
func TestDemoNetworks(t *testing.T) {
	if err := topo.Available(); err != nil {
		t.Skipf("needs network namespaces: %v", err)
	}
	dir := t.TempDir()
	meshtun := filepath.Join(dir, "meshtun")
	build := exec.Command("go", "build", "-o", meshtun, "./cmd/meshtun")
	build.Dir = "../../../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/meshtun: %v\n%s", err, out)
	}
	demo := filepath.Join(dir, "demo-mesh")
	if out, err := exec.Command("go", "build", "-o", demo, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build demo-mesh: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, demo, "-networks", "-bin", meshtun, "-example", exampleDir, "-bytes", "1048576").CombinedOutput()
	text := string(out)
	if err != nil || !strings.Contains(text, "DEMO PASSED") {
		t.Fatalf("demo-mesh -networks: %v\n%s", err, text)
	}
	for _, want := range []string{"double HBONE", "direction=east-west", "direction=inbound"} {
		if !strings.Contains(text, want) {
			t.Errorf("the demo's output has no %q:\n%s", want, text)
		}
	}
}
