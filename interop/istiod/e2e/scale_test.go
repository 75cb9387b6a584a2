package e2e

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshtun/meshtun/internal/topo"
	"github.com/meshtun/meshtun/interop/istiod/controlplane"
)

// The scale scenario (issue "Scale with the mesh"): Istio's control plane,
// pushing every change on its own (no debounce), grows the mesh to each
// size of $MESHTUN_SCALE_PODS — ambient pods in namespace scale, one
// Service per podsPerService of them — and then replaces churnRate pods
// a second (delete one, add one with a new IP). Node A's gateway is
// measured at each size: the CPU of the bulk add, the CPU per push of one
// changed pod, the lag from a pod's creation until /route routes it, its
// RSS per address, and an echo flow from node A to node B that runs
// through the pair the whole time.
//
// Environment:
//
//	MESHTUN_SCALE_PODS    sizes, ascending (default 1000; the full run:
//	                      1000,20000,100000)
//	MESHTUN_SCALE_CHURN   how long each churn window lasts (default 5s)
//	MESHTUN_SCALE_OUT     a directory for the report (scale.md, scale.json)
//	                      and, at the largest size, CPU profiles of node
//	                      A's gateway under churn (push.pprof) and in the
//	                      first minute of the bulk add (bulk.pprof), and
//	                      its heap after a collection (heap.pprof)
//	MESHTUN_BIN           an earlier meshtun build to measure instead
const (
	scaleNS        = "scale"
	podsPerService = 10
	churnRate      = 10 // replacements a second
	scalePort      = 80 // every Service's port, to the pods' 8080
)

// scaleRow is what one size measured.
type scaleRow struct {
	Pods      int `json:"pods"`
	Addresses int `json:"addresses"` // meshtun_xds_resources{type="address"}

	BulkPods    int     `json:"bulk_pods"` // pods added to reach this size
	BulkCPU     float64 `json:"bulk_cpu_seconds"`
	BulkWall    float64 `json:"bulk_wall_seconds"`
	BulkUpdates int     `json:"bulk_updates"` // xDS responses applied meanwhile
	// BulkCPUNet takes out the background (the echo flow, timers) at the
	// idle rate measured before the add, at the smaller size: it
	// understates the background, never the add.
	BulkCPUNet float64 `json:"bulk_cpu_net_seconds"`

	ChurnChanges  int     `json:"churn_changes"`     // pods replaced in the CPU window
	ChurnUpdates  int     `json:"churn_updates"`     // xDS responses applied in it
	IdleCPUPerSec float64 `json:"idle_cpu_ms_per_s"` // the echo flow held
	// IdleFlowCPUPerSec is the idle rate with the echo flow's round
	// trips, which the next size's bulk add (the flow running) takes out.
	IdleFlowCPUPerSec float64 `json:"idle_flow_cpu_ms_per_s"`
	CPUPerPush        float64 `json:"cpu_ms_per_push"` // idle CPU taken out
	CPUPerChange      float64 `json:"cpu_ms_per_change"`
	// CPUPerPushSteady is CPUPerPush with the collector's CPU in the
	// window (go_cpu_classes_gc_total_cpu_seconds_total) replaced by its
	// share over all of the size's pushes: a collection of a large heap
	// comes every few hundred pushes, so a window holds one or none.
	// 0: the build does not export the collector's CPU.
	CPUPerPushSteady float64 `json:"cpu_ms_per_push_steady"`
	GCPerPush        float64 `json:"gc_cpu_ms_per_push"` // that share

	LagN      int     `json:"lag_n"`
	LagMedian float64 `json:"lag_median_ms"`
	LagP90    float64 `json:"lag_p90_ms"`
	LagMax    float64 `json:"lag_max_ms"`
	// ApplyMean and ApplyP99 are node A's own part of the lag, from its
	// meshtun_xds_apply_seconds over the lag window: receipt of a
	// response to its ACK (ApplyP99 is the bucket bound at or above the
	// 99th percentile).
	ApplyN    int     `json:"apply_n"`
	ApplyMean float64 `json:"apply_mean_ms"`
	ApplyP99  float64 `json:"apply_p99_bound_ms"`

	RSS           int64   `json:"rss_bytes"`
	RSSPerAddress float64 `json:"rss_bytes_per_address"`

	FlowIdleP50  float64 `json:"flow_idle_p50_us"`
	FlowChurnP50 float64 `json:"flow_churn_p50_us"`
	FlowChurnP99 float64 `json:"flow_churn_p99_us"`
	FlowTrips    int     `json:"flow_round_trips"`

	Coalesced int `json:"coalesced"` // meshtun_xds_coalesced_total, -1: not served
}

func TestScale(t *testing.T) {
	sizes := scaleSizes(t)
	churnFor := 5 * time.Second
	if v := os.Getenv("MESHTUN_SCALE_CHURN"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Second {
			t.Fatalf("MESHTUN_SCALE_CHURN=%q: want a duration of 1s or more", v)
		}
		churnFor = d
	}
	out := os.Getenv("MESHTUN_SCALE_OUT")
	m := setupWith(t, setupOptions{noDebounce: true})
	serve(t, m.topo.B)
	must(t, m.cp.ApplyNamespace(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: scaleNS}}))

	s := &scaler{t: t, m: m, a: m.topo.A, pid: m.gwA.PID(), rng: rand.New(rand.NewPCG(1, 2))}
	s.baseAddrs = s.waitAddresses(s.expected(), 30*time.Second)
	s.baseRSS = rssOf(t, s.pid)
	flow := s.startFlow()
	s.flow = flow
	defer flow.stop()
	flow.mark()
	s.idleRate = s.idleWindow(churnFor)
	flow.take()

	var rows []scaleRow
	for i, n := range sizes {
		bulkProfile := ""
		if out != "" && i == len(sizes)-1 {
			bulkProfile = filepath.Join(out, "bulk.pprof")
		}
		row := s.grow(n, bulkProfile)
		s.measure(&row, flow, churnFor)
		if out != "" && i == len(sizes)-1 {
			// What the heap holds at the largest size, after a collection.
			if err := s.pprof(filepath.Join(out, "heap.pprof"), "heap?gc=1", 0); err != nil {
				t.Errorf("heap profile of node A: %v", err)
			}
			s.profile(filepath.Join(out, "push.pprof"), churnFor)
		}
		rows = append(rows, row)
		t.Logf("at %d pods: %+v", n, row)
	}
	s.checkRouted()
	if err := flow.stop(); err != nil {
		t.Errorf("the echo flow A → B through the pair during churn: %v", err)
	}
	// A gateway in a mesh collects at 1.5 times its live heap unless the
	// environment says otherwise (the RSS above depends on it).
	if _, set := os.LookupEnv("GOGC"); !set {
		if v, err := metricSeries(m.topo.A, "go_gc_gogc_percent"); err != nil || v != 50 {
			t.Errorf("node A's go_gc_gogc_percent = %v (%v), want 50 with [mesh] and GOGC unset", v, err)
		}
	}
	if v, err := metricSeries(m.topo.A, `meshtun_xds_nacks_total{type="address"}`); err == nil && v != 0 {
		t.Errorf("node A NACKed %v address responses during the scale run", v)
	}
	table := scaleTable(rows)
	t.Logf("scale, node A's gateway (%s):\n%s", m.bin, table)
	if out != "" {
		must(t, os.MkdirAll(out, 0o755))
		must(t, os.WriteFile(filepath.Join(out, "scale.md"), []byte(table), 0o644))
		b, err := json.MarshalIndent(rows, "", "  ")
		must(t, err)
		must(t, os.WriteFile(filepath.Join(out, "scale.json"), append(b, '\n'), 0o644))
	}
}

func scaleSizes(t *testing.T) []int {
	v := os.Getenv("MESHTUN_SCALE_PODS")
	if v == "" {
		return []int{1000}
	}
	var sizes []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < podsPerService || (len(sizes) > 0 && n <= sizes[len(sizes)-1]) || n > 1_000_000 {
			t.Fatalf("MESHTUN_SCALE_PODS=%q: want ascending pod counts, each %d to 1000000", v, podsPerService)
		}
		sizes = append(sizes, n)
	}
	return sizes
}

// scaler grows and churns the scale namespace and measures node A.
type scaler struct {
	t   *testing.T
	m   *mesh
	a   *topo.Node
	pid int
	rng *rand.Rand

	baseAddrs int
	baseRSS   int64
	idleRate  float64 // ms of CPU a second with the mesh still and the flow running: the last idle window's
	flow      *echoFlow
	seq       int        // pods ever made: the next pod's name and IP
	services  int        // Services made
	live      []scalePod // pods in the mesh now
	gone      []string   // IPs of pods replaced, for the check at the end
}

type scalePod struct {
	name, ip string
	svc      int
}

// scalePodIP is pod i's address, in 10.128.0.0/10 (4M addresses);
// scaleVIP the VIP of Service k, in 10.112.0.0/12. Neither is in
// svcCIDR, which the nodes capture: /route explains a destination
// whether or not it is captured.
func scalePodIP(i int) string { return addrAt(netip.MustParseAddr("10.128.0.0"), i) }
func scaleVIP(k int) string   { return addrAt(netip.MustParseAddr("10.112.0.0"), k+1) }

func addrAt(base netip.Addr, i int) string {
	b := base.As4()
	binary.BigEndian.PutUint32(b[:], binary.BigEndian.Uint32(b[:])+uint32(i))
	return netip.AddrFrom4(b).String()
}

// expected is the number of addresses node A should hold: the setup's
// own (as Istio's index has them) and the scale namespace's.
func (s *scaler) expected() int {
	x := s.m.cp.Index()
	return len(x.Workloads()) + len(x.Services())
}

func (s *scaler) newPod(svc int) scalePod {
	p := scalePod{name: "p" + strconv.Itoa(s.seq), ip: scalePodIP(s.seq), svc: svc}
	s.seq++
	must(s.t, s.m.cp.ApplyPod(controlplane.NewPod(scaleNS, p.name, "sa"+strconv.Itoa(svc%100), p.ip,
		map[string]string{"app": "s" + strconv.Itoa(svc)})))
	return p
}

// grow adds pods (and a Service for each podsPerService of them) until
// the namespace holds n, as fast as Istio takes them, and measures node
// A's CPU until it holds every address Istio's index has.
func (s *scaler) grow(n int, profile string) scaleRow {
	t := s.t
	row := scaleRow{Pods: n, BulkPods: n - len(s.live)}
	cpu0, upd0, start := cpuOf(t, s.pid), s.updates(), time.Now()
	if profile != "" {
		// At most the first minute of the add (Istio's pace is steady,
		// about 80 pods a second here), not beyond its end.
		wait := s.startProfile(profile, min(60, max(1, row.BulkPods/80)))
		defer func() {
			if err := wait(); err != nil {
				t.Errorf("CPU profile of node A during the bulk add: %v", err)
			} else {
				t.Logf("CPU profile of node A's first minute of the bulk add to %d pods: %s", n, profile)
			}
		}()
	}
	for len(s.live) < n {
		svc := len(s.live) / podsPerService
		if svc >= s.services {
			must(t, s.m.cp.ApplyService(controlplane.NewService(scaleNS, "s"+strconv.Itoa(svc), scaleVIP(svc),
				map[string]string{"app": "s" + strconv.Itoa(svc)}, controlplane.ServicePort{Name: "http", Port: scalePort, TargetPort: xferPort})))
			s.services++
		}
		s.live = append(s.live, s.newPod(svc))
		if len(s.live)%paceEvery == 0 {
			s.waitPod(s.live[len(s.live)-paceEvery].name)
		}
	}
	want := s.waitIndex(n)
	// A gateway that falls behind takes long; the bound only ends a wait
	// that would otherwise hang.
	row.Addresses = s.waitAddresses(want, 10*time.Minute+time.Duration(n)*20*time.Millisecond)
	s.waitRouted(s.live[len(s.live)-1].ip, time.Minute)
	row.BulkWall = time.Since(start).Seconds()
	row.BulkCPU = (cpuOf(t, s.pid) - cpu0).Seconds()
	row.BulkCPUNet = max(0, row.BulkCPU-s.idleRate*row.BulkWall/1000)
	row.BulkUpdates = s.updates() - upd0
	return row
}

// paceEvery is how many pods grow creates before it waits for Istio's
// index to hold the one created paceEvery before: at most 2×paceEvery
// pods (two events each) are then unread by Istio's informers, within
// the 100 that the in-memory client's watch channels hold.
const paceEvery = 20

// waitPod waits until Istio's index holds pod name.
func (s *scaler) waitPod(name string) {
	deadline := time.Now().Add(5 * time.Minute)
	for !s.m.cp.HoldsPod(scaleNS, name) {
		if time.Now().After(deadline) {
			s.t.Fatalf("Istio's index never held pod %s/%s", scaleNS, name)
		}
		time.Sleep(2 * time.Millisecond) // polling Istio's index, which has no change feed for outsiders
	}
}

// waitIndex waits until Istio's index holds the scale namespace's n pods
// and their Services, and returns how many addresses it holds in all.
func (s *scaler) waitIndex(n int) int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	prefix := scaleNS + "/"
	x, err := s.m.cp.WaitIndex(ctx, func(x controlplane.Index) bool {
		pods := 0
		for _, w := range x.Workloads() {
			if w.GetNamespace() == scaleNS {
				pods++
			}
		}
		svcs := 0
		for name := range x.Services() {
			if strings.HasPrefix(name, prefix) {
				svcs++
			}
		}
		return pods == n && svcs == s.services
	})
	if err != nil {
		s.t.Fatalf("Istio's index never held %d pods and %d services in %s: %v", n, s.services, scaleNS, err)
	}
	return len(x.Workloads()) + len(x.Services())
}

// measure runs the windows of one size: idle with the echo flow, idle
// and churn with the flow held for CPU per push, churn with every new
// pod's lag polled and the flow running; then RSS.
func (s *scaler) measure(row *scaleRow, flow *echoFlow, d time.Duration) {
	t := s.t
	gcStart, gcKnown := s.gcCPU()
	updStart := s.updates()
	// Idle with the flow: its round trips with the mesh still, and the
	// background the next bulk add's net figure takes out.
	flow.mark()
	row.IdleFlowCPUPerSec = s.idleWindow(d)
	s.idleRate = row.IdleFlowCPUPerSec
	row.FlowIdleP50 = flow.take().p50

	// The CPU windows hold the flow: its ≈ 20 ms of CPU a second would be
	// most of what the idle rate takes out of the churn window's again,
	// and its spread the figure's. Idle: the gateway's own background
	// (timers, certificate renewals).
	flow.pause()
	row.IdleCPUPerSec = s.idleWindow(d)

	// Churn, nothing polled: CPU per push.
	gc0, _ := s.gcCPU()
	cpu0, upd0 := cpuOf(t, s.pid), s.updates()
	start := time.Now()
	row.ChurnChanges = s.churn(d, nil)
	last := s.live[len(s.live)-1].ip
	s.waitRouted(last, 10*time.Minute)
	took := time.Since(start)
	cpu := cpuOf(t, s.pid) - cpu0
	row.ChurnUpdates = s.updates() - upd0
	busy := ms(cpu) - row.IdleCPUPerSec*took.Seconds()
	if row.ChurnUpdates > 0 {
		row.CPUPerPush = busy / float64(row.ChurnUpdates)
	}
	if row.ChurnChanges > 0 {
		row.CPUPerChange = busy / float64(row.ChurnChanges)
	}
	gcWindow, _ := s.gcCPU()
	gcWindow -= gc0
	flow.resume()
	flow.mark()

	// Churn, every new pod polled until routed: the lag, and the flow
	// through the pair meanwhile.
	var mu sync.Mutex
	var lags []time.Duration
	var wg sync.WaitGroup
	apply0, err := applyHistogramOf(s.a)
	must(t, err)
	s.churn(d, func(ip string, created time.Time) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			at := s.waitRouted(ip, 10*time.Minute)
			mu.Lock()
			lags = append(lags, at.Sub(created))
			mu.Unlock()
		}()
	})
	wg.Wait()
	f := flow.take()
	row.FlowChurnP50, row.FlowChurnP99, row.FlowTrips = f.p50, f.p99, f.n
	apply1, err := applyHistogramOf(s.a)
	must(t, err)
	row.ApplyN, row.ApplyMean, row.ApplyP99 = apply1.since(apply0)
	slices.Sort(lags)
	row.LagN = len(lags)
	if len(lags) > 0 {
		row.LagMedian, row.LagP90, row.LagMax = ms(lags[len(lags)/2]), ms(lags[len(lags)*9/10]), ms(lags[len(lags)-1])
	}
	// A replacement keeps the count: the grown size's, once Istio has
	// pushed the last deletion.
	s.waitAddresses(row.Addresses, time.Minute)
	if gcEnd, ok := s.gcCPU(); ok && gcKnown && row.ChurnUpdates > 0 {
		if pushes := s.updates() - updStart; pushes > 0 {
			row.GCPerPush = (gcEnd - gcStart) / float64(pushes)
			row.CPUPerPushSteady = row.CPUPerPush - gcWindow/float64(row.ChurnUpdates) + row.GCPerPush
		}
	}

	row.RSS = rssOf(t, s.pid)
	if extra := row.Addresses - s.baseAddrs; extra > 0 {
		row.RSSPerAddress = float64(row.RSS-s.baseRSS) / float64(extra)
	}
	row.Coalesced = -1
	if v, err := metricSeries(s.a, "meshtun_xds_coalesced_total"); err == nil {
		row.Coalesced = int(v)
	}
}

// idleWindow measures node A's CPU over d with the mesh left alone, in
// ms a second: its background (the echo flow, timers, renewals).
func (s *scaler) idleWindow(d time.Duration) float64 {
	cpu0 := cpuOf(s.t, s.pid)
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		time.Sleep(50 * time.Millisecond) // a measurement window, not a wait for an event
	}
	return ms(cpuOf(s.t, s.pid)-cpu0) / d.Seconds()
}

// churn replaces churnRate pods a second for d, each by a new one with a
// new IP behind the same Service, and calls added (if set) with each new
// pod's IP and the moment before its creation. It returns how many it
// replaced.
func (s *scaler) churn(d time.Duration, added func(ip string, created time.Time)) int {
	tick := time.NewTicker(time.Second / churnRate)
	defer tick.Stop()
	end := time.Now().Add(d)
	n := 0
	for time.Now().Before(end) {
		<-tick.C
		i := s.rng.IntN(len(s.live))
		old := s.live[i]
		must(s.t, s.m.cp.DeletePod(scaleNS, old.name))
		s.gone = append(s.gone, old.ip)
		created := time.Now()
		p := s.newPod(old.svc)
		s.live[i] = p
		if added != nil {
			added(p.ip, created)
		}
		n++
	}
	// The last one made is the one the callers wait for.
	if last := slices.IndexFunc(s.live, func(p scalePod) bool { return p.name == "p"+strconv.Itoa(s.seq-1) }); last >= 0 {
		s.live[last], s.live[len(s.live)-1] = s.live[len(s.live)-1], s.live[last]
	}
	return n
}

// profile takes a CPU profile of node A's gateway while the mesh churns.
func (s *scaler) profile(path string, d time.Duration) {
	secs := int(d.Seconds())
	// The pushes alone: the echo flow is held.
	s.flow.pause()
	defer s.flow.resume()
	wait := s.startProfile(path, secs)
	s.churn(time.Duration(secs)*time.Second, nil)
	if err := wait(); err != nil {
		s.t.Errorf("CPU profile of node A under churn: %v", err)
		return
	}
	s.waitRouted(s.live[len(s.live)-1].ip, 10*time.Minute)
	s.t.Logf("CPU profile of node A under churn at %d pods: %s", len(s.live), path)
}

// startProfile starts a CPU profile of node A's gateway of secs seconds,
// written to path; wait returns when it is written.
func (s *scaler) startProfile(path string, secs int) (wait func() error) {
	done := make(chan error, 1)
	go func() {
		done <- s.pprof(path, fmt.Sprintf("profile?seconds=%d", secs), time.Duration(secs)*time.Second)
	}()
	return func() error { return <-done }
}

// pprof writes node A's gateway's /debug/pprof/<what> to path; the
// profile takes d.
func (s *scaler) pprof(path, what string, d time.Duration) error {
	must(s.t, os.MkdirAll(filepath.Dir(path), 0o755))
	c := httpIn(s.a)
	c.Timeout = d + 30*time.Second
	resp, err := c.Get(fmt.Sprintf("http://%s/debug/pprof/%s", adminAddr, what))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s: %.200s", resp.Status, b)
	}
	if err == nil {
		err = os.WriteFile(path, b, 0o644)
	}
	return err
}

// checkRouted checks a sample of what node A ended with: live pods and
// Services route to the pod, replaced pods' IPs do not.
func (s *scaler) checkRouted() {
	const sample = 40
	for range sample {
		p := s.live[s.rng.IntN(len(s.live))]
		if a, err := route(s.a, p.ip+":"+strconv.Itoa(scalePort)); err != nil || !routesTo(a, p.ip) {
			s.t.Errorf("live pod %s (%s): plan %+v, error %v", p.name, p.ip, a, err)
		}
		vip := scaleVIP(p.svc) + ":" + strconv.Itoa(scalePort)
		if a, err := route(s.a, vip); err != nil || a.Kind != "hbone" || a.Service == "" {
			s.t.Errorf("service s%d (%s): plan %+v, error %v", p.svc, vip, a, err)
		}
	}
	for range min(sample, len(s.gone)) {
		ip := s.gone[s.rng.IntN(len(s.gone))]
		if a, err := route(s.a, ip+":"+strconv.Itoa(scalePort)); err != nil || routesTo(a, ip) {
			s.t.Errorf("replaced pod's %s still routed: plan %+v, error %v", ip, a, err)
		}
	}
}

func routesTo(a routeAnswer, ip string) bool {
	return a.Kind == "hbone" && a.HBONEAddress == ip+":15008"
}

// waitRouted polls node A's /route for ip:80 until it sends the flow to
// the pod over HBONE and returns the moment it first did. It polls often
// at first and then less (every twentieth of the time waited so far), so
// a gateway that falls behind is not also buried in requests.
func (s *scaler) waitRouted(ip string, bound time.Duration) time.Time {
	start := time.Now()
	deadline := start.Add(bound)
	var last routeAnswer
	var err error
	for time.Now().Before(deadline) {
		if last, err = route(s.a, ip+":"+strconv.Itoa(scalePort)); err == nil && routesTo(last, ip) {
			return time.Now()
		}
		time.Sleep(max(5*time.Millisecond, time.Since(start)/20))
	}
	s.t.Fatalf("node A never routed %s within %v: last plan %+v, error %v", ip, bound, last, err)
	return time.Time{}
}

// waitAddresses waits until node A holds want addresses and returns the
// count.
func (s *scaler) waitAddresses(want int, bound time.Duration) int {
	deadline := time.Now().Add(bound)
	var got float64
	var err error
	for time.Now().Before(deadline) {
		if got, err = metricSeries(s.a, `meshtun_xds_resources{type="address"}`); err == nil && int(got) == want {
			return want
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatalf("node A holds %v addresses, Istio's index %d, after %v (error %v)", got, want, bound, err)
	return 0
}

func (s *scaler) updates() int {
	v, err := metricSeries(s.a, `meshtun_xds_updates_total{type="address"}`)
	if err != nil {
		s.t.Fatal(err)
	}
	return int(v)
}

// gcCPU is node A's collector's CPU so far, in ms, if its build exports it.
func (s *scaler) gcCPU() (float64, bool) {
	v, err := metricSeries(s.a, "go_cpu_classes_gc_total_cpu_seconds_total")
	return v * 1000, err == nil
}

// histogram is the samples of a Prometheus histogram: count, sum and the
// cumulative count at each bucket's bound (seconds).
type histogram struct {
	count, sum float64
	bounds     []float64
	cum        []float64
}

// applyHistogramOf reads node n's meshtun_xds_apply_seconds.
func applyHistogramOf(n *topo.Node) (histogram, error) {
	const name = "meshtun_xds_apply_seconds"
	b, err := get(n, metricsAddr, "/metrics")
	if err != nil {
		return histogram{}, err
	}
	var h histogram
	seen := 0
	for _, line := range strings.Split(string(b), "\n") {
		series, value, ok := strings.Cut(line, " ")
		if !ok || !strings.HasPrefix(series, name) {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return histogram{}, fmt.Errorf("%s: %v", line, err)
		}
		switch {
		case series == name+"_count":
			h.count, seen = v, seen+1
		case series == name+"_sum":
			h.sum, seen = v, seen+1
		case strings.HasPrefix(series, name+`_bucket{le="`):
			le := strings.TrimSuffix(strings.TrimPrefix(series, name+`_bucket{le="`), `"}`)
			if le == "+Inf" {
				continue
			}
			bound, err := strconv.ParseFloat(le, 64)
			if err != nil {
				return histogram{}, fmt.Errorf("%s: %v", line, err)
			}
			h.bounds, h.cum = append(h.bounds, bound), append(h.cum, v)
		}
	}
	if seen != 2 || len(h.bounds) == 0 {
		return histogram{}, fmt.Errorf("/metrics has no histogram %s", name)
	}
	return h, nil
}

// since is what h counted after earlier: how many, their mean and the
// bound at or above their 99th percentile, in milliseconds (the last
// bound's double when beyond every bound).
func (h histogram) since(earlier histogram) (n int, meanMS, p99MS float64) {
	count := h.count - earlier.count
	if count <= 0 || len(h.cum) != len(earlier.cum) {
		return 0, 0, 0
	}
	p99MS = 2 * h.bounds[len(h.bounds)-1] * 1000
	for i := range h.bounds {
		if h.cum[i]-earlier.cum[i] >= 0.99*count {
			p99MS = h.bounds[i] * 1000
			break
		}
	}
	return int(count), (h.sum - earlier.sum) / count * 1000, p99MS
}

// metricSeries reads one sample of n's /metrics by its series, as the
// exposition writes it (name{labels}).
func metricSeries(n *topo.Node, series string) (float64, error) {
	b, err := get(n, metricsAddr, "/metrics")
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("/metrics has no sample %s", series)
}

// cpuOf is the CPU time process pid's threads have run, from each
// thread's schedstat (nanoseconds; /proc/pid/stat counts in 10 ms ticks,
// too coarse for a push).
func cpuOf(t *testing.T, pid int) time.Duration {
	t.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(tasks) == 0 {
		t.Fatalf("threads of %d: %v", pid, err)
	}
	var sum time.Duration
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // a thread that ended meanwhile
		}
		f := strings.Fields(string(b))
		if len(f) < 1 {
			continue
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			t.Fatalf("%s: %q: %v", p, b, err)
		}
		sum += time.Duration(ns)
	}
	return sum
}

// rssOf is process pid's resident set (VmRSS).
func rssOf(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("/proc/%d/status has no VmRSS", pid)
	return 0
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// echoFlow is one connection from node A to node B's echo service through
// the pair, carrying a 64-byte round trip every 20 ms for the whole run.
type echoFlow struct {
	paused atomic.Bool // round trips skipped while set
	mu     sync.Mutex
	rtts   []time.Duration
	err    error
	quit   chan struct{}
	done   chan struct{}
	once   sync.Once
	total  int
}

type flowFigures struct {
	p50, p99 float64 // µs
	n        int
}

func (s *scaler) startFlow() *echoFlow {
	conn, err := dial(s.a, vipB+":"+strconv.Itoa(echoSvcPort))
	if err != nil {
		s.t.Fatalf("echo flow A → B: %v", err)
	}
	f := &echoFlow{quit: make(chan struct{}), done: make(chan struct{})}
	go f.run(conn)
	return f
}

func (f *echoFlow) run(conn net.Conn) {
	defer close(f.done)
	defer conn.Close()
	msg := make([]byte, 64)
	back := make([]byte, 64)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-f.quit:
			return
		case <-tick.C:
		}
		if f.paused.Load() {
			continue
		}
		binary.BigEndian.PutUint64(msg, uint64(i))
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		start := time.Now()
		_, err := conn.Write(msg)
		if err == nil {
			_, err = io.ReadFull(conn, back)
		}
		if err == nil && string(back) != string(msg) {
			err = fmt.Errorf("round trip %d: echo %x, want %x", i, back, msg)
		}
		f.mu.Lock()
		if err != nil {
			f.err = fmt.Errorf("round trip %d: %w", i, err)
			f.mu.Unlock()
			return
		}
		f.rtts = append(f.rtts, time.Since(start))
		f.total++
		f.mu.Unlock()
	}
}

// pause holds the flow's round trips (its connection stays open) until
// resume: the CPU windows measure the gateway's pushes, not the flow.
func (f *echoFlow) pause()  { f.paused.Store(true) }
func (f *echoFlow) resume() { f.paused.Store(false) }

// mark drops the round trips measured so far; take returns the figures
// of those since the last mark or take.
func (f *echoFlow) mark() { f.take() }

func (f *echoFlow) take() flowFigures {
	f.mu.Lock()
	r := f.rtts
	f.rtts = nil
	f.mu.Unlock()
	slices.Sort(r)
	var ff flowFigures
	if ff.n = len(r); ff.n > 0 {
		us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
		ff.p50, ff.p99 = us(r[len(r)/2]), us(r[len(r)*99/100])
	}
	return ff
}

// stop ends the flow and returns the first error it met, if any.
func (f *echoFlow) stop() error {
	f.once.Do(func() { close(f.quit) })
	<-f.done
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil && f.total == 0 {
		return fmt.Errorf("no round trip completed")
	}
	return f.err
}

// scaleTable writes the rows as the table.
func scaleTable(rows []scaleRow) string {
	var b strings.Builder
	fmt.Fprintln(&b, "| pods | addresses | bulk add: CPU-s net, raw (wall s, updates) | CPU per push (per change); collector amortized: per push, of it the collector | add → routed under 10/s: median / p90 / max (n) | of it node A's apply: mean / p99 (responses) | RSS (per address) | echo rr p50 idle → churn, p99 | coalesced |")
	fmt.Fprintln(&b, "|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		co := "–"
		if r.Coalesced >= 0 {
			co = strconv.Itoa(r.Coalesced)
		}
		fmt.Fprintf(&b, "| %d | %d | %.2f, %.2f (%.1f s, %d) | %.2f ms (%.2f ms); %.2f ms, %.2f ms | %.0f / %.0f / %.0f ms (%d) | %.2f / ≤ %g ms (%d) | %.0f MiB (%.2f KiB) | %.0f → %.0f µs, %.0f µs | %s |\n",
			r.Pods, r.Addresses, r.BulkCPUNet, r.BulkCPU, r.BulkWall, r.BulkUpdates, r.CPUPerPush, r.CPUPerChange,
			r.CPUPerPushSteady, r.GCPerPush, r.LagMedian, r.LagP90, r.LagMax, r.LagN, r.ApplyMean, r.ApplyP99, r.ApplyN, float64(r.RSS)/(1<<20), r.RSSPerAddress/1024,
			r.FlowIdleP50, r.FlowChurnP50, r.FlowChurnP99, co)
	}
	return b.String()
}
