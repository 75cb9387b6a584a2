package bench

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
)

func samples(vs ...float64) []Sample {
	var out []Sample
	for _, v := range vs {
		out = append(out, Sample{Value: v, Work: 2, CPU: CPU{GatewayA: v / 100, GatewayB: v / 50, Loadgen: 1}})
	}
	return out
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// The pair's ratios to the kernel and to each peer are ratios of the
// medians, the peers' CPU per work is that of their two proxies, and a
// peer without runs has no ratio.
func TestFinishPeerRatios(t *testing.T) {
	f := &Figure{Key: "rr.p50", Unit: "µs", WorkUnit: "conn",
		Pair:   samples(300, 200, 250),
		Kernel: samples(20, 30, 25),
		Relay:  samples(210, 190, 200),
		Istio:  samples(260, 240, 250),
	}
	f.finish()
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"pair÷kernel", f.Ratio, 250.0 / 25},
		{"pair÷relay", f.RatioRelay, 250.0 / 200},
		{"pair÷Istio", f.RatioIstio, 1},
		{"relay median", f.RelayS.Median, 200},
		{"Istio min", f.IstioS.Min, 240},
		{"relay proxy A CPU per conn", f.RelayCPU.GatewayA, 200.0 / 100 / 2},
		{"Istio proxy B CPU per conn", f.IstioCPU.GatewayB, 250.0 / 50 / 2},
	} {
		if !near(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}

	g := &Figure{Key: "bulk1.up", Unit: "Gbit/s", Higher: true, Pair: samples(4), Kernel: samples(16), Relay: samples(8)}
	g.finish()
	if !near(g.RatioRelay, 0.5) || g.RatioIstio != 0 || g.IstioS.N != 0 {
		t.Errorf("relay ratio %v, Istio ratio %v with %d runs; want 0.5, 0, 0", g.RatioRelay, g.RatioIstio, g.IstioS.N)
	}
}

// The rr targets against the peers are measured from the peers' runs,
// met or missed against their limits, and not measured without them.
func TestPeerTargets(t *testing.T) {
	target := func(rs []TargetResult, name string) TargetResult {
		t.Helper()
		for _, r := range rs {
			if strings.Contains(r.Name, name) {
				return r
			}
		}
		t.Fatalf("no target %q", name)
		return TargetResult{}
	}
	f := &Figure{Key: "rr.p50", Unit: "µs", Pair: samples(220), Kernel: samples(25), Relay: samples(200), Istio: samples(230)}
	f.finish()
	rs := evalTargets([]*Figure{f})
	relay, istio := target(rs, "plain relay pair"), target(rs, "Istio's Go HBONE pair")
	if !relay.Measured || !near(relay.Value, 1.1) || !relay.Met {
		t.Errorf("relay target %+v, want measured 1.1, met (≤ 1.1)", relay)
	}
	if !istio.Measured || !near(istio.Value, 220.0/230) || !istio.Met {
		t.Errorf("Istio target %+v, want measured %.3f, met", istio, 220.0/230)
	}

	f = &Figure{Key: "rr.p50", Unit: "µs", Pair: samples(300), Kernel: samples(25), Relay: samples(200)}
	f.finish()
	rs = evalTargets([]*Figure{f})
	relay, istio = target(rs, "plain relay pair"), target(rs, "Istio's Go HBONE pair")
	if !relay.Measured || relay.Met {
		t.Errorf("relay target %+v, want measured 1.5, missed", relay)
	}
	if istio.Measured {
		t.Errorf("Istio target %+v measured without Istio's runs", istio)
	}
}

// The table has the peers' columns and says which figures a peer could
// not take and which peers the run left out; the JSON carries the peers.
func TestTablePeers(t *testing.T) {
	up := &Figure{Scenario: "bulk1", Key: "bulk1.up", Name: "bulk1 up A→B", Unit: "Gbit/s", Higher: true, WorkUnit: "GiB",
		Pair: samples(4), Kernel: samples(16), Relay: samples(8)}
	up.notMeasuredOn("istio", "no half-close")
	down := &Figure{Scenario: "bulk1", Key: "bulk1.down", Name: "bulk1 down B→A", Unit: "Gbit/s", Higher: true, WorkUnit: "GiB",
		Pair: samples(4), Kernel: samples(16), Relay: samples(8), Istio: samples(2)}
	for _, f := range []*Figure{up, down} {
		f.finish()
	}
	rep := &Report{Figures: []*Figure{up, down}, PeersLeftOut: map[string]string{"relay": "left out here"}}
	out := Summary(rep)
	for _, want := range []string{
		"relay pair", "Istio HBONE pair", "pair÷relay", "pair÷Istio", "| relay A+B", "| Istio A+B",
		"not measured on istio: bulk1 up A→B (no half-close)",
		"relay: not measured: left out here",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q:\n%s", want, out)
		}
	}
	var downLine string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "bulk1 down") {
			downLine = l
		}
	}
	// pair÷kernel 0.25, pair÷relay 0.5, pair÷Istio 2; Istio's two proxies
	// 2/100/2 + 2/50/2 = 0.03 CPU-s per GiB.
	for _, want := range []string{" 0.250 ", " 0.500 ", " 2.00 ", "| 0.030"} {
		if !strings.Contains(downLine, want) {
			t.Errorf("the bulk1 down row lacks %q: %q", want, downLine)
		}
	}

	b, err := marshalReport(rep)
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		Figures []struct {
			Key         string            `json:"key"`
			Relay       []Sample          `json:"relay"`
			Istio       []Sample          `json:"istio"`
			RatioRelay  float64           `json:"ratio_relay"`
			RatioIstio  float64           `json:"ratio_istio"`
			IstioCPU    CPU               `json:"istio_cpu_per_work"`
			NotMeasured map[string]string `json:"not_measured"`
		} `json:"figures"`
		PeersLeftOut map[string]string `json:"peers_left_out"`
	}
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Figures) != 2 || back.Figures[0].NotMeasured["istio"] != "no half-close" || len(back.Figures[1].Istio) != 1 ||
		!near(back.Figures[1].RatioIstio, 2) || !near(back.Figures[1].RatioRelay, 0.5) || back.Figures[1].IstioCPU.GatewayB == 0 ||
		back.PeersLeftOut["relay"] == "" {
		t.Errorf("the JSON does not carry the peers: %s", b)
	}
}

// Runs alternate the order of every path: pair, kernel, then the peers
// on even runs, the reverse on odd ones; without peers only the pair and
// the kernel, and a peer the run left out never.
func TestOrder(t *testing.T) {
	e := &env{}
	e.pair, e.kernel, e.relay, e.istio = &path{name: "pair"}, &path{name: "kernel"}, &path{name: "relay"}, &path{name: "istio"}
	names := func(ps []*path) string {
		var out []string
		for _, p := range ps {
			out = append(out, p.name)
		}
		return strings.Join(out, ",")
	}
	for _, c := range []struct {
		run   int
		peers bool
		want  string
	}{
		{0, true, "pair,kernel,relay,istio"},
		{1, true, "istio,relay,kernel,pair"},
		{2, true, "pair,kernel,relay,istio"},
		{0, false, "pair,kernel"},
		{1, false, "kernel,pair"},
	} {
		if got := names(e.order(c.run, c.peers)); got != c.want {
			t.Errorf("order(%d, peers %v) = %s, want %s", c.run, c.peers, got, c.want)
		}
	}
	e.istio = nil
	if got := names(e.order(1, true)); got != "relay,kernel,pair" {
		t.Errorf("without Istio's pair, order(1) = %s", got)
	}
	// order must not reorder the env's own list of paths.
	if got := names(e.all()); got != "pair,kernel,relay" {
		t.Errorf("all() = %s after order", got)
	}
}
