package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Scenario is one thing the bench measures; it returns its figures, with
// both paths' runs filled in.
type Scenario struct {
	Name  string
	About string
	// Peers: the scenario runs on the peer paths too (the plain relay
	// pair, Istio's Go HBONE pair), not only the pair and the kernel.
	Peers bool
	run   func(ctx context.Context, e *env) ([]*Figure, error)
}

// Scenarios lists every scenario in the order `make bench` runs them.
func Scenarios() []Scenario {
	return []Scenario{
		{"bulk1", "one bulk flow each way, default MTU", true, bulkScenario("bulk1", 1, 0, true)},
		{"bulk1-mss", "one bulk flow each way, client MSS clamped (what traffic routed in from another host sees)", true, bulkScenario("bulk1-mss", 1, -1, true)},
		{"bulk8", "8 concurrent bulk flows each way (the bulk size split over them)", true, bulkScenario("bulk8", 8, 0, true)},
		{"bulk8-spread", "bulk8 with the gateways restarted on hbone.conns_per_peer = -spread (flows spread over pooled connections)", false, spreadScenario},
		{"conn1ip", "connection rate: connect, 64 B request, 64 B reply, close; one destination IP", true, connScenario("conn1ip", false)},
		{"connmany", "connection rate, round-robin over many distinct destination IPs", false, connScenario("connmany", true)},
		{"short1", "short connections one at a time: connect, 64 B each way, both FINs; connect and whole-connection latency", true, shortScenario("short1", 1)},
		{"short8", "short connections, 8 at once", true, shortScenario("short8", 8)},
		{"rr", "request/response latency: 64 B ping-pong on one established flow", true, rrScenario("rr", "", true)},
		{"idle", "idle established flows: resident memory per flow of each gateway (fresh gateways per run)", false, idleScenario},
		{"cross-network", "bulk1 and rr with node B's server in another network, reached as double HBONE through node B as its network's east-west gateway", false, crossNetworkScenario},
		{"iperf3", "cross-check: iperf3, one flow node A → node B", false, iperfScenario},
	}
}

// ScenarioNames lists the names Config.Scenarios accepts.
func ScenarioNames() []string {
	var n []string
	for _, s := range Scenarios() {
		n = append(n, s.Name)
	}
	return n
}

func scenarioByName(name string) (Scenario, bool) {
	for _, s := range Scenarios() {
		if s.Name == name {
			return s, true
		}
	}
	return Scenario{}, false
}

// order is the paths of run i: the pair, the kernel and, with peers, the
// peers this run has, in that order on even runs and reversed on odd
// ones, so a slow drift of the machine's load favours no path (over two
// runs each sits at every position's mirror once).
func (e *env) order(i int, peers bool) []*path {
	ps := []*path{e.pair, e.kernel}
	if peers {
		ps = e.all()
	}
	if i%2 == 1 {
		slices.Reverse(ps)
	}
	return ps
}

// cpu reads the CPU time of the path's processes so far.
func (p *path) cpu() (CPU, error) {
	c := CPU{Loadgen: selfCPU()}
	var err error
	if p.gwA != nil {
		if c.GatewayA, err = procCPU(p.gwA.PID()); err != nil {
			return c, err
		}
	}
	if p.gwB != nil {
		if c.GatewayB, err = procCPU(p.gwB.PID()); err != nil {
			return c, err
		}
	}
	// A peer's proxies take the gateways' places.
	if p.proxyA != nil {
		if c.GatewayA, err = procCPU(p.proxyA.pid()); err != nil {
			return c, err
		}
	}
	if p.proxyB != nil {
		if c.GatewayB, err = procCPU(p.proxyB.pid()); err != nil {
			return c, err
		}
	}
	return c, nil
}

// measure runs fn on path p and wraps its result with wall time and the
// CPU the path's processes spent meanwhile.
func (p *path) measure(fn func() (value, work float64, err error)) (Sample, error) {
	before, err := p.cpu()
	if err != nil {
		return Sample{}, err
	}
	var profiled func() error
	if p == p.e.pair && p.e.cfg.Profile != "" {
		profiled = p.profileGateways(context.Background())
	}
	start := time.Now()
	v, w, err := fn()
	el := time.Since(start)
	after, cerr := p.cpu()
	if profiled != nil {
		if perr := profiled(); perr != nil && err == nil {
			err = perr
		}
	}
	if err != nil {
		return Sample{}, err
	}
	if cerr != nil {
		return Sample{}, cerr
	}
	return Sample{Value: v, Seconds: el.Seconds(), Work: w, CPU: after.sub(before)}, nil
}

// add files r under p's side of f and prints it as progress.
func (e *env) add(f *Figure, p *path, run int, r Sample) {
	rs := f.samples(p.name)
	*rs = append(*rs, r)
	line := fmt.Sprintf("   run %d/%d %-6s %-26s %s", run+1, e.cfg.Runs, p.name, f.Name, fmtValue(r.Value, f.Unit))
	if r.Extra != "" {
		line += "  " + r.Extra
	}
	if f.WorkUnit != "" && r.Work > 0 {
		line += "  " + fmtCPUPer(r.CPU, r.Work, f.WorkUnit, p.name)
	}
	fmt.Fprintln(e.out, line)
}

// dialTimeout bounds one TCP connect (a gateway dials HBONE first).
const dialTimeout = 20 * time.Second

// deadline bounds a transfer of n bytes: a minute plus 5 MB/s, far below
// anything either path does, so only a stuck flow ever hits it.
func deadline(n int64) time.Time {
	return time.Now().Add(time.Minute + time.Duration(n/5e6)*time.Second)
}

// guard makes c's blocked reads and writes fail when ctx ends; the
// returned stop must be called.
func guard(ctx context.Context, c net.Conn) (stop func() bool) {
	return context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
}

// bulkScenario moves cfg.Bulk bytes each way over flows concurrent
// connections. mss < 0 clamps the client's MSS to cfg.MSS. With peers
// the peer paths run it too (an upload not on a peer that cannot pass
// the client's half-close on).
func bulkScenario(name string, flows int, mss int, peers bool) func(context.Context, *env) ([]*Figure, error) {
	return func(ctx context.Context, e *env) ([]*Figure, error) {
		label := name
		if flows > 1 {
			label = fmt.Sprintf("%s (%d flows)", name, flows)
		}
		up := &Figure{Scenario: name, Key: name + ".up", Name: label + " up A→B", Unit: "Gbit/s", Higher: true, WorkUnit: "GiB"}
		down := &Figure{Scenario: name, Key: name + ".down", Name: label + " down B→A", Unit: "Gbit/s", Higher: true, WorkUnit: "GiB"}
		figs := []*Figure{up, down}
		if mss < 0 {
			mss = e.cfg.MSS
		}
		for run := 0; run < e.cfg.Runs; run++ {
			for _, p := range e.order(run, peers) {
				for _, d := range []struct {
					f  *Figure
					op byte
				}{{up, 'U'}, {down, 'D'}} {
					if d.op == 'U' && p.noHalfClose != "" {
						d.f.notMeasuredOn(p.name, "the upload half-closes, then reads the receipt: "+p.noHalfClose)
						continue
					}
					r, err := p.measure(func() (float64, float64, error) {
						return bulkFlows(ctx, p, d.op, e.cfg.Bulk, flows, mss)
					})
					if err != nil {
						return figs, fmt.Errorf("%s, run %d, %s path: %w", d.f.Name, run+1, p.name, err)
					}
					if p == e.pair {
						// How many HBONE connections carry the flows
						// (the pool keeps them after the run): across
						// networks, the outer ones to the gateway (the
						// inner ones end with their flow).
						port := 15008
						if name == "cross-network" {
							port = xnetGatewayPort
						}
						if n, err := p.tp.B.Established(ctx, port); err == nil {
							r.Extra = fmt.Sprintf("[%d HBONE conn]", n)
						}
					}
					e.add(d.f, p, run, r)
				}
			}
		}
		return figs, nil
	}
}

// spreadScenario is bulk8 on gateways whose pools spread busy flows over
// cfg.Spread connections per peer (hbone.conns_per_peer); the gateways go
// back to the examples' configs afterwards.
func spreadScenario(ctx context.Context, e *env) (figs []*Figure, err error) {
	if err := e.pair.restartGatewaysOn(ctx, "-spread"); err != nil {
		return nil, err
	}
	defer func() {
		if rerr := e.pair.restartGatewaysOn(ctx, ""); rerr != nil && err == nil {
			err = rerr
		}
	}()
	figs, err = bulkScenario("bulk8-spread", 8, 0, false)(ctx, e)
	for _, f := range figs {
		f.Name = strings.Replace(f.Name, "(8 flows)", fmt.Sprintf("(8 flows, %d conns)", e.cfg.Spread), 1)
	}
	return figs, err
}

// crossNetworkScenario is bulk1 and rr on gateways restarted on the
// -xnet configs (env.go, writeConfigs): node A holds node B's server as a
// workload of another network whose east-west gateway is node B itself,
// so every flow is double HBONE — an outer CONNECT to B's east-west
// listener, carrying the inner TLS and HTTP/2 connection to B's own
// HBONE listener. Against bulk1 and rr of the same run (the direct pair)
// it is what crossing networks costs; the kernel path runs as for those.
// The gateways go back to the examples' configs afterwards.
func crossNetworkScenario(ctx context.Context, e *env) (figs []*Figure, err error) {
	if w := e.pair.tp.B.Workload4.String(); w != xnetServer {
		return nil, fmt.Errorf("node B's workload address is %s, the -xnet configs name %s", w, xnetServer)
	}
	if err := e.pair.restartGatewaysOn(ctx, "-xnet"); err != nil {
		return nil, err
	}
	defer func() {
		if rerr := e.pair.restartGatewaysOn(ctx, ""); rerr != nil && err == nil {
			err = rerr
		}
	}()
	figs, err = bulkScenario("cross-network", 1, 0, false)(ctx, e)
	if err != nil {
		return figs, err
	}
	for _, f := range figs {
		f.Name = strings.Replace(f.Name, "cross-network", "bulk1 cross-network", 1)
	}
	rr, err := rrRuns(ctx, e, "cross-network-rr", ", cross-network", false)
	for _, f := range rr {
		f.Scenario = "cross-network"
	}
	return append(figs, rr...), err
}

// bulkFlows moves total bytes (op 'U' or 'D') over flows connections at
// once and returns Gbit/s and GiB.
func bulkFlows(ctx context.Context, p *path, op byte, total int64, flows, mss int) (float64, float64, error) {
	addr := p.target(BulkPort)
	errs := make([]error, flows)
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < flows; i++ {
		size := total / int64(flows)
		if i == 0 {
			size += total % int64(flows)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			dctx, cancel := context.WithTimeout(ctx, dialTimeout)
			var c net.Conn
			var err error
			if mss > 0 {
				c, err = p.tp.A.DialMSS(dctx, "tcp", addr, mss)
			} else {
				c, err = p.tp.A.Dial(dctx, "tcp", addr)
			}
			cancel()
			if err != nil {
				errs[i] = fmt.Errorf("dial %s: %w", addr, err)
				return
			}
			stop := guard(ctx, c)
			defer stop()
			c.SetDeadline(deadline(size))
			errs[i] = bulk(c, op, size)
		}()
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	if err := errors.Join(errs...); err != nil {
		return 0, 0, err
	}
	return float64(total) * 8 / el / 1e9, float64(total) / (1 << 30), nil
}

// manyAddrs is the first n addresses of ManyPrefix whose last byte is
// neither 0 nor 255 (never mistaken for a network or broadcast address).
func manyAddrs(n int) []netip.Addr {
	var out []netip.Addr
	for a := ManyPrefix.Addr(); ManyPrefix.Contains(a) && len(out) < n; a = a.Next() {
		if b := a.As4(); b[3] != 0 && b[3] != 255 {
			out = append(out, a)
		}
	}
	return out
}

// connScenario measures short connections per second, to node B's
// workload address or round-robin over cfg.IPs addresses.
func connScenario(name string, many bool) func(context.Context, *env) ([]*Figure, error) {
	return func(ctx context.Context, e *env) ([]*Figure, error) {
		f := &Figure{Scenario: name, Key: name, Name: "conn rate, 1 IP", Unit: "conn/s", Higher: true, WorkUnit: "conn"}
		if many {
			f.Name = fmt.Sprintf("conn rate, %d IPs", e.cfg.IPs)
		}
		for run := 0; run < e.cfg.Runs; run++ {
			// The peers' relays listen on one address: many destination
			// IPs would need a listener each (or a transparent proxy).
			for _, p := range e.order(run, !many) {
				targets := []string{p.target(EchoPort)}
				if many {
					targets = targets[:0]
					for _, a := range manyAddrs(e.cfg.IPs) {
						targets = append(targets, netip.AddrPortFrom(a, EchoPort).String())
					}
				}
				r, err := p.measure(func() (float64, float64, error) {
					return connRate(ctx, p, targets, e.cfg.Conns, e.cfg.Workers)
				})
				if err != nil {
					return []*Figure{f}, fmt.Errorf("%s, run %d, %s path: %w", f.Name, run+1, p.name, err)
				}
				e.add(f, p, run, r)
			}
		}
		return []*Figure{f}, nil
	}
}

// connRate makes n short connections with workers clients in node A,
// connection i to targets[i % len(targets)], and returns connections per
// second and n. The first failure stops it.
func connRate(ctx context.Context, p *path, targets []string, n, workers int) (float64, float64, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < min(workers, n); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The whole worker runs on a thread inside node A, so each of
			// its sockets is made there without a namespace switch per dial.
			err := p.tp.A.Do(func() error {
				d := net.Dialer{Timeout: dialTimeout}
				buf := make([]byte, MsgSize)
				for ctx.Err() == nil {
					i := int(next.Add(1)) - 1
					if i >= n {
						return nil
					}
					if err := shortConn(ctx, &d, targets[i%len(targets)], buf); err != nil {
						return fmt.Errorf("connection %d: %w", i, err)
					}
				}
				return context.Cause(ctx)
			})
			if err != nil {
				cancel(err)
			}
		}()
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	if err := context.Cause(ctx); err != nil {
		return 0, 0, err
	}
	return float64(n) / el, float64(n), nil
}

// rrWarmup exchanges precede the timed ones (first-use costs of the pool
// and the stack are not latency).
const rrWarmup = 100

// rrScenario is the 64 B ping-pong as scenario name, its figures' names
// carrying suffix, on the peer paths too if peers.
func rrScenario(name, suffix string, peers bool) func(context.Context, *env) ([]*Figure, error) {
	return func(ctx context.Context, e *env) ([]*Figure, error) { return rrRuns(ctx, e, name, suffix, peers) }
}

func rrRuns(ctx context.Context, e *env, name, suffix string, peers bool) ([]*Figure, error) {
	p50 := &Figure{Scenario: name, Key: name + ".p50", Name: "latency p50 (64 B rr" + suffix + ")", Unit: "µs"}
	p99 := &Figure{Scenario: name, Key: name + ".p99", Name: "latency p99 (64 B rr" + suffix + ")", Unit: "µs"}
	figs := []*Figure{p50, p99}
	for run := 0; run < e.cfg.Runs; run++ {
		for _, p := range e.order(run, peers) {
			var tail float64
			r, err := p.measure(func() (float64, float64, error) {
				dctx, cancel := context.WithTimeout(ctx, dialTimeout)
				c, err := p.tp.A.Dial(dctx, "tcp", p.target(EchoPort))
				cancel()
				if err != nil {
					return 0, 0, err
				}
				defer c.Close()
				stop := guard(ctx, c)
				defer stop()
				c.SetDeadline(time.Now().Add(time.Minute + time.Duration(e.cfg.RR)*time.Millisecond))
				rtts, err := pingPong(c, rrWarmup, e.cfg.RR)
				if err != nil {
					return 0, 0, err
				}
				tail = micros(percentile(rtts, 99))
				e.keepRTTs(p.name, rtts)
				return micros(percentile(rtts, 50)), 0, nil
			})
			if err != nil {
				return figs, fmt.Errorf("latency, run %d, %s path: %w", run+1, p.name, err)
			}
			r99 := r
			r99.Value = tail
			e.add(p50, p, run, r)
			e.add(p99, p, run, r99)
		}
	}
	return figs, nil
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// idleSettle lets the gateways finish what opening the flows started
// (access-log lines, pool bookkeeping) before their memory is read; RSS is
// a reading, not a synchronization.
const idleSettle = time.Second

func idleScenario(ctx context.Context, e *env) ([]*Figure, error) {
	fa := &Figure{Scenario: "idle", Key: "idle.gw_a", Name: fmt.Sprintf("RSS/flow gw A, %d idle", e.cfg.Idle), Unit: "KiB/flow"}
	fb := &Figure{Scenario: "idle", Key: "idle.gw_b", Name: fmt.Sprintf("RSS/flow gw B, %d idle", e.cfg.Idle), Unit: "KiB/flow"}
	figs := []*Figure{fa, fb}
	p := e.pair
	if lim := noFileLimit(); lim < uint64(e.cfg.Idle)+1000 {
		return figs, fmt.Errorf("%d idle flows need about %d file descriptors in this process, RLIMIT_NOFILE is %d", e.cfg.Idle, e.cfg.Idle+1000, lim)
	}
	h, err := startHelper(ctx, p)
	if err != nil {
		return figs, err
	}
	defer h.stop()
	for run := 0; run < e.cfg.Runs; run++ {
		// Fresh processes: a Go heap that already grew for an earlier
		// scenario or run would absorb the flows without growing RSS.
		if err := p.restartGateways(ctx); err != nil {
			return figs, err
		}
		ra, rb, err := idleRun(ctx, p, e.cfg.Idle, e.cfg.Workers)
		if err != nil {
			return figs, fmt.Errorf("idle flows, run %d: %w", run+1, err)
		}
		e.add(fa, p, run, ra)
		e.add(fb, p, run, rb)
	}
	return figs, nil
}

// idleRun opens n flows through the pair (each proven end to end by one
// echo), reads each gateway's VmRSS before and after, and closes them.
func idleRun(ctx context.Context, p *path, n, workers int) (Sample, Sample, error) {
	target := p.target(IdlePort)
	// Warm up: the first flow opens the HBONE connection and wakes every
	// lazy part of both gateways; that is not per-flow cost.
	if _, _, err := connRate(ctx, p, []string{target}, 1, 1); err != nil {
		return Sample{}, Sample{}, fmt.Errorf("warm-up: %w", err)
	}
	rss := func() (int64, int64, error) {
		a, err := procStatusKiB(p.gwA.PID(), "VmRSS")
		if err != nil {
			return 0, 0, err
		}
		b, err := procStatusKiB(p.gwB.PID(), "VmRSS")
		return a, b, err
	}
	a0, b0, err := rss()
	if err != nil {
		return Sample{}, Sample{}, err
	}
	start := time.Now()
	conns, err := openIdle(ctx, p, target, n, workers)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	if err != nil {
		return Sample{}, Sample{}, err
	}
	el := time.Since(start).Seconds()
	select {
	case <-time.After(idleSettle):
	case <-ctx.Done():
		return Sample{}, Sample{}, ctx.Err()
	}
	a1, b1, err := rss()
	if err != nil {
		return Sample{}, Sample{}, err
	}
	if p.e.cfg.Profile != "" {
		if err := p.snapshotGateways(ctx); err != nil {
			return Sample{}, Sample{}, err
		}
	}
	mk := func(before, after int64) Sample {
		return Sample{Value: float64(after-before) / float64(n), Seconds: el,
			Extra: fmt.Sprintf("(RSS %d → %d MiB)", before>>10, after>>10)}
	}
	return mk(a0, a1), mk(b0, b1), nil
}

// openIdle opens n echo flows from node A with workers clients, one
// exchange each, and returns them open.
func openIdle(ctx context.Context, p *path, target string, n, workers int) ([]net.Conn, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var mu sync.Mutex
	conns := make([]net.Conn, 0, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < min(workers, n); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := p.tp.A.Do(func() error {
				d := net.Dialer{Timeout: dialTimeout, Control: noLinger}
				buf := make([]byte, MsgSize)
				for ctx.Err() == nil {
					if int(next.Add(1)) > n {
						return nil
					}
					c, err := d.DialContext(ctx, "tcp", target)
					if err != nil {
						return err
					}
					mu.Lock()
					conns = append(conns, c)
					mu.Unlock()
					c.SetDeadline(time.Now().Add(dialTimeout))
					if err := echo(c, buf); err != nil {
						return err
					}
					c.SetDeadline(time.Time{})
				}
				return context.Cause(ctx)
			})
			if err != nil {
				cancel(err)
			}
		}()
	}
	wg.Wait()
	return conns, context.Cause(ctx)
}

// noLinger makes Close of an idle flow send a RST instead of a FIN: the
// bench closes 10,000 of them at once, and an abortive close leaves no
// TIME_WAIT behind in node A for the scenarios that follow.
func noLinger(_, _ string, rc syscall.RawConn) error {
	var serr error
	err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptLinger(int(fd), unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
	})
	if err != nil {
		return err
	}
	return serr
}
