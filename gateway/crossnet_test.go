package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
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
)

// Cross-network flows (double HBONE): gateway A (net-1) reaches a
// workload of net-2 behind gateway B through net-2's east-west gateway,
// a test server built from hbone.Server that terminates only the outer
// CONNECT and relays the inner connection as bytes.

const (
	ewID       = "spiffe://cluster.local/ns/istio-system/sa/istio-eastwestgateway"
	xnetHost   = "web.default.svc.cluster.local"
	xnetVIP    = "10.96.0.50"
	xnetSecret = "bytes only the destination may read, never the east-west gateway"
)

// ewGateway is net-2's east-west gateway.
type ewGateway struct {
	addr   netip.AddrPort
	dest   netip.AddrPort // where it sends every outer CONNECT
	seen   chan *hbone.Request
	mu     sync.Mutex
	bytes  bytes.Buffer
	resetN int // reset this many outer streams right after their 200
}

func newEWGateway(t *testing.T, dir string, dest netip.AddrPort) *ewGateway {
	t.Helper()
	ca, _, err := devca.LoadOrCreate(dir, "cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.KeyPair(ewID)
	if err != nil {
		t.Fatal(err)
	}
	ew := &ewGateway{dest: dest, seen: make(chan *hbone.Request, 16)}
	srv, err := hbone.NewServer(hbone.ServerOptions{
		Certificate: cert, Roots: ca.Pool(), TrustDomain: "cluster.local",
		Handler: ew.serve, NameAuthorities: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	ew.addr = serveLoopback(t, srv, nil)
	return ew
}

func (ew *ewGateway) Write(p []byte) (int, error) {
	ew.mu.Lock()
	defer ew.mu.Unlock()
	return ew.bytes.Write(p)
}

func (ew *ewGateway) relayed() string {
	ew.mu.Lock()
	defer ew.mu.Unlock()
	return ew.bytes.String()
}

func (ew *ewGateway) serve(r *hbone.Request) {
	ew.seen <- r
	tc, err := net.DialTimeout("tcp", ew.dest.String(), 10*time.Second)
	if err != nil {
		r.Reject(http.StatusServiceUnavailable)
		return
	}
	defer tc.Close()
	st, err := r.Accept()
	if err != nil {
		return
	}
	defer st.Close()
	ew.mu.Lock()
	reset := ew.resetN > 0
	ew.resetN--
	ew.mu.Unlock()
	if reset {
		st.Reset()
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		io.Copy(io.MultiWriter(tc, ew), st)
		tc.(*net.TCPConn).CloseWrite()
	}()
	if _, err := io.Copy(io.MultiWriter(st, ew), tc); err != nil {
		st.Reset()
	} else {
		st.CloseWrite()
	}
	<-done
}

// xnetEnv: B serves service web (xnetHost at xnetVIP:80 → the echo) in
// net-2; A in net-1 knows web and B's workload from the mesh, with net-2's
// gateway.
type xnetEnv struct {
	*outboundEnv
	ew     *ewGateway
	target netip.AddrPort // the echo, B's workload
	// gwAddr and gwID are the east-west gateway A is told of: ew's, or
	// those mkGateway returned.
	gwAddr netip.AddrPort
	gwID   string
	bAddr  netip.AddrPort // B's HBONE listener
}

func newXnetEnv(t *testing.T, serverID string, gwAddr func(*ewGateway) netip.AddrPort) *xnetEnv {
	return newXnetEnvWith(t, serverID, gwAddr, "")
}

// newXnetEnvWith is newXnetEnv with more of B's config (TOML).
func newXnetEnvWith(t *testing.T, serverID string, gwAddr func(*ewGateway) netip.AddrPort, moreB string) *xnetEnv {
	return newXnetEnvGateway(t, serverID, gwAddr, moreB, nil)
}

// newXnetEnvGateway is newXnetEnvWith with net-2's gateway made by
// mkGateway (B is up; target is the echo), instead of ewGateway.
func newXnetEnvGateway(t *testing.T, serverID string, gwAddr func(*ewGateway) netip.AddrPort, moreB string,
	mkGateway func(e *outboundEnv, target netip.AddrPort) (netip.AddrPort, string)) *xnetEnv {
	t.Helper()
	target := echo(t)
	tail := moreB + fmt.Sprintf(`
[[workloads]]
name = "server"
namespace = "default"
addresses = ["127.0.0.1"]
[[services]]
name = "web"
namespace = "default"
hostname = %q
vips = [%q]
ports = { 80 = %d }
endpoints = ["default/server"]
`, xnetHost, xnetVIP, target.Port())
	x := &xnetEnv{target: target}
	x.outboundEnv = newOutboundEnvWith(t, tail, func(cfg *config.Config) {
		cfg.Network = "net-1"
		addr := x.gwAddr
		if gwAddr != nil {
			addr = gwAddr(x.ew)
		}
		cfg.Workloads = append(cfg.Workloads, config.Workload{
			Name: "server", Namespace: "default", ServiceAccount: "server", Protocol: "HBONE", Source: config.SourceXDS,
			Network: "net-2", Addresses: []netip.Addr{target.Addr()}, HBONEAddress: x.bAddr, Identity: serverID,
			NetworkGateway: &config.Waypoint{Name: "istio-system/istio-eastwestgateway.istio-system.svc.cluster.local",
				Endpoints: []config.WaypointEndpoint{{Address: addr, Identity: x.gwID}}},
		})
		cfg.Services = append(cfg.Services, config.Service{
			Name: "web", Namespace: "default", Hostname: xnetHost, Source: config.SourceXDS,
			VIPs: []netip.Addr{netip.MustParseAddr(xnetVIP)}, Ports: map[uint16]uint16{80: target.Port()},
			Endpoints: []string{"default/server"},
		})
	}, func(e *outboundEnv) {
		x.bAddr = e.addr
		if mkGateway != nil {
			x.gwAddr, x.gwID = mkGateway(e, target)
			return
		}
		x.ew = newEWGateway(t, e.dir, e.addr)
		x.gwAddr, x.gwID = x.ew.addr, ewID
	})
	return x
}

// flow runs one flow from the app to dst through A and returns the echo.
func (x *xnetEnv) flow(t *testing.T, dst netip.AddrPort) (*fakeRequest, string, error) {
	t.Helper()
	r := newFakeRequest(t, dst)
	x.a.serveOutbound(r)
	if acc, _ := r.decisions(); acc != 1 {
		return r, "", fmt.Errorf("flow refused")
	}
	r.app.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(r.app, xnetSecret); err != nil {
		return r, "", err
	}
	r.app.CloseWrite()
	back, err := io.ReadAll(r.app)
	return r, string(back), err
}

func TestCrossNetworkService(t *testing.T) {
	x := newXnetEnv(t, reloadServerID, nil)
	vip := netip.AddrPortFrom(netip.MustParseAddr(xnetVIP), 80)
	_, back, err := x.flow(t, vip)
	if err != nil || back != xnetSecret {
		t.Fatalf("echo %q, %v; want it back through both layers and a clean end", back, err)
	}
	outer := <-x.ew.seen
	if got := outer.TargetName(); got != xnetHost+":80" {
		t.Errorf("the east-west gateway got :authority %q, want %s:80 (ztunnel's hostname and service port)", got, xnetHost)
	}
	if got := outer.PeerIdentity(); got != reloadClientID {
		t.Errorf("outer CONNECT from %q, want A's %s", got, reloadClientID)
	}
	if strings.Contains(x.ew.relayed(), xnetSecret) || x.ew.relayed() == "" {
		t.Errorf("the east-west gateway relayed %d bytes and must see the inner connection only as ciphertext", len(x.ew.relayed()))
	}
	a := accessLine(t, x.aLogs, netip.AddrPortFrom(x.target.Addr(), x.target.Port()))
	wantIn(t, a, "[INFO]", "direction=outbound", "response_flags=-", "dst.hbone_addr="+x.ew.addr.String(),
		"dst.identity="+reloadServerID, "dst.service=default/web")
	// B names the real source, from the inner TLS and the forwarded
	// header, not the east-west gateway.
	b := accessLine(t, x.logs, x.target)
	wantIn(t, b, "[INFO]", "direction=inbound", "response_flags=-", "src.addr=10.0.0.7:41000",
		"src.identity="+reloadClientID, fmt.Sprintf("bytes_sent=%d", len(xnetSecret)))
	if strings.Contains(b, ewID) {
		t.Errorf("B's access log names the east-west gateway: %s", b)
	}
	// A second flow shares the outer connection to the gateway.
	if _, back, err := x.flow(t, vip); err != nil || back != xnetSecret {
		t.Fatalf("second flow: %q, %v", back, err)
	}
	<-x.ew.seen
	if st := x.a.pool.Stats(); st.ConnsOpened != 1 {
		t.Errorf("A's pool opened %d connections, want 1 to the gateway for both flows", st.ConnsOpened)
	}
}

func TestCrossNetworkWorkloadByAddress(t *testing.T) {
	x := newXnetEnv(t, reloadServerID, nil)
	_, back, err := x.flow(t, x.target)
	if err != nil || back != xnetSecret {
		t.Fatalf("echo %q, %v", back, err)
	}
	if got := (<-x.ew.seen).Target(); got != x.target {
		t.Errorf("the east-west gateway got :authority %v, want the workload's %v", got, x.target)
	}
}

func TestCrossNetworkWrongInnerIdentity(t *testing.T) {
	x := newXnetEnv(t, "spiffe://cluster.local/ns/default/sa/not-the-server", nil)
	vip := netip.AddrPortFrom(netip.MustParseAddr(xnetVIP), 80)
	r, _, err := x.flow(t, vip)
	if err == nil {
		t.Fatal("the flow was accepted though the destination's identity is wrong")
	}
	if acc, rej := r.decisions(); acc != 0 || rej != 1 {
		t.Errorf("%d accepts, %d rejects; want a RST before any accept", acc, rej)
	}
	a := accessLine(t, x.aLogs, x.target)
	wantIn(t, a, "[WARN]", "response_flags=CONNECT", "network gateway", "peer identity is not one of the expected")
	if lines := x.logs.lines("connection complete"); len(lines) != 0 {
		t.Errorf("B logged %d flows, want none: nothing is forwarded past a wrong identity: %q", len(lines), lines)
	}
}

func TestCrossNetworkGatewayDown(t *testing.T) {
	var down netip.AddrPort
	x := newXnetEnv(t, reloadServerID, func(*ewGateway) netip.AddrPort {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		down = ln.Addr().(*net.TCPAddr).AddrPort()
		ln.Close()
		return down
	})
	r, _, err := x.flow(t, x.target)
	if err == nil {
		t.Fatal("accepted through a gateway that is down")
	}
	if _, rej := r.decisions(); rej != 1 {
		t.Error("not refused with a RST")
	}
	a := accessLine(t, x.aLogs, x.target)
	wantIn(t, a, "[WARN]", "response_flags=CONNECT", "network gateway "+down.String(), "dst.hbone_addr="+down.String())
}

func TestCrossNetworkGatewayResets(t *testing.T) {
	x := newXnetEnv(t, reloadServerID, nil)
	x.ew.resetN = 1
	r, _, err := x.flow(t, x.target)
	if err == nil {
		t.Fatal("accepted though the gateway reset the outer stream after its 200")
	}
	if _, rej := r.decisions(); rej != 1 {
		t.Error("not refused with a RST")
	}
	<-x.ew.seen
	// The next flow gets through: the gateway's connection is fine.
	if _, back, err := x.flow(t, x.target); err != nil || back != xnetSecret {
		t.Fatalf("after the reset: %q, %v", back, err)
	}
}

// Through a gateway, B's metrics describe the source by its baggage,
// never by a workload of B's own network that happens to have the
// forwarded address (ztunnel's from_gateway); a direct flow from that
// address is described by that workload.
func TestCrossNetworkInboundSourceLabels(t *testing.T) {
	x := newXnetEnvWith(t, reloadServerID, nil, `
[[workloads]]
name = "impostor"
namespace = "default"
addresses = ["10.0.0.7"]
`)
	vip := netip.AddrPortFrom(netip.MustParseAddr(xnetVIP), 80)
	if _, back, err := x.flow(t, vip); err != nil || back != xnetSecret {
		t.Fatalf("echo %q, %v", back, err)
	}
	accessLine(t, x.logs, x.target)
	s, err := x.pool.Connect(t.Context(), hbone.ConnectRequest{Address: x.addr, Authority: x.target,
		Identities: []string{reloadServerID}, Source: netip.MustParseAddrPort("10.0.0.7:42000")})
	if err != nil {
		t.Fatal(err)
	}
	s.CloseWrite()
	io.ReadAll(s)
	s.Close()
	srv := httptest.NewServer(x.g.metricsHandler())
	defer srv.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		samples := scrape(t, srv.URL, "/metrics")
		through, _ := find(t, samples, "istio_tcp_connections_opened_total", map[string]string{"reporter": "destination", "source_workload": "node-a"})
		direct, _ := find(t, samples, "istio_tcp_connections_opened_total", map[string]string{"reporter": "destination", "source_workload": "impostor"})
		if through == 1 && direct == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("B counted %v flows from node-a (want 1, the one through the gateway) and %v from impostor (want 1, the direct one)", through, direct)
		}
		time.Sleep(10 * time.Millisecond) // polling counters for a bounded time
	}
}

// meshtunEastWest is net-2's east-west gateway made of a meshtun gateway
// (gateway.east_west, eastwest.go): node C knows web and B's workload
// from its file, in its own network.
type meshtunEastWest struct {
	g    *Gateway
	logs *syncBuffer
	addr netip.AddrPort
}

const nodeCID = "spiffe://cluster.local/ns/meshtun/sa/node-c"

func newMeshtunEastWest(t *testing.T, e *outboundEnv, target netip.AddrPort, more string) *meshtunEastWest {
	t.Helper()
	ca, _, err := devca.LoadOrCreate(e.dir, "cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := ca.WriteLeaf(e.dir, "node-c", nodeCID); err != nil {
		t.Fatal(err)
	}
	text := fmt.Sprintf(`version = 1
[gateway]
name = "node-c"
[tls]
cert = "node-c.pem"
key = "node-c-key.pem"
trust_bundle = "ca.pem"
[[workloads]]
name = "server"
namespace = "default"
addresses = ["127.0.0.1"]
hbone_address = %q
identity = %q
[[services]]
name = "web"
namespace = "default"
hostname = %q
vips = [%q]
ports = { 80 = %d }
endpoints = ["default/server"]
`, e.addr, reloadServerID, xnetHost, xnetVIP, target.Port()) + more
	path := filepath.Join(e.dir, "gateway-c.toml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	m := &meshtunEastWest{logs: &syncBuffer{}}
	log := hclog.New(&hclog.LoggerOptions{Output: io.MultiWriter(m.logs, testWriter{t}), Level: hclog.Info})
	if m.g, err = New(cfg, log); err != nil {
		t.Fatal(err)
	}
	srv, err := hbone.NewServer(hbone.ServerOptions{Source: m.g.certs(), TrustDomain: "cluster.local",
		Handler: m.g.EastWestHandler(), NameAuthorities: true})
	if err != nil {
		t.Fatal(err)
	}
	m.addr = serveLoopback(t, srv, m.g.flows.wait)
	return m
}

// meshtun as net-2's east-west gateway: A's flows to web and to B's
// workload go A → C → B, C logs them east-west with the real client and
// the next hop, and B serves them with A's identity (the inner TLS is
// end to end).
func TestEastWestMeshtunGateway(t *testing.T) {
	var c *meshtunEastWest
	x := newXnetEnvGateway(t, reloadServerID, nil, "", func(e *outboundEnv, target netip.AddrPort) (netip.AddrPort, string) {
		c = newMeshtunEastWest(t, e, target, "")
		return c.addr, nodeCID
	})
	vip := netip.AddrPortFrom(netip.MustParseAddr(xnetVIP), 80)
	for _, dst := range []netip.AddrPort{vip, x.target} {
		if _, back, err := x.flow(t, dst); err != nil || back != xnetSecret {
			t.Fatalf("to %s: echo %q, %v", dst, back, err)
		}
	}
	var lines []string
	for deadline := time.Now().Add(10 * time.Second); ; {
		if lines = c.logs.lines("connection complete"); len(lines) >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("C logged %d flows, want 2: %q", len(lines), lines)
		}
		time.Sleep(10 * time.Millisecond) // polling the log for a bounded time
	}
	for _, l := range lines {
		wantIn(t, l, "[INFO]", "direction=east-west", "response_flags=-", "src.addr=10.0.0.7:41000",
			"src.identity="+reloadClientID, "dst.hbone_addr="+x.bAddr.String(), "dst.identity="+reloadServerID)
	}
	if !strings.Contains(lines[0], "dst.service=default/web") {
		t.Errorf("C's line for the flow to web names no service: %s", lines[0])
	}
	for _, l := range x.logs.lines("connection complete") {
		wantIn(t, l, "src.identity="+reloadClientID, "direction=inbound")
	}
}

// C refuses what it must not forward, with 503 before any dial: a
// service it does not know, a destination behind another gateway, and
// a plain TCP one.
func TestEastWestMeshtunRefuses(t *testing.T) {
	var c *meshtunEastWest
	x := newXnetEnvGateway(t, reloadServerID, nil, "", func(e *outboundEnv, target netip.AddrPort) (netip.AddrPort, string) {
		c = newMeshtunEastWest(t, e, target, `
[[workloads]]
name = "plain"
namespace = "default"
addresses = ["127.0.0.2"]
protocol = "TCP"
[[networks]]
name = "net-3"
gateway = "127.0.0.1:9"
identity = "spiffe://cluster.local/ns/istio-system/sa/net-3-gw"
[[workloads]]
name = "farther"
namespace = "default"
addresses = ["127.0.0.3"]
network = "net-3"
`)
		return c.addr, nodeCID
	})
	_ = x
	for _, tc := range []struct {
		name, authority string
		want            string
	}{
		{"unknown service", "nope.default.svc.cluster.local:80", "no service nope.default.svc.cluster.local with port 80"},
		{"plain TCP", "127.0.0.2:22", "speaks plain TCP"},
		{"behind another gateway", "127.0.0.3:80", "one gateway does not forward to another"},
		{"no route", "192.0.2.99:80", "no service, workload or peer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := hbone.ConnectRequest{Address: c.addr, Identities: []string{nodeCID}}
			if ap, err := netip.ParseAddrPort(tc.authority); err == nil {
				req.Authority = ap
			} else {
				req.Authority, req.AuthorityName = netip.MustParseAddrPort("10.0.0.1:80"), tc.authority
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := x.pool.Connect(ctx, req)
			var se *hbone.StatusError
			if !errors.As(err, &se) || se.Code != http.StatusServiceUnavailable {
				t.Fatalf("Connect = %v, want 503", err)
			}
			var line string
			deadline := time.Now().Add(10 * time.Second)
			for line == "" {
				for _, l := range c.logs.lines("connection complete") {
					if strings.Contains(l, tc.want) {
						line = l
					}
				}
				if line == "" {
					if time.Now().After(deadline) {
						t.Fatalf("C logged no refusal saying %q: %q", tc.want, c.logs.lines("connection complete"))
					}
					time.Sleep(10 * time.Millisecond) // polling the log for a bounded time
				}
			}
			wantIn(t, line, "[WARN]", "direction=east-west", "response_flags=NO_ROUTE")
		})
	}
}

// Run serves gateway.east_west: an outer CONNECT to a service of this
// node's routes is relayed to its endpoint's HBONE address (here a plain
// echo stands in for it: the gateway relays bytes, whatever they are), an
// unknown one is a 503, and the drain ends the listener.
func TestRunEastWest(t *testing.T) {
	dir := t.TempDir()
	ca, _, err := devca.LoadOrCreate(dir, "cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := ca.WriteLeaf(dir, "node-c", nodeCID); err != nil {
		t.Fatal(err)
	}
	hboneOfServer := echo(t) // "the destination's HBONE listener"
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ew := free.Addr().String()
	free.Close()
	text := fmt.Sprintf(`version = 1
[gateway]
name = "node-c"
east_west = %q
[tls]
cert = "node-c.pem"
key = "node-c-key.pem"
trust_bundle = "ca.pem"
[hbone]
listen = ""
[admin]
listen = ""
readiness = ""
metrics = ""
[[workloads]]
name = "server"
namespace = "default"
addresses = ["10.244.9.9"]
hbone_address = %q
[[services]]
name = "web"
namespace = "default"
hostname = %q
vips = [%q]
ports = { 80 = 8080 }
endpoints = ["default/server"]
`, ew, hboneOfServer, xnetHost, xnetVIP)
	path := filepath.Join(dir, "gateway.toml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg.TUN.Name = "" // no device: only the listeners start
	g, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- g.Run(ctx) }()
	select {
	case <-g.Ready():
	case err := <-ran:
		t.Fatalf("Run: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("not ready within 10s")
	}
	cc, err := ca.KeyPair(reloadClientID)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := hbone.NewPool(hbone.PoolOptions{Certificate: cc, Roots: ca.Pool()})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	connect := func(name string) (*hbone.ClientStream, error) {
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer ccancel()
		return pool.Connect(cctx, hbone.ConnectRequest{Address: netip.MustParseAddrPort(ew), Authority: netip.MustParseAddrPort("10.244.9.9:8080"),
			AuthorityName: name, Identities: []string{nodeCID}})
	}
	s, err := connect(xnetHost + ":80")
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(s, "relayed as bytes")
	s.CloseWrite()
	if back, err := io.ReadAll(s); err != nil || string(back) != "relayed as bytes" {
		t.Fatalf("through the east-west listener: %q, %v", back, err)
	}
	s.Close()
	var se *hbone.StatusError
	if _, err := connect("nope.default.svc.cluster.local:80"); !errors.As(err, &se) || se.Code != http.StatusServiceUnavailable {
		t.Errorf("an unknown service: %v, want 503", err)
	}
	cancel()
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("Run after the drain: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return within 20s of its context's end")
	}
	if c, err := net.DialTimeout("tcp", ew, time.Second); err == nil {
		c.Close()
		t.Error("the east-west listener still accepts after Run returned")
	}
}
