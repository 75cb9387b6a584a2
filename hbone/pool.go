package hbone

// The client pool. Its invariants, which every function here keeps:
//
//  1. A connection belongs to exactly one key (source identity, sorted
//     expected identities, HBONE address, source IP) and only carries
//     streams whose request has that key. Keys are never mixed. The
//     source identity is the SPIFFE ID of the certificate in force when
//     the flow starts, and a dial uses a certificate of that identity or
//     fails, so flows after an identity change never ride a connection
//     made under the old one.
//  2. A connection carries at most pc.maxStreams streams at once:
//     min(PoolOptions.MaxStreamsPerConn, the peer's initial
//     SETTINGS_MAX_CONCURRENT_STREAMS). pc.inflight counts them; a slot is
//     taken (inflight++ and h2Conn.reserve) under p.mu before the
//     request is sent, and given back exactly once when the stream ends.
//     reserve also enforces any later, lower peer limit.
//  3. A connection is offered to new streams only after the peer's first
//     SETTINGS frame has been applied (so the cap is known), and never once
//     it got GOAWAY, failed or is closing (reserve refuses); its open
//     streams finish undisturbed, and it is closed when the last one ends.
//  4. At most one dial per key is in flight. Flows that find no free slot
//     while a dial runs wait for that dial and share its result, error
//     included; nobody retries a failed dial on another's behalf.
//  5. A connection with no stream for IdleTimeout is closed.
//  6. Every goroutine the pool starts (the reaper, one per dial) is counted
//     in p.wg; Close cancels p.ctx, closes every connection and waits.
//  7. Spreading, only with PoolOptions.ConnsPerKey > 1: while a key has
//     fewer than ConnsPerKey live connections and every one of them
//     carries a stream, a new flow waits for one more connection (dialled
//     under invariant 4: one dial per key at a time, so at most
//     ConnsPerKey-1 extra dials, one after the other) instead of sharing;
//     and a flow takes the least-loaded connection with room. Caps
//     (invariant 2) are unchanged. If such a dial fails, the flows that
//     waited for it take slots on the existing connections, and the key
//     does not spread again for poolSpreadRetry. With the default of 1,
//     streams pack onto the first connection with room and a new
//     connection is dialled only when all are full.

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
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

	"github.com/hashicorp/go-hclog"
)

// Defaults of PoolOptions.
const (
	// DefaultMaxStreamsPerConn is ztunnel's default: enough streams to
	// amortize a handshake, few enough that one connection's reader
	// goroutine and write lock (the throughput ceiling: docs/field-notes.md,
	// "Go HTTP/2 over mutual TLS") are not shared by too many flows.
	DefaultMaxStreamsPerConn = 100
	// DefaultIdleTimeout is ztunnel's pool idle timeout.
	DefaultIdleTimeout = 5 * time.Minute
	// DefaultConnectTimeout bounds TCP + TLS + HTTP/2 setup; ztunnel uses 10 s.
	DefaultConnectTimeout = 10 * time.Second

	// poolSpreadRetry is how long a key whose extra (spreading) dial
	// failed shares its connections instead (invariant 7): a peer that
	// refuses more connections is not asked again on every flow.
	poolSpreadRetry = 10 * time.Second
	// MaxConnsPerKey bounds PoolOptions.ConnsPerKey: a few connections
	// already use both of a small node's cores: 8 streams over 8
	// connections 7.8–8.1 Gbit/s vs 5.3 over one (docs/field-notes.md,
	// "Go HTTP/2 over mutual TLS").
	MaxConnsPerKey = 8
)

// ErrPoolClosed is returned by Connect after Close.
var ErrPoolClosed = errors.New("hbone: pool closed")

// PoolOptions configure a Pool. Zero values take the documented defaults.
type PoolOptions struct {
	// Certificate is our chain and key; the SPIFFE ID of its leaf is the
	// source identity. Required unless Source is set.
	Certificate tls.Certificate
	// Roots is the trust bundle servers must chain to. Required unless
	// Source is set.
	Roots *x509.CertPool
	// Source, if set, supplies our certificate and the trust bundle
	// instead of Certificate and Roots (set one or the other). Each new
	// connection takes what it holds at that moment; open connections
	// keep what they were made with. The SPIFFE ID of the certificate in
	// force when a flow starts is the source identity of its pool key
	// (invariant 1). While it holds no usable certificate, Connect fails
	// with an error wrapping ErrNoCertificate, counted in DialsFailed.
	Source CertSource
	// MaxStreamsPerConn caps the streams of one connection; the effective
	// cap is min(this, the peer's SETTINGS_MAX_CONCURRENT_STREAMS).
	// Default DefaultMaxStreamsPerConn.
	MaxStreamsPerConn int
	// ConnsPerKey spreads flows of one key over up to this many
	// connections while they are busy (invariant 7 at the top of pool.go):
	// one connection's reader goroutine and write lock bound its throughput,
	// so concurrent bulk flows go faster on several. Default 1 (pack
	// streams, ztunnel's behaviour); at most MaxConnsPerKey.
	ConnsPerKey int
	// IdleTimeout closes a connection that carried no stream this long.
	// Default DefaultIdleTimeout.
	IdleTimeout time.Duration
	// ConnectTimeout bounds TCP + TLS + HTTP/2 setup of one connection.
	// Default DefaultConnectTimeout.
	ConnectTimeout time.Duration
	// Logger receives the pool's logs (named "pool"). Default: none.
	Logger hclog.Logger
	// Control, if set, is called on each peer socket before it connects
	// (net.Dialer.Control): the gateway marks its sockets with it so they
	// are not routed into its own TUN.
	Control func(network, address string, c syscall.RawConn) error

	// Dial, if set, replaces net.Dialer.DialContext for the TCP connection
	// (tests). ConnectRequest.SourceIP and Control are then not applied by
	// the pool.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)

	// pingAfter and pingTimeout override h2PingAfter and h2PingTimeout
	// (tests).
	pingAfter, pingTimeout time.Duration
	// beforeOpen, if set, runs between taking a slot and sending the
	// CONNECT (tests).
	beforeOpen func(*poolConn)
}

// PoolStats is a snapshot of a Pool's counters.
type PoolStats struct {
	ConnsOpened   uint64 // connections set up successfully since NewPool
	ConnsOpen     int    // connections currently held, draining ones included
	StreamsOpen   int    // streams currently open (or being opened) on them
	DialsFailed   uint64 // connection attempts that failed (no certificate of ours, TCP, TLS, or the peer's first SETTINGS)
	StreamsOpened uint64 // CONNECT streams that got 200
	StreamsFailed uint64 // CONNECTs that got another status, a reset, or no answer
}

// Pool carries HBONE flows over shared HTTP/2 connections, one CONNECT
// stream per flow. It is safe for concurrent use. Close ends it.
type Pool struct {
	opts     PoolOptions
	src      CertSource
	srcID    atomic.Pointer[poolSourceID] // identity of the certificate last seen
	log      hclog.Logger
	ctx      context.Context // cancelled by Close; parent of dials and streams
	cancel   context.CancelFunc
	kick     chan struct{} // wakes the reaper; buffered 1, sends never block
	wg       sync.WaitGroup
	closeMu  sync.Mutex // serializes Close
	closeErr error

	streamsOpened, streamsFailed atomic.Uint64

	mu          sync.Mutex
	closed      bool
	keys        map[poolKey]*poolEntry
	opened      uint64
	dialsFailed uint64
}

// poolSourceID remembers the SPIFFE ID of one certificate of the
// source, so that a flow does not parse the leaf again.
type poolSourceID struct {
	cert *tls.Certificate
	id   string
}

// poolKey is invariant 1's key. ids is the sorted expected identities
// joined by newlines (a newline cannot appear in a SPIFFE ID).
type poolKey struct {
	src   string
	ids   string
	addr  netip.AddrPort
	srcIP netip.Addr
}

// poolEntry is the state of one key: its connections and its dial.
type poolEntry struct {
	conns       []*poolConn
	dialing     *poolDial // nil when no dial runs (invariant 4)
	spreadAfter time.Time // no spreading before this (invariant 7)
}

// poolDial is one dial in flight; done is closed when conn or err is set.
type poolDial struct {
	done    chan struct{}
	conn    *poolConn
	err     error
	waiters int // Connects waiting for it; guarded by Pool.mu
}

// poolConn is one HTTP/2 connection. Fields after mu's comment are guarded
// by Pool.mu.
type poolConn struct {
	key        poolKey
	cc         *h2Conn
	peerID     string
	maxStreams int
	readerDone <-chan struct{} // closed when the connection's reader and writer stopped

	// guarded by Pool.mu
	inflight  int
	idleSince time.Time
	removed   bool
}

// NewPool checks opts, fills in defaults and returns a running pool.
func NewPool(opts PoolOptions) (*Pool, error) {
	src := opts.Source
	switch {
	case src != nil && (len(opts.Certificate.Certificate) > 0 || opts.Roots != nil):
		return nil, errors.New("hbone: pool: Source set together with Certificate or Roots (use one or the other)")
	case src == nil:
		static, err := newStaticSource(opts.Certificate, opts.Roots)
		if err != nil {
			return nil, fmt.Errorf("hbone: pool: %w", err)
		}
		if _, err := certIdentity(static.cert); err != nil {
			return nil, fmt.Errorf("hbone: pool: Certificate: %w", err)
		}
		src = static
	}
	if opts.MaxStreamsPerConn <= 0 {
		opts.MaxStreamsPerConn = DefaultMaxStreamsPerConn
	}
	if opts.ConnsPerKey <= 0 {
		opts.ConnsPerKey = 1
	}
	if opts.ConnsPerKey > MaxConnsPerKey {
		return nil, fmt.Errorf("hbone: pool: ConnsPerKey %d is above %d", opts.ConnsPerKey, MaxConnsPerKey)
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = DefaultIdleTimeout
	}
	if opts.ConnectTimeout <= 0 {
		opts.ConnectTimeout = DefaultConnectTimeout
	}
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	if opts.pingAfter <= 0 {
		opts.pingAfter = h2PingAfter
	}
	if opts.pingTimeout <= 0 {
		opts.pingTimeout = h2PingTimeout
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Pool{
		opts:   opts,
		src:    src,
		log:    opts.Logger.Named("pool"),
		ctx:    ctx,
		cancel: cancel,
		kick:   make(chan struct{}, 1),
		keys:   make(map[poolKey]*poolEntry),
	}
	p.wg.Add(1)
	go p.reaper()
	return p, nil
}

// keyFor computes invariant 1's key of req. With no usable certificate
// in force the source identity is "", a key no connection ever has: the
// flow dials, and the dial fails with the reason.
func (p *Pool) keyFor(req *ConnectRequest) poolKey {
	ids := slices.Clone(req.Identities)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	var src string
	if cert, _, err := inForce(p.src, time.Now()); err == nil {
		src, _ = p.sourceID(cert)
	}
	return poolKey{src: src, ids: strings.Join(ids, "\n"), addr: req.Address, srcIP: req.SourceIP}
}

// sourceID is the SPIFFE ID of cert, one of the source's certificates.
func (p *Pool) sourceID(cert *tls.Certificate) (string, error) {
	last := p.srcID.Load()
	if last != nil && last.cert == cert {
		return last.id, nil
	}
	id, err := certIdentity(cert)
	if err != nil {
		return "", fmt.Errorf("our certificate: %w", err)
	}
	if p.srcID.CompareAndSwap(last, &poolSourceID{cert: cert, id: id}) && last != nil && last.id != id {
		p.log.Info("source identity changed; new flows use new connections", "from", last.id, "to", id)
	}
	return id, nil
}

// acquire returns a connection of key with a slot taken for one stream,
// dialling (or waiting for the dial in flight) when none has room.
func (p *Pool) acquire(ctx context.Context, key poolKey, ids []string) (*poolConn, error) {
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, ErrPoolClosed
		}
		e := p.keys[key]
		if e == nil {
			e = &poolEntry{}
			p.keys[key] = e
		}
		spread := p.spreadLocked(e, time.Now())
		if !spread {
			if pc := p.takeSlotLocked(e); pc != nil {
				p.mu.Unlock()
				return pc, nil
			}
		}
		d := e.dialing
		if d == nil {
			d = &poolDial{done: make(chan struct{})}
			e.dialing = d
			p.wg.Add(1)
			go p.runDial(key, ids, d)
		}
		d.waiters++
		p.mu.Unlock()

		select {
		case <-d.done:
		case <-ctx.Done():
			return nil, fmt.Errorf("hbone: connect %s: waiting for connection: %w", key.addr, ctx.Err())
		}
		if d.err != nil {
			if !spread {
				return nil, d.err
			}
			// An extra connection failed; share the existing ones.
			p.mu.Lock()
			e.spreadAfter = time.Now().Add(poolSpreadRetry)
			p.mu.Unlock()
		}
		// The new connection is in e.conns now; loop to take a slot on it
		// (or on any other), racing fairly with the other waiters.
	}
}

// spreadLocked reports whether a new flow of e should wait for one more
// connection rather than share (invariant 7).
func (p *Pool) spreadLocked(e *poolEntry, now time.Time) bool {
	if p.opts.ConnsPerKey <= 1 || now.Before(e.spreadAfter) {
		return false
	}
	live := 0
	for _, pc := range e.conns {
		if pc.cc.Err() != nil {
			continue
		}
		if pc.inflight == 0 {
			return false // an idle connection is there to take
		}
		live++
	}
	return live > 0 && live < p.opts.ConnsPerKey
}

// takeSlotLocked takes a stream slot on a connection of e with room, or
// returns nil: on the first one, or with spreading (invariant 7) on the
// one carrying the fewest streams.
func (p *Pool) takeSlotLocked(e *poolEntry) *poolConn {
	conns := e.conns
	if p.opts.ConnsPerKey > 1 {
		conns = slices.Clone(conns)
		slices.SortStableFunc(conns, func(a, b *poolConn) int { return a.inflight - b.inflight })
	}
	for _, pc := range conns {
		if pc.inflight >= pc.maxStreams {
			continue
		}
		// reserve refuses after GOAWAY, on a failed or closing connection
		// and at a peer limit lowered after the first SETTINGS.
		if pc.cc.reserve() != nil {
			continue
		}
		pc.inflight++
		return pc
	}
	return nil
}

// release gives back the slot of a stream that ended (invariant 2).
func (p *Pool) release(pc *poolConn) {
	p.mu.Lock()
	pc.inflight--
	idle := pc.inflight == 0
	if idle {
		pc.idleSince = time.Now()
	}
	p.mu.Unlock()
	if idle {
		p.wake()
	}
}

// wake asks the reaper for a scan without ever blocking.
func (p *Pool) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// runDial sets up one connection for key and hands the result to every
// waiter of d.
func (p *Pool) runDial(key poolKey, ids []string, d *poolDial) {
	defer p.wg.Done()
	pc, err := p.dial(key, ids)
	p.mu.Lock()
	e := p.keys[key] // nil if Close ran meanwhile
	switch {
	case err != nil:
		d.err = err
		if !p.closed { // not a dial that Close cut short
			p.dialsFailed++
		}
	case p.closed:
		d.err = ErrPoolClosed
	default:
		p.opened++
		pc.idleSince = time.Now()
		e.conns = append(e.conns, pc)
		d.conn = pc
	}
	if e != nil {
		e.dialing = nil
		if len(e.conns) == 0 {
			delete(p.keys, key)
		}
	}
	close(d.done)
	p.mu.Unlock()
	switch {
	case err != nil:
		p.log.Debug("dial failed", "addr", key.addr, "error", err)
	case d.err != nil: // Close ran during the dial and did not see pc
		pc.close()
		<-pc.readerDone
	default:
		p.log.Debug("connection up", "addr", key.addr, "peer", pc.peerID, "max_streams", pc.maxStreams)
	}
}

// reaper closes failed, drained and idle connections (invariants 3 and 5).
// It scans when woken (a stream released the last slot of a connection, a
// connection changed state) and when the earliest idle deadline passes.
func (p *Pool) reaper() {
	defer p.wg.Done()
	defer p.log.Trace("reaper stopped")
	timer := time.NewTimer(p.opts.IdleTimeout)
	defer timer.Stop()
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-p.kick:
		case <-timer.C:
		}
		next := p.reap(time.Now())
		timer.Reset(next)
	}
}

// reap removes and closes what invariants 3 and 5 say must go, and
// returns how long until the next idle deadline.
func (p *Pool) reap(now time.Time) time.Duration {
	next := p.opts.IdleTimeout
	var doomed []*poolConn
	p.mu.Lock()
	for key, e := range p.keys {
		kept := e.conns[:0]
		for _, pc := range e.conns {
			why := ""
			switch {
			case pc.cc.Err() != nil:
				why = "failed"
			case pc.inflight > 0:
			case pc.cc.draining():
				why = "drained" // GOAWAY or closing, last stream gone
			case now.Sub(pc.idleSince) >= p.opts.IdleTimeout:
				why = "idle"
			default:
				next = min(next, pc.idleSince.Add(p.opts.IdleTimeout).Sub(now))
			}
			if why == "" {
				kept = append(kept, pc)
				continue
			}
			pc.removed = true
			doomed = append(doomed, pc)
			p.log.Debug("closing connection", "addr", key.addr, "reason", why, "streams", pc.inflight)
		}
		clear(e.conns[len(kept):])
		e.conns = kept
		if len(e.conns) == 0 && e.dialing == nil {
			delete(p.keys, key)
		}
	}
	p.mu.Unlock()
	for _, pc := range doomed {
		pc.close()
	}
	return max(next, time.Millisecond)
}

// close closes the HTTP/2 connection; streams still on it fail.
func (pc *poolConn) close() {
	pc.cc.close()
}

// Close closes every connection (open streams fail), stops the pool's
// goroutines and waits for them and for every connection's reader.
// Connect fails with ErrPoolClosed afterwards. Close may be called more
// than once.
func (p *Pool) Close() error {
	p.closeMu.Lock()
	defer p.closeMu.Unlock()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return p.closeErr
	}
	p.closed = true
	var all []*poolConn
	for _, e := range p.keys {
		all = append(all, e.conns...)
		e.conns = nil
	}
	clear(p.keys)
	p.mu.Unlock()

	p.cancel() // aborts dials in flight and every stream
	for _, pc := range all {
		pc.close()
	}
	p.wg.Wait()
	for _, pc := range all {
		<-pc.readerDone
	}
	return p.closeErr
}

// Stats returns a snapshot of the pool's counters.
func (p *Pool) Stats() PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := PoolStats{
		ConnsOpened:   p.opened,
		DialsFailed:   p.dialsFailed,
		StreamsOpened: p.streamsOpened.Load(),
		StreamsFailed: p.streamsFailed.Load(),
	}
	for _, e := range p.keys {
		s.ConnsOpen += len(e.conns)
		for _, pc := range e.conns {
			s.StreamsOpen += pc.inflight
		}
	}
	return s
}

// PeerStats is what a Pool holds towards one peer: an HBONE address and
// the identity its certificate proved.
type PeerStats struct {
	Addr     netip.AddrPort
	Identity string // the peer's SPIFFE ID, as its certificate proved it
	Conns    int    // connections held, draining ones included
	Streams  int    // streams open (or being opened) on them
}

// Peers returns what the pool holds towards each peer, ordered by
// address and identity; a dial in flight is not a peer yet.
func (p *Pool) Peers() []PeerStats {
	type peer struct {
		addr netip.AddrPort
		id   string
	}
	p.mu.Lock()
	byPeer := map[peer]*PeerStats{}
	for key, e := range p.keys {
		for _, pc := range e.conns {
			k := peer{key.addr, pc.peerID}
			s := byPeer[k]
			if s == nil {
				s = &PeerStats{Addr: key.addr, Identity: pc.peerID}
				byPeer[k] = s
			}
			s.Conns++
			s.Streams += pc.inflight
		}
	}
	p.mu.Unlock()
	out := make([]PeerStats, 0, len(byPeer))
	for _, s := range byPeer {
		out = append(out, *s)
	}
	slices.SortFunc(out, func(a, b PeerStats) int {
		return cmp.Or(a.Addr.Compare(b.Addr), strings.Compare(a.Identity, b.Identity))
	})
	return out
}
