package gateway

import (
	"maps"
	"testing"

	"github.com/meshtun/meshtun/tun"
)

// meshtun_repairs_total has one series per kind of restoration, each
// with its own count, and none while no device runs.
func TestMetricsRepairs(t *testing.T) {
	got := gatherSeries(t, &repairCollector{stats: func() (tun.RepairStats, bool) {
		return tun.RepairStats{Link: 1, Address: 2, Route: 3, Rule: 4, Reconciles: 50, Failures: 60, Resubscribes: 70}, true
	}})
	if want := map[string]float64{
		"meshtun_repairs_total{what=link}": 1, "meshtun_repairs_total{what=address}": 2,
		"meshtun_repairs_total{what=route}": 3, "meshtun_repairs_total{what=rule}": 4,
	}; !maps.Equal(got, want) {
		t.Errorf("gathered %v, want %v", got, want)
	}
	if got := gatherSeries(t, &repairCollector{stats: func() (tun.RepairStats, bool) { return tun.RepairStats{}, false }}); len(got) != 0 {
		t.Errorf("without a device: %v, want no sample", got)
	}
}
