package main

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshtun/meshtun/internal/topo"
	"github.com/meshtun/meshtun/internal/xfer"
)

// The namespace tests of services, protocol TCP workloads and inbound
// authorization, on the standard topology:
//
//   - node A captures the service range 10.96.0.0/16 besides node B's
//     workloads; service default/web (VIP 10.96.0.10, port 80 → 8080) has
//     two endpoints on node B, 10.244.2.5 and 10.244.2.6, whose workload
//     identities node B's gateway does not have: its identity is accepted
//     through the service's subject_alt_names;
//   - default/legacy (10.244.2.7) is a protocol TCP workload: inside node
//     A's captured 10.244.2.0/24, reachable from node A over the veth by a
//     main-table /32;
//   - node B's policies: deny target port 9090; deny port 9092 from the
//     client 10.244.1.5 (known to node B only from forwarded); allow
//     principals "cluster.local/ns/meshtun/*" (node A); they are checked
//     on 10.244.2.8, which node A reaches by its peer CIDR.
const (
	policyVIP       = "10.96.0.10"
	policyEndpoint1 = "10.244.2.5"
	policyEndpoint2 = "10.244.2.6"
	policyTCPTarget = "10.244.2.7"
	// policyPlain is on node B, routed by node A's peer CIDR (no workload
	// entry), so node B's gateway identity is the one expected.
	policyPlain      = "10.244.2.8"
	policyNodeAExtra = `
[[workloads]]
name = "web-1"
namespace = "default"
service_account = "web"
addresses = ["10.244.2.5"]
hbone_address = "192.0.2.2:15008"

[[workloads]]
name = "web-2"
namespace = "default"
service_account = "web"
addresses = ["10.244.2.6"]
hbone_address = "192.0.2.2:15008"

[[workloads]]
name = "legacy"
namespace = "default"
service_account = "legacy"
addresses = ["10.244.2.7"]
protocol = "TCP"

[[services]]
name = "web"
namespace = "default"
hostname = "web.default.svc.cluster.local"
vips = ["10.96.0.10"]
ports = { 80 = 8080 }
endpoints = ["default/web-1", "default/web-2"]
subject_alt_names = ["spiffe://cluster.local/ns/meshtun/sa/node-b"]
`
	policyNodeBExtra = `
[[policies]]
name = "no-9090"
action = "deny"
  [[policies.rules]]
  destination_ports = [9090]

[[policies]]
name = "not-that-client-on-9092"
action = "deny"
  [[policies.rules]]
  source_ips = ["10.244.1.5/32"]
  destination_ports = [9092]

[[policies]]
name = "mesh-gateways"
action = "allow"
  [[policies.rules]]
  principals = ["cluster.local/ns/meshtun/*"]
`
)

// recordingListener remembers the remote address of every connection it
// accepted.
type recordingListener struct {
	net.Listener
	mu      sync.Mutex
	remotes []netip.AddrPort
}

func (l *recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.remotes = append(l.remotes, c.RemoteAddr().(*net.TCPAddr).AddrPort())
		l.mu.Unlock()
	}
	return c, err
}

func (l *recordingListener) seen() []netip.AddrPort {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]netip.AddrPort(nil), l.remotes...)
}

type policyE2E struct {
	topo     *topo.Topology
	gwA, gwB *topo.Gateway
}

func setupPolicyE2E(t *testing.T) *policyE2E {
	t.Helper()
	bin, dir, tp := twoNodes(t, "mtpol", func(n, s string) string {
		if n == "node-a" {
			return strings.Replace(s, `routes = [`, `routes = ["10.96.0.0/16", `, 1) + policyNodeAExtra
		}
		return s + policyNodeBExtra
	})
	for _, c := range [][]string{
		{"addr", "add", policyEndpoint2 + "/32", "dev", "lo"},
		{"addr", "add", policyTCPTarget + "/32", "dev", "lo"},
		{"addr", "add", policyPlain + "/32", "dev", "lo"},
	} {
		if err := tp.B.IP(c...); err != nil {
			t.Fatal(err)
		}
	}
	// Node A reaches the TCP workload over the veth, by a main-table route
	// more specific than the TUN's capture route. Replies come back on the
	// veth from an address inside a captured range: the reverse-path
	// filter must be loose or off (tun/bypass.go), as on Kubernetes nodes.
	if err := tp.A.IP("route", "add", policyTCPTarget+"/32", "via", tp.B.VethIP4.String()); err != nil {
		t.Fatal(err)
	}
	if out, err := tp.A.Command(context.Background(), "sysctl", "-w", "net.ipv4.conf.all.rp_filter=2").CombinedOutput(); err != nil {
		t.Fatalf("sysctl: %v: %s", err, out)
	}

	e := &policyE2E{topo: tp}
	e.gwA, e.gwB = startGateways(t, tp, bin, dir)
	return e
}

// serveB starts an xfer server in node B on addr, closed at cleanup.
func (e *policyE2E) serveB(t *testing.T, addr string) *recordingListener {
	t.Helper()
	l, err := e.topo.B.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	rl := &recordingListener{Listener: l}
	done := make(chan struct{})
	go func() { xfer.Serve(rl); close(done) }()
	t.Cleanup(func() { l.Close(); <-done })
	return rl
}

// dialA connects from node A, from local address from if it is valid.
func (e *policyE2E) dialA(addr string, from netip.Addr) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var c net.Conn
	err := e.topo.A.Do(func() error {
		d := net.Dialer{}
		if from.IsValid() {
			d.LocalAddr = &net.TCPAddr{IP: from.AsSlice()}
		}
		var err error
		c, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	return c, err
}

// transfer runs one small checked exchange from node A to addr.
func (e *policyE2E) transfer(addr string, from netip.Addr) error {
	c, err := e.dialA(addr, from)
	if err != nil {
		return err
	}
	_, err = xfer.Run(c, 1000, 1000)
	return err
}

func waitLog(t *testing.T, g *topo.Gateway, s string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	line, err := g.WaitLog(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	return line
}

func TestEndToEndPolicy(t *testing.T) {
	e := setupPolicyE2E(t)

	t.Run("service spreads flows over every endpoint", func(t *testing.T) {
		ep1 := e.serveB(t, policyEndpoint1+":8080")
		ep2 := e.serveB(t, policyEndpoint2+":8080")
		const flows = 20
		for i := range flows {
			if err := e.transfer(policyVIP+":80", netip.Addr{}); err != nil {
				t.Fatalf("flow %d to the VIP: %v", i, err)
			}
		}
		n1, n2 := len(ep1.seen()), len(ep2.seen())
		t.Logf("endpoint %s: %d connections, %s: %d", policyEndpoint1, n1, policyEndpoint2, n2)
		if n1 == 0 || n2 == 0 || n1+n2 != flows {
			t.Fatalf("endpoints saw %d and %d of %d connections; want both some, %d in all", n1, n2, flows, flows)
		}
		line := waitLog(t, e.gwA, "dst.service=default/web")
		if !strings.Contains(line, "dst.hbone_addr=192.0.2.2:15008") || !strings.Contains(line, "dst.identity=spiffe://cluster.local/ns/meshtun/sa/node-b") {
			t.Errorf("node A's access log line for the service: %s", line)
		}
	})

	t.Run("VIP port the service does not declare is a RST", func(t *testing.T) {
		c, err := e.dialA(policyVIP+":81", netip.Addr{})
		if c != nil {
			c.Close() // a wrongly accepted connection must not hold the server
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("dial %s:81: %v, want connection refused", policyVIP, err)
		}
		line := waitLog(t, e.gwA, "dst.addr="+policyVIP+":81")
		if !strings.Contains(line, "has no port 81") || !strings.Contains(line, "response_flags=NO_ROUTE") {
			t.Errorf("node A's access log does not say why: %s", line)
		}
	})

	t.Run("TCP workload is dialled directly without looping", func(t *testing.T) {
		srv := e.serveB(t, policyTCPTarget+":5432")
		c, err := e.dialA(policyTCPTarget+":5432", netip.Addr{})
		if err != nil {
			t.Fatal(err)
		}
		client := c.LocalAddr().(*net.TCPAddr).AddrPort()
		if _, err := xfer.Run(c, 1<<20, 1<<20); err != nil {
			t.Fatal(err)
		}
		seen := srv.seen()
		if len(seen) != 1 || seen[0].Addr() != e.topo.A.VethIP4 {
			t.Fatalf("the server saw connections from %v; want one, from node A's gateway at %s", seen, e.topo.A.VethIP4)
		}
		// The client's flow went through node A's gateway (the capture
		// route won over the main /32) ...
		line := waitLog(t, e.gwA, "dst.addr="+policyTCPTarget+":5432")
		if !strings.Contains(line, "src.addr="+client.String()) || !strings.Contains(line, "dst.hbone_addr=-") || strings.Contains(line, "error=") {
			t.Errorf("node A's access log line for the direct flow: %s", line)
		}
		// ... and its own dial did not come back into its TUN: that would
		// be a second captured flow, from the veth address, to the target.
		if lines := e.gwA.LogsContaining("dst.addr=" + policyTCPTarget + ":5432"); len(lines) != 1 {
			t.Errorf("node A logged %d flows to %s:5432, want 1 (a looped dial shows as more):\n%s", len(lines), policyTCPTarget, strings.Join(lines, "\n"))
		}
		if lines := e.gwA.LogsContaining("src.addr=" + e.topo.A.VethIP4.String() + ":"); len(lines) != 0 {
			t.Errorf("node A captured its own dial:\n%s", strings.Join(lines, "\n"))
		}
		if lines := e.gwB.LogsContaining("dst.addr=" + policyTCPTarget); len(lines) != 0 {
			t.Errorf("the direct flow went through node B's gateway:\n%s", strings.Join(lines, "\n"))
		}
	})

	t.Run("denied port is a RST and the target sees nothing", func(t *testing.T) {
		denied := e.serveB(t, policyPlain+":9090")
		allowed := e.serveB(t, policyPlain+":9091")
		c, err := e.dialA(policyPlain+":9090", netip.Addr{})
		if c != nil {
			c.Close() // a wrongly accepted connection must not hold the server
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("dial the denied port: %v, want connection refused", err)
		}
		if err := e.transfer(policyPlain+":9091", netip.Addr{}); err != nil {
			t.Fatalf("the allowed port: %v", err)
		}
		if n := len(denied.seen()); n != 0 {
			t.Fatalf("the target of the denied port accepted %d connections, want 0", n)
		}
		if n := len(allowed.seen()); n != 1 {
			t.Fatalf("the target of the allowed port accepted %d connections, want 1", n)
		}
		line := waitLog(t, e.gwB, "dst.addr="+policyPlain+":9090")
		for _, want := range []string{"response_flags=DENY", `denied by policy \"no-9090\"`, "direction=inbound"} {
			if !strings.Contains(line, want) {
				t.Errorf("node B's access log line has no %q: %s", want, line)
			}
		}
		line = waitLog(t, e.gwA, "dst.addr="+policyPlain+":9090")
		if !strings.Contains(line, "401") {
			t.Errorf("node A's access log does not report the 401: %s", line)
		}
	})

	t.Run("policies see the forwarded client", func(t *testing.T) {
		srv := e.serveB(t, policyPlain+":9092")
		c, err := e.dialA(policyPlain+":9092", e.topo.A.Workload4)
		if c != nil {
			c.Close() // a wrongly accepted connection must not hold the server
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("dial from %s: %v, want connection refused", e.topo.A.Workload4, err)
		}
		if err := e.transfer(policyPlain+":9092", netip.Addr{}); err != nil {
			t.Fatalf("dial from the TUN's address: %v", err)
		}
		if n := len(srv.seen()); n != 1 {
			t.Fatalf("the target accepted %d connections, want 1", n)
		}
		line := waitLog(t, e.gwB, "src.addr="+e.topo.A.Workload4.String()+":")
		if !strings.Contains(line, "not-that-client-on-9092") {
			t.Errorf("node B's access log line: %s", line)
		}
	})

	t.Run("inbound access log has the trace id and the forwarded source", func(t *testing.T) {
		lines := e.gwB.LogsContaining("direction=inbound")
		if len(lines) == 0 {
			t.Fatal("node B logged no inbound connection")
		}
		trace := regexp.MustCompile(`trace_id=[0-9a-f]{32}\b`)
		src := regexp.MustCompile(`src.addr=(100\.64\.0\.1|10\.244\.1\.5):[0-9]+\b`)
		for _, l := range lines {
			if !trace.MatchString(l) || !src.MatchString(l) {
				t.Errorf("inbound line without a trace id or the client's forwarded address: %s", l)
			}
		}
		ids := map[string]bool{}
		for _, l := range lines {
			ids[trace.FindString(l)] = true
		}
		if len(ids) != len(lines) {
			t.Errorf("%d inbound lines share %d trace ids; want a fresh one per connection", len(lines), len(ids))
		}
	})
}
