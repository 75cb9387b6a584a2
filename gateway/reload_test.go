package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/hbone"
	"github.com/meshtun/meshtun/hbone/devca"
)

const (
	reloadServerID = "spiffe://cluster.local/ns/meshtun/sa/node-b"
	reloadClientID = "spiffe://cluster.local/ns/meshtun/sa/node-a"
)

// reloadEnv is a gateway's inbound side over real sockets: our HBONE
// server with the gateway's handler on a loopback port, a client pool with
// a certificate of the same CA, and echo targets on loopback.
type reloadEnv struct {
	t     *testing.T
	dir   string
	g     *Gateway
	pool  *hbone.Pool
	addr  netip.AddrPort // the HBONE server
	logs  *syncBuffer
	extra string // the config's text after [hbone], set by writeConfig
}

// syncBuffer is a log destination safe for the handlers' goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) lines(sub string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, l := range strings.Split(s.b.String(), "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return out
}

func newReloadEnv(t *testing.T, policies string) *reloadEnv {
	t.Helper()
	e := &reloadEnv{t: t, dir: t.TempDir(), logs: &syncBuffer{}}
	ca, _, err := devca.LoadOrCreate(e.dir, "cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := ca.WriteLeaf(e.dir, "node-b", reloadServerID); err != nil {
		t.Fatal(err)
	}
	cfg := e.load(policies)
	log := hclog.New(&hclog.LoggerOptions{Output: io.MultiWriter(e.logs, testWriter{t}), Level: hclog.Info})
	e.g, err = New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := hbone.NewServer(hbone.ServerOptions{
		Source:          e.g.certs(),
		TrustDomain:     "cluster.local",
		Handler:         e.g.handleInbound,
		NameAuthorities: true, // as Run's server
	})
	if err != nil {
		t.Fatal(err)
	}
	e.addr = serveLoopback(t, srv, e.g.flows.wait)
	cc, err := ca.KeyPair(reloadClientID)
	if err != nil {
		t.Fatal(err)
	}
	e.pool, err = hbone.NewPool(hbone.PoolOptions{Certificate: cc, Roots: ca.Pool()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.pool.Close() })
	return e
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// load writes a config with the given text appended and loads it as the
// CLI does.
func (e *reloadEnv) load(tail string) *config.Config {
	e.t.Helper()
	text := `version = 1
[gateway]
name = "node-b"
[tls]
cert = "node-b.pem"
key = "node-b-key.pem"
trust_bundle = "ca.pem"
[hbone]
serve = ["127.0.0.1/32"]
` + tail
	path := filepath.Join(e.dir, "gateway.toml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		e.t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		e.t.Fatal(err)
	}
	return cfg
}

// reload loads tail as the new config and applies it.
func (e *reloadEnv) reload(tail string) (changed, restart []string) {
	e.t.Helper()
	changed, restart, err := e.g.Reload(e.load(tail))
	if err != nil {
		e.t.Fatal(err)
	}
	return changed, restart
}

// echo starts an echo server on loopback and returns its address.
func echo(t *testing.T) netip.AddrPort {
	t.Helper()
	return echoOn(t, "127.0.0.1:0")
}

func (e *reloadEnv) connect(target netip.AddrPort) (*hbone.ClientStream, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return e.pool.Connect(ctx, hbone.ConnectRequest{
		Address:    e.addr,
		Authority:  target,
		Identities: []string{reloadServerID},
		Source:     netip.MustParseAddrPort("10.0.0.1:40000"),
	})
}

// ping writes a message and reads its echo, within a bounded time.
func ping(s *hbone.ClientStream, msg string) error {
	type result struct {
		got string
		err error
	}
	done := make(chan result, 1)
	go func() {
		if _, err := s.Write([]byte(msg)); err != nil {
			done <- result{err: err}
			return
		}
		b := make([]byte, len(msg))
		_, err := io.ReadFull(s, b)
		done <- result{string(b), err}
	}()
	select {
	case r := <-done:
		if r.err == nil && r.got != msg {
			return fmt.Errorf("echo %q, want %q", r.got, msg)
		}
		return r.err
	case <-time.After(10 * time.Second):
		return errors.New("no echo within 10s")
	}
}

func denyPort(name string, port uint16) string {
	return fmt.Sprintf("\n[[policies]]\nname = %q\naction = \"deny\"\n  [[policies.rules]]\n  destination_ports = [%d]\n", name, port)
}

// openEchoed opens a stream through e's gateway to each of the two echo
// targets (closed at cleanup) and checks that each echoes.
func (e *reloadEnv) openEchoed(a, b netip.AddrPort) (sa, sb *hbone.ClientStream) {
	e.t.Helper()
	var streams [2]*hbone.ClientStream
	for i, target := range []netip.AddrPort{a, b} {
		s, err := e.connect(target)
		if err != nil {
			e.t.Fatal(err)
		}
		e.t.Cleanup(func() { s.Close() })
		if err := ping(s, "before"); err != nil {
			e.t.Fatalf("stream to %s, before any change: %v", target, err)
		}
		streams[i] = s
	}
	return streams[0], streams[1]
}

func TestReloadClosesDeniedOpenFlows(t *testing.T) {
	e := newReloadEnv(t, "")
	denied, kept := echo(t), echo(t)

	sd, sk := e.openEchoed(denied, kept)

	changed, restart := e.reload(denyPort("close-it", denied.Port()))
	if !slices.Equal(changed, []string{"policies"}) || len(restart) != 0 {
		t.Fatalf("Reload: changed %v, restart %v; want [policies], []", changed, restart)
	}

	// The denied flow ends: its read fails (a reset, or at least an end)
	// within a bounded time; no data crosses it any more.
	readErr := make(chan error, 1)
	go func() { _, err := io.ReadAll(sd); readErr <- err }()
	select {
	case err := <-readErr:
		t.Logf("denied flow ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the denied flow is still open 10s after the reload")
	}
	if _, err := sd.Write([]byte("x")); err == nil {
		// A write may still be buffered locally; a second one after the
		// reset was seen must fail.
		if _, err := sd.Write([]byte("x")); err == nil {
			t.Error("writes to the denied flow still succeed")
		}
	}
	// The other flow is untouched.
	if err := ping(sk, "after"); err != nil {
		t.Fatalf("the allowed flow after the reload: %v", err)
	}
	// A new flow to the denied target is refused with 401.
	if s, err := e.connect(denied); err == nil {
		s.Close()
		t.Fatal("a new flow to the denied target was accepted")
	} else if !strings.Contains(err.Error(), "401") {
		t.Fatalf("new flow to the denied target: %v, want a 401", err)
	}
	// The access log says why the open flow was ended.
	deadline := time.Now().Add(10 * time.Second)
	for {
		lines := e.logs.lines("denied by policy after reload")
		if len(lines) == 1 {
			if !strings.Contains(lines[0], "response_flags=DENY") || !strings.Contains(lines[0], `close-it`) || !strings.Contains(lines[0], "dst.addr="+denied.String()) {
				t.Errorf("access log line: %s", lines[0])
			}
			break
		}
		if len(lines) > 1 || time.Now().After(deadline) {
			t.Fatalf("%d access log lines about the reload's denial, want 1", len(lines))
		}
		time.Sleep(10 * time.Millisecond) // polling the log for a bounded time
	}
	if n := len(e.logs.lines("inbound_closed=1")); n != 1 {
		t.Errorf("%d reload lines reporting one closed flow, want 1", n)
	}
}

func TestReloadAllowsWhatWasDenied(t *testing.T) {
	target := echo(t)
	e := newReloadEnv(t, denyPort("deny", target.Port()))
	if s, err := e.connect(target); err == nil {
		s.Close()
		t.Fatal("flow accepted under the deny policy")
	}
	e.reload("")
	s, err := e.connect(target)
	if err != nil {
		t.Fatalf("after the deny policy was removed: %v", err)
	}
	defer s.Close()
	if err := ping(s, "hello"); err != nil {
		t.Fatal(err)
	}
}

// TestReloadConcurrentFlows flips the policy of one target while flows to
// it run concurrently; under -race this checks the snapshot swap. Every
// flow must either work or be denied: nothing else may go wrong.
func TestReloadConcurrentFlows(t *testing.T) {
	target := echo(t)
	e := newReloadEnv(t, "")
	const workers, perWorker, reloads = 8, 15, 20
	var (
		wg                sync.WaitGroup
		mu                sync.Mutex
		ok, denied, other int
		firstOther        error
		finished          = make(chan struct{}, workers*perWorker)
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range perWorker {
				err := func() error {
					s, err := e.connect(target)
					if err != nil {
						return err
					}
					defer s.Close()
					return ping(s, "ping")
				}()
				mu.Lock()
				switch {
				case err == nil:
					ok++
				case strings.Contains(err.Error(), "401") || isStreamEnd(err):
					denied++
				default:
					other++
					if firstOther == nil {
						firstOther = err
					}
				}
				mu.Unlock()
				finished <- struct{}{}
			}
		}()
	}
	// Reload after every few finished flows, so that flows start under
	// both policies and some are open during a swap.
	allDone := make(chan struct{})
	go func() { wg.Wait(); close(allDone) }()
	for i := range reloads {
	wait:
		for range 5 {
			select {
			case <-finished:
			case <-allDone:
				break wait
			}
		}
		if i%2 == 0 {
			e.reload(denyPort("flip", target.Port()))
		} else {
			e.reload("")
		}
		_ = e.g.Router() // readers of the snapshot race with the swap
	}
	wg.Wait()
	t.Logf("flows: %d ok, %d denied, %d other", ok, denied, other)
	if other > 0 {
		t.Fatalf("%d flows failed in another way, first: %v", other, firstOther)
	}
	// The last reload allowed everything again: a new flow works, and
	// nothing is left registered.
	s, err := e.connect(target)
	if err != nil {
		t.Fatal(err)
	}
	if err := ping(s, "last"); err != nil {
		t.Fatal(err)
	}
	s.Close()
	waitFlowsAtMost(t, &e.g.flows, inbound, 0)
}

// isStreamEnd reports an error of a stream the gateway ended.
func isStreamEnd(err error) bool {
	s := err.Error()
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		strings.Contains(s, "CONNECT_ERROR") || strings.Contains(s, "reset") || strings.Contains(s, "closed")
}

func TestReloadRestartKeysKeepTheirValues(t *testing.T) {
	e := newReloadEnv(t, "")
	changed, restart := e.reload(`
[tun]
mtu = 9000
[admin]
listen = "127.0.0.1:16000"
[log]
level = "debug"
access_log = false
` + denyPort("p", 1))
	if !slices.Equal(changed, []string{"log.level", "policies"}) {
		t.Errorf("changed %v, want [log.level policies]", changed)
	}
	if want := []string{"log.access_log", "tun.mtu", "admin.listen"}; !slices.Equal(restart, want) {
		t.Errorf("restart needed %v, want %v", restart, want)
	}
	snap := e.g.snapshot()
	if snap.cfg.TUN.MTU != 65000 || snap.cfg.Admin.Listen != "127.0.0.1:15000" || !snap.cfg.Log.AccessLog {
		t.Errorf("restart-only keys changed in the running config: mtu %d, admin.listen %q, access_log %v",
			snap.cfg.TUN.MTU, snap.cfg.Admin.Listen, snap.cfg.Log.AccessLog)
	}
	if len(snap.cfg.Policies) != 1 || !e.g.log.IsDebug() {
		t.Errorf("runtime keys not applied: %d policies, debug %v", len(snap.cfg.Policies), e.g.log.IsDebug())
	}
	if n := len(e.logs.lines("needs a restart")); n != 3 {
		t.Errorf("%d warnings about restart-only keys, want 3", n)
	}
	// Unchanged: nothing to apply, the snapshot stays.
	changed, restart = e.reload(`
[tun]
mtu = 9000
[admin]
listen = "127.0.0.1:16000"
[log]
level = "debug"
access_log = false
` + denyPort("p", 1))
	if len(changed) != 0 || len(restart) != 3 || e.g.snapshot() != snap {
		t.Errorf("second identical reload: changed %v, restart %v, snapshot swapped %v", changed, restart, e.g.snapshot() != snap)
	}
}

func TestReloadNilKeepsTheConfig(t *testing.T) {
	e := newReloadEnv(t, "")
	snap := e.g.snapshot()
	if _, _, err := e.g.Reload(nil); !errors.Is(err, ErrReloadNil) {
		t.Fatalf("Reload(nil): %v", err)
	}
	if e.g.snapshot() != snap {
		t.Fatal("a failed reload swapped the snapshot")
	}
}

func TestReloadKeepsServiceTurns(t *testing.T) {
	svc := `
[[workloads]]
name = "w1"
namespace = "default"
addresses = ["10.1.0.1"]
hbone_address = "192.0.2.2:15008"
[[workloads]]
name = "w2"
namespace = "default"
addresses = ["10.1.0.2"]
hbone_address = "192.0.2.2:15008"
[[services]]
name = "web"
namespace = "default"
hostname = "web.default.svc.cluster.local"
vips = ["10.96.0.10"]
ports = { 80 = 8080 }
endpoints = ["default/w1", "default/w2"]
`
	e := newReloadEnv(t, svc)
	before := e.g.snapshot()
	before.pickEndpoint("default/web", 2)
	e.reload(svc + denyPort("p", 1))
	after := e.g.snapshot()
	if after == before || turnOf(after, "default/web") != turnOf(before, "default/web") {
		t.Fatal("the service's round-robin counter was not carried over")
	}
	if got := after.pickEndpoint("default/web", 2); got != 1 {
		t.Fatalf("next endpoint after the reload: %d, want 1 (round robin continues)", got)
	}
}

// turnOf is the round-robin counter of service in snap (nil if none).
func turnOf(snap *snapshot, service string) *atomic.Uint64 {
	t, _ := snap.endpointTurn.Get(service)
	return t
}
