package gateway

import (
	"maps"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshtun/meshtun/tun"
)

// meshtun_repairs_total has one series per kind of restoration, each
// with its own count, and none while no device runs.
func TestMetricsRepairs(t *testing.T) {
	gather := func(c prometheus.Collector) map[string]float64 {
		t.Helper()
		reg := prometheus.NewRegistry()
		reg.MustRegister(c)
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, f := range families {
			if f.GetName() != "meshtun_repairs_total" {
				t.Errorf("family %s", f.GetName())
			}
			for _, m := range f.GetMetric() {
				if l := m.GetLabel(); len(l) != 1 || l[0].GetName() != "what" {
					t.Errorf("labels %v, want what only", l)
					continue
				}
				out[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
		return out
	}
	got := gather(&repairCollector{stats: func() (tun.RepairStats, bool) {
		return tun.RepairStats{Link: 1, Address: 2, Route: 3, Rule: 4, Reconciles: 50, Failures: 60, Resubscribes: 70}, true
	}})
	if want := map[string]float64{"link": 1, "address": 2, "route": 3, "rule": 4}; !maps.Equal(got, want) {
		t.Errorf("gathered %v, want %v", got, want)
	}
	if got := gather(&repairCollector{stats: func() (tun.RepairStats, bool) { return tun.RepairStats{}, false }}); len(got) != 0 {
		t.Errorf("without a device: %v, want no sample", got)
	}
}
