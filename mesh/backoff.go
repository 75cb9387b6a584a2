package mesh

import (
	"math/rand/v2"
	"time"
)

const (
	// defaultMinBackoff is the first retry delay: short, because the usual
	// failure is istiod restarting or a connection reaching its maximum age.
	defaultMinBackoff = 100 * time.Millisecond
	// defaultMaxBackoff caps the delay so a node finds istiod again within
	// half a minute of it coming back, without hammering it while it is down
	// (ztunnel caps its xDS backoff at 15 s; twice that is still well inside
	// the life of a certificate or a token).
	defaultMaxBackoff = 30 * time.Second
)

// backoffConfig bounds a retry schedule.
type backoffConfig struct {
	Min, Max time.Duration
}

func newBackoffConfig(min, max time.Duration) backoffConfig {
	if min <= 0 {
		min = defaultMinBackoff
	}
	if max <= 0 {
		max = defaultMaxBackoff
	}
	if max < min {
		max = min
	}
	return backoffConfig{Min: min, Max: max}
}

// backoff is an exponential schedule with jitter: each delay is drawn from
// [d/2, d], and d doubles from Min up to Max. Not safe for concurrent use;
// each retry loop owns one.
type backoff struct {
	cfg backoffConfig
	d   time.Duration
}

func newBackoff(cfg backoffConfig) *backoff { return &backoff{cfg: cfg, d: cfg.Min} }

// next returns the delay before the next attempt and lengthens the one
// after it.
func (b *backoff) next() time.Duration {
	d := b.d
	b.d = min(b.d*2, b.cfg.Max)
	half := d / 2
	return half + rand.N(d-half+1)
}

// reset starts the schedule again from Min, after a success.
func (b *backoff) reset() { b.d = b.cfg.Min }

// jitter returns d moved by a random amount within ±frac of it.
func jitter(d time.Duration, frac float64) time.Duration {
	span := time.Duration(float64(d) * frac)
	if span <= 0 {
		return d
	}
	return d - span + rand.N(2*span+1)
}
