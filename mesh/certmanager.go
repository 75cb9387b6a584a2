package mesh

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"sync"
	"time"
)

// CertSource is what the HBONE side consumes: the certificate in force and
// a signal when it changes.
type CertSource interface {
	// Current returns the certificate in force (nil before the first one and
	// once it has expired without a renewal), the trust roots that came with
	// it, and its expiry (zero before the first).
	Current() (*tls.Certificate, *x509.CertPool, time.Time)
	// Subscribe returns a channel that receives a value after each change of
	// Current (changes in a burst may coalesce into one) and a cancel func.
	// The channel is closed by cancel and when the source closes.
	Subscribe() (<-chan struct{}, func())
}

var _ CertSource = (*CertManager)(nil)

const (
	// renewJitter spreads renewals of a fleet over ±10% of the half-life,
	// so nodes given certificates at the same moment do not renew together.
	renewJitter = 0.1
	// minRenewDelay bounds how often a CA that hands out certificates about
	// to expire is asked again; no real TTL is this short.
	minRenewDelay = 100 * time.Millisecond
)

// CAStats is the CertManager's state for metrics and /config_dump.
type CAStats struct {
	Identity string
	// Expiry is the NotAfter of the certificate held (zero before the first).
	Expiry time.Time
	// NextAttempt is when the next request to the CA is due.
	NextAttempt time.Time
	// Renewals and RenewalFailures count CA requests by result (the first
	// issuance counts as a renewal).
	Renewals, RenewalFailures uint64
	// LastError is the last failure ("" once a request succeeds again).
	LastError   string
	LastErrorAt time.Time
}

// CertManager keeps a workload certificate from Istio's CA: it requests one
// at Start, renews it at half its life (with jitter), retries failures with
// bounded exponential backoff, keeps the old certificate until it expires
// while renewals fail, and tells subscribers of each new certificate.
type CertManager struct {
	client *CAClient
	log    Logger
	bcfg   backoffConfig
	now    func() time.Time

	ready     chan struct{}
	loop      routine // the request/renewal loop, run
	closeOnce sync.Once

	mu      sync.Mutex
	cert    *Certificate
	stats   CAStats
	subs    map[int]chan struct{}
	nextSub int
	closed  bool
}

// NewCertManager checks opts and makes the manager; nothing is requested
// until Start.
func NewCertManager(opts CAOptions) (*CertManager, error) {
	client, err := NewCAClient(opts)
	if err != nil {
		return nil, err
	}
	return &CertManager{
		client: client,
		log:    orNop(opts.Logger),
		bcfg:   newBackoffConfig(opts.MinBackoff, opts.MaxBackoff),
		now:    time.Now,
		ready:  make(chan struct{}),
		subs:   map[int]chan struct{}{},
		stats:  CAStats{Identity: client.Identity()},
	}, nil
}

// Start begins the request/renewal loop in a goroutine Close ends. It
// returns at once; Ready tells when the first certificate is in.
func (m *CertManager) Start() { m.loop.start(m.run) }

// Close stops the loop, waits for it, closes the connection and the
// subscribers' channels. Idempotent; safe without Start.
func (m *CertManager) Close() error {
	var err error
	m.closeOnce.Do(func() {
		m.mu.Lock()
		m.closed = true
		m.mu.Unlock()
		m.loop.stop()
		err = m.client.Close()
		m.mu.Lock()
		for id, ch := range m.subs {
			close(ch)
			delete(m.subs, id)
		}
		m.mu.Unlock()
	})
	return err
}

// Ready is closed once the first certificate is in.
func (m *CertManager) Ready() <-chan struct{} { return m.ready }

// Identity is the SPIFFE URI the manager requests.
func (m *CertManager) Identity() string { return m.client.Identity() }

// Current implements CertSource.
func (m *CertManager) Current() (*tls.Certificate, *x509.CertPool, time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cert == nil {
		return nil, nil, time.Time{}
	}
	if !m.now().Before(m.cert.NotAfter) {
		return nil, m.cert.Roots, m.cert.NotAfter
	}
	return &m.cert.TLS, m.cert.Roots, m.cert.NotAfter
}

// Certificate returns the certificate held, even an expired one (nil
// before the first).
func (m *CertManager) Certificate() *Certificate {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cert
}

// Subscribe implements CertSource.
func (m *CertManager) Subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		close(ch)
		return ch, func() {}
	}
	id := m.nextSub
	m.nextSub++
	m.subs[id] = ch
	return ch, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if c, ok := m.subs[id]; ok {
			close(c)
			delete(m.subs, id)
		}
	}
}

// Stats returns a copy of the manager's state.
func (m *CertManager) Stats() CAStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stats
}

func (m *CertManager) run(ctx context.Context) {
	b := newBackoff(m.bcfg)
	var wait time.Duration // the first request goes out at once
	var announced *Certificate
	for {
		if !m.sleep(ctx, wait, &announced) {
			return
		}
		cert, err := m.client.Fetch(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			b.reset()
			wait = max(jitter(cert.NotAfter.Sub(m.now())/2, renewJitter), minRenewDelay)
			m.install(cert)
			m.log.Info("mesh: certificate issued", "identity", cert.Identity,
				"expiry", cert.NotAfter.UTC().Format(time.RFC3339), "renew_in", wait.Round(time.Millisecond).String())
			continue
		}

		wait = b.next()
		held := m.fail(err)
		switch {
		case held == nil:
			m.log.Warn("mesh: no certificate yet; CA request failed", "error", err.Error(),
				"retry_in", wait.Round(time.Millisecond).String())
		case m.now().Before(held.NotAfter):
			m.log.Warn("mesh: certificate renewal failed; keeping the current certificate until it expires",
				"error", err.Error(), "expiry", held.NotAfter.UTC().Format(time.RFC3339),
				"retry_in", wait.Round(time.Millisecond).String())
		default:
			m.log.Error("mesh: certificate expired and renewal failed; no certificate in force",
				"error", err.Error(), "expired", held.NotAfter.UTC().Format(time.RFC3339),
				"retry_in", wait.Round(time.Millisecond).String())
		}
	}
}

// sleep waits d, or less if ctx ends (then it returns false). When the
// certificate held expires before or during the wait, it says so once per
// certificate (*announced remembers which) and tells the subscribers, as
// Current no longer returns it.
func (m *CertManager) sleep(ctx context.Context, d time.Duration, announced **Certificate) bool {
	m.mu.Lock()
	m.stats.NextAttempt = m.now().Add(d)
	held := m.cert
	m.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	var expiry <-chan time.Time
	if held != nil && held != *announced {
		e := time.NewTimer(held.NotAfter.Sub(m.now())) // fires at once if already past
		defer e.Stop()
		expiry = e.C
	}
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		case <-expiry:
			expiry = nil
			*announced = held
			m.log.Error("mesh: certificate expired; no certificate in force until the CA issues one",
				"identity", held.Identity, "expired", held.NotAfter.UTC().Format(time.RFC3339))
			m.notify()
		}
	}
}

func (m *CertManager) install(cert *Certificate) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cert == nil {
		close(m.ready) // before the subscribers hear of it
	}
	m.cert = cert
	m.stats.Expiry = cert.NotAfter
	m.stats.Renewals++
	m.stats.LastError = ""
	m.notifyLocked()
}

// fail records a failed request and returns the certificate still held.
func (m *CertManager) fail(err error) *Certificate {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stats.RenewalFailures++
	m.stats.LastError = err.Error()
	m.stats.LastErrorAt = m.now()
	return m.cert
}

func (m *CertManager) notify() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.notifyLocked()
}

func (m *CertManager) notifyLocked() {
	for _, ch := range m.subs {
		select {
		case ch <- struct{}{}:
		default: // a signal is already pending; the subscriber reads Current
		}
	}
}
