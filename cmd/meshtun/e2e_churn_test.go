package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshtun/meshtun/internal/topo"
	"github.com/meshtun/meshtun/internal/xfer"
)

// The churn's load. `make test` runs it for a few seconds; a soak run sets
// MESHTUN_CHURN_CLIENTS and MESHTUN_CHURN_DURATION (a Go duration).
const (
	churnClients  = 200
	churnDuration = 3 * time.Second
	// churnMaxBytes bounds each flow's random upload and download: flows
	// of a few round trips, so the churn is in opening and closing.
	churnMaxBytes = 64 << 10
	// soakMin is the churn's length from which it samples the gateways
	// as it goes (make soak).
	soakMin = time.Minute
)

// Tolerances of the return to the baseline, once the flows are done and
// the pool's connections have gone idle and closed.
const (
	// churnGoroutineSlack: goroutines that come and go without a flow
	// (the runtime's, a scrape being served).
	churnGoroutineSlack = 5
	// churnFDSlack: descriptors that come and go without a flow (the
	// scrape's own connection, the runtime's).
	churnFDSlack = 5
	// churnRSSSlack: Go returns freed heap to the kernel slowly (the
	// scavenger) and the race detector's shadow memory stays, so resident
	// memory does not come back exactly; measured, it grew 3–14 MiB over
	// the churn under -race. A leak of what the churn's flows held (a
	// 256 KiB relay buffer each, hundreds of flows) would add far more.
	churnRSSSlack = 48 << 20
)

// envOr reads a positive value of the environment, or def.
func envOr[T int | time.Duration](t *testing.T, key string, def T, parse func(string) (T, error)) T {
	t.Helper()
	s := os.Getenv(key)
	if s == "" {
		return def
	}
	v, err := parse(s)
	if err != nil || v <= 0 {
		t.Fatalf("%s=%q: want a positive value (%v)", key, s, err)
	}
	return v
}

// gwSample is what the churn test reads of one gateway's /metrics.
type gwSample struct {
	goroutines, fds, rss                    float64
	flows, poolConns, serverConns, buffers  float64
	closedFlagged, closedTotal, openedTotal float64
}

func sampleGateway(t *testing.T, n *topo.Node) gwSample {
	t.Helper()
	s := scrapeNode(t, n, "/metrics")
	sum := func(name string, labels map[string]string) float64 { return promSum(s, name, labels) }
	closed := sum("istio_tcp_connections_closed_total", nil)
	return gwSample{
		goroutines:    sum("go_goroutines", nil),
		fds:           sum("process_open_fds", nil),
		rss:           sum("process_resident_memory_bytes", nil),
		flows:         sum("meshtun_flows_open", nil),
		poolConns:     sum("meshtun_hbone_pool_connections_open", nil),
		serverConns:   sum("meshtun_hbone_server_connections_open", nil),
		buffers:       sum("meshtun_relay_buffers_in_use", nil),
		closedTotal:   closed,
		closedFlagged: closed - sum("istio_tcp_connections_closed_total", map[string]string{"response_flags": "-"}),
		openedTotal:   sum("istio_tcp_connections_opened_total", nil),
	}
}

func (s gwSample) String() string {
	return fmt.Sprintf("goroutines %.0f, fds %.0f, RSS %.1f MiB, flows open %.0f, pool conns %.0f, server conns %.0f, relay buffers %.0f",
		s.goroutines, s.fds, s.rss/(1<<20), s.flows, s.poolConns, s.serverConns, s.buffers)
}

// idle: no flow, no HBONE connection, no relay buffer.
func (s gwSample) idle() bool {
	return s.flows == 0 && s.poolConns == 0 && s.serverConns == 0 && s.buffers == 0
}

// churnResult counts what the churn's flows ended with.
type churnResult struct {
	ok, resets, failures atomic.Int64
	bytes                atomic.Int64
	mu                   sync.Mutex
	samples              []string // the first errors, for the log
}

func (r *churnResult) note(err error) {
	if isReset(err) {
		r.resets.Add(1)
	} else {
		r.failures.Add(1)
	}
	r.mu.Lock()
	if len(r.samples) < 10 {
		r.samples = append(r.samples, err.Error())
	}
	r.mu.Unlock()
}

// churn runs clients in node A, each opening flows to target one after
// another, at least one and more until d has passed: a random upload and
// download, both checked by hash, then close.
func churn(tp *topo.Topology, target string, clients int, d time.Duration) *churnResult {
	r := &churnResult{}
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for first := true; first || time.Now().Before(end); first = false {
				ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
				c, err := tp.A.Dial(ctx, "tcp", target)
				cancel()
				if err != nil {
					r.note(fmt.Errorf("dial: %w", err))
					continue
				}
				c.SetDeadline(time.Now().Add(30 * time.Second))
				up, down := rand.Int64N(churnMaxBytes+1), rand.Int64N(churnMaxBytes+1)
				if _, err := xfer.Run(c, up, down); err != nil {
					r.note(err)
					continue
				}
				r.ok.Add(1)
				r.bytes.Add(up + down)
			}
		}()
	}
	wg.Wait() // each flow is bounded by its deadlines
	return r
}

// TestEndToEndChurn: hundreds of concurrent clients in node A open flows
// through both gateways for a bounded time, each with a random amount
// each way checked by hash. Pass: every flow intact, zero resets (the
// clients' and both gateways' count), and both gateways' goroutines and
// file descriptors back to their baseline within a small slack, their
// resident memory within churnRSSSlack, no flow, HBONE connection or
// relay buffer left.
func TestEndToEndChurn(t *testing.T) {
	clients := envOr(t, "MESHTUN_CHURN_CLIENTS", churnClients, strconv.Atoi)
	d := envOr(t, "MESHTUN_CHURN_DURATION", churnDuration, time.ParseDuration)
	bin, dir, tp := twoNodes(t, "mtchn", func(_, s string) string {
		// A short idle timeout, so the pool's connections close after
		// the churn and the gateways return to no connection at all.
		return strings.Replace(s, `idle_timeout = "5m"`, `idle_timeout = "1s"`, 1)
	})
	// Clients close first, so their ports wait in TIME_WAIT; a soak run
	// opens many.
	if err := tp.A.Sysctl("net.ipv4.ip_local_port_range", "1024 65535"); err != nil {
		t.Fatal(err)
	}
	gws := map[*topo.Node]*topo.Gateway{}
	for _, n := range []*topo.Node{tp.B, tp.A} {
		// The access log is kept (its WARN lines are the gateways'
		// count of flows that did not end cleanly) but not copied to
		// the test's log: thousands of lines.
		g, err := n.StartGateway(bin, filepath.Join(dir, n.Name+".toml"), nil)
		if err != nil {
			t.Fatal(err)
		}
		gws[n] = g
		t.Cleanup(func() {
			if err := g.Stop(15 * time.Second); err != nil {
				t.Errorf("gateway %s: %v\n%s", n.Name, err, strings.Join(g.Logs(), "\n"))
			}
		})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = g.WaitReady(ctx, "127.0.0.1:15021")
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	target := tp.B.Workload4.String() + ":7001"
	l, err := tp.B.Listen("tcp", target)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { xfer.Serve(l); close(served) }()
	t.Cleanup(func() { l.Close(); <-served })

	nodes := []*topo.Node{tp.A, tp.B}
	// settle waits until both gateways are idle and, if base is set,
	// back within the slack of goroutines and descriptors.
	settle := func(what string, base []gwSample) []gwSample {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			now := []gwSample{sampleGateway(t, tp.A), sampleGateway(t, tp.B)}
			back := now[0].idle() && now[1].idle()
			for i := range base {
				back = back && now[i].goroutines <= base[i].goroutines+churnGoroutineSlack &&
					now[i].fds <= base[i].fds+churnFDSlack
			}
			if back {
				return now
			}
			if time.Now().After(deadline) {
				for i, n := range nodes {
					t.Errorf("%s %s: %v", n.Name, what, now[i])
					if base != nil {
						t.Errorf("%s baseline: %v", n.Name, base[i])
					}
				}
				t.FailNow()
			}
			time.Sleep(100 * time.Millisecond) // polling the gateways' metrics; bounded by deadline
		}
	}

	// Warm-up, so the baseline holds what serving the load grows once
	// (pools, runtime threads, gVisor's processors): one flow per client.
	if r := churn(tp, target, clients, 0); r.resets.Load()+r.failures.Load() > 0 {
		t.Fatalf("warm-up: %d resets, %d failures: %s", r.resets.Load(), r.failures.Load(), strings.Join(r.samples, "; "))
	}
	base := settle("idle after the warm-up", nil)
	warnBase := []int{len(gws[tp.A].LogsContaining("WARN")), len(gws[tp.B].LogsContaining("WARN"))}

	start := time.Now()
	var r *churnResult
	churned := make(chan struct{})
	go func() { defer close(churned); r = churn(tp, target, clients, d) }()
	// A soak (make soak) logs both gateways every tenth of its length:
	// memory, goroutines and descriptors must plateau, not grow.
	if d >= soakMin {
		t.Logf("soak sample every %v: %s baseline %v; %s baseline %v", d/10, tp.A.Name, base[0], tp.B.Name, base[1])
		tick := time.NewTicker(d / 10)
	samples:
		for {
			select {
			case <-churned:
				break samples
			case <-tick.C:
				t.Logf("soak t+%v: %s %v; %s %v", time.Since(start).Round(time.Second),
					tp.A.Name, sampleGateway(t, tp.A), tp.B.Name, sampleGateway(t, tp.B))
			}
		}
		tick.Stop()
	}
	<-churned
	elapsed := time.Since(start)
	t.Logf("churn: %d clients for %v: %d flows intact (%.1f MiB), %d resets, %d other failures, in %v",
		clients, d, r.ok.Load(), float64(r.bytes.Load())/(1<<20), r.resets.Load(), r.failures.Load(), elapsed.Round(time.Millisecond))
	if n := r.resets.Load() + r.failures.Load(); n > 0 {
		t.Errorf("%d flows not intact (%d resets), e.g.:\n%s", n, r.resets.Load(), strings.Join(r.samples, "\n"))
	}
	if r.ok.Load() < int64(clients) {
		t.Errorf("only %d flows intact for %d clients", r.ok.Load(), clients)
	}

	after := settle("not back to the baseline after the churn", base)
	for i, n := range nodes {
		t.Logf("%s baseline: %v", n.Name, base[i])
		t.Logf("%s after:    %v", n.Name, after[i])
		if grew := after[i].rss - base[i].rss; grew > churnRSSSlack {
			t.Errorf("%s: resident memory grew by %.1f MiB over the churn, more than %d MiB", n.Name, grew/(1<<20), churnRSSSlack>>20)
		}
		if after[i].closedFlagged != base[i].closedFlagged {
			t.Errorf("%s: %.0f flows closed with a response flag during the churn, want 0", n.Name, after[i].closedFlagged-base[i].closedFlagged)
		}
		if after[i].closedTotal != after[i].openedTotal {
			t.Errorf("%s: %.0f flows opened, %.0f closed", n.Name, after[i].openedTotal, after[i].closedTotal)
		}
		if warns := gws[n].LogsContaining("WARN"); len(warns) > warnBase[i] {
			t.Errorf("%s logged %d warnings during the churn (flows that did not end cleanly), e.g. %s",
				n.Name, len(warns)-warnBase[i], warns[warnBase[i]])
		}
	}
	if after[0].closedTotal-base[0].closedTotal < float64(r.ok.Load()) {
		t.Errorf("node A counted %.0f flows closed during the churn; the clients finished %d", after[0].closedTotal-base[0].closedTotal, r.ok.Load())
	}
}
