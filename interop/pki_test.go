package interop

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Identities of the interop tests, all in one trust domain.
const (
	trustDomain  = "cluster.local"
	goServerID   = "spiffe://cluster.local/ns/go/sa/server"
	goClientID   = "spiffe://cluster.local/ns/go/sa/client"
	nodeServerID = "spiffe://cluster.local/ns/node/sa/server"
	nodeClientID = "spiffe://cluster.local/ns/node/sa/client"
)

// pki is a CA and leaf certificates made by the openssl command, not by
// hbone/devca: the certificates are independent of our code too.
type pki struct {
	t   *testing.T
	dir string
	CA  string // the CA certificate (the trust bundle), PEM
}

// leaf is a certificate and key made by pki.
type leaf struct{ Cert, Key string }

// needTools skips the test when node or openssl is missing, unless
// MESHTUN_REQUIRE_INTEROP is set (.ci/run sets it after installing both):
// then a missing tool fails the test instead of hiding it.
func needTools(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"node", "openssl"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("MESHTUN_REQUIRE_INTEROP") != "" {
				t.Fatalf("interop test needs %s on PATH (MESHTUN_REQUIRE_INTEROP is set): %v", tool, err)
			}
			t.Skipf("interop test needs %s on PATH: %v", tool, err)
		}
	}
}

// newPKI makes an EC P-256 CA in a temporary directory.
func newPKI(t *testing.T) *pki {
	t.Helper()
	needTools(t)
	p := &pki{t: t, dir: t.TempDir()}
	p.CA = filepath.Join(p.dir, "ca.pem")
	p.openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
		"-keyout", filepath.Join(p.dir, "ca-key.pem"), "-out", p.CA,
		"-days", "2", "-subj", "/O=meshtun interop/CN=interop CA",
		"-addext", "basicConstraints=critical,CA:TRUE",
		"-addext", "keyUsage=critical,keyCertSign,cRLSign")
	return p
}

// issue makes a leaf for the SPIFFE ID id, usable as client and server,
// signed by the CA.
func (p *pki) issue(name, id string) leaf {
	p.t.Helper()
	l := leaf{Cert: filepath.Join(p.dir, name+".pem"), Key: filepath.Join(p.dir, name+"-key.pem")}
	csr := filepath.Join(p.dir, name+".csr")
	ext := filepath.Join(p.dir, name+".ext")
	p.openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
		"-keyout", l.Key, "-out", csr, "-subj", "/O=meshtun interop")
	extensions := strings.Join([]string{
		"basicConstraints=critical,CA:FALSE",
		"keyUsage=critical,digitalSignature",
		"extendedKeyUsage=serverAuth,clientAuth",
		"subjectAltName=URI:" + id,
	}, "\n") + "\n"
	if err := os.WriteFile(ext, []byte(extensions), 0o600); err != nil {
		p.t.Fatal(err)
	}
	p.openssl("x509", "-req", "-in", csr, "-CA", p.CA, "-CAkey", filepath.Join(p.dir, "ca-key.pem"),
		"-CAcreateserial", "-days", "1", "-extfile", ext, "-out", l.Cert)
	return l
}

func (p *pki) openssl(args ...string) {
	p.t.Helper()
	cmd := exec.Command("openssl", args...)
	cmd.Dir = p.dir
	if out, err := cmd.CombinedOutput(); err != nil {
		p.t.Fatalf("openssl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}
