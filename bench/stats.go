package bench

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Stats summarizes the runs of one figure on one path.
type Stats struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

// summarize is the median, min and max of vs (NaN-free); zero Stats for
// none. With an even count the median is the mean of the middle two.
func summarize(vs []float64) Stats {
	if len(vs) == 0 {
		return Stats{}
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	mid := len(s) / 2
	med := s[mid]
	if len(s)%2 == 0 {
		med = (s[mid-1] + s[mid]) / 2
	}
	return Stats{Median: med, Min: s[0], Max: s[len(s)-1], N: len(s)}
}

// percentile is the nearest-rank p-th percentile (0 < p ≤ 100) of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return sortedPercentile(s, p)
}

// sortedPercentile is percentile of s, sorted already.
func sortedPercentile(s []time.Duration, p float64) time.Duration {
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	rank = min(max(rank, 1), len(s))
	return s[rank-1]
}

// ParseSize reads a byte count: a plain number or one with a binary suffix
// (KiB, MiB, GiB; K, M, G are the same).
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1}} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || f*float64(mult) > math.MaxInt64/2 {
		return 0, fmt.Errorf("bench: bad size %q (want e.g. 2GiB, 512MiB, 4096)", s)
	}
	return int64(f * float64(mult)), nil
}

// formatSize prints a byte count with the largest binary unit that keeps
// it whole-ish.
func formatSize(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}
