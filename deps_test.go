// Package meshtun_test holds repository-wide checks. deps_test keeps the
// package import directions of ARCHITECTURE.md true.
package meshtun_test

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/meshtun/meshtun"

// allowed lists, for each package, the module's own packages it may import
// and the external module prefixes it may import. The standard library is
// always allowed.
var allowed = map[string]struct {
	internal []string
	external []string
}{
	"identity": {nil, nil},
	// pmap, the persistent map the routing state is made of, is a leaf.
	"internal/pmap": {nil, nil},
	// rawsock, raw system calls on non-blocking descriptors under the Go
	// poller, is a leaf the data path shares.
	"internal/rawsock": {nil, []string{"golang.org/x/sys"}},
	"config":           {[]string{"identity"}, []string{"github.com/BurntSushi/toml"}},
	"tun":              {nil, []string{"golang.org/x/sys", "github.com/songgao/water", "github.com/vishvananda/", "github.com/hashicorp/go-hclog"}},
	"tun/tuntest":      {[]string{"tun"}, []string{"golang.org/x/sys", "github.com/vishvananda/"}},
	"netstack":         {[]string{"tun", "internal/rawsock"}, []string{"gvisor.dev/gvisor", "golang.org/x/sys", "github.com/hashicorp/go-hclog"}},
	"hbone":            {[]string{"identity", "internal/rawsock"}, []string{"golang.org/x/net", "golang.org/x/time/rate", "github.com/hashicorp/go-hclog"}},
	"hbone/devca":      {[]string{"hbone"}, nil},
	"gateway":          {[]string{"identity", "config", "tun", "netstack", "hbone", "hbone/certfile", "mesh", "dnsproxy", "internal/pmap", "internal/rawsock"}, []string{"github.com/hashicorp/go-hclog", "golang.org/x/sys", "github.com/prometheus/client_golang"}},
	// mesh speaks Istio's protocols with Istio's own Go types; genproto's
	// rpc status is the type of xDS's error_detail.
	"mesh": {[]string{"config", "identity", "internal/pmap"}, []string{"google.golang.org/grpc", "google.golang.org/protobuf", "google.golang.org/genproto/googleapis/rpc",
		"istio.io/api/security/v1alpha1", "istio.io/istio/pkg/workloadapi", "github.com/envoyproxy/go-control-plane/envoy"}},

	// dnsproxy serves DNS with miekg/dns; x/net's netutil bounds its TCP
	// connections.
	"dnsproxy": {[]string{"internal/pmap"}, []string{"github.com/miekg/dns", "github.com/hashicorp/go-hclog", "golang.org/x/net"}},

	// certfile watches the directories of the certificate files.
	"hbone/certfile": {[]string{"hbone", "identity"}, []string{"github.com/fsnotify/fsnotify", "github.com/hashicorp/go-hclog"}},
}

func TestPackageDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(strings.TrimPrefix(fields[0], module), "/")
		rule, ok := allowed[pkg]
		if !ok {
			continue // commands, examples, bench and internal helpers may import anything
		}
		for _, imp := range fields[1:] {
			if !strings.Contains(strings.Split(imp, "/")[0], ".") {
				continue // standard library
			}
			if strings.HasPrefix(imp, module+"/") {
				own := strings.TrimPrefix(imp, module+"/")
				if !contains(rule.internal, own) {
					t.Errorf("%s imports %s: not allowed by ARCHITECTURE.md", pkg, own)
				}
				continue
			}
			if !hasPrefix(rule.external, imp) {
				t.Errorf("%s imports %s: not an allowed dependency", pkg, imp)
			}
		}
	}
}

// Every package says what it owns in a doc comment.
func TestPackageDocs(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{if .Doc}}ok{{else}}missing{{end}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if strings.HasSuffix(line, " missing") {
			t.Errorf("package %s has no doc comment", strings.Fields(line)[0])
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func hasPrefix(prefixes []string, s string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}
