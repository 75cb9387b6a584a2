package mesh

import (
	"testing"
	"time"
)

func TestBackoffDoublesWithinBoundsAndResets(t *testing.T) {
	cfg := newBackoffConfig(10*time.Millisecond, 80*time.Millisecond)
	b := newBackoff(cfg)
	for round := range 2 {
		want := []time.Duration{10, 20, 40, 80, 80, 80}
		for i, d := range want {
			d *= time.Millisecond
			got := b.next()
			if got < d/2 || got > d {
				t.Fatalf("round %d delay %d = %v, want within [%v, %v]", round, i, got, d/2, d)
			}
		}
		b.reset()
	}
}

func TestBackoffConfigDefaults(t *testing.T) {
	if c := newBackoffConfig(0, 0); c.Min != defaultMinBackoff || c.Max != defaultMaxBackoff {
		t.Errorf("defaults %+v", c)
	}
	if c := newBackoffConfig(time.Second, time.Millisecond); c.Max != time.Second {
		t.Errorf("max below min: %+v", c)
	}
}

func TestJitterStaysWithinTheFraction(t *testing.T) {
	for range 1000 {
		if d := jitter(time.Second, 0.1); d < 900*time.Millisecond || d > 1100*time.Millisecond {
			t.Fatalf("jitter(1s, 0.1) = %v", d)
		}
	}
	if d := jitter(time.Second, 0); d != time.Second {
		t.Errorf("no jitter: %v", d)
	}
}
