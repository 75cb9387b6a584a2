package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/meshtun/meshtun/internal/topo"
)

// ManyPrefix holds the distinct destination IPs of the many-IP connection
// scenario: node B treats every address in it as local (AnyIP route on
// lo), node A routes it to node B (into the TUN on the gateway path, over
// the veth on the kernel path), and gateway B serves it. /17 leaves room
// for 10,000 addresses without .0 and .255.
var ManyPrefix = netip.MustParsePrefix("10.244.128.0/17")

const (
	// readinessAddr is the examples' admin.readiness, inside each node.
	readinessAddr = "127.0.0.1:15021"
	// startTimeout bounds a gateway's start until ready.
	startTimeout = 30 * time.Second
	// stopTimeout bounds a gateway's drain after SIGTERM (the examples'
	// drain_timeout is 5 s).
	stopTimeout = 15 * time.Second
	// wantNoFile: the harness holds the client end of every idle flow, and
	// the gateways (which inherit it) one socket per flow on node B.
	wantNoFile = 1 << 20
)

// path is one way from the client in node A to the server in node B: a
// topology of its own, with gateways (the pair) or without (the kernel).
type path struct {
	name     string // "pair", "kernel", or a peer: "relay", "istio"
	tp       *topo.Topology
	gwA, gwB *topo.Gateway // nil but on the pair
	srv      *Server
	e        *env
	variant  string // config file suffix the gateways run on: "" or "-spread"

	// A peer's two proxy processes (node A's, node B's); nil on the
	// pair and the kernel path.
	proxyA, proxyB *helper
	// entry, on a peer, is the host in node A the client dials (proxy
	// A's listener) instead of node B's workload address.
	entry string
	// noHalfClose, on a peer, says why a client's half-close cannot
	// cross it ("" when it can).
	noHalfClose string
}

// env is everything a bench run built; close removes it all.
type env struct {
	cfg    Config
	dir    string // temp dir: certificates, configs, gateway logs
	logw   *os.File
	pair   *path
	kernel *path
	relay  *path // nil when the plain relay pair is left out
	istio  *path // nil without an hbone-pair binary
	out    io.Writer

	scenario   string // the scenario running (names profiles)
	profileSeq int    // profiles taken so far

	rtts map[string][]time.Duration // the rr scenario's round trips, by path name
}

// setup builds both paths: two topologies side by side (so that the
// gateway's TUN routes and the kernel's veth routes never fight over the
// same namespace), the sysctls, the many-IP range, the gateways, servers.
func setup(ctx context.Context, cfg Config, out io.Writer) (e *env, err error) {
	if err := topo.Available(); err != nil {
		return nil, fmt.Errorf("%w\n  the bench builds network namespaces and TUN devices: run it as root (sudo make bench)", err)
	}
	bin, err := filepath.Abs(cfg.Bin)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("bench: meshtun binary: %w (make build)", err)
	}
	cfg.Bin = bin
	e = &env{cfg: cfg, out: out}
	built := e // the named result is nil after `return nil, err`
	defer func() {
		if err != nil {
			built.close()
		}
	}()
	raiseNoFile(wantNoFile)
	if e.dir, err = os.MkdirTemp("", "meshtun-bench-"); err != nil {
		return nil, err
	}
	// The log lives in a directory of its own: the gateways watch the
	// certificates' directory (inotify), and every line written beside
	// them woke both (12 % of gateway B's CPU during short1).
	logs := filepath.Join(e.dir, "logs")
	if err := os.Mkdir(logs, 0o755); err != nil {
		return nil, err
	}
	if e.logw, err = os.Create(filepath.Join(logs, "gateways.log")); err != nil {
		return nil, err
	}
	if err := e.writeConfigs(); err != nil {
		return nil, err
	}
	// Namespace prefixes differ per path so both can live at once; each
	// name also carries our pid (topo adds it).
	e.pair = &path{name: "pair", e: e}
	e.kernel = &path{name: "kernel", e: e}
	for _, p := range []*path{e.pair, e.kernel} {
		if p.tp, err = topo.New("mtb" + p.name[:1]); err != nil {
			return nil, err
		}
		if err := p.prepare(); err != nil {
			return nil, fmt.Errorf("bench: %s path: %w", p.name, err)
		}
	}
	if err := e.kernel.tp.Direct(); err != nil {
		return nil, err
	}
	if err := e.kernel.tp.A.RouteVia(ManyPrefix, e.kernel.tp.B); err != nil {
		return nil, err
	}
	if err := e.pair.startGateways(ctx); err != nil {
		return nil, err
	}
	for _, p := range []*path{e.pair, e.kernel} {
		if p.srv, err = NewServer(p.tp.B.Listen, "0.0.0.0"); err != nil {
			return nil, err
		}
	}
	if !cfg.NoRelay {
		e.relay = &path{name: "relay", e: e}
	}
	if cfg.IstioHBONE != "" {
		e.istio = &path{name: "istio", e: e, noHalfClose: istioNoHalfClose}
	}
	for _, p := range e.peers() {
		if err := p.setupPeer(ctx); err != nil {
			return nil, fmt.Errorf("bench: %s path: %w", p.name, err)
		}
	}
	return e, nil
}

// all is every path this run measures, in the order of even runs.
func (e *env) all() []*path {
	return append([]*path{e.pair, e.kernel}, e.peers()...)
}

// peers is the peer paths this run measures.
func (e *env) peers() []*path {
	var out []*path
	for _, p := range []*path{e.relay, e.istio} {
		if p != nil {
			out = append(out, p)
		}
	}
	return out
}

// writeConfigs makes certificates with `meshtun certs` and writes the
// examples' two configs with the many-IP range added: routed into node A's
// TUN, part of node B's peer CIDRs, served by node B.
func (e *env) writeConfigs() error {
	if out, err := exec.Command(e.cfg.Bin, "certs", "--out", e.dir, "node-a", "node-b").CombinedOutput(); err != nil {
		return fmt.Errorf("bench: meshtun certs: %v: %s", err, out)
	}
	many := fmt.Sprintf("%q, ", ManyPrefix.String())
	edits := map[string][]string{
		"node-a": {`routes = [`, `cidrs = [`},
		"node-b": {`serve = [`},
	}
	for name, keys := range edits {
		src := filepath.Join(e.cfg.Examples, name+".toml")
		b, err := os.ReadFile(src)
		if err != nil {
			return fmt.Errorf("bench: example config: %w", err)
		}
		s := string(b)
		for _, k := range keys {
			if n := strings.Count(s, k); n != 1 {
				return fmt.Errorf("bench: %s: found %q %d times, want once (did the example change shape?)", src, k, n)
			}
			s = strings.Replace(s, k, k+many, 1)
		}
		// The -spread variant: the same with hbone.conns_per_peer set.
		const key = "max_streams_per_conn = "
		if n := strings.Count(s, key); n != 1 {
			return fmt.Errorf("bench: %s: found %q %d times, want once (did the example change shape?)", src, key, n)
		}
		spread := strings.Replace(s, key, fmt.Sprintf("conns_per_peer = %d\n", e.cfg.Spread)+key, 1)
		xnet, err := crossNetworkConfig(name, s)
		if err != nil {
			return fmt.Errorf("bench: %s: %w", src, err)
		}
		variants := []struct{ suffix, text string }{{"", s}, {"-spread", spread}, {"-xnet", xnet}}
		if !e.cfg.runs("cross-network") {
			// Its keys are newer than the rest: a build from before them
			// can still be measured on the other scenarios.
			variants = variants[:2]
		}
		for _, v := range variants {
			dst := filepath.Join(e.dir, name+v.suffix+".toml")
			if err := os.WriteFile(dst, []byte(v.text), 0o644); err != nil {
				return err
			}
			if out, err := exec.Command(e.cfg.Bin, "validate", "--config", dst).CombinedOutput(); err != nil {
				return fmt.Errorf("bench: meshtun validate %s: %v: %s", dst, err, out)
			}
		}
	}
	return nil
}

// The -xnet variant (crossNetworkScenario): node B's server workload,
// in network xnetName, whose east-west gateway is node B on
// xnetGatewayPort. Node A reaches it through that gateway (double HBONE);
// node B serves it to the gateway's inner connections.
const (
	xnetName        = "bench-remote"
	xnetGatewayPort = 15009
	// xnetServer is node B's workload address in the topology
	// (topo's Node.Workload4): the configs are written before the
	// topology exists; crossNetworkScenario checks the two agree.
	xnetServer = "10.244.2.5"
)

// crossNetworkConfig is node's example config text s as the -xnet
// variant: node B's address and identity are the examples' (192.0.2.2,
// spiffe://cluster.local/ns/meshtun/sa/node-b), the server the topology's
// workload address on node B.
func crossNetworkConfig(node, s string) (string, error) {
	const (
		nodeB    = "192.0.2.2"
		identity = "spiffe://cluster.local/ns/meshtun/sa/node-b"
	)
	server := fmt.Sprintf(`
[[workloads]]
name = "bench-server"
namespace = "bench"
addresses = [%q]
hbone_address = "%s:15008"
identity = %q
`, xnetServer, nodeB, identity)
	switch node {
	case "node-a":
		return s + fmt.Sprintf(`
[[networks]]
name = %q
gateway = "%s:%d"
identity = %q
`, xnetName, nodeB, xnetGatewayPort, identity) + server + fmt.Sprintf("network = %q\n", xnetName), nil
	case "node-b":
		const key = "[gateway]\n"
		if n := strings.Count(s, key); n != 1 {
			return "", fmt.Errorf("found %q %d times, want once (did the example change shape?)", key, n)
		}
		return strings.Replace(s, key, key+fmt.Sprintf("east_west = \"0.0.0.0:%d\"\n", xnetGatewayPort), 1) + server, nil
	}
	return s, nil
}

// prepare sets what both paths share: room for tens of thousands of
// short connections (TIME_WAIT) and idle flows to one server port, and the
// AnyIP range on node B.
func (p *path) prepare() error {
	for _, n := range []*topo.Node{p.tp.A, p.tp.B} {
		// 10,000 idle flows to one ip:port, and conns×runs short ones
		// whose TIME_WAIT lasts 60 s, need more than the default 28k ports.
		if err := n.Sysctl("net.ipv4.ip_local_port_range", "1024 65535"); err != nil {
			return err
		}
		// Reuse TIME_WAIT ports for new outgoing connections (timestamps
		// make it safe); the default (2) does so only on loopback.
		if err := n.Sysctl("net.ipv4.tcp_tw_reuse", "1"); err != nil {
			return err
		}
		// The default backlog (4096) is short for bursts of SYNs from
		// many workers when the server is descheduled.
		if err := n.Sysctl("net.core.somaxconn", "65535"); err != nil {
			return err
		}
	}
	return p.tp.B.AddLocalPrefix(ManyPrefix)
}

// startGateways starts gateway B, then A, each until ready.
func (p *path) startGateways(ctx context.Context) error {
	var err error
	if p.gwB, err = p.startGateway(ctx, p.tp.B); err != nil {
		return err
	}
	p.gwA, err = p.startGateway(ctx, p.tp.A)
	return err
}

func (p *path) startGateway(ctx context.Context, n *topo.Node) (*topo.Gateway, error) {
	g, err := n.StartGateway(p.e.cfg.Bin, filepath.Join(p.e.dir, n.Name+p.variant+".toml"), p.e.logw)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	if err := g.WaitReady(wctx, readinessAddr); err != nil {
		g.Stop(stopTimeout)
		return nil, err
	}
	return g, nil
}

// stopGateways stops both gateways (SIGTERM, drain), A first.
func (p *path) stopGateways() error {
	var errs []error
	for _, g := range []**topo.Gateway{&p.gwA, &p.gwB} {
		if *g != nil {
			if err := (*g).Stop(stopTimeout); err != nil {
				errs = append(errs, err)
			}
			*g = nil
		}
	}
	return errors.Join(errs...)
}

// restartGatewaysOn restarts the gateways on the configs of variant.
func (p *path) restartGatewaysOn(ctx context.Context, variant string) error {
	p.variant = variant
	return p.restartGateways(ctx)
}

// restartGateways gives the next measurement fresh gateway processes.
func (p *path) restartGateways(ctx context.Context) error {
	if err := p.stopGateways(); err != nil {
		return err
	}
	return p.startGateways(ctx)
}

// target is host:port the client in node A dials to reach the server's
// port: node B's workload address, or on a peer proxy A's listener.
func (p *path) target(port int) string {
	if p.entry != "" {
		return net.JoinHostPort(p.entry, fmt.Sprint(port))
	}
	return netip.AddrPortFrom(p.tp.B.Workload4, uint16(port)).String()
}

// close removes everything setup built. It may be called more than once.
func (e *env) close() error {
	var errs []error
	for _, p := range []*path{e.pair, e.kernel, e.relay, e.istio} {
		if p == nil {
			continue
		}
		if err := p.stopGateways(); err != nil {
			errs = append(errs, err)
		}
		p.stopProxies()
		if p.srv != nil {
			p.srv.Close()
		}
		if p.tp != nil {
			if err := p.tp.Close(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if e.logw != nil {
		e.logw.Close()
		e.logw = nil
	}
	if e.dir != "" && !e.cfg.Keep {
		os.RemoveAll(e.dir)
	}
	return errors.Join(errs...)
}
