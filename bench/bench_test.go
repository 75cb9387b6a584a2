package bench

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshtun/meshtun/internal/topo"
)

func TestMain(m *testing.M) {
	if code, ok := Child(); ok { // the idle scenario's helper server
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// testConfig skips without namespaces, builds meshtun into a temp dir and
// returns the default config on it and the examples, with that dir.
func testConfig(t *testing.T) (Config, string) {
	t.Helper()
	if err := topo.Available(); err != nil {
		t.Skipf("the bench needs namespaces: %v", err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "meshtun")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/meshtun").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cfg := DefaultConfig()
	cfg.Bin = bin
	cfg.Examples = filepath.Join("..", "examples", "two-nodes")
	return cfg, dir
}

// TestTinyBench runs every scenario once at tiny sizes through the real
// harness (two topologies, two gateways, the helper, iperf3 if present),
// so that `make bench` cannot rot. It checks behaviour only: every
// scenario produced numbers on both paths, the tables and the targets
// were printed, the JSON parses, nothing failed and nothing is left
// behind. Never a time or a throughput.
func TestTinyBench(t *testing.T) {
	cfg, dir := testConfig(t)
	cfg.Runs = 1
	cfg.Bulk = 4 << 20
	cfg.Conns = 100
	cfg.IPs = 50
	cfg.Idle = 100
	cfg.RR = 200
	cfg.Workers = 4
	cfg.Out = filepath.Join(dir, "results")
	// Istio's Go HBONE peer only with a prebuilt hbone-pair: building
	// Istio's tree here would take tens of minutes.
	cfg.IstioHBONE = os.Getenv("MESHTUN_BENCH_HBONE_PAIR")

	nsBefore := netnsNames(t)
	rep, out := runBench(t, cfg, 5*time.Minute)
	peerCPU := map[string]bool{} // a figure saw that peer's proxies use CPU

	gatewayCPU := false // some scenario saw the gateways use CPU
	byScenario := map[string][]*Figure{}
	for _, f := range rep.Figures {
		byScenario[f.Scenario] = append(byScenario[f.Scenario], f)
	}
	for _, name := range ScenarioNames() {
		if why, skipped := rep.Skipped[name]; skipped {
			if _, err := exec.LookPath("iperf3"); name == "iperf3" && err != nil {
				t.Logf("%s skipped: %s", name, why)
				continue
			}
			t.Errorf("%s skipped: %s", name, why)
			continue
		}
		figs := byScenario[name]
		if len(figs) == 0 {
			t.Errorf("scenario %s produced no figures", name)
		}
		sc, _ := scenarioByName(name)
		for _, f := range figs {
			// Each peer took every figure of a scenario that runs on the
			// peers, but those it says it cannot take, and no other.
			for _, peer := range []struct {
				name    string
				runs    int
				enabled bool
			}{{"relay", f.RelayS.N, true}, {"istio", f.IstioS.N, cfg.IstioHBONE != ""}} {
				why, cannot := f.NotMeasured[peer.name]
				want := 0
				if sc.Peers && peer.enabled && !cannot {
					want = cfg.Runs
				}
				if peer.runs != want {
					t.Errorf("%s: %d runs on %s, want %d (not measured: %q)", f.Name, peer.runs, peer.name, want, why)
				}
				if cannot && !sc.Peers {
					t.Errorf("%s: a scenario without peers says why %s cannot take it", f.Name, peer.name)
				}
			}
			if f.RelayCPU.GatewayA < 0 || f.RelayCPU.GatewayB < 0 || f.IstioCPU.GatewayA < 0 || f.IstioCPU.GatewayB < 0 {
				t.Errorf("%s: negative proxy CPU %+v / %+v", f.Name, f.RelayCPU, f.IstioCPU)
			}
			if f.WorkUnit != "" && f.RelayCPU.GatewayA+f.RelayCPU.GatewayB > 0 {
				peerCPU["relay"] = true
			}
			if f.WorkUnit != "" && f.IstioCPU.GatewayA+f.IstioCPU.GatewayB > 0 {
				peerCPU["istio"] = true
			}
			// The relay passes half-closes on: only the connect figures,
			// which a proxy in front of the client cannot take, are missing.
			if why, ok := f.NotMeasured["relay"]; ok && !strings.HasPrefix(f.Key, name+".connect.") {
				t.Errorf("%s: not measured on the relay: %s", f.Name, why)
			}
			for _, r := range append(append([]Sample(nil), f.Relay...), f.Istio...) {
				if math.IsNaN(r.Value) || math.IsInf(r.Value, 0) || r.Value <= 0 {
					t.Errorf("%s: peer value %v", f.Name, r.Value)
				}
				if f.WorkUnit != "" && r.Work <= 0 {
					t.Errorf("%s: no work counted on a peer", f.Name)
				}
			}
			if f.PairS.N != cfg.Runs {
				t.Errorf("%s: %d runs through the pair, want %d", f.Name, f.PairS.N, cfg.Runs)
			}
			wantKernel := cfg.Runs
			if name == "idle" {
				wantKernel = 0 // the kernel path has no gateway process to weigh
			}
			if f.KernelS.N != wantKernel {
				t.Errorf("%s: %d kernel runs, want %d", f.Name, f.KernelS.N, wantKernel)
			}
			for _, r := range append(append([]Sample(nil), f.Pair...), f.Kernel...) {
				if math.IsNaN(r.Value) || math.IsInf(r.Value, 0) || (f.Unit != "KiB/flow" && r.Value <= 0) {
					t.Errorf("%s: value %v", f.Name, r.Value)
				}
				if f.WorkUnit != "" && r.Work <= 0 {
					t.Errorf("%s: no work counted", f.Name)
				}
			}
			// /proc counts CPU in clock ticks (10 ms), so a tiny scenario can
			// honestly read 0; negative means the sampling is broken.
			if f.PairCPU.GatewayA < 0 || f.PairCPU.GatewayB < 0 {
				t.Errorf("%s: negative gateway CPU %v / %v", f.Name, f.PairCPU.GatewayA, f.PairCPU.GatewayB)
			}
			if f.WorkUnit != "" && f.PairS.N > 0 && f.PairCPU.GatewayA+f.PairCPU.GatewayB > 0 {
				gatewayCPU = true
			}
		}
	}
	if !gatewayCPU {
		t.Errorf("no scenario measured any gateway CPU: the /proc sampling of the gateway processes is broken")
	}
	if !peerCPU["relay"] || (cfg.IstioHBONE != "" && !peerCPU["istio"]) {
		t.Errorf("no scenario measured the CPU of a peer's proxies (%v): the /proc sampling of the proxies is broken", peerCPU)
	}
	if len(rep.RR["relay"]) == 0 || (cfg.IstioHBONE != "") != (len(rep.RR["istio"]) > 0) {
		t.Errorf("rr distributions of %v; want the relay's, and Istio's iff it ran", keys(rep.RR))
	}
	if _, left := rep.PeersLeftOut["istio"]; left != (cfg.IstioHBONE == "") {
		t.Errorf("peers left out: %v, with istio-hbone %q", rep.PeersLeftOut, cfg.IstioHBONE)
	}
	if len(rep.Targets) != len(Targets()) {
		t.Errorf("%d targets evaluated, want %d", len(rep.Targets), len(Targets()))
	}
	pending := map[string]bool{}
	for _, tg := range Targets() {
		pending[tg.Name] = tg.Pending
	}
	for _, tr := range rep.Targets {
		istio := strings.Contains(tr.Name, "Istio")
		switch {
		case istio && cfg.IstioHBONE == "":
			if tr.Measured {
				t.Errorf("target %q measured without Istio's HBONE pair", tr.Name)
			}
		case !tr.Measured && !pending[tr.Name]:
			t.Errorf("target %q not measured", tr.Name)
		}
	}
	for _, want := range []string{"pair median", "pair÷relay", "pair÷Istio", "target (" + TargetsIssue + ")", "run 1/1 pair", "run 1/1 kernel", "run 1/1 relay"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}

	b, err := os.ReadFile(rep.JSONPath)
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("results JSON: %v", err)
	}
	if len(back.Figures) != len(rep.Figures) || back.Machine.NProc < 1 || back.Machine.Kernel == "" {
		t.Errorf("results JSON: %d figures (want %d), machine %+v", len(back.Figures), len(rep.Figures), back.Machine)
	}

	if left := newNames(nsBefore, netnsNames(t)); len(left) > 0 {
		t.Errorf("namespaces left behind: %v", left)
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func netnsNames(t *testing.T) map[string]bool {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]bool{}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			m[f[0]] = true
		}
	}
	return m
}

// newNames is the bench's namespaces (prefix mtb) in after but not before;
// other engineers' tests come and go meanwhile.
func newNames(before, after map[string]bool) []string {
	var out []string
	for n := range after {
		if !before[n] && strings.HasPrefix(n, "mtb") {
			out = append(out, n)
		}
	}
	return out
}

// TestBenchProfile checks -profile: one CPU profile per gateway per pair
// measurement, each a gzip-compressed pprof protobuf.
func TestBenchProfile(t *testing.T) {
	cfg, dir := testConfig(t)
	cfg.Scenarios = []string{"conn1ip"}
	cfg.Runs = 1
	cfg.Conns = 50
	cfg.Workers = 2
	cfg.Out = ""
	cfg.Profile = filepath.Join(dir, "profiles")
	cfg.ProfileSeconds = 1

	_, out := runBench(t, cfg, 3*time.Minute)
	for _, node := range []string{"node-a", "node-b"} {
		file := filepath.Join(cfg.Profile, "conn1ip-1-"+node+".pprof")
		f, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		zr, err := gzip.NewReader(f)
		if err != nil {
			t.Fatalf("%s: not gzip: %v", file, err)
		}
		n, err := io.Copy(io.Discard, zr)
		f.Close()
		if err != nil || n == 0 {
			t.Fatalf("%s: %d bytes of profile, %v", file, n, err)
		}
	}
	if !strings.Contains(out.String(), "profile: ") {
		t.Errorf("the progress does not name the profiles:\n%s", out.String())
	}
}

// TestBenchTrace checks -trace on the rr scenario: an execution trace per
// gateway, from which RoundTrips cuts complete round trips (every cut
// point found, in order, across both processes).
func TestBenchTrace(t *testing.T) {
	cfg, dir := testConfig(t)
	cfg.Scenarios = []string{"rr"}
	cfg.Runs = 1
	cfg.RR = 3000
	cfg.Out = ""
	cfg.Profile = filepath.Join(dir, "traces")
	cfg.ProfileSeconds = 1
	cfg.Trace = true

	runBench(t, cfg, 3*time.Minute)
	var acct bytes.Buffer
	n, err := RoundTrips(filepath.Join(cfg.Profile, "rr-1-node-a.trace"), filepath.Join(cfg.Profile, "rr-1-node-b.trace"), &acct)
	t.Log("\n" + acct.String())
	if err != nil {
		t.Fatal(err)
	}
	if n < 100 {
		t.Fatalf("%d complete round trips in one second of traces, want at least 100", n)
	}
	for _, seg := range rttSegments {
		if !strings.Contains(acct.String(), seg) {
			t.Errorf("the account has no line for %q", seg)
		}
	}
}

// runBench runs cfg within timeout, logs its progress and tables, and
// fails the test if it failed; it returns the report and the output.
func runBench(t *testing.T, cfg Config, timeout time.Duration) (*Report, *bytes.Buffer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out bytes.Buffer
	rep, err := Run(ctx, cfg, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	return rep, &out
}

// TestConfigRuns: every scenario runs when none is named, and only the
// named ones otherwise (writeConfigs leaves out the -xnet configs, whose
// keys an older build would refuse, unless cross-network runs).
func TestConfigRuns(t *testing.T) {
	all := Config{}
	some := Config{Scenarios: []string{"short1", "rr"}}
	for _, s := range ScenarioNames() {
		if !all.runs(s) {
			t.Errorf("no scenarios named: %s does not run", s)
		}
		if want := s == "short1" || s == "rr"; some.runs(s) != want {
			t.Errorf("scenarios short1,rr: runs(%s) = %v", s, !want)
		}
	}
}
