package bench

import (
	"encoding/json"
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// What a run draws: one SVG beside its JSON, and latest.svg, which
// bench/README.md shows. The left panel is every throughput figure
// measured on the pair and the kernel path (a row each: a bar per path
// measured — kernel, pair, plain relay pair, Istio's Go HBONE pair —
// scaled to the row's largest, with the values, the pair's ratio to the
// kernel and to each peer), the right one the distribution of the rr
// round trips on every path (the share of exchanges faster than each
// latency, on a log scale).

// Quantile is the latency below which a share Q of the exchanges fell.
type Quantile struct {
	Q      float64 `json:"q"`
	Micros float64 `json:"us"`
}

// rrQuantilePoints are the shares drawn and kept in the JSON.
var rrQuantilePoints = []float64{0.001, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 0.999}

// keepRTTs keeps one run's round trips of path for the distribution.
func (e *env) keepRTTs(path string, rtts []time.Duration) {
	if e.rtts == nil {
		e.rtts = map[string][]time.Duration{}
	}
	e.rtts[path] = append(e.rtts[path], rtts...)
}

func (e *env) rrQuantiles() map[string][]Quantile {
	if len(e.rtts) == 0 {
		return nil
	}
	out := map[string][]Quantile{}
	for path, rtts := range e.rtts {
		out[path] = quantiles(rtts, rrQuantilePoints)
	}
	return out
}

func quantiles(rtts []time.Duration, qs []float64) []Quantile {
	s := slices.Clone(rtts)
	slices.Sort(s)
	var out []Quantile
	for _, q := range qs {
		out = append(out, Quantile{Q: q, Micros: micros(sortedPercentile(s, q*100))})
	}
	return out
}

// writeSVG draws rep into dir/<timestamp>.svg and dir/latest.svg, and
// returns the first's path.
func writeSVG(rep *Report, dir string) (string, error) {
	svg := drawReport(rep)
	p := filepath.Join(dir, rep.Started.UTC().Format("20060102T150405Z")+".svg")
	if err := os.WriteFile(p, []byte(svg), 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "latest.svg"), []byte(svg), 0o644); err != nil {
		return "", err
	}
	return p, nil
}

// Redraw draws the run of a results JSON again, beside it (and as
// latest.svg), and returns the drawing's path.
func Redraw(jsonPath string) (string, error) {
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		return "", err
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return "", fmt.Errorf("bench: %s: %w", jsonPath, err)
	}
	if rep.Started.IsZero() || len(rep.Figures) == 0 {
		return "", fmt.Errorf("bench: %s holds no run of meshtun-bench", jsonPath)
	}
	return writeSVG(&rep, filepath.Dir(jsonPath))
}

// Colours of the paths, the same in both panels.
const (
	kernelColour = "#8c8c8c"
	pairColour   = "#1f6fb4"
	relayColour  = "#2e9e44"
	istioColour  = "#e07b00"
)

// drawnPaths are the paths in the order drawn (bars top to bottom, rr
// lines), with their colour and legend.
var drawnPaths = []struct{ name, colour, legend string }{
	{"kernel", kernelColour, "kernel TCP"},
	{"pair", pairColour, "meshtun pair"},
	{"relay", relayColour, "plain relay pair"},
	{"istio", istioColour, "Istio's Go HBONE pair"},
}

// statsOf is f's summary on path name.
func statsOf(f *Figure, name string) Stats {
	switch name {
	case "kernel":
		return f.KernelS
	case "pair":
		return f.PairS
	case "relay":
		return f.RelayS
	case "istio":
		return f.IstioS
	}
	return Stats{}
}

// drawReport is rep as an SVG document.
func drawReport(rep *Report) string {
	var rows []*Figure
	for _, f := range rep.Figures {
		if f.Higher && f.KernelS.N > 0 && f.PairS.N > 0 {
			rows = append(rows, f)
		}
	}
	const (
		width  = 1180
		leftW  = 700
		barH   = 13
		top    = 86
		labelW = 270
	)
	// Each row has a bar per path measured (kernel, pair, then peers).
	rowPaths := func(f *Figure) []int {
		var out []int
		for i, dp := range drawnPaths {
			if statsOf(f, dp.name).N > 0 {
				out = append(out, i)
			}
		}
		return out
	}
	rowsH := 0
	for _, f := range rows {
		rowsH += 8 + barH*len(rowPaths(f))
	}
	// The right panel: title, 300 px of plot, the axis, a legend line per
	// path.
	height := max(top+rowsH+40, top+300+34+16*len(drawnPaths)+10)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	title := "meshtun bench, " + rep.Started.UTC().Format("2006-01-02 15:04 UTC")
	fmt.Fprintf(&b, `<text x="10" y="20" font-size="14" font-weight="bold">%s</text>`+"\n", esc(title))
	fmt.Fprintf(&b, `<text x="10" y="38" font-size="11" fill="#555">%s</text>`+"\n", esc(rep.Machine.oneLine()))
	var legend []string
	for _, dp := range drawnPaths {
		legend = append(legend, fmt.Sprintf(`<tspan fill="%s">■ %s</tspan>`, dp.colour, esc(dp.legend)))
	}
	fmt.Fprintf(&b, `<text x="10" y="56">%s  (medians of %s; whiskers: min to max)</text>`+"\n", strings.Join(legend, "  "), runsOf(rep))

	// Left: throughput, one row per figure.
	fmt.Fprintf(&b, `<text x="10" y="%d" font-weight="bold">throughput (pair ÷ kernel; ÷ each peer)</text>`+"\n", top-12)
	barMax := float64(leftW - labelW - 150)
	y := top
	for _, f := range rows {
		ps := rowPaths(f)
		scale := 0.0
		for _, i := range ps {
			scale = math.Max(scale, statsOf(f, drawnPaths[i].name).Max)
		}
		if scale <= 0 {
			scale = 1
		}
		fmt.Fprintf(&b, `<g class="row" data-key="%s">`+"\n", esc(f.Key))
		fmt.Fprintf(&b, `<text x="10" y="%d">%s</text>`+"\n", y+18, esc(f.Name))
		for j, i := range ps {
			dp := drawnPaths[i]
			st := statsOf(f, dp.name)
			by := y + 4 + j*barH
			w := st.Median / scale * barMax
			fmt.Fprintf(&b, `<rect class="bar" data-path="%s" x="%d" y="%d" width="%.1f" height="11" fill="%s"/>`+"\n", dp.name, labelW, by, w, dp.colour)
			x0, x1 := float64(labelW)+st.Min/scale*barMax, float64(labelW)+st.Max/scale*barMax
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="black"/>`+"\n", x0, by+5, x1, by+5)
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-size="10">%s</text>`+"\n", float64(labelW)+barMax+6, by+10, esc(num(st.Median)+" "+f.Unit))
		}
		if f.Ratio > 0 {
			fmt.Fprintf(&b, `<text x="%d" y="%d" font-weight="bold" text-anchor="end">%.2f×</text>`+"\n", leftW, y+18, f.Ratio)
		}
		var peers []string
		if f.RelayS.N > 0 && f.RatioRelay > 0 {
			peers = append(peers, fmt.Sprintf("%.2f× relay", f.RatioRelay))
		}
		if f.IstioS.N > 0 && f.RatioIstio > 0 {
			peers = append(peers, fmt.Sprintf("%.2f× Istio", f.RatioIstio))
		}
		if len(peers) > 0 {
			fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="10" text-anchor="end">%s</text>`+"\n", leftW, y+31, esc(strings.Join(peers, ", ")))
		}
		b.WriteString("</g>\n")
		y += 8 + barH*len(ps)
	}
	if len(rows) == 0 {
		fmt.Fprintf(&b, `<text x="10" y="%d">no throughput figure measured on both paths</text>`+"\n", top+18)
	}

	// Right: the rr distribution.
	drawRR(&b, rep.RR, leftW+40, top, width-leftW-70, 300)
	b.WriteString("</svg>\n")
	return b.String()
}

// drawRR draws the distributions at (x, y), w × h: latency on a log
// axis, and upwards the share of exchanges at or below it on a scale of
// nines (p50, p90, p99, p99.9 equally apart), where a tail shows.
func drawRR(b *strings.Builder, rr map[string][]Quantile, x, y, w, h int) {
	fmt.Fprintf(b, `<text x="%d" y="%d" font-weight="bold">64 B round trips: share at or below a latency</text>`+"\n", x, y-12)
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, qs := range rr {
		for _, q := range qs {
			if q.Micros > 0 {
				lo, hi = math.Min(lo, q.Micros), math.Max(hi, q.Micros)
			}
		}
	}
	if math.IsInf(lo, 1) {
		fmt.Fprintf(b, `<text x="%d" y="%d">rr not measured</text>`+"\n", x, y+18)
		return
	}
	// Whole decades around the data.
	dlo, dhi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if dhi <= dlo {
		dhi = dlo + 1
	}
	px := func(us float64) float64 {
		return float64(x) + (math.Log10(us)-dlo)/(dhi-dlo)*float64(w)
	}
	py := func(q float64) float64 {
		nines := -math.Log10(1 - math.Min(q, maxNines))
		return float64(y+h) - nines/(-math.Log10(1-maxNines))*float64(h)
	}
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#ccc"/>`+"\n", x, y, w, h)
	for d := dlo; d <= dhi; d++ {
		v := math.Pow(10, d)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/>`+"\n", px(v), y, px(v), y+h)
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle" font-size="10">%s µs</text>`+"\n", px(v), y+h+14, short(v))
	}
	for _, q := range []struct {
		q     float64
		label string
	}{{0, "p0"}, {0.5, "p50"}, {0.9, "p90"}, {0.99, "p99"}, {0.999, "p99.9"}} {
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/>`+"\n", x, py(q.q), x+w, py(q.q))
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end" font-size="10">%s</text>`+"\n", x-4, py(q.q)+3, q.label)
	}
	line := 0
	for _, dp := range drawnPaths {
		path, colour := dp.name, dp.colour
		qs := rr[path]
		if len(qs) == 0 {
			continue
		}
		var pts []string
		for _, q := range qs {
			if q.Micros > 0 {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(q.Micros), py(q.Q)))
			}
		}
		fmt.Fprintf(b, `<polyline class="rr" data-path="%s" points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", path, strings.Join(pts, " "), colour)
		if p50 := quantileAt(qs, 0.5); p50 > 0 {
			fmt.Fprintf(b, `<text x="%d" y="%d" fill="%s">%s p50 %s µs, p99 %s µs</text>`+"\n", x, y+h+34+line*16, colour,
				path, short(p50), short(quantileAt(qs, 0.99)))
			line++
		}
	}
}

// maxNines is the top of drawRR's scale.
const maxNines = 0.999

func quantileAt(qs []Quantile, q float64) float64 {
	for _, x := range qs {
		if x.Q == q {
			return x.Micros
		}
	}
	return 0
}

func runsOf(rep *Report) string {
	switch n := rep.Config["runs"].(type) {
	case int:
		return fmt.Sprintf("%d runs", n)
	case float64: // read back from the JSON
		return fmt.Sprintf("%.0f runs", n)
	}
	return "the runs"
}

// short writes a latency or a share as a reader wants it on a chart: 1500,
// 40, 2.5, 0.99.
func short(v float64) string {
	switch {
	case v >= 10:
		return fmt.Sprintf("%.0f", v)
	case v >= 1:
		return fmt.Sprintf("%.1f", v)
	default:
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
}

func esc(s string) string { return html.EscapeString(s) }
