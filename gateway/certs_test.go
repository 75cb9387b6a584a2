package gateway

import (
	"crypto/tls"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meshtun/meshtun/hbone/devca"
)

// Without [mesh], new certificate files reach the certificate HBONE takes
// for its next handshake (certs().Current), and a set with another
// identity is refused while the one in force stays.
func TestWatchCertFiles(t *testing.T) {
	e := newReloadEnv(t, "") // gateway B from files in e.dir: node-b.pem, node-b-key.pem, ca.pem
	logs := &syncBuffer{}
	e.g.log = hclog.New(&hclog.LoggerOptions{Output: io.MultiWriter(logs, testWriter{t}), Level: hclog.Info})
	ca, _, err := devca.LoadOrCreate(e.dir, "cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	var routines sync.WaitGroup
	stop, err := e.g.watchCertFiles(&routines)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { stop(); routines.Wait() }()

	first, _, _ := e.g.certs().Current()
	// replace writes a new leaf for id beside the files in force and
	// renames it over them, as an atomic update does.
	replace := func(id string) {
		t.Helper()
		certPEM, keyPEM, err := ca.Issue(id)
		if err != nil {
			t.Fatal(err)
		}
		for name, data := range map[string][]byte{"node-b-key.pem": keyPEM, "node-b.pem": certPEM} {
			tmp := filepath.Join(e.dir, "."+name+".tmp")
			if err := os.WriteFile(tmp, data, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, filepath.Join(e.dir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// waitFor polls, for a bounded time, for what the watch's goroutine
	// does in its own time.
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no %s within 10s", what)
			}
		}
	}

	replace(reloadServerID)
	var renewed *tls.Certificate
	waitFor("new certificate in force", func() bool {
		renewed, _, _ = e.g.certs().Current()
		return renewed != first
	})
	if renewed.Leaf.SerialNumber.Cmp(first.Leaf.SerialNumber) == 0 {
		t.Errorf("the certificate in force changed but has the old serial")
	}

	replace("spiffe://cluster.local/ns/meshtun/sa/someone-else")
	waitFor("refusal of a certificate with another identity", func() bool {
		return len(logs.lines("certificate files refused")) > 0
	})
	if now, _, _ := e.g.certs().Current(); now != renewed {
		t.Errorf("a certificate with another identity was put in force")
	}
	if got := e.g.Identity(); got != reloadServerID {
		t.Errorf("identity %s, want %s", got, reloadServerID)
	}
}
