package dnsproxy

import (
	"errors"
	"net"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// upstream is a test resolver on loopback: a miekg/dns server on UDP and
// TCP that answers example.org. A 192.0.2.80 with TTL 1234, and NXDOMAIN
// to everything else, counting what it was asked.
type upstream struct {
	addr    netip.AddrPort
	queries atomic.Int64
	names   chan string
}

func startUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{names: make(chan string, 1000)}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.addr = pc.LocalAddr().(*net.UDPAddr).AddrPort()
	ln, err := net.Listen("tcp", u.addr.String())
	if err != nil {
		t.Fatal(err)
	}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		u.queries.Add(1)
		select {
		case u.names <- r.Question[0].Name:
		default:
		}
		m := new(dns.Msg).SetReply(r)
		switch r.Question[0].Name {
		case "example.org.":
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: "example.org.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 1234}, A: net.IPv4(192, 0, 2, 80)})
		case "big.example.org.":
			for i := range 60 {
				m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: "big.example.org.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(192, 0, 2, byte(i))})
			}
		default:
			m.Rcode = dns.RcodeNameError
		}
		if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
			m.Truncate(udpSize(r)) // as a real server does
		}
		w.WriteMsg(m)
	})
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		done := make(chan struct{})
		go func() { defer close(done); srv.ActivateAndServe() }()
		<-started
		t.Cleanup(func() { srv.Shutdown(); <-done })
	}
	return u
}

// blackHole is an upstream that takes queries and never answers: a bound
// UDP socket nobody reads and a TCP listener nobody answers on.
func blackHole(t *testing.T) netip.AddrPort {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	ap := pc.LocalAddr().(*net.UDPAddr).AddrPort()
	ln, err := net.Listen("tcp", ap.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ap
}

func startServer(t *testing.T, opts Options) *Server {
	t.Helper()
	if !opts.Listen.IsValid() {
		opts.Listen = netip.MustParseAddrPort("127.0.0.1:0")
	}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// ask sends one query with the library's client.
func ask(t *testing.T, network string, server netip.AddrPort, name string, qtype uint16) *dns.Msg {
	t.Helper()
	c := &dns.Client{Net: network, Timeout: 20 * time.Second}
	m := new(dns.Msg).SetQuestion(dns.Fqdn(name), qtype)
	r, _, err := c.Exchange(m, server.String())
	if err != nil {
		t.Fatalf("%s %s %s: %v", network, name, dns.TypeToString[qtype], err)
	}
	if r.Id != m.Id {
		t.Fatalf("answer id %d, query id %d", r.Id, m.Id)
	}
	return r
}

func addrsOf(r *dns.Msg) []string {
	var out []string
	for _, rr := range r.Answer {
		switch rr := rr.(type) {
		case *dns.A:
			out = append(out, rr.A.String())
		case *dns.AAAA:
			out = append(out, rr.AAAA.String())
		}
	}
	return out
}

func TestAnswers(t *testing.T) {
	up := startUpstream(t)
	var zone atomic.Pointer[Zone]
	zone.Store(testZone("default"))
	s := startServer(t, Options{Upstream: []netip.AddrPort{up.addr}, Zone: zone.Load})
	for _, network := range []string{"udp", "tcp"} {
		t.Run(network, func(t *testing.T) {
			addr := s.Addr()
			if network == "tcp" {
				addr = s.TCPAddr()
			}
			for _, tc := range []struct {
				name   string
				qtype  uint16
				rcode  int
				addrs  []string
				ttl    uint32
				soa    bool
				upward bool // the upstream answered it
			}{
				{"web.default.svc.cluster.local", dns.TypeA, dns.RcodeSuccess, []string{"10.96.0.10"}, 30, false, false},
				{"web.default.svc.cluster.local", dns.TypeAAAA, dns.RcodeSuccess, []string{"fd00:96::10"}, 30, false, false},
				{"web.default.svc", dns.TypeA, dns.RcodeSuccess, []string{"10.96.0.10"}, 30, false, false},
				{"web.default", dns.TypeA, dns.RcodeSuccess, []string{"10.96.0.10"}, 30, false, false},
				{"web", dns.TypeA, dns.RcodeSuccess, []string{"10.96.0.10"}, 30, false, false},
				// a name with v4 only: AAAA is NODATA, not NXDOMAIN
				{"db.data.svc.cluster.local", dns.TypeAAAA, dns.RcodeSuccess, nil, 0, true, false},
				{"db.data.svc.cluster.local", dns.TypeMX, dns.RcodeSuccess, nil, 0, true, false},
				{"nope.default.svc.cluster.local", dns.TypeA, dns.RcodeNameError, nil, 0, true, false},
				{"default.svc.cluster.local", dns.TypeA, dns.RcodeSuccess, nil, 0, true, false},
				{"example.org", dns.TypeA, dns.RcodeSuccess, []string{"192.0.2.80"}, 1234, false, true},
				{"unknown.example.org", dns.TypeA, dns.RcodeNameError, nil, 0, false, true},
				// a short form the zone lacks is no mesh name: forwarded
				{"nope.default", dns.TypeA, dns.RcodeNameError, nil, 0, false, true},
				{".", dns.TypeNS, dns.RcodeNameError, nil, 0, false, true},
			} {
				before := up.queries.Load()
				r := ask(t, network, addr, tc.name, tc.qtype)
				what := tc.name + " " + dns.TypeToString[tc.qtype]
				if r.Rcode != tc.rcode || !slices.Equal(addrsOf(r), tc.addrs) {
					t.Errorf("%s: rcode %s, addresses %v; want %s, %v", what, dns.RcodeToString[r.Rcode], addrsOf(r), dns.RcodeToString[tc.rcode], tc.addrs)
				}
				for _, rr := range r.Answer {
					if rr.Header().Ttl != tc.ttl || rr.Header().Name != dns.Fqdn(tc.name) {
						t.Errorf("%s: record %s, want the name asked and TTL %d", what, rr, tc.ttl)
					}
				}
				if soa := len(r.Ns) == 1 && r.Ns[0].Header().Rrtype == dns.TypeSOA; soa != tc.soa {
					t.Errorf("%s: authority %v, want an SOA: %v", what, r.Ns, tc.soa)
				}
				if asked := up.queries.Load() > before; asked != tc.upward {
					t.Errorf("%s: the upstream asked: %v, want %v", what, asked, tc.upward)
				}
				if !tc.upward && !r.Authoritative {
					t.Errorf("%s: a mesh answer must be authoritative", what)
				}
			}
		})
	}

	// A new zone reaches the next query.
	before := ask(t, "udp", s.Addr(), "new.default.svc.cluster.local", dns.TypeA)
	zone.Store(NewZone(ZoneOptions{Domains: []string{"cluster.local"}, TTL: 5 * time.Second},
		[]Host{{Name: "new.default.svc.cluster.local", Addrs: []netip.Addr{netip.MustParseAddr("10.96.0.99")}}}))
	after := ask(t, "udp", s.Addr(), "new.default.svc.cluster.local", dns.TypeA)
	if before.Rcode != dns.RcodeNameError || after.Rcode != dns.RcodeSuccess || !slices.Equal(addrsOf(after), []string{"10.96.0.99"}) {
		t.Errorf("before the new zone %s, after %s %v; want NXDOMAIN, then 10.96.0.99", dns.RcodeToString[before.Rcode], dns.RcodeToString[after.Rcode], addrsOf(after))
	}
	st := s.Stats()
	if st.Answered == 0 || st.NXDomain == 0 || st.Forwarded == 0 || st.UpstreamError != 0 || st.Malformed != 0 || st.RateLimited != 0 {
		t.Errorf("stats %+v", st)
	}
}

// A forwarded answer too large for UDP comes back truncated, and whole
// over TCP, as the client then asks.
func TestForwardTruncated(t *testing.T) {
	up := startUpstream(t)
	s := startServer(t, Options{Upstream: []netip.AddrPort{up.addr}})
	r := ask(t, "udp", s.Addr(), "big.example.org", dns.TypeA)
	if r.Compress = true; !r.Truncated || r.Len() > dns.MinMsgSize || len(r.Answer) == 60 {
		t.Errorf("udp answer of %d bytes, %d records, truncated %v: want at most %d bytes and TC", r.Len(), len(r.Answer), r.Truncated, dns.MinMsgSize)
	}
	r = ask(t, "tcp", s.TCPAddr(), "big.example.org", dns.TypeA)
	if r.Truncated || len(r.Answer) != 60 {
		t.Errorf("tcp answer: %d records, truncated %v; want all 60", len(r.Answer), r.Truncated)
	}
}

func TestUpstreamNeverAnswers(t *testing.T) {
	dead := blackHole(t)
	up := startUpstream(t)
	s := startServer(t, Options{Upstream: []netip.AddrPort{dead}, UpstreamTimeout: 500 * time.Millisecond})
	for _, network := range []string{"udp", "tcp"} {
		addr := s.Addr()
		if network == "tcp" {
			addr = s.TCPAddr()
		}
		if r := ask(t, network, addr, "example.org", dns.TypeA); r.Rcode != dns.RcodeServerFailure {
			t.Errorf("%s: rcode %s, want SERVFAIL", network, dns.RcodeToString[r.Rcode])
		}
	}
	if st := s.Stats(); st.UpstreamError != 2 {
		t.Errorf("upstream errors %d, want 2", st.UpstreamError)
	}
	// A dead first upstream, a live second: the second's answer.
	// The library's exchange gives up on the first after its 2s read
	// timeout, well within the budget, and asks the second.
	s2 := startServer(t, Options{Upstream: []netip.AddrPort{dead, up.addr}, UpstreamTimeout: 20 * time.Second})
	if r := ask(t, "udp", s2.Addr(), "example.org", dns.TypeA); r.Rcode != dns.RcodeSuccess || !slices.Equal(addrsOf(r), []string{"192.0.2.80"}) {
		t.Errorf("with a live second upstream: %s %v", dns.RcodeToString[r.Rcode], addrsOf(r))
	}
	// No upstream at all: SERVFAIL at once.
	s3 := startServer(t, Options{})
	if r := ask(t, "udp", s3.Addr(), "example.org", dns.TypeA); r.Rcode != dns.RcodeServerFailure {
		t.Errorf("no upstream: rcode %s, want SERVFAIL", dns.RcodeToString[r.Rcode])
	}
}

// rawUDP sends b to addr and returns the answer, or nil if none came
// within wait.
func rawUDP(t *testing.T, addr netip.AddrPort, b []byte, wait time.Duration) []byte {
	t.Helper()
	c, err := net.Dial("udp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 65536)
	n, err := c.Read(buf)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil
		}
		t.Fatal(err)
	}
	return buf[:n]
}

// waitStats polls s's stats until cond holds, for at most 20s.
func waitStats(t *testing.T, s *Server, what string, cond func(Stats) bool) Stats {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st := s.Stats()
		if cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: stats %+v", what, st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestHostileInput(t *testing.T) {
	up := startUpstream(t)
	s := startServer(t, Options{Upstream: []netip.AddrPort{up.addr}, Zone: func() *Zone { return testZone("") }, RateLimit: 1, Burst: 50})

	// Garbage, a truncated header, a query with two questions, an
	// oversize datagram, a response sent as a query: none answered but
	// the two-question one (FORMERR), all counted.
	two := new(dns.Msg).SetQuestion("a.example.org.", dns.TypeA)
	two.Question = append(two.Question, dns.Question{Name: "b.example.org.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
	twoB, _ := two.Pack()
	resp := new(dns.Msg).SetQuestion("example.org.", dns.TypeA)
	resp.Response = true
	respB, _ := resp.Pack()
	big := new(dns.Msg).SetQuestion("example.org.", dns.TypeA)
	big.SetEdns0(4096, false)
	big.IsEdns0().Option = append(big.IsEdns0().Option, &dns.EDNS0_PADDING{Padding: make([]byte, 2000)})
	bigB, _ := big.Pack()
	badName := []byte{0x12, 0x34, 0x01, 0x00, 0x00, 0x01, 0, 0, 0, 0, 0, 0, 0x3f, 'a'} // a label longer than the packet
	malformed := func(st Stats) uint64 { return st.Malformed }
	for _, tc := range []struct {
		name    string
		b       []byte
		answer  bool
		rcode   int
		counter func(Stats) uint64
	}{
		// Its header's opcode bits are no query's.
		{"garbage", []byte("GET / HTTP/1.1\r\n\r\n"), true, dns.RcodeNotImplemented, func(st Stats) uint64 { return st.Refused }},
		{"short header", []byte{1, 2, 3}, false, 0, malformed},
		{"two questions", twoB, true, dns.RcodeFormatError, malformed},
		{"oversize", bigB, false, 0, malformed},
		{"a response", respB, false, 0, malformed},
		{"bad name", badName, true, dns.RcodeFormatError, malformed},
	} {
		before := tc.counter(s.Stats())
		got := rawUDP(t, s.Addr(), tc.b, time.Second)
		var m dns.Msg
		switch {
		case tc.answer && got == nil:
			t.Errorf("%s: no answer, want %s", tc.name, dns.RcodeToString[tc.rcode])
		case tc.answer && (m.Unpack(got) != nil || m.Rcode != tc.rcode):
			t.Errorf("%s: answer rcode %s, want %s", tc.name, dns.RcodeToString[m.Rcode], dns.RcodeToString[tc.rcode])
		case !tc.answer && got != nil:
			t.Errorf("%s: answered %d bytes, want silence", tc.name, len(got))
		}
		waitStats(t, s, tc.name+" counted", func(st Stats) bool { return tc.counter(st) > before })
	}

	// An oversize TCP message ends its connection.
	c, err := net.Dial("tcp", s.TCPAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	before := s.Stats().Malformed
	c.Write(append([]byte{byte(len(bigB) >> 8), byte(len(bigB))}, bigB...))
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	if n, err := c.Read(make([]byte, 10)); err == nil {
		t.Errorf("an oversize TCP query got %d bytes back, want the connection closed", n)
	}
	c.Close()
	waitStats(t, s, "oversize tcp counted", func(st Stats) bool { return st.Malformed > before })

	// Not class IN, not a query: refused without a forward.
	chaos := new(dns.Msg).SetQuestion("version.bind.", dns.TypeTXT)
	chaos.Question[0].Qclass = dns.ClassCHAOS
	r, _, err := (&dns.Client{Timeout: 20 * time.Second}).Exchange(chaos, s.Addr().String())
	if err != nil || r.Rcode != dns.RcodeRefused {
		t.Errorf("CHAOS query: %v %v, want REFUSED", r, err)
	}

	// A flood from one source: past the burst, queries are dropped and
	// counted, and another source is still answered.
	fc, err := net.Dial("udp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer fc.Close()
	q, _ := new(dns.Msg).SetQuestion("web.default.svc.cluster.local.", dns.TypeA).Pack()
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; s.Stats().RateLimited == 0; i++ {
		if i > 100000 || time.Now().After(deadline) {
			t.Fatalf("after %d queries none was rate limited: %+v", i, s.Stats())
		}
		fc.Write(q)
	}
	// The flood's datagrams still queued in the socket may crowd it out
	// in the kernel, before the limiter sees it: it retries, as a stub
	// resolver does, each try within a second.
	oc := &dns.Client{Timeout: time.Second, Dialer: &net.Dialer{LocalAddr: &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2)}}}
	for try := 0; try < 20; try++ {
		if r, _, err = oc.Exchange(new(dns.Msg).SetQuestion("web.default.svc.cluster.local.", dns.TypeA), s.Addr().String()); err == nil {
			break
		}
	}
	if err != nil || !slices.Equal(addrsOf(r), []string{"10.96.0.10"}) {
		t.Errorf("another source during the flood: %v %v, want its answer (stats %+v)", r, err, s.Stats())
	}
}
