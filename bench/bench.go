package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/meshtun/meshtun/config"
)

// Config is what one bench run measures. DefaultConfig is `make bench`.
type Config struct {
	Bin       string   // the meshtun binary
	Examples  string   // directory of node-a.toml / node-b.toml
	Scenarios []string // names from Scenarios(); empty means all
	Runs      int      // runs per figure and path (median, min, max)
	Bulk      int64    // bytes per bulk run (each direction; split over the flows of bulk8)
	Conns     int      // short connections per connection-rate run
	IPs       int      // distinct destination IPs of connmany
	Idle      int      // idle flows of the memory scenario
	RR        int      // timed exchanges of the latency scenario
	Workers   int      // concurrent clients of the connection-rate and idle scenarios
	MSS       int      // the clamped client MSS of bulk1-mss
	Spread    int      // hbone.conns_per_peer of bulk8-spread
	Out       string   // directory for the JSON result; "" writes none
	Keep      bool     // keep the temp dir (configs, certificates, gateway logs)
	// Profile, when set, is a directory for CPU profiles of both gateways,
	// ProfileSeconds long, taken during every measurement on the pair.
	Profile        string
	ProfileSeconds int
	// Trace, with Profile, takes a Go execution trace of each gateway
	// (/debug/pprof/trace) instead of the CPU profile, as
	// <scenario>-<n>-<node>.trace: where each goroutine waited and woke
	// (read with go tool trace).
	Trace bool
	// NoRelay leaves out the plain relay pair (the peer built into the
	// bench).
	NoRelay bool
	// IstioHBONE is the hbone-pair binary (interop/istiod/cmd/hbone-pair)
	// of the Istio Go HBONE peer; "" leaves that peer out, and its
	// figures are reported as not measured.
	IstioHBONE string
}

// DefaultConfig is the full bench (`make bench`).
func DefaultConfig() Config {
	return Config{
		Bin:      "bin/meshtun",
		Examples: "examples/two-nodes",
		Runs:     3,
		Bulk:     2 << 30,
		Conns:    10000,
		IPs:      10000,
		Idle:     10000,
		RR:       10000,
		// 16 clients keep both paths busy on 2 cores without queueing
		// thousands of SYNs; the demo's 8 left the kernel path idle.
		Workers: 16,
		MSS:     1460,
		Spread:  4,
		Out:     "bench/results",

		ProfileSeconds: 5,
	}
}

func (c Config) check() error {
	var errs []error
	if c.Runs < 1 {
		errs = append(errs, errors.New("runs must be ≥ 1"))
	}
	if c.Bulk < 8 {
		errs = append(errs, errors.New("bulk must be ≥ 8 bytes"))
	}
	if c.Conns < 1 || c.IPs < 1 || c.Idle < 1 || c.RR < 1 || c.Workers < 1 {
		errs = append(errs, errors.New("conns, ips, idle, rr and workers must be ≥ 1"))
	}
	if max := ManyPrefix.Bits(); c.IPs > len(manyAddrs(1<<(32-max))) {
		errs = append(errs, fmt.Errorf("ips must be ≤ %d (the addresses of %s)", len(manyAddrs(1<<(32-max))), ManyPrefix))
	}
	if c.Trace && c.Profile == "" {
		errs = append(errs, errors.New("trace needs profile (the directory the traces go to)"))
	}
	if c.Profile != "" && c.ProfileSeconds < 1 {
		errs = append(errs, errors.New("profile-seconds must be ≥ 1"))
	}
	if c.Spread < 1 || c.Spread > config.MaxConnsPerPeer {
		errs = append(errs, fmt.Errorf("spread must be in 1..%d", config.MaxConnsPerPeer))
	}
	if c.MSS < 536 || c.MSS > 65495 {
		errs = append(errs, errors.New("mss must be in 536..65495"))
	}
	for _, s := range c.Scenarios {
		if _, ok := scenarioByName(s); !ok {
			errs = append(errs, fmt.Errorf("unknown scenario %q (have %s)", s, strings.Join(ScenarioNames(), ", ")))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	return nil
}

// runs reports whether scenario name is among those c runs.
func (c Config) runs(name string) bool {
	return len(c.Scenarios) == 0 || slices.Contains(c.Scenarios, name)
}

// Sample is one measurement of one figure on one path.
type Sample struct {
	Value   float64 `json:"value"`
	Seconds float64 `json:"seconds"`         // wall time of the measurement
	Work    float64 `json:"work,omitempty"`  // GiB moved or connections made
	CPU     CPU     `json:"cpu_seconds"`     // CPU spent during the measurement
	Extra   string  `json:"extra,omitempty"` // e.g. the p99 beside a p50
}

// CPU is CPU-seconds (user + system) per process. On the kernel path
// there are no gateways: Loadgen (this process: client, server and the
// kernel's TCP work in their system calls) is the whole cost. On a peer
// path GatewayA and GatewayB are its two proxy processes (relays, or
// hbone-pair's client and server).
type CPU struct {
	GatewayA float64 `json:"gateway_a"`
	GatewayB float64 `json:"gateway_b"`
	Loadgen  float64 `json:"loadgen"`
}

func (c CPU) sub(o CPU) CPU {
	return CPU{c.GatewayA - o.GatewayA, c.GatewayB - o.GatewayB, c.Loadgen - o.Loadgen}
}

// Figure is one number of the bench, measured on the pair, the kernel
// path and, for the scenarios that run them, the two peers.
type Figure struct {
	Scenario string   `json:"scenario"`
	Key      string   `json:"key"` // stable id, e.g. "bulk1.up", "rr.p50"
	Name     string   `json:"name"`
	Unit     string   `json:"unit"`
	Higher   bool     `json:"higher_is_better"`
	WorkUnit string   `json:"work_unit,omitempty"` // "GiB" or "conn": what CPU is divided by
	Pair     []Sample `json:"pair"`
	Kernel   []Sample `json:"kernel,omitempty"`
	// Relay and Istio are the peers: the plain relay pair and Istio's Go
	// HBONE pair (README.md, "The peers").
	Relay   []Sample `json:"relay,omitempty"`
	Istio   []Sample `json:"istio,omitempty"`
	PairS   Stats    `json:"pair_stats"`
	KernelS Stats    `json:"kernel_stats,omitempty"`
	RelayS  Stats    `json:"relay_stats,omitempty"`
	IstioS  Stats    `json:"istio_stats,omitempty"`
	Ratio   float64  `json:"ratio,omitempty"` // pair median ÷ kernel median
	// RatioRelay and RatioIstio are the pair's median ÷ each peer's.
	RatioRelay float64 `json:"ratio_relay,omitempty"`
	RatioIstio float64 `json:"ratio_istio,omitempty"`
	// CPU per unit of work, medians over the runs.
	PairCPU   CPU     `json:"pair_cpu_per_work,omitempty"`
	KernelCPU float64 `json:"kernel_cpu_per_work,omitempty"` // loadgen on the kernel path
	RelayCPU  CPU     `json:"relay_cpu_per_work,omitempty"`
	IstioCPU  CPU     `json:"istio_cpu_per_work,omitempty"`
	// NotMeasured says, by path name, why a path that runs this
	// scenario could not take this figure.
	NotMeasured map[string]string `json:"not_measured,omitempty"`
}

// finish computes the summaries from the runs.
func (f *Figure) finish() {
	val := func(rs []Sample) []float64 {
		var v []float64
		for _, r := range rs {
			v = append(v, r.Value)
		}
		return v
	}
	f.PairS, f.KernelS = summarize(val(f.Pair)), summarize(val(f.Kernel))
	f.RelayS, f.IstioS = summarize(val(f.Relay)), summarize(val(f.Istio))
	ratio := func(s Stats) float64 {
		if s.N > 0 && s.Median != 0 && f.PairS.N > 0 {
			return f.PairS.Median / s.Median
		}
		return 0
	}
	f.Ratio, f.RatioRelay, f.RatioIstio = ratio(f.KernelS), ratio(f.RelayS), ratio(f.IstioS)
	if f.WorkUnit == "" {
		return
	}
	per := func(rs []Sample, pick func(CPU) float64) float64 {
		var v []float64
		for _, r := range rs {
			if r.Work > 0 {
				v = append(v, pick(r.CPU)/r.Work)
			}
		}
		return summarize(v).Median
	}
	perCPU := func(rs []Sample) CPU {
		return CPU{
			GatewayA: per(rs, func(c CPU) float64 { return c.GatewayA }),
			GatewayB: per(rs, func(c CPU) float64 { return c.GatewayB }),
			Loadgen:  per(rs, func(c CPU) float64 { return c.Loadgen }),
		}
	}
	f.PairCPU, f.RelayCPU, f.IstioCPU = perCPU(f.Pair), perCPU(f.Relay), perCPU(f.Istio)
	f.KernelCPU = per(f.Kernel, func(c CPU) float64 { return c.Loadgen })
}

// samples is where the runs of path name go.
func (f *Figure) samples(name string) *[]Sample {
	switch name {
	case "pair":
		return &f.Pair
	case "kernel":
		return &f.Kernel
	case "relay":
		return &f.Relay
	case "istio":
		return &f.Istio
	}
	panic("bench: no path " + name)
}

// notMeasuredOn records that path name cannot take f, and why.
func (f *Figure) notMeasuredOn(name, why string) {
	if f.NotMeasured == nil {
		f.NotMeasured = map[string]string{}
	}
	f.NotMeasured[name] = why
}

// Report is a bench run: machine, settings, figures, targets, and what was
// skipped or failed.
type Report struct {
	Started time.Time      `json:"started"`
	Seconds float64        `json:"seconds"`
	Machine Machine        `json:"machine"`
	Config  map[string]any `json:"config"`
	Figures []*Figure      `json:"figures"`
	Targets []TargetResult `json:"targets"`
	// RR is the distribution of the rr scenario's round trips on each
	// path ("pair", "kernel", "relay", "istio"), every timed exchange of
	// every run.
	RR      map[string][]Quantile `json:"rr_distribution,omitempty"`
	Skipped map[string]string     `json:"skipped,omitempty"`
	// PeersLeftOut says, by path name ("relay", "istio"), why the run
	// measured no figure on that peer.
	PeersLeftOut map[string]string `json:"peers_left_out,omitempty"`
	Errors       map[string]string `json:"errors,omitempty"`
	JSONPath     string            `json:"-"`
}

// Run builds the paths, runs the chosen scenarios (each run on the pair,
// the kernel path and, for the scenarios that take them, the peers, in an
// order reversed every other run), prints
// progress and the tables to out, writes the JSON, and removes everything.
// A failed scenario is recorded and the others still run; the returned
// error says which failed.
func Run(ctx context.Context, cfg Config, out io.Writer) (*Report, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	names := cfg.Scenarios
	if len(names) == 0 {
		names = ScenarioNames()
	}
	rep := &Report{Started: time.Now(), Config: cfg.summary(), Skipped: map[string]string{}, Errors: map[string]string{}, PeersLeftOut: map[string]string{}}
	if cfg.NoRelay {
		rep.PeersLeftOut["relay"] = "left out (-relay=false)"
	}
	if cfg.IstioHBONE == "" {
		rep.PeersLeftOut["istio"] = "no hbone-pair binary (-istio-hbone; make bench builds bin/hbone-pair from interop/istiod)"
	}
	fmt.Fprintf(out, "meshtun bench: %s; %d run(s) per figure and path; bulk %s, %d conns, %d IPs, %d idle flows, %d rr\n",
		strings.Join(names, ", "), cfg.Runs, formatSize(cfg.Bulk), cfg.Conns, cfg.IPs, cfg.Idle, cfg.RR)
	if cfg.Profile != "" {
		if err := os.MkdirAll(cfg.Profile, 0o755); err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
	}
	e, err := setup(ctx, cfg, out)
	if err != nil {
		return nil, err
	}
	defer e.close()
	rep.Machine = machineInfo(e)
	fmt.Fprintf(out, "machine: %s\n", rep.Machine.oneLine())

	for _, name := range names {
		if err := ctx.Err(); err != nil {
			rep.Errors[name] = err.Error()
			continue
		}
		sc, _ := scenarioByName(name)
		e.scenario = sc.Name
		fmt.Fprintf(out, "\n== %s: %s\n", sc.Name, sc.About)
		figs, err := sc.run(ctx, e)
		var skip errSkip
		switch {
		case errors.As(err, &skip):
			rep.Skipped[name] = skip.why
			fmt.Fprintf(out, "   skipped: %s\n", skip.why)
			continue
		case err != nil:
			rep.Errors[name] = err.Error()
			fmt.Fprintf(out, "   FAILED: %v\n", err)
		}
		for _, f := range figs {
			f.finish()
		}
		rep.Figures = append(rep.Figures, figs...)
	}
	rep.Targets = evalTargets(rep.Figures)
	rep.RR = e.rrQuantiles()
	rep.Seconds = time.Since(rep.Started).Seconds()
	rep.Machine.LoadEnd = loadavg()

	fmt.Fprintln(out)
	printTable(out, rep)
	fmt.Fprintln(out)
	printTargets(out, rep.Targets)
	if cfg.Out != "" {
		if err := writeJSON(rep, cfg.Out); err != nil {
			rep.Errors["json"] = err.Error()
		} else {
			fmt.Fprintf(out, "\nresults: %s\n", rep.JSONPath)
		}
		if p, err := writeSVG(rep, cfg.Out); err != nil {
			rep.Errors["svg"] = err.Error()
		} else {
			fmt.Fprintf(out, "drawn: %s\n", p)
		}
	}
	if err := e.close(); err != nil {
		rep.Errors["teardown"] = err.Error()
	}
	if len(rep.Errors) > 0 {
		var keys []string
		for k := range rep.Errors {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		return rep, fmt.Errorf("bench: failed: %s", strings.Join(keys, ", "))
	}
	return rep, nil
}

func (c Config) summary() map[string]any {
	return map[string]any{
		"runs": c.Runs, "bulk_bytes": c.Bulk, "conns": c.Conns, "ips": c.IPs,
		"idle": c.Idle, "rr": c.RR, "workers": c.Workers, "mss": c.MSS, "spread": c.Spread, "scenarios": c.Scenarios,
		"relay": !c.NoRelay, "istio_hbone": c.IstioHBONE,
	}
}

// errSkip means a scenario cannot run here (e.g. no iperf3); not a failure.
type errSkip struct{ why string }

func (e errSkip) Error() string { return "skipped: " + e.why }

// writeJSON writes rep to dir/<timestamp>.json.
func writeJSON(rep *Report, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := marshalReport(rep)
	if err != nil {
		return err
	}
	p := filepath.Join(dir, rep.Started.UTC().Format("20060102T150405Z")+".json")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		return err
	}
	rep.JSONPath = p
	return nil
}
