package bench

import (
	"math"
	"testing"
	"time"
)

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		bad  bool
	}{
		{in: "4096", want: 4096},
		{in: "2GiB", want: 2 << 30},
		{in: "2G", want: 2 << 30},
		{in: "512MiB", want: 512 << 20},
		{in: "1.5 MiB", want: 3 << 19},
		{in: "64KiB", want: 64 << 10},
		{in: "10B", want: 10},
		{in: "", bad: true},
		{in: "GiB", bad: true},
		{in: "-1MiB", bad: true},
		{in: "1TiB", bad: true},
		{in: "1e300GiB", bad: true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseSize(tc.in)
			if tc.bad {
				if err == nil {
					t.Fatalf("ParseSize(%q) = %d, want an error", tc.in, got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestSummarize(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []float64
		want Stats
	}{
		{"none", nil, Stats{}},
		{"one", []float64{3}, Stats{3, 3, 3, 1}},
		{"odd count, unsorted", []float64{5, 1, 3}, Stats{3, 1, 5, 3}},
		{"even count: mean of the middle two", []float64{4, 1, 2, 10}, Stats{3, 1, 10, 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := summarize(tc.in); got != tc.want {
				t.Fatalf("summarize(%v) = %+v, want %+v", tc.in, got, tc.want)
			}
		})
	}
}

func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- { // 1..100 µs, reversed
		ds = append(ds, time.Duration(i)*time.Microsecond)
	}
	for _, tc := range []struct {
		name string
		p    float64
		want time.Duration
	}{
		{"p50", 50, 50 * time.Microsecond},
		{"p99", 99, 99 * time.Microsecond},
		{"p100", 100, 100 * time.Microsecond},
		{"tiny p is the minimum", 0.001, time.Microsecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := percentile(ds, tc.p); got != tc.want {
				t.Fatalf("percentile(%v) = %v, want %v", tc.p, got, tc.want)
			}
		})
	}
	if got := percentile(nil, 50); got != 0 {
		t.Fatalf("percentile of nothing = %v", got)
	}
}

func TestManyAddrs(t *testing.T) {
	as := manyAddrs(10000)
	if len(as) != 10000 {
		t.Fatalf("%d addresses, want 10000", len(as))
	}
	seen := map[string]bool{}
	for _, a := range as {
		if !ManyPrefix.Contains(a) {
			t.Fatalf("%v outside %v", a, ManyPrefix)
		}
		if b := a.As4(); b[3] == 0 || b[3] == 255 {
			t.Fatalf("%v ends in .0 or .255", a)
		}
		if seen[a.String()] {
			t.Fatalf("%v twice", a)
		}
		seen[a.String()] = true
	}
	// The prefix bounds the list.
	if n := len(manyAddrs(1 << 20)); n != 128*254 {
		t.Fatalf("all of %v: %d addresses, want %d", ManyPrefix, n, 128*254)
	}
}

func TestTargets(t *testing.T) {
	figs := []*Figure{
		{Key: "bulk1.up", PairS: Stats{N: 3, Median: 4}, KernelS: Stats{N: 3, Median: 10}, Ratio: 0.4,
			PairCPU: CPU{GatewayA: 2, GatewayB: 2}},
		{Key: "short1.connect.p50", PairS: Stats{N: 3, Median: 500}, KernelS: Stats{N: 3, Median: 65}, Ratio: 7.7},
		{Key: "short1.whole.p99", PairS: Stats{N: 3, Median: 900}, KernelS: Stats{N: 3, Median: 300}, Ratio: 3},
		{Key: "short1.whole.p50", PairS: Stats{N: 3, Median: 700}, KernelS: Stats{N: 3, Median: 200}, Ratio: 3.5, WorkUnit: "conn",
			PairCPU: CPU{GatewayA: 0.00025, GatewayB: 0.0002}}, // CPU-s per connection: 0.45 ms
		{Key: "idle.gw_a", PairS: Stats{N: 3, Median: 32}},
		{Key: "idle.gw_b", PairS: Stats{N: 3, Median: 12}},
	}
	got := map[string]TargetResult{}
	for _, r := range evalTargets(figs) {
		got[r.Name] = r
	}
	for _, tc := range []struct {
		name          string
		measured, met bool
		value         float64
	}{
		{"connect p50, pair ÷ kernel", true, false, 7.7},
		{"short connection p99, pair ÷ kernel", true, true, 3},
		{"CPU-ms per connection, both gateways (short1)", true, true, 0.45},
		{"64 B rr p50, pair ÷ Istio's Go HBONE pair", false, false, 0},
		{"one bulk flow up, pair ÷ kernel", true, true, 0.4},
		{"one bulk flow down, pair ÷ kernel", false, false, 0},
		{"CPU-s/GiB both gateways, bulk1 up", true, false, 4},
		{"CPU-s/GiB both gateways, bulk1 down", false, false, 0},
		{"RSS per idle flow, gateway A (KiB; was 17)", true, false, 32},
		{"RSS per idle flow, gateway B (KiB; was 12)", true, true, 12},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, ok := got[tc.name]
			if !ok {
				t.Fatal("no such target")
			}
			if r.Measured != tc.measured || r.Met != tc.met || math.Abs(r.Value-tc.value) > 1e-9 {
				t.Fatalf("got %+v, want measured %v met %v value %v", r, tc.measured, tc.met, tc.value)
			}
		})
	}
}
