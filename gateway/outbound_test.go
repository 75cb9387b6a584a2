package gateway

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/hbone"
	"github.com/meshtun/meshtun/hbone/devca"
	"github.com/meshtun/meshtun/internal/tcptest"
)

// fakeRequest is a captured connection without a TUN: Accept hands the
// gateway one end of a real loopback TCP connection, whose other end
// (app) plays the application.
type fakeRequest struct {
	src, dst netip.AddrPort
	app      *net.TCPConn
	side     *net.TCPConn // what Accept returns
	failWith error        // Accept's error, if set

	mu                 sync.Mutex
	accepted, rejected int
}

var _ flowRequest = (*fakeRequest)(nil)

func newFakeRequest(t *testing.T, dst netip.AddrPort) *fakeRequest {
	app, side := tcptest.Pair(t)
	return &fakeRequest{src: netip.MustParseAddrPort("10.0.0.7:41000"), dst: dst, app: app, side: side}
}

func (r *fakeRequest) Src() netip.AddrPort { return r.src }
func (r *fakeRequest) Dst() netip.AddrPort { return r.dst }

func (r *fakeRequest) Accept() (conn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.accepted+r.rejected > 0 {
		return nil, errors.New("fake request: already decided")
	}
	r.accepted++
	if r.failWith != nil {
		return nil, r.failWith
	}
	return r.side, nil
}

// Reject resets the application's connection, as netstack's RST would.
func (r *fakeRequest) Reject() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.accepted+r.rejected > 0 {
		return
	}
	r.rejected++
	reset(r.side)
}

func (r *fakeRequest) decisions() (accepted, rejected int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.accepted, r.rejected
}

// outboundEnv is a gateway pair without root: gateway A's outbound handler
// (driven with fake requests) with a real pool, routing 127.0.0.0/8 to
// gateway B's inbound side (reloadEnv) over real HBONE on loopback.
type outboundEnv struct {
	*reloadEnv // gateway B
	a          *Gateway
	aLogs      *syncBuffer
}

func newOutboundEnv(t *testing.T, policiesB string) *outboundEnv {
	t.Helper()
	return newOutboundEnvWith(t, policiesB, nil, nil)
}

// newOutboundEnvWith is newOutboundEnv with gateway A's config changed by
// edit (when set) after it is loaded: entries the file cannot hold.
func newOutboundEnvWith(t *testing.T, policiesB string, edit func(*config.Config), before func(*outboundEnv)) *outboundEnv {
	t.Helper()
	e := &outboundEnv{reloadEnv: newReloadEnv(t, policiesB), aLogs: &syncBuffer{}}
	if before != nil {
		before(e) // B is up, A is not made yet
	}
	ca, _, err := devca.LoadOrCreate(e.dir, "cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := ca.WriteLeaf(e.dir, "node-a", reloadClientID); err != nil {
		t.Fatal(err)
	}
	text := fmt.Sprintf(`version = 1
[gateway]
name = "node-a"
[tls]
cert = "node-a.pem"
key = "node-a-key.pem"
trust_bundle = "ca.pem"
[[peers]]
name = "node-b"
cidrs = ["127.0.0.0/8"]
address = %q
identity = %q
`, e.addr, reloadServerID)
	path := filepath.Join(e.dir, "gateway-a.toml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(cfg)
	}
	log := hclog.New(&hclog.LoggerOptions{Output: io.MultiWriter(e.aLogs, testWriter{t}), Level: hclog.Info})
	if e.a, err = New(cfg, log); err != nil {
		t.Fatal(err)
	}
	opts := e.a.poolOptions()
	opts.Control = nil // the bypass mark needs CAP_NET_ADMIN, and there is no TUN to bypass
	if e.a.pool, err = hbone.NewPool(opts); err != nil {
		t.Fatal(err)
	}
	e.a.metrics.pool.Store(e.a.pool) // as Start does
	t.Cleanup(func() {
		e.a.pool.Close()
		select {
		case <-e.a.flows.idleCh():
		case <-time.After(10 * time.Second):
			t.Errorf("gateway A: %d outbound flows still open 10s after the pool closed", e.a.flows.open(outbound))
		}
	})
	return e
}

// accessLine waits, for a bounded time, for the one access-log line of a
// flow towards dst in logs.
func accessLine(t *testing.T, logs *syncBuffer, dst netip.AddrPort) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var lines []string
		for _, l := range logs.lines("connection complete") {
			if strings.Contains(l, "dst.addr="+dst.String()+" ") {
				lines = append(lines, l)
			}
		}
		if len(lines) == 1 {
			return lines[0]
		}
		if len(lines) > 1 || time.Now().After(deadline) {
			t.Fatalf("%d access-log lines for %s, want 1: %q", len(lines), dst, lines)
		}
		time.Sleep(10 * time.Millisecond) // polling the log for a bounded time
	}
}

func wantIn(t *testing.T, line string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(line, w) {
			t.Errorf("access-log line lacks %s: %s", w, line)
		}
	}
}

// An outbound flow is routed to the peer, accepted only after the CONNECT
// got its 200, relayed both ways with half-close, and logged once on each
// gateway when it ends.
func TestOutboundFlowRelayed(t *testing.T) {
	e := newOutboundEnv(t, "")
	target := echo(t)
	r := newFakeRequest(t, target)
	e.a.serveOutbound(r)
	if acc, rej := r.decisions(); acc != 1 || rej != 0 {
		t.Fatalf("after the CONNECT: %d accepts, %d rejects; want 1, 0", acc, rej)
	}
	if n := e.a.flows.open(outbound); n != 1 {
		t.Fatalf("%d outbound flows open while relaying, want 1", n)
	}
	r.app.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := r.app.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if err := r.app.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	back, err := io.ReadAll(r.app) // the echo, then the target's FIN through both relays
	if err != nil || string(back) != "ping" {
		t.Fatalf("app read %q, %v; want the echo and EOF", back, err)
	}
	a := accessLine(t, e.aLogs, target)
	wantIn(t, a, "[INFO]", "direction=outbound", "response_flags=-", "src.addr=10.0.0.7:41000",
		"src.identity="+reloadClientID, "dst.hbone_addr="+e.addr.String(), "dst.identity="+reloadServerID,
		"bytes_sent=4", "bytes_recv=4")
	b := accessLine(t, e.logs, target)
	wantIn(t, b, "[INFO]", "direction=inbound", "response_flags=-", "src.addr=10.0.0.7:41000",
		"src.identity="+reloadClientID, "bytes_sent=4", "bytes_recv=4")
	waitFlowsAtMost(t, &e.a.flows, outbound, 0)
}

// A destination no route matches is refused with a RST before anything
// is dialled, and logged NO_ROUTE.
func TestOutboundNoRoute(t *testing.T) {
	e := newOutboundEnv(t, "")
	dst := netip.MustParseAddrPort("192.0.2.9:80")
	r := newFakeRequest(t, dst)
	e.a.serveOutbound(r)
	if acc, rej := r.decisions(); acc != 0 || rej != 1 {
		t.Fatalf("%d accepts, %d rejects; want 0, 1", acc, rej)
	}
	wantIn(t, accessLine(t, e.aLogs, dst), "[WARN]", "direction=outbound", "response_flags=NO_ROUTE", "dst.hbone_addr=-", `error="no route: `)
	if n := e.a.flows.open(outbound); n != 0 {
		t.Errorf("%d outbound flows open after the refusal, want 0", n)
	}
	r.app.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := r.app.Read(make([]byte, 1)); err == nil || err == io.EOF {
		t.Errorf("app read after the refusal: %v, want a reset", err)
	}
}

// A CONNECT the peer refuses is a RST to the client, logged CONNECT with
// the peer's status, which the outcome carries too.
func TestOutboundPeerRefuses(t *testing.T) {
	closed := func(t *testing.T) netip.AddrPort { // a loopback port nobody listens on
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ap := ln.Addr().(*net.TCPAddr).AddrPort()
		ln.Close()
		return ap
	}
	for _, tc := range []struct {
		name   string
		target func(t *testing.T) netip.AddrPort
		deny   bool // B denies the target's port by policy
		status int
		flagB  string
	}{
		{"denied by the peer's policy", echo, true, http.StatusUnauthorized, flagDeny},
		{"target not served by the peer", func(t *testing.T) netip.AddrPort {
			return netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), echo(t).Port())
		}, false, http.StatusServiceUnavailable, flagConnect},
		{"target down", closed, false, http.StatusServiceUnavailable, flagConnect},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target := tc.target(t)
			policies := ""
			if tc.deny {
				policies = denyPort("no-target", target.Port())
			}
			e := newOutboundEnv(t, policies)

			r := newFakeRequest(t, target)
			e.a.serveOutbound(r)
			if acc, rej := r.decisions(); acc != 0 || rej != 1 {
				t.Fatalf("%d accepts, %d rejects; want 0, 1", acc, rej)
			}
			wantIn(t, accessLine(t, e.aLogs, target), "[WARN]", "direction=outbound", "response_flags=CONNECT",
				"dst.hbone_addr="+e.addr.String(), fmt.Sprintf("CONNECT refused: %d", tc.status))
			wantIn(t, accessLine(t, e.logs, target), "[WARN]", "direction=inbound", "response_flags="+tc.flagB)

			// The handler's outcome itself carries the peer's status.
			f := e.a.flows.begin(outbound)
			client, _, o := e.a.outbound(newFakeRequest(t, target), f)
			e.a.flows.end(f, o)
			if client != nil || o.flag != flagConnect || o.status != tc.status || o.err == nil {
				t.Errorf("outcome: client %v, flag %q, status %d, err %v; want none, %s, %d and an error", client, o.flag, o.status, o.err, flagConnect, tc.status)
			}
		})
	}
}

// A client gone before its handshake completes (Accept fails after the
// CONNECT's 200) ends the flow with Accept's error and no response flag,
// and closes the stream: the peer's side of the flow ends too.
func TestOutboundAcceptFails(t *testing.T) {
	e := newOutboundEnv(t, "")
	target := echo(t)
	r := newFakeRequest(t, target)
	r.failWith = errors.New("client gone")
	e.a.serveOutbound(r)
	wantIn(t, accessLine(t, e.aLogs, target), "[WARN]", "response_flags=-", `error="client gone"`)
	accessLine(t, e.logs, target) // the peer's inbound flow ended too
	waitFlowsAtMost(t, &e.a.flows, outbound, 0)
}

// While draining, a captured connection is refused and never becomes a
// flow.
func TestOutboundDraining(t *testing.T) {
	e := newOutboundEnv(t, "")
	e.a.draining.Store(true)
	target := echo(t)
	r := newFakeRequest(t, target)
	e.a.serveOutbound(r)
	if acc, rej := r.decisions(); acc != 0 || rej != 1 {
		t.Fatalf("%d accepts, %d rejects; want 0, 1", acc, rej)
	}
	if n := len(e.aLogs.lines("connection complete")); n != 0 {
		t.Errorf("%d access-log lines for a refused connection while draining, want 0", n)
	}
}
