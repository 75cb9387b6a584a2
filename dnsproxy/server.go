package dnsproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/miekg/dns"
	"golang.org/x/net/netutil"
)

// Options configure a Server.
type Options struct {
	// Listen is the UDP and TCP address served.
	Listen netip.AddrPort
	// Upstream are the resolvers other names are forwarded to, tried in
	// order; none: such queries get SERVFAIL.
	Upstream []netip.AddrPort
	// Zone returns the zone in force; it is called once per query, so a
	// new one reaches the next query. Nil or a nil Zone: no mesh names,
	// every query is forwarded.
	Zone func() *Zone
	// Control, if set, is applied to every socket to an upstream: the
	// gateway's tun.BypassControl, so an upstream inside tun.routes (a
	// cluster's DNS VIP) is reached by the main table, not our own TUN.
	Control func(network, address string, c syscall.RawConn) error
	// RateLimit and Burst are each source address's queries a second and
	// at once; 0: DefaultRateLimit and DefaultBurst.
	RateLimit float64
	Burst     int
	// UpstreamTimeout bounds one forwarded query, all upstreams tried
	// included; 0: DefaultUpstreamTimeout.
	UpstreamTimeout time.Duration
	Logger          hclog.Logger
}

// Tuning.
const (
	// DefaultRateLimit and DefaultBurst, config's dns.rate_limit's:
	// a node's clients reach the server from one source address (the
	// TUN's own, which the kernel picks for a local destination; or
	// systemd-resolved, which caches), so the limit is the node's: a few
	// hundred queries a second is a busy host, and ten times that is a
	// loop or a flood.
	DefaultRateLimit = 1000
	DefaultBurst     = 2000
	// DefaultUpstreamTimeout: below the 5 s a stub resolver (glibc,
	// systemd-resolved) waits, so the client gets our SERVFAIL rather
	// than its own timeout and a retry that doubles the load.
	DefaultUpstreamTimeout = 3 * time.Second
	// maxForwards bounds forwarded queries in flight, and with them the
	// goroutines waiting on upstreams: at DefaultUpstreamTimeout, 256
	// in flight pass well over the rate limit's worth of slow answers.
	maxForwards = 256
	// maxTCPConns bounds open TCP connections (and their goroutines);
	// clients use TCP only after a truncated answer, briefly.
	maxTCPConns = 128
	// tcpReadTimeout: a TCP client that sends nothing for this long is
	// dropped (miekg's default too); the idle timeout between queries is
	// RFC 7766's advice.
	tcpReadTimeout = 2 * time.Second
	tcpIdleTimeout = 8 * time.Second
	// MaxQuerySize: a query is one question (a name of at most 255
	// bytes) and at most an OPT record, a few hundred bytes even with
	// EDNS padding (RFC 8467 pads to 128-byte blocks); 1232 is DNS flag
	// day 2020's safe UDP size. A longer message is no query of ours.
	MaxQuerySize = 1232
	// warnEvery spaces the warnings about a failing upstream: once is
	// news, one per query is a flood in the log.
	warnEvery = 10 * time.Second
)

// Stats count the queries by what the server did with them.
type Stats struct {
	Answered      uint64 // answered from the zone (records, or NODATA)
	NXDomain      uint64 // within the mesh's domains, no such host
	Forwarded     uint64 // forwarded, the upstream's answer relayed
	UpstreamError uint64 // forwarded, no upstream answered in time: SERVFAIL
	Refused       uint64 // REFUSED or NOTIMP: not class IN, not a query, or forwards at their bound
	RateLimited   uint64 // dropped: over the source's rate
	Malformed     uint64 // dropped or FORMERR: does not decode, not one question, longer than MaxQuerySize
}

// Server is a running DNS server. Make it with New; Close stops it.
type Server struct {
	opts    Options
	log     hclog.Logger
	limit   *limiter
	forward chan struct{} // a slot per forwarded query in flight
	udp     *dns.Server
	tcp     *dns.Server
	udpAddr net.Addr
	tcpAddr net.Addr
	served  sync.WaitGroup // the two serve loops

	closeOnce sync.Once
	closeErr  error

	stats struct {
		answered, nxdomain, forwarded, upstreamError, refused, rateLimited, malformed atomic.Uint64
	}
	lastWarn atomic.Int64 // unix nanoseconds of the last upstream warning
}

var _ dns.Handler = (*Server)(nil)

// New binds opts.Listen (UDP and TCP) and starts serving. The server's
// goroutines are its own; Close ends them.
func New(opts Options) (*Server, error) {
	if !opts.Listen.IsValid() {
		return nil, errors.New("dnsproxy: no listen address")
	}
	if opts.RateLimit <= 0 {
		opts.RateLimit = DefaultRateLimit
	}
	if opts.Burst <= 0 {
		opts.Burst = DefaultBurst
	}
	if opts.UpstreamTimeout <= 0 {
		opts.UpstreamTimeout = DefaultUpstreamTimeout
	}
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	s := &Server{
		opts:    opts,
		log:     opts.Logger,
		limit:   newLimiter(opts.RateLimit, opts.Burst),
		forward: make(chan struct{}, maxForwards),
	}
	pc, err := net.ListenPacket("udp", opts.Listen.String())
	if err != nil {
		return nil, fmt.Errorf("dnsproxy: listen udp: %w", err)
	}
	ln, err := net.Listen("tcp", opts.Listen.String())
	if err != nil {
		pc.Close()
		return nil, fmt.Errorf("dnsproxy: listen tcp: %w", err)
	}
	s.udpAddr, s.tcpAddr = pc.LocalAddr(), ln.Addr()
	common := func(srv *dns.Server) *dns.Server {
		srv.Handler = s
		srv.MsgAcceptFunc = s.accept
		srv.MsgInvalidFunc = func([]byte, error) { s.stats.malformed.Add(1) }
		srv.DecorateReader = func(r dns.Reader) dns.Reader { return sizeReader{r, s} }
		return srv
	}
	s.udp = common(&dns.Server{PacketConn: pc, UDPSize: MaxQuerySize + 1})
	s.tcp = common(&dns.Server{
		Listener:      netutil.LimitListener(ln, maxTCPConns),
		ReadTimeout:   tcpReadTimeout,
		IdleTimeout:   func() time.Duration { return tcpIdleTimeout },
		MaxTCPQueries: -1,
	})
	for _, srv := range []*dns.Server{s.udp, s.tcp} {
		started, failed := make(chan struct{}), make(chan error, 1)
		srv.NotifyStartedFunc = func() { close(started) }
		s.served.Add(1)
		go func() {
			defer s.served.Done()
			if err := srv.ActivateAndServe(); err != nil {
				failed <- err
				s.log.Error("serving stopped", "error", err)
			}
		}()
		select {
		case <-started:
		case err := <-failed:
			pc.Close()
			ln.Close()
			s.Close()
			return nil, fmt.Errorf("dnsproxy: serve: %w", err)
		}
	}
	s.log.Info("serving", "listen", opts.Listen, "upstream", fmt.Sprint(opts.Upstream))
	return s, nil
}

// Addr is the UDP address served (its port, with a Listen port of 0).
func (s *Server) Addr() netip.AddrPort { return s.udpAddr.(*net.UDPAddr).AddrPort() }

// TCPAddr is the TCP address served.
func (s *Server) TCPAddr() netip.AddrPort { return s.tcpAddr.(*net.TCPAddr).AddrPort() }

// Close stops serving and waits for the queries being answered, each
// bounded by UpstreamTimeout. It is idempotent.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.opts.UpstreamTimeout+time.Second)
		defer cancel()
		s.closeErr = errors.Join(s.udp.ShutdownContext(ctx), s.tcp.ShutdownContext(ctx))
		s.served.Wait()
	})
	return s.closeErr
}

// Stats returns the counts so far.
func (s *Server) Stats() Stats {
	return Stats{
		Answered:      s.stats.answered.Load(),
		NXDomain:      s.stats.nxdomain.Load(),
		Forwarded:     s.stats.forwarded.Load(),
		UpstreamError: s.stats.upstreamError.Load(),
		Refused:       s.stats.refused.Load(),
		RateLimited:   s.stats.rateLimited.Load(),
		Malformed:     s.stats.malformed.Load(),
	}
}

// accept is the library's check of a message's header (a query, one
// question, few records), with what it refuses counted.
func (s *Server) accept(h dns.Header) dns.MsgAcceptAction {
	a := dns.DefaultMsgAcceptFunc(h)
	switch a {
	case dns.MsgAccept:
	case dns.MsgRejectNotImplemented:
		s.stats.refused.Add(1)
	default:
		s.stats.malformed.Add(1)
	}
	return a
}

// sizeReader drops messages longer than MaxQuerySize: a datagram that
// filled the buffer (UDPSize is one more byte) was cut short by the
// kernel; a TCP message that long ends the connection.
type sizeReader struct {
	dns.Reader
	s *Server
}

var errOversize = errors.New("dnsproxy: message longer than a query")

func (r sizeReader) ReadTCP(conn net.Conn, timeout time.Duration) ([]byte, error) {
	m, err := r.Reader.ReadTCP(conn, timeout)
	if err == nil && len(m) > MaxQuerySize {
		r.s.stats.malformed.Add(1)
		return nil, errOversize
	}
	return m, err
}

func (r sizeReader) ReadUDP(conn *net.UDPConn, timeout time.Duration) ([]byte, *dns.SessionUDP, error) {
	for {
		m, sess, err := r.Reader.ReadUDP(conn, timeout)
		if err != nil || len(m) <= MaxQuerySize {
			return m, sess, err
		}
		r.s.stats.malformed.Add(1) // and read the next one
	}
}

// ServeDNS answers one query: the source's rate first, then the zone,
// else the upstream.
func (s *Server) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	src := addrOf(w.RemoteAddr())
	if !s.limit.allow(src, time.Now()) {
		s.stats.rateLimited.Add(1)
		return // no answer: a flood gets no work, and no amplification
	}
	network := "udp"
	if _, ok := w.RemoteAddr().(*net.TCPAddr); ok {
		network = "tcp"
	}
	reply := s.answer(context.Background(), r, network)
	if network == "udp" {
		reply.Truncate(udpSize(r))
	}
	if err := w.WriteMsg(reply); err != nil {
		s.log.Debug("writing the answer", "src", src, "error", err)
	}
}

// udpSize is the largest UDP answer the client takes.
func udpSize(r *dns.Msg) int {
	if opt := r.IsEdns0(); opt != nil && opt.UDPSize() > dns.MinMsgSize {
		return int(opt.UDPSize())
	}
	return dns.MinMsgSize
}

func addrOf(a net.Addr) netip.Addr {
	switch a := a.(type) {
	case *net.UDPAddr:
		return a.AddrPort().Addr().Unmap()
	case *net.TCPAddr:
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// answer is the reply to r, received over network ("udp" or "tcp", the
// transport forwarded queries use too), and counts it. It never returns
// nil.
func (s *Server) answer(ctx context.Context, r *dns.Msg, network string) *dns.Msg {
	m := new(dns.Msg)
	if len(r.Question) != 1 || r.Response {
		s.stats.malformed.Add(1)
		return m.SetRcodeFormatError(r)
	}
	q := r.Question[0]
	if r.Opcode != dns.OpcodeQuery {
		s.stats.refused.Add(1)
		return m.SetRcode(r, dns.RcodeNotImplemented)
	}
	if q.Qclass != dns.ClassINET {
		s.stats.refused.Add(1)
		return m.SetRcode(r, dns.RcodeRefused)
	}
	if q.Name == "." {
		return s.forwardQuery(ctx, r, network, q.Name) // the root: no mesh name
	}
	fq, ok := canonical(q.Name)
	if !ok {
		s.stats.malformed.Add(1)
		return m.SetRcodeFormatError(r)
	}
	var z *Zone
	if s.opts.Zone != nil {
		z = s.opts.Zone()
	}
	res, addrs, domain := notOurs, []netip.Addr(nil), ""
	if z != nil {
		res, addrs, domain = z.lookup(fq)
	}
	typeAsked := q.Qtype == dns.TypeA || q.Qtype == dns.TypeAAAA || q.Qtype == dns.TypeANY
	if res == notOurs || (res == found && domain == "" && !typeAsked) {
		return s.forwardQuery(ctx, r, network, fq)
	}
	m.SetReply(r)
	m.Authoritative = true
	m.RecursionAvailable = r.RecursionDesired
	if opt := r.IsEdns0(); opt != nil {
		m.SetEdns0(MaxQuerySize, false)
	}
	switch res {
	case found:
		hdr := func(t uint16) dns.RR_Header {
			return dns.RR_Header{Name: q.Name, Rrtype: t, Class: dns.ClassINET, Ttl: z.ttl}
		}
		for _, a := range addrs {
			switch {
			case a.Is4() && (q.Qtype == dns.TypeA || q.Qtype == dns.TypeANY):
				m.Answer = append(m.Answer, &dns.A{Hdr: hdr(dns.TypeA), A: a.AsSlice()})
			case a.Is6() && (q.Qtype == dns.TypeAAAA || q.Qtype == dns.TypeANY):
				m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr(dns.TypeAAAA), AAAA: a.AsSlice()})
			}
		}
		if len(m.Answer) == 0 && domain != "" {
			m.Ns = []dns.RR{z.soa(domain)} // NODATA, cached for ttl (RFC 2308)
		}
		s.stats.answered.Add(1)
		s.log.Debug("answered", "name", fq, "type", dns.TypeToString[q.Qtype], "answers", len(m.Answer))
	case exists:
		m.Ns = []dns.RR{z.soa(domain)}
		s.stats.answered.Add(1)
		s.log.Debug("answered", "name", fq, "type", dns.TypeToString[q.Qtype], "answers", 0)
	case noSuch:
		m.Rcode = dns.RcodeNameError
		m.Ns = []dns.RR{z.soa(domain)}
		s.stats.nxdomain.Add(1)
		s.log.Debug("nxdomain", "name", fq, "type", dns.TypeToString[q.Qtype])
	}
	return m
}

// soa is the SOA of a mesh domain, for the authority section of negative
// answers: its minimum is how long a resolver caches them (RFC 2308).
func (z *Zone) soa(domain string) dns.RR {
	return &dns.SOA{
		Hdr:  dns.RR_Header{Name: domain, Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: z.ttl},
		Ns:   "ns.dns." + domain,
		Mbox: "hostmaster." + domain,
		// The secondaries' timers mean nothing here (no zone transfer);
		// RFC 1912's suggested values, so tools that show them see sane ones.
		Serial: 1, Refresh: 7200, Retry: 1800, Expire: 86400, Minttl: z.ttl,
	}
}

// forwardQuery asks the upstreams, in order, within UpstreamTimeout, and
// relays the first answer that is neither SERVFAIL nor REFUSED (or the
// last one); none in time is SERVFAIL.
func (s *Server) forwardQuery(ctx context.Context, r *dns.Msg, network, fq string) *dns.Msg {
	select {
	case s.forward <- struct{}{}:
		defer func() { <-s.forward }()
	default:
		s.stats.refused.Add(1)
		s.log.Debug("refused: forwarded queries at their bound", "name", fq, "bound", maxForwards)
		return new(dns.Msg).SetRcode(r, dns.RcodeRefused)
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.UpstreamTimeout)
	defer cancel()
	q := r.Copy()
	q.Id = dns.Id() // ours, not the client's: a reply must answer what we sent
	var (
		last    *dns.Msg
		lastErr error = errors.New("no upstream resolver (dns.upstream empty, and none in " + ResolvConf + ")")
	)
	for _, up := range s.opts.Upstream {
		c := &dns.Client{Net: network, Dialer: &net.Dialer{Control: s.opts.Control}, UDPSize: uint16(udpSize(r))}
		resp, _, err := c.ExchangeContext(ctx, q, up.String())
		if err != nil {
			lastErr = fmt.Errorf("%s: %w", up, err)
			if ctx.Err() != nil {
				break
			}
			continue
		}
		last = resp
		if resp.Rcode != dns.RcodeServerFailure && resp.Rcode != dns.RcodeRefused {
			break
		}
	}
	if last == nil {
		s.stats.upstreamError.Add(1)
		s.warnUpstream(fq, lastErr)
		return new(dns.Msg).SetRcode(r, dns.RcodeServerFailure)
	}
	last.Id = r.Id
	s.stats.forwarded.Add(1)
	s.log.Debug("forwarded", "name", fq, "rcode", dns.RcodeToString[last.Rcode], "answers", len(last.Answer))
	return last
}

func (s *Server) warnUpstream(name string, err error) {
	now := time.Now().UnixNano()
	last := s.lastWarn.Load()
	if now-last < int64(warnEvery) || !s.lastWarn.CompareAndSwap(last, now) {
		s.log.Debug("upstream failed: SERVFAIL", "name", name, "error", err)
		return
	}
	s.log.Warn("no upstream answered: SERVFAIL (logged at most every 10s)", "name", name, "error", err)
}
