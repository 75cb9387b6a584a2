package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/meshtun/meshtun/internal/topo"
)

// dnsServices are node A's services for the DNS test: web, served by node
// B's workload on 7070 behind VIP 10.96.0.10:80.
const dnsServices = `
[[workloads]]
name = "web"
namespace = "default"
addresses = ["10.244.2.5"]
hbone_address = "192.0.2.2:15008"
identity = "spiffe://cluster.local/ns/meshtun/sa/node-b"

[[services]]
name = "web"
namespace = "default"
hostname = "web.default.svc.cluster.local"
vips = ["10.96.0.10"]
ports = { 80 = 7070 }
endpoints = ["default/web"]
`

// dnsAPI is the service a reload adds.
const dnsAPI = `
[[services]]
name = "api"
namespace = "default"
hostname = "api.default.svc.cluster.local"
vips = ["10.96.0.11"]
ports = { 80 = 7070 }
endpoints = ["default/web"]
`

// dnsUpstream is a resolver inside node A, on its workload address:
// outside.example. A 192.0.2.99 TTL 4321; hang.example. is never
// answered; anything else NXDOMAIN.
type dnsUpstream struct {
	addr  netip.AddrPort
	asked atomic.Int64 // queries for outside.example.
}

func startDNSUpstream(t *testing.T, n *topo.Node) *dnsUpstream {
	t.Helper()
	u := &dnsUpstream{addr: netip.AddrPortFrom(n.Workload4, 53)}
	var pc net.PacketConn
	if err := n.Do(func() (err error) { pc, err = net.ListenPacket("udp", u.addr.String()); return err }); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{}) // hang.example.'s handlers wait for it
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg).SetReply(r)
		switch r.Question[0].Name {
		case "outside.example.":
			u.asked.Add(1)
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: "outside.example.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 4321}, A: net.IPv4(192, 0, 2, 99)})
		case "hang.example.":
			<-release
			return
		default:
			m.Rcode = dns.RcodeNameError
		}
		w.WriteMsg(m)
	})}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	done := make(chan struct{})
	go func() { defer close(done); srv.ActivateAndServe() }()
	<-started
	t.Cleanup(func() { close(release); srv.Shutdown(); <-done })
	return u
}

// digAnswer is what dig printed: the status and the A records, as
// "address ttl".
type digAnswer struct {
	status  string
	records []string
	out     string
}

// dig runs Debian's dig inside n against server, one try.
func dig(t *testing.T, n *topo.Node, server netip.Addr, args ...string) digAnswer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := n.Command(ctx, "dig", append([]string{"@" + server.String(), "+tries=1", "+time=15"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("dig %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	a := digAnswer{out: string(out)}
	for _, l := range strings.Split(a.out, "\n") {
		if _, st, ok := strings.Cut(l, "status: "); ok && strings.HasPrefix(l, ";; ->>HEADER<<-") {
			a.status, _, _ = strings.Cut(st, ",")
		}
		f := strings.Fields(l)
		if len(f) == 5 && !strings.HasPrefix(l, ";") && f[2] == "IN" && (f[3] == "A" || f[3] == "AAAA") {
			a.records = append(a.records, f[4]+" "+f[1])
		}
	}
	return a
}

// fakeResolvectl puts a resolvectl first on PATH (inherited by the
// gateways through `ip netns exec`) that records its arguments: the
// hook's calls, without a systemd-resolved in the namespace.
func fakeResolvectl(t *testing.T) (log string) {
	dir := t.TempDir()
	log = filepath.Join(dir, "calls")
	script := "#!/bin/sh\necho \"$*\" >> " + log + "\n"
	if err := os.WriteFile(filepath.Join(dir, "resolvectl"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
	return log
}

// TestEndToEndDNS runs the real binaries in the two-node topology with
// [dns] on in node A: dig resolves a service's name to its VIP, a client
// connects through the gateway by name, a reload adds a name, other names
// go to a resolver in the namespace, hostile queries are dropped and
// counted and stall nothing, and systemd-resolved is told of the domain
// and told again to forget it at the stop.
func TestEndToEndDNS(t *testing.T) {
	calls := fakeResolvectl(t)
	var upstreamAt netip.AddrPort
	bin, dir, tp := twoNodes(t, "mtdns", func(n, s string) string {
		if n != "node-a" {
			return s
		}
		s = strings.Replace(s, `routes = [`, `routes = ["10.96.0.0/16", `, 1)
		// A low rate limit, so the flood below passes it even when a
		// busy machine answers slowly.
		return s + dnsServices + "\n[dns]\nenabled = true\nupstream = [\"10.244.1.5:53\"]\nrate_limit = 20\n"
	})
	needTool(t, "dig", "bind9-dnsutils") // after twoNodes: without root the test skips first
	up := startDNSUpstream(t, tp.A)
	upstreamAt = up.addr
	gwA, _ := startGateways(t, tp, bin, dir)
	waitLog(t, gwA, "meshtun.gateway.dns: serving")
	waitLog(t, gwA, "systemd-resolved sends the mesh's domains here")
	server := tp.A.TUNAddr4.Addr()
	echoServer(t, tp.B, tp.B.Workload4.String()+":7070")

	t.Run("dig resolves a service name to its VIP", func(t *testing.T) {
		a := dig(t, tp.A, server, "web.default.svc.cluster.local", "A")
		t.Logf("dig transcript:\n%s", a.out)
		if a.status != "NOERROR" || !slices.Equal(a.records, []string{"10.96.0.10 30"}) || !strings.Contains(a.out, " aa ") {
			t.Errorf("web.default.svc.cluster.local A: status %q, records %v; want NOERROR, 10.96.0.10 TTL 30, authoritative\n%s", a.status, a.records, a.out)
		}
		for _, short := range []string{"web.default.svc", "web.default"} {
			if a := dig(t, tp.A, server, short, "A"); !slices.Equal(a.records, []string{"10.96.0.10 30"}) {
				t.Errorf("%s: %v, want 10.96.0.10", short, a.records)
			}
		}
		if a := dig(t, tp.A, server, "+tcp", "web.default.svc.cluster.local", "A"); !slices.Equal(a.records, []string{"10.96.0.10 30"}) {
			t.Errorf("over TCP: %v, want 10.96.0.10", a.records)
		}
		if a := dig(t, tp.A, server, "web.default.svc.cluster.local", "AAAA"); a.status != "NOERROR" || len(a.records) != 0 {
			t.Errorf("AAAA of a v4-only service: %s %v, want NOERROR with no records", a.status, a.records)
		}
		if a := dig(t, tp.A, server, "nope.default.svc.cluster.local", "A"); a.status != "NXDOMAIN" {
			t.Errorf("a mesh name no service has: %s, want NXDOMAIN", a.status)
		}
	})

	t.Run("a client connects through the gateway by name", func(t *testing.T) {
		// The line the log gives where systemd-resolved is absent, in the
		// namespace's own resolv.conf (`ip netns exec` mounts
		// /etc/netns/<ns>/ over /etc): glibc then asks our server, and a
		// shell opens a TCP connection by name, as an application would.
		nsEtc := filepath.Join("/etc/netns", tp.A.NS)
		if err := os.MkdirAll(nsEtc, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(nsEtc) })
		if err := os.WriteFile(filepath.Join(nsEtc, "resolv.conf"), []byte("nameserver "+server.String()+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := tp.A.Command(ctx, "getent", "ahostsv4", "web.default.svc.cluster.local").CombinedOutput()
		if err != nil || !strings.HasPrefix(string(out), "10.96.0.10 ") {
			t.Errorf("getent ahostsv4 web.default.svc.cluster.local: %v\n%s; want 10.96.0.10", err, out)
		}
		const msg = "hello by name"
		out, err = tp.A.Command(ctx, "bash", "-c",
			`exec 3<>/dev/tcp/web.default.svc.cluster.local/80 && printf '`+msg+`' >&3 && head -c `+fmt.Sprint(len(msg))+` <&3`).CombinedOutput()
		if err != nil || string(out) != msg {
			t.Fatalf("bash /dev/tcp/web.default.svc.cluster.local/80: %v, got %q; want the echo %q", err, out, msg)
		}
		if line := waitLog(t, gwA, "dst.service=default/web"); !strings.Contains(line, "dst.addr=10.244.2.5:7070") {
			t.Errorf("access log: %s, want the flow to the VIP's endpoint", line)
		}
	})

	t.Run("a name outside the mesh is forwarded", func(t *testing.T) {
		before := up.asked.Load()
		a := dig(t, tp.A, server, "outside.example", "A")
		if a.status != "NOERROR" || !slices.Equal(a.records, []string{"192.0.2.99 4321"}) || up.asked.Load() != before+1 {
			t.Errorf("outside.example: %s %v (upstream %s asked %d times); want the upstream's 192.0.2.99 with its TTL 4321, asked once",
				a.status, a.records, upstreamAt, up.asked.Load()-before)
		}
	})

	t.Run("a reload adding a service makes its name resolve", func(t *testing.T) {
		if a := dig(t, tp.A, server, "api.default.svc.cluster.local", "A"); a.status != "NXDOMAIN" {
			t.Fatalf("api before the reload: %s, want NXDOMAIN", a.status)
		}
		path := filepath.Join(dir, "node-a.toml")
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		// The [[services]] entry goes before [dns], whose table would
		// otherwise swallow it.
		text := strings.Replace(string(b), "\n[dns]\n", dnsAPI+"\n[dns]\n", 1)
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(gwA.PID(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		if line := waitLog(t, gwA, "reloaded:"); !strings.Contains(line, "changed=services") {
			t.Fatalf("reload line: %s", line)
		}
		if a := dig(t, tp.A, server, "api.default.svc.cluster.local", "A"); !slices.Equal(a.records, []string{"10.96.0.11 30"}) {
			t.Errorf("api after the reload: %s %v, want 10.96.0.11", a.status, a.records)
		}
	})

	t.Run("hostile queries stall nothing", func(t *testing.T) {
		// An upstream that never answers: SERVFAIL, in bounded time.
		if a := dig(t, tp.A, server, "hang.example", "A"); a.status != "SERVFAIL" {
			t.Errorf("a name the upstream never answers: %q, want SERVFAIL\n%s", a.status, a.out)
		}
		// Garbage and an oversize datagram, then a flood from one source
		// until the limiter drops some.
		big := new(dns.Msg).SetQuestion("web.default.svc.cluster.local.", dns.TypeA)
		big.SetEdns0(4096, false)
		big.IsEdns0().Option = append(big.IsEdns0().Option, &dns.EDNS0_PADDING{Padding: make([]byte, 3000)})
		bigB, _ := big.Pack()
		q, _ := new(dns.Msg).SetQuestion("web.default.svc.cluster.local.", dns.TypeA).Pack()
		err := tp.A.Do(func() error {
			c, err := net.Dial("udp", netip.AddrPortFrom(server, 53).String())
			if err != nil {
				return err
			}
			defer c.Close()
			for _, b := range [][]byte{{1, 2, 3}, []byte("\x00\x01\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x3fab"), bigB} {
				if _, err := c.Write(b); err != nil {
					return err
				}
			}
			deadline := time.Now().Add(30 * time.Second)
			for i := 0; ; i++ {
				if i%500 == 0 && promSum(scrapeNode(t, tp.A, "/metrics"), "meshtun_dns_queries_total", map[string]string{"result": "ratelimited"}) > 0 {
					return nil
				}
				if i > 200000 || time.Now().After(deadline) {
					return errors.New("no query of the flood was rate limited")
				}
				c.Write(q)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		samples := scrapeNode(t, tp.A, "/metrics")
		if n := promSum(samples, "meshtun_dns_queries_total", map[string]string{"result": "malformed"}); n < 3 {
			t.Errorf("malformed %v, want the 3 bad datagrams counted", n)
		}
		if n := promSum(samples, "meshtun_dns_queries_total", map[string]string{"result": "upstream_error"}); n != 1 {
			t.Errorf("upstream_error %v, want 1", n)
		}
		// Still serving, other sources at once: dig from node A's workload
		// address, over TCP (no datagram of the flood can crowd it out).
		if a := dig(t, tp.A, server, "-b", tp.A.Workload4.String(), "+tcp", "web.default.svc.cluster.local", "A"); !slices.Equal(a.records, []string{"10.96.0.10 30"}) {
			t.Errorf("after the flood: %s %v, want 10.96.0.10\n%s", a.status, a.records, a.out)
		}
		var lines []string
		for _, s := range scrapeNode(t, tp.A, "/metrics") {
			if s.name == "meshtun_dns_queries_total" {
				lines = append(lines, fmt.Sprintf("meshtun_dns_queries_total{result=%q} %v", s.labels["result"], s.value))
			}
		}
		t.Logf("query metrics:\n%s", strings.Join(lines, "\n"))
	})

	// systemd-resolved was told that the TUN link answers cluster.local,
	// and only it; the stop takes it back.
	if err := gwA.Stop(15 * time.Second); err != nil {
		t.Errorf("gateway A: %v", err)
	}
	b, err := os.ReadFile(calls)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"dns meshtun0 100.64.0.1", "domain meshtun0 ~cluster.local", "default-route meshtun0 false", "revert meshtun0"}
	if got := strings.Split(strings.TrimSpace(string(b)), "\n"); !slices.Equal(got, want) {
		t.Errorf("resolvectl calls %q, want %q", got, want)
	}
}
