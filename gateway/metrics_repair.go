package gateway

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshtun/meshtun/tun"
)

// repairsDesc is meshtun_repairs_total: the TUN's self-repair
// (tun/repair.go), one series per kind of restoration. The label values
// are tun.RepairKinds, a fixed set; each has a sample from the start, 0
// until something is restored, so a rate() sees the first one.
var repairsDesc = prometheus.NewDesc("meshtun_repairs_total",
	"Parts of the TUN's configuration restored after something outside the gateway removed or changed them, by what: "+
		"link (set up again, or its MTU set back), address, route (a capture route) or rule (a bypass rule).",
	[]string{"what"}, nil)

// repairCollector exports the Repairer's Stats, read once per scrape.
// Without a device (tun.name empty) or before Run opens it, there is no
// sample.
type repairCollector struct {
	stats func() (tun.RepairStats, bool)
}

var _ prometheus.Collector = (*repairCollector)(nil)

func (c *repairCollector) Describe(ch chan<- *prometheus.Desc) { ch <- repairsDesc }

func (c *repairCollector) Collect(ch chan<- prometheus.Metric) {
	s, ok := c.stats()
	if !ok {
		return
	}
	for _, what := range tun.RepairKinds {
		ch <- prometheus.MustNewConstMetric(repairsDesc, prometheus.CounterValue, float64(s.Of(what)), what)
	}
}
