// Package certfile serves HBONE's certificate from files and swaps it
// when the files change: a Source loads a certificate chain, its key and
// a trust bundle, watches the directories that hold them (so atomic
// renames and Kubernetes' "..data" symlink swaps are seen, not only
// writes in place), and after a burst of changes loads them again. A new
// set is put in force only if it is whole: the key matches the
// certificate, every PEM parses, the leaf carries a SPIFFE ID in the same
// trust domain as before, and it has not expired; otherwise the set in
// force stays, and the refusal is logged and counted. A Source is an
// hbone.CertSource; its Subscribe has the semantics of mesh.CertSource.
package certfile

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/hashicorp/go-hclog"

	"github.com/meshtun/meshtun/hbone"
	"github.com/meshtun/meshtun/identity"
)

// DefaultDebounce is how long a Source waits after the last change event
// of a burst before it loads the files: long enough that a tool writing
// the certificate, the key and the bundle one after another is read once
// (and not caught between the certificate and its key), short enough that
// a new certificate is in force well within a second.
const DefaultDebounce = 250 * time.Millisecond

// Options configure a Source.
type Options struct {
	// CertFile holds the certificate chain, leaf first (PEM). Required.
	CertFile string
	// KeyFile holds the leaf's private key (PEM). Required.
	KeyFile string
	// TrustBundleFile holds the trust roots (PEM). Required.
	TrustBundleFile string
	// TrustDomain, if set, is the trust domain the leaf's SPIFFE ID must
	// be in, at start and at every reload. Unset, the trust domain of the
	// first certificate is kept: a reload may change the identity but not
	// its trust domain.
	TrustDomain string
	// Debounce is the quiet time after a change before the files are
	// loaded. Default DefaultDebounce.
	Debounce time.Duration
	// Logger receives the reloads and refusals (named "certfile").
	// Default: none.
	Logger hclog.Logger

	// onReload, if set, is called after each reload attempt with its
	// result (tests).
	onReload func(Result)
}

// Result is the outcome of one reload, the label of Stats' counters.
type Result string

// Reload results.
const (
	Applied   Result = "applied"   // a new certificate is in force
	Unchanged Result = "unchanged" // the files hold what is in force already
	Refused   Result = "refused"   // the files are broken; the certificate in force stays
)

// Stats is a Source's state for metrics and /config_dump.
type Stats struct {
	Identity string    // SPIFFE ID of the certificate in force
	Expiry   time.Time // its NotAfter
	// Reloads counts reload attempts by result (the load at New is not one).
	Reloads map[Result]uint64
	// LastError is why the last refused reload was refused ("" once one is
	// applied or unchanged again).
	LastError   string
	LastErrorAt time.Time
}

// Source is a certificate, key and trust bundle from files, swapped when
// the files change. Make it with New; Close stops watching.
type Source struct {
	opts    Options
	log     hclog.Logger
	watcher *fsnotify.Watcher
	names   map[string]bool // base names of the three files
	stop    chan struct{}   // closed by Close
	done    chan struct{}   // closed when run returns

	closeOnce sync.Once

	mu      sync.Mutex
	cur     *loaded
	stats   Stats
	subs    map[int]chan struct{}
	nextSub int
	closed  bool
}

var _ hbone.CertSource = (*Source)(nil)

// loaded is one set of files, checked.
type loaded struct {
	cert  tls.Certificate
	roots *x509.CertPool
	id    identity.ID
	files [3][]byte // the files' contents, to tell an unchanged reload
}

// New loads the files, failing with an error that names the file at
// fault, and starts watching their directories in a goroutine Close ends.
func New(opts Options) (*Source, error) {
	var errs []error
	for _, f := range []struct{ name, path string }{
		{"CertFile", opts.CertFile}, {"KeyFile", opts.KeyFile}, {"TrustBundleFile", opts.TrustBundleFile},
	} {
		if f.path == "" {
			errs = append(errs, fmt.Errorf("%s: missing", f.name))
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("certfile: options: %w", errors.Join(errs...))
	}
	if opts.Debounce <= 0 {
		opts.Debounce = DefaultDebounce
	}
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	s := &Source{
		opts:  opts,
		log:   opts.Logger.Named("certfile"),
		names: map[string]bool{},
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
		subs:  map[int]chan struct{}{},
		stats: Stats{Reloads: map[Result]uint64{}},
	}
	cur, err := s.load()
	if err != nil {
		return nil, err
	}
	if opts.TrustDomain != "" && cur.id.TrustDomain() != opts.TrustDomain {
		return nil, fmt.Errorf("certfile: %s: identity %s is not in trust domain %q", opts.CertFile, cur.id, opts.TrustDomain)
	}
	s.opts.TrustDomain = cur.id.TrustDomain()
	s.installLocked(cur) // no subscriber and no other goroutine yet

	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("certfile: watch: %w", err)
	}
	var dirs []string
	for _, p := range []string{opts.CertFile, opts.KeyFile, opts.TrustBundleFile} {
		s.names[filepath.Base(p)] = true
		if d := filepath.Dir(p); !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	for _, d := range dirs {
		if err := w.Add(d); err != nil {
			w.Close()
			return nil, fmt.Errorf("certfile: watch %s: %w", d, err)
		}
	}
	s.watcher = w
	go s.run()
	s.log.Info("certificate loaded", "identity", cur.id.String(), "expiry", expiryString(cur),
		"cert", opts.CertFile, "key", opts.KeyFile, "trust_bundle", opts.TrustBundleFile)
	return s, nil
}

// load reads and checks the three files (all but the trust-domain rule,
// which depends on what is in force).
func (s *Source) load() (*loaded, error) {
	var l loaded
	paths := [3]string{s.opts.CertFile, s.opts.KeyFile, s.opts.TrustBundleFile}
	for i, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("certfile: %w", err)
		}
		l.files[i] = b
	}
	cert, err := tls.X509KeyPair(l.files[0], l.files[1])
	if err != nil {
		return nil, fmt.Errorf("certfile: %s and %s: %w", paths[0], paths[1], err)
	}
	if cert.Leaf == nil { // crypto/tls leaves it unset under GODEBUG x509keypairleaf=0
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("certfile: %s: %w", paths[0], err)
		}
	}
	if l.id, err = identity.FromCertificate(cert.Leaf); err != nil {
		return nil, fmt.Errorf("certfile: %s: %w", paths[0], err)
	}
	if l.roots, err = hbone.LoadRoots(l.files[2]); err != nil {
		return nil, fmt.Errorf("certfile: %s: %w", paths[2], err)
	}
	l.cert = cert
	return &l, nil
}

// Current implements hbone.CertSource: the certificate in force (nil once
// it has expired), the trust roots and the expiry.
func (s *Source) Current() (*tls.Certificate, *x509.CertPool, time.Time) {
	s.mu.Lock()
	cur := s.cur
	s.mu.Unlock()
	expiry := cur.cert.Leaf.NotAfter
	if !time.Now().Before(expiry) {
		return nil, cur.roots, expiry
	}
	return &cur.cert, cur.roots, expiry
}

// Subscribe returns a channel that receives a value after each change of
// Current (a new certificate, or the one in force expiring; changes in a
// burst may coalesce into one) and a cancel func. The channel is closed by
// cancel and by Close.
func (s *Source) Subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		close(ch)
		return ch, func() {}
	}
	id := s.nextSub
	s.nextSub++
	s.subs[id] = ch
	return ch, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if c, ok := s.subs[id]; ok {
			close(c)
			delete(s.subs, id)
		}
	}
}

// Stats returns a copy of the source's state.
func (s *Source) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Reloads = make(map[Result]uint64, len(s.stats.Reloads))
	for k, v := range s.stats.Reloads {
		st.Reloads[k] = v
	}
	return st
}

// Close stops watching and waits for the watcher's goroutine, and closes
// the subscribers' channels. The certificate in force stays in force.
// Idempotent.
func (s *Source) Close() error {
	var err error
	s.closeOnce.Do(func() {
		close(s.stop)
		<-s.done
		err = s.watcher.Close()
		s.mu.Lock()
		s.closed = true
		for id, ch := range s.subs {
			close(ch)
			delete(s.subs, id)
		}
		s.mu.Unlock()
	})
	return err
}

// run turns the watcher's events into debounced reloads, and says when
// the certificate in force expires.
func (s *Source) run() {
	defer close(s.done)
	debounce := time.NewTimer(s.opts.Debounce)
	debounce.Stop()
	defer debounce.Stop()
	expiry := time.NewTimer(s.untilExpiry())
	defer expiry.Stop()
	for {
		select {
		case <-s.stop:
			return
		case ev, ok := <-s.watcher.Events:
			if !ok {
				return
			}
			if s.relevant(ev) {
				debounce.Reset(s.opts.Debounce)
			}
		case err, ok := <-s.watcher.Errors:
			if !ok {
				return
			}
			// Events may have been lost (a queue overflow): look at the
			// files anyway.
			s.log.Warn("watching the certificate files failed; reloading them", "error", err)
			debounce.Reset(s.opts.Debounce)
		case <-debounce.C:
			s.reload()
			expiry.Reset(s.untilExpiry())
		case <-expiry.C:
			s.mu.Lock()
			cur := s.cur
			s.notifyLocked()
			s.mu.Unlock()
			s.log.Error("certificate expired; no certificate in force until the files hold a valid one",
				"identity", cur.id.String(), "expired", expiryString(cur), "cert", s.opts.CertFile)
			expiry.Reset(24 * time.Hour) // a new certificate resets it; only say it again if none comes
		}
	}
}

// relevant reports whether ev may change one of our files: an event on
// one of their names, or on a name starting with ".." (Kubernetes'
// atomic writer swaps the "..data" symlink the files point through).
func (s *Source) relevant(ev fsnotify.Event) bool {
	base := filepath.Base(ev.Name)
	return s.names[base] || strings.HasPrefix(base, "..")
}

// untilExpiry is the time left until the certificate in force expires
// (at least a moment, so an expired one is reported at once).
func (s *Source) untilExpiry() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return max(time.Until(s.cur.cert.Leaf.NotAfter), time.Millisecond)
}

// reload loads the files again and puts them in force if they are whole
// and new.
func (s *Source) reload() {
	result, next, err := s.tryReload()
	s.mu.Lock()
	if result == Applied {
		s.installLocked(next)
	}
	// Counted under the lock that puts next in force, so a subscriber
	// woken by the signal reads stats that already include this reload.
	s.stats.Reloads[result]++
	cur := s.cur
	if err != nil {
		s.stats.LastError = err.Error()
		s.stats.LastErrorAt = time.Now()
	} else {
		s.stats.LastError = ""
	}
	if result == Applied {
		s.notifyLocked()
	}
	s.mu.Unlock()
	switch result {
	case Applied:
		s.log.Info("certificate reloaded", "identity", cur.id.String(), "expiry", expiryString(cur),
			"serial", cur.cert.Leaf.SerialNumber.String())
	case Refused:
		s.log.Warn("certificate files refused; keeping the certificate in force", "error", err.Error(),
			"identity", cur.id.String(), "expiry", expiryString(cur))
	}
	if s.opts.onReload != nil {
		s.opts.onReload(result)
	}
}

// tryReload loads the files and says whether they may replace the pair
// in force (Applied, with the new pair), are the same (Unchanged) or are
// refused.
func (s *Source) tryReload() (Result, *loaded, error) {
	next, err := s.load()
	if err != nil {
		return Refused, nil, err
	}
	s.mu.Lock()
	cur := s.cur
	s.mu.Unlock()
	if sameFiles(next, cur) {
		return Unchanged, nil, nil
	}
	if td := next.id.TrustDomain(); td != s.opts.TrustDomain {
		return Refused, nil, fmt.Errorf("certfile: %s: identity %s is not in trust domain %q", s.opts.CertFile, next.id, s.opts.TrustDomain)
	}
	if !time.Now().Before(next.cert.Leaf.NotAfter) {
		return Refused, nil, fmt.Errorf("certfile: %s: certificate expired at %s", s.opts.CertFile, expiryString(next))
	}
	if next.id != cur.id {
		s.log.Warn("identity changed; new connections use the new one", "from", cur.id.String(), "to", next.id.String())
	}
	return Applied, next, nil
}

// installLocked puts l in force; the caller holds s.mu and tells the
// subscribers.
func (s *Source) installLocked(l *loaded) {
	s.cur = l
	s.stats.Identity = l.id.String()
	s.stats.Expiry = l.cert.Leaf.NotAfter
}

func (s *Source) notifyLocked() {
	for _, ch := range s.subs {
		select {
		case ch <- struct{}{}:
		default: // a signal is pending already; the subscriber reads Current
		}
	}
}

func sameFiles(a, b *loaded) bool {
	for i := range a.files {
		if !bytes.Equal(a.files[i], b.files[i]) {
			return false
		}
	}
	return true
}

func expiryString(l *loaded) string { return l.cert.Leaf.NotAfter.UTC().Format(time.RFC3339) }
