package dnsproxy

import (
	"net/netip"
	"sync"
	"time"
)

// limiter is a token bucket per source address: rate queries a second,
// burst at once. It remembers at most maxSources sources; past that, the
// ones whose buckets are full again (idle long enough to have forgotten
// nothing) are dropped, and while none is, new sources share one bucket.
type limiter struct {
	rate  float64
	burst float64

	mu       sync.Mutex
	sources  map[netip.Addr]*bucket
	overflow bucket // for sources beyond maxSources
}

// maxSources bounds the limiter's memory under a flood of spoofed
// sources: about 100 bytes each, so a few hundred KiB at most.
const maxSources = 4096

type bucket struct {
	tokens float64
	last   time.Time
}

func newLimiter(rate float64, burst int) *limiter {
	return &limiter{rate: rate, burst: float64(burst), sources: make(map[netip.Addr]*bucket)}
}

// allow takes one token of src's bucket at now, if it has one.
func (l *limiter) allow(src netip.Addr, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.sources[src]
	if b == nil {
		if len(l.sources) >= maxSources {
			l.sweepLocked(now)
		}
		if len(l.sources) >= maxSources {
			b = &l.overflow
		} else {
			b = &bucket{tokens: l.burst, last: now}
			l.sources[src] = b
		}
	}
	b.refill(now, l.rate, l.burst)
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// sweepLocked forgets the sources whose buckets have refilled: they
// would start full anyway. The caller holds mu.
func (l *limiter) sweepLocked(now time.Time) {
	for src, b := range l.sources {
		if b.refill(now, l.rate, l.burst); b.tokens >= l.burst {
			delete(l.sources, src)
		}
	}
}

func (b *bucket) refill(now time.Time, rate, burst float64) {
	if b.last.IsZero() {
		b.tokens, b.last = burst, now
		return
	}
	if d := now.Sub(b.last); d > 0 {
		b.tokens = min(burst, b.tokens+d.Seconds()*rate)
		b.last = now
	}
}
