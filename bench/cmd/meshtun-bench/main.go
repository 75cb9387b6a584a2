// Command meshtun-bench is `make bench`: it measures meshtun's gateway pair
// against the kernel on the same machine, in the same run (see
// bench/README.md). It needs root.
//
//	go run ./bench/cmd/meshtun-bench -scenarios bulk1,conn1ip -runs 3 -bulk 2GiB
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/meshtun/meshtun/bench"
)

func main() {
	if code, ok := bench.Child(); ok { // the idle scenario's helper server
		os.Exit(code)
	}
	os.Exit(run())
}

func run() int {
	cfg := bench.DefaultConfig()
	var scenarios, bulk string
	flag.StringVar(&cfg.Bin, "bin", cfg.Bin, "the meshtun binary (make build)")
	flag.StringVar(&cfg.Examples, "examples", cfg.Examples, "directory with the node-a.toml and node-b.toml the gateways start from")
	flag.StringVar(&scenarios, "scenarios", "", "comma-separated scenarios to run (default all): "+strings.Join(bench.ScenarioNames(), ","))
	flag.IntVar(&cfg.Runs, "runs", cfg.Runs, "runs per figure and path; each figure is their median, min and max")
	flag.StringVar(&bulk, "bulk", "2GiB", "bytes per bulk run, each direction (bulk8 splits them over its flows)")
	flag.IntVar(&cfg.Conns, "conns", cfg.Conns, "short connections per connection-rate run")
	flag.IntVar(&cfg.IPs, "ips", cfg.IPs, "distinct destination IPs of connmany")
	flag.IntVar(&cfg.Idle, "idle", cfg.Idle, "idle flows held open by the memory scenario")
	flag.IntVar(&cfg.RR, "rr", cfg.RR, "timed 64 B exchanges per latency run")
	flag.IntVar(&cfg.Workers, "workers", cfg.Workers, "concurrent clients for the connection-rate and idle scenarios")
	flag.IntVar(&cfg.MSS, "mss", cfg.MSS, "client MSS of bulk1-mss")
	flag.IntVar(&cfg.Spread, "spread", cfg.Spread, "hbone.conns_per_peer of the gateways in bulk8-spread")
	flag.StringVar(&cfg.Out, "out", cfg.Out, "directory for the JSON results (empty: none)")
	flag.StringVar(&cfg.Profile, "profile", "", "directory for CPU profiles of both gateways taken during each measurement on the pair (use with -runs 1)")
	flag.BoolVar(&cfg.Trace, "trace", false, "with -profile: an execution trace of each gateway instead of the CPU profile (go tool trace)")
	flag.IntVar(&cfg.ProfileSeconds, "profile-seconds", cfg.ProfileSeconds, "length of each profile; a shorter measurement leaves idle time in it")
	flag.BoolVar(&cfg.Keep, "keep", false, "keep the temp dir (configs, certificates, gateway logs)")
	flag.StringVar(&cfg.IstioHBONE, "istio-hbone", "", "the hbone-pair binary (cd interop/istiod && go build -o ../../bin/hbone-pair ./cmd/hbone-pair): measure Istio's Go HBONE pair as a peer; without it those figures are not measured")
	relayPeer := flag.Bool("relay", true, "measure the plain relay pair as a peer")
	draw := flag.String("draw", "", "instead of a run: draw the run of this results JSON again, beside it and as latest.svg")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "meshtun-bench: unexpected arguments %q\n", flag.Args())
		return 2
	}
	if *draw != "" {
		p, err := bench.Redraw(*draw)
		if err != nil {
			fmt.Fprintln(os.Stderr, "meshtun-bench:", err)
			return 1
		}
		fmt.Println("drawn:", p)
		return 0
	}
	cfg.NoRelay = !*relayPeer
	var err error
	if cfg.Bulk, err = bench.ParseSize(bulk); err != nil {
		fmt.Fprintln(os.Stderr, "meshtun-bench:", err)
		return 2
	}
	for _, s := range strings.Split(scenarios, ",") {
		if s = strings.TrimSpace(s); s != "" {
			cfg.Scenarios = append(cfg.Scenarios, s)
		}
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "meshtun-bench: needs root (network namespaces, TUN devices, sysctls): run `sudo make bench`")
		return 1
	}
	// Ctrl-C and SIGTERM stop the run; everything built is still removed.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := bench.Run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "meshtun-bench:", err)
		return 1
	}
	return 0
}
