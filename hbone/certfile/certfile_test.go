package certfile

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"

	"github.com/meshtun/meshtun/hbone"
	"github.com/meshtun/meshtun/hbone/devca"
	"github.com/meshtun/meshtun/mesh"
)

// The gateway may subscribe to a Source as it does to Istio's CA.
var _ mesh.CertSource = (*Source)(nil)

const (
	testDomain   = "cluster.local"
	testServerID = "spiffe://cluster.local/ns/meshtun/sa/node-a"
	testClientID = "spiffe://cluster.local/ns/meshtun/sa/node-b"
	// testWait bounds every wait: far above what any step needs.
	testWait = 20 * time.Second
	// testDebounce keeps the tests quick; they never rely on its length.
	testDebounce = 20 * time.Millisecond
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var testCA = sync.OnceValues(func() (*devca.CA, error) { return devca.New(testDomain) })

func ca(t *testing.T) *devca.CA {
	t.Helper()
	c, err := testCA()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// testPair is a certificate and key, PEM, and the leaf's serial.
type testPair struct {
	cert, key []byte
	serial    string
}

func issue(t *testing.T, c *devca.CA, id string) testPair {
	t.Helper()
	cert, key, err := c.Issue(id)
	if err != nil {
		t.Fatal(err)
	}
	return testPair{cert: cert, key: key, serial: pemSerial(t, cert)}
}

// issueTemplate signs a leaf of a fresh key with c from tmpl.
func issueTemplate(t *testing.T, c *devca.CA, tmpl *x509.Certificate) testPair {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.Cert, key.Public(), c.Key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return testPair{
		cert:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		key:    pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		serial: tmpl.SerialNumber.String(),
	}
}

func pemSerial(t *testing.T, certPEM []byte) string {
	t.Helper()
	b, _ := pem.Decode(certPEM)
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c.SerialNumber.String()
}

func currentSerial(t *testing.T, s *Source) string {
	t.Helper()
	cert, roots, _ := s.Current()
	if cert == nil || roots == nil {
		t.Fatal("no certificate in force")
	}
	return cert.Leaf.SerialNumber.String()
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// renameOver writes data beside path and renames it over path, as tools
// that replace files atomically do.
func renameOver(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	writeFile(t, tmp, data)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func testLogger(t *testing.T) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Debug, Output: testLogWriter{t}})
}

type testLogWriter struct{ t *testing.T }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// testSource is a Source over files, with its reload results on a
// channel and a subscription.
type testSource struct {
	*Source
	results chan Result
	changed <-chan struct{}
}

func newTestSource(t *testing.T, opts Options) *testSource {
	t.Helper()
	results := make(chan Result, 1024) // far more than a test makes
	opts.Debounce = testDebounce
	opts.Logger = testLogger(t)
	opts.onReload = func(r Result) {
		select {
		case results <- r:
		default:
		}
	}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	changed, cancel := s.Subscribe()
	t.Cleanup(cancel)
	return &testSource{Source: s, results: results, changed: changed}
}

// waitChanged waits for the subscription's next signal.
func (s *testSource) waitChanged(t *testing.T) {
	t.Helper()
	select {
	case _, ok := <-s.changed:
		if !ok {
			t.Fatal("subscription closed")
		}
	case <-time.After(testWait):
		t.Fatal("timed out waiting for a new certificate")
	}
}

// waitReload waits for reloads until one ends with want and cond holds
// after it.
func (s *testSource) waitReload(t *testing.T, want Result, cond func(Stats) bool) Stats {
	t.Helper()
	deadline := time.After(testWait)
	for {
		select {
		case r := <-s.results:
			if st := s.Stats(); r == want && (cond == nil || cond(st)) {
				return st
			}
		case <-deadline:
			t.Fatalf("timed out waiting for a reload %s; stats %+v", want, s.Stats())
		}
	}
}

// flatDir holds cert.pem, key.pem and ca.pem as plain files.
func flatDir(t *testing.T, p testPair, bundle []byte) (dir string, opts Options) {
	dir = t.TempDir()
	opts = Options{
		CertFile:        filepath.Join(dir, "cert.pem"),
		KeyFile:         filepath.Join(dir, "key.pem"),
		TrustBundleFile: filepath.Join(dir, "ca.pem"),
	}
	writeFile(t, opts.CertFile, p.cert)
	writeFile(t, opts.KeyFile, p.key)
	writeFile(t, opts.TrustBundleFile, bundle)
	return dir, opts
}

// kubeDir lays files out as kubelet's atomic writer does for a mounted
// Secret: each version in a "..<timestamp>" directory, "..data" a symlink
// to the current one, and each file a symlink through "..data".
type kubeDir struct {
	dir     string
	version string // the directory ..data points to
	n       int
}

var kubeFiles = []string{"tls.crt", "tls.key", "ca.crt"}

func newKubeDir(t *testing.T, p testPair, bundle []byte) (*kubeDir, Options) {
	k := &kubeDir{dir: t.TempDir()}
	k.write(t, p.cert, p.key, bundle)
	if err := os.Symlink(k.version, filepath.Join(k.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for _, f := range kubeFiles {
		if err := os.Symlink(filepath.Join("..data", f), filepath.Join(k.dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	return k, Options{
		CertFile:        filepath.Join(k.dir, "tls.crt"),
		KeyFile:         filepath.Join(k.dir, "tls.key"),
		TrustBundleFile: filepath.Join(k.dir, "ca.crt"),
	}
}

// write puts a new version directory in place (not yet in force).
func (k *kubeDir) write(t *testing.T, cert, key, bundle []byte) {
	t.Helper()
	k.n++
	k.version = "..2026_12_01_16_00_00." + strings.Repeat("0", 8) + string(rune('0'+k.n))
	d := filepath.Join(k.dir, k.version)
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, b := range [][]byte{cert, key, bundle} {
		writeFile(t, filepath.Join(d, kubeFiles[i]), b)
	}
}

// swap is kubelet's update: a new version directory, a "..data_tmp"
// symlink to it renamed over "..data", the old version removed.
func (k *kubeDir) swap(t *testing.T, cert, key, bundle []byte) {
	t.Helper()
	old := k.version
	k.write(t, cert, key, bundle)
	tmp := filepath.Join(k.dir, "..data_tmp")
	if err := os.Symlink(k.version, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(k.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(k.dir, old)); err != nil {
		t.Fatal(err)
	}
}

// Files replaced by rename: the new pair is in force after the change
// signal, and the first is what was in force before.
func TestRenameSwap(t *testing.T) {
	c := ca(t)
	first, second := issue(t, c, testServerID), issue(t, c, testServerID)
	_, opts := flatDir(t, first, c.PEM())
	s := newTestSource(t, opts)
	if got := currentSerial(t, s.Source); got != first.serial {
		t.Fatalf("serial at start %s, want %s", got, first.serial)
	}

	renameOver(t, opts.KeyFile, second.key)
	renameOver(t, opts.CertFile, second.cert)
	s.waitChanged(t)
	if got := currentSerial(t, s.Source); got != second.serial {
		t.Fatalf("serial after the rename %s, want %s", got, second.serial)
	}
	if st := s.Stats(); st.Reloads[Applied] != 1 || st.Identity != testServerID {
		t.Errorf("stats %+v, want one applied reload of %s", st, testServerID)
	}
}

// Kubernetes' "..data" swap, where the named files (symlinks) never
// change themselves, is seen.
func TestDataSymlinkSwap(t *testing.T) {
	c := ca(t)
	first, second := issue(t, c, testServerID), issue(t, c, testServerID)
	k, opts := newKubeDir(t, first, c.PEM())
	s := newTestSource(t, opts)
	if got := currentSerial(t, s.Source); got != first.serial {
		t.Fatalf("serial at start %s, want %s", got, first.serial)
	}
	k.swap(t, second.cert, second.key, c.PEM())
	s.waitChanged(t)
	if got := currentSerial(t, s.Source); got != second.serial {
		t.Fatalf("serial after the ..data swap %s, want %s", got, second.serial)
	}
}

// servedSerial is the serial of the certificate srv presents to a new
// client.
func servedSerial(t *testing.T, addr string, client tls.Certificate, roots *x509.CertPool) string {
	t.Helper()
	d := tls.Dialer{
		NetDialer: &net.Dialer{Timeout: testWait},
		Config:    hbone.ClientConfig(client, roots, []string{testServerID}),
	}
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("TLS dial: %v", err)
	}
	defer conn.Close()
	return conn.(*tls.Conn).ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// serve runs an HBONE server over s on loopback until the test ends.
func serve(t *testing.T, s *Source) string {
	t.Helper()
	srv, err := hbone.NewServer(hbone.ServerOptions{
		Source:      s,
		TrustDomain: testDomain,
		Handler:     func(r *hbone.Request) { r.Reject(503) },
		Logger:      testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-served; !errors.Is(err, net.ErrClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return ln.Addr().String()
}

// Broken sets are refused one after the other, each for its own reason,
// while the first certificate stays in force and is what an HBONE server
// over the source presents; files identical to those in force are
// "unchanged"; a good set after all that is applied.
func TestBrokenPairRefused(t *testing.T) {
	c := ca(t)
	good := issue(t, c, testServerID)
	k, opts := newKubeDir(t, good, c.PEM())
	s := newTestSource(t, opts)
	addr := serve(t, s.Source)
	client, err := c.KeyPair(testClientID)
	if err != nil {
		t.Fatal(err)
	}
	if got := servedSerial(t, addr, client, c.Pool()); got != good.serial {
		t.Fatalf("served serial %s, want %s", got, good.serial)
	}

	k.swap(t, good.cert, good.key, c.PEM())
	s.waitReload(t, Unchanged, nil)

	other := issue(t, c, testServerID)
	foreignCA, err := devca.New("other.example")
	if err != nil {
		t.Fatal(err)
	}
	foreign := issue(t, foreignCA, "spiffe://other.example/ns/meshtun/sa/node-a")
	noSPIFFE := issueTemplate(t, c, &x509.Certificate{
		SerialNumber: big.NewInt(1001),
		Subject:      pkix.Name{CommonName: "no-uri"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	})
	u, _ := url.Parse(testServerID)
	expired := issueTemplate(t, c, &x509.Certificate{
		SerialNumber: big.NewInt(1002),
		NotBefore:    time.Now().Add(-2 * time.Hour),
		NotAfter:     time.Now().Add(-time.Hour),
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{u},
	})
	cases := []struct {
		name              string
		cert, key, bundle []byte
		why               string // in Stats.LastError, and in no earlier case's error
	}{
		{"key of another certificate", other.cert, good.key, c.PEM(), "private key does not match"},
		{"unparsable certificate", []byte("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"), good.key, c.PEM(), "PEM data in certificate input"},
		{"unparsable trust bundle", good.cert, good.key, []byte("garbage"), opts.TrustBundleFile},
		{"no SPIFFE ID", noSPIFFE.cert, noSPIFFE.key, c.PEM(), "no spiffe:// URI SAN"},
		{"other trust domain", foreign.cert, foreign.key, foreignCA.PEM(), `not in trust domain "cluster.local"`},
		{"expired", expired.cert, expired.key, c.PEM(), "expired"},
	}
	for i, tc := range cases {
		k.swap(t, tc.cert, tc.key, tc.bundle)
		st := s.waitReload(t, Refused, func(st Stats) bool { return strings.Contains(st.LastError, tc.why) })
		if st.Reloads[Applied] != 0 || st.Reloads[Refused] < uint64(i+1) {
			t.Fatalf("%s: stats %+v", tc.name, st)
		}
		if got := currentSerial(t, s.Source); got != good.serial {
			t.Fatalf("%s: serial in force %s, want the first %s", tc.name, got, good.serial)
		}
		if got := servedSerial(t, addr, client, c.Pool()); got != good.serial {
			t.Fatalf("%s: served serial %s, want the first %s", tc.name, got, good.serial)
		}
	}

	next := issue(t, c, testServerID)
	k.swap(t, next.cert, next.key, c.PEM())
	st := s.waitReload(t, Applied, nil)
	if st.LastError != "" || st.Reloads[Applied] != 1 {
		t.Errorf("stats after a good set %+v", st)
	}
	if got := servedSerial(t, addr, client, c.Pool()); got != next.serial {
		t.Errorf("served serial %s, want the new %s", got, next.serial)
	}
}

// New fails with the file at fault named.
func TestNewErrors(t *testing.T) {
	c := ca(t)
	good := issue(t, c, testServerID)
	mismatched := issue(t, c, testServerID)
	noSPIFFE := issueTemplate(t, c, &x509.Certificate{
		SerialNumber: big.NewInt(2001),
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
	})
	tests := []struct {
		name string
		edit func(dir string, o *Options)
		want []string
	}{
		{"no options", func(_ string, o *Options) { *o = Options{} }, []string{"CertFile: missing", "KeyFile: missing", "TrustBundleFile: missing"}},
		{"missing key file", func(dir string, o *Options) { o.KeyFile = filepath.Join(dir, "nope.pem") }, []string{"nope.pem"}},
		{"key of another certificate", func(_ string, o *Options) { writeFile(t, o.KeyFile, mismatched.key) }, []string{"cert.pem", "key.pem", "does not match"}},
		{"no SPIFFE ID", func(_ string, o *Options) {
			writeFile(t, o.CertFile, noSPIFFE.cert)
			writeFile(t, o.KeyFile, noSPIFFE.key)
		}, []string{"cert.pem", "spiffe://"}},
		{"bad bundle", func(_ string, o *Options) { writeFile(t, o.TrustBundleFile, []byte("x")) }, []string{"ca.pem"}},
		{"wrong trust domain", func(_ string, o *Options) { o.TrustDomain = "example.org" }, []string{`"example.org"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir, opts := flatDir(t, good, c.PEM())
			tt.edit(dir, &opts)
			s, err := New(opts)
			if err == nil {
				s.Close()
				t.Fatal("New succeeded")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// Close ends the watcher's goroutine (and fsnotify's), closes the
// subscriptions and may be called again; the certificate stays in force.
func TestCloseEndsWatcher(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	c := ca(t)
	good := issue(t, c, testServerID)
	_, opts := flatDir(t, good, c.PEM())
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ch, _ := s.Subscribe()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, ok := <-ch; ok {
		t.Error("subscription not closed by Close")
	}
	if late, _ := s.Subscribe(); late != nil {
		if _, ok := <-late; ok {
			t.Error("Subscribe after Close gave an open channel")
		}
	}
	if got := currentSerial(t, s); got != good.serial {
		t.Errorf("serial after Close %s, want %s", got, good.serial)
	}
}
