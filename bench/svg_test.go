package bench

import (
	"encoding/xml"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

type svgElem struct {
	name  string
	attrs map[string]string
}

// parseSVG reads every element of doc, failing on XML that does not parse.
func parseSVG(t *testing.T, doc string) []svgElem {
	t.Helper()
	d := xml.NewDecoder(strings.NewReader(doc))
	var out []svgElem
	for {
		tok, err := d.Token()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("the SVG is not XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			e := svgElem{name: se.Name.Local, attrs: map[string]string{}}
			for _, a := range se.Attr {
				e.attrs[a.Name.Local] = a.Value
			}
			out = append(out, e)
		}
	}
}

func TestDrawReport(t *testing.T) {
	rep := &Report{
		Started: time.Date(2026, 12, 3, 7, 0, 0, 0, time.UTC),
		Config:  map[string]any{"runs": 3},
		Figures: []*Figure{
			{Key: "bulk1.up", Name: "bulk <1 flow> up", Unit: "Gbit/s", Higher: true,
				PairS: Stats{Median: 3, Min: 2.5, Max: 3.5, N: 3}, KernelS: Stats{Median: 12, Min: 11, Max: 13, N: 3}, Ratio: 0.25,
				RelayS: Stats{Median: 6, Min: 6, Max: 6, N: 3}, RatioRelay: 0.5, IstioS: Stats{Median: 2, Min: 2, Max: 2, N: 3}, RatioIstio: 1.5},
			{Key: "conn1", Name: "conn rate", Unit: "conn/s", Higher: true,
				PairS: Stats{Median: 4000, Min: 3900, Max: 4100, N: 3}, KernelS: Stats{Median: 20000, Min: 19000, Max: 21000, N: 3}, Ratio: 0.2},
			{Key: "rr.p50", Name: "latency p50", Unit: "µs", PairS: Stats{Median: 150, N: 3}, KernelS: Stats{Median: 40, N: 3}},
			{Key: "idle.gw_a", Name: "RSS/flow", Unit: "KiB/flow", Higher: true, PairS: Stats{Median: 17, N: 3}}, // pair only
		},
		RR: map[string][]Quantile{
			"kernel": {{0.5, 40}, {0.99, 160}},
			"pair":   {{0.5, 150}, {0.99, 1500}},
			"relay":  {{0.5, 120}, {0.99, 400}},
		},
	}
	doc := drawReport(rep)
	els := parseSVG(t, doc)
	bars := map[string]map[string]float64{} // key → path → width
	var lines int
	var key string
	for _, e := range els {
		switch {
		case e.name == "g" && e.attrs["class"] == "row":
			key = e.attrs["data-key"]
		case e.name == "rect" && e.attrs["class"] == "bar":
			w, err := strconv.ParseFloat(e.attrs["width"], 64)
			if err != nil {
				t.Fatalf("bar width %q", e.attrs["width"])
			}
			if bars[key] == nil {
				bars[key] = map[string]float64{}
			}
			bars[key][e.attrs["data-path"]] = w
		case e.name == "polyline" && e.attrs["class"] == "rr":
			lines++
			if n := len(strings.Fields(e.attrs["points"])); n != 2 {
				t.Errorf("%s's rr line has %d points, want 2", e.attrs["data-path"], n)
			}
		}
	}
	if len(bars) != 2 || bars["bulk1.up"] == nil || bars["conn1"] == nil {
		t.Fatalf("rows drawn: %v, want bulk1.up and conn1 (throughput measured on both paths)", bars)
	}
	for k, want := range map[string]float64{"bulk1.up": 0.25, "conn1": 0.2} {
		if got := bars[k]["pair"] / bars[k]["kernel"]; math.Abs(got-want) > 0.01 {
			t.Errorf("%s: pair bar ÷ kernel bar = %.3f, want the medians' ratio %.2f", k, got, want)
		}
	}
	// The peers' bars, where measured, to the same scale.
	if got := bars["bulk1.up"]["relay"] / bars["bulk1.up"]["kernel"]; math.Abs(got-0.5) > 0.01 {
		t.Errorf("relay bar ÷ kernel bar = %.3f, want the medians' ratio 0.5", got)
	}
	if got := bars["bulk1.up"]["istio"] / bars["bulk1.up"]["kernel"]; math.Abs(got-2.0/12) > 0.01 {
		t.Errorf("Istio bar ÷ kernel bar = %.3f, want the medians' ratio %.3f", got, 2.0/12)
	}
	if _, ok := bars["conn1"]["relay"]; ok {
		t.Errorf("a relay bar drawn for a figure the relay did not take")
	}
	// Everything written fits in the drawing.
	height, _ := strconv.ParseFloat(els[0].attrs["height"], 64)
	for _, e := range els {
		if y, err := strconv.ParseFloat(e.attrs["y"], 64); err == nil && (e.name == "text" || e.name == "rect") && y > height {
			t.Errorf("a %s at y=%v, below the drawing's height %v", e.name, y, height)
		}
	}
	if lines != 3 {
		t.Errorf("%d rr lines, want one per path with round trips (3)", lines)
	}
	for _, want := range []string{"bulk &lt;1 flow&gt; up", "0.25×", "0.50× relay, 1.50× Istio", "pair p50 150 µs, p99 1500 µs", "kernel p50 40 µs", "relay p50 120 µs", "plain relay pair", "3 runs"} {
		if !strings.Contains(doc, want) {
			t.Errorf("the SVG lacks %q", want)
		}
	}

	dir := t.TempDir()
	p, err := writeSVG(rep, dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{p, filepath.Join(dir, "latest.svg")} {
		if b, err := os.ReadFile(f); err != nil || string(b) != doc {
			t.Errorf("%s: %v, or not the drawing", f, err)
		}
	}
}

func TestQuantiles(t *testing.T) {
	var rtts []time.Duration
	for i := 1000; i >= 1; i-- {
		rtts = append(rtts, time.Duration(i)*time.Microsecond)
	}
	got := quantiles(rtts, []float64{0.001, 0.5, 0.99, 1})
	want := []float64{1, 500, 990, 1000}
	for i, q := range got {
		if q.Micros != want[i] {
			t.Errorf("quantile %v = %v µs, want %v", q.Q, q.Micros, want[i])
		}
	}
}
