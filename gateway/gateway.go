package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/hbone"
	"github.com/meshtun/meshtun/identity"
	"github.com/meshtun/meshtun/mesh"
	"github.com/meshtun/meshtun/netstack"
	"github.com/meshtun/meshtun/tun"
)

// Gateway is one node's meshtun. Make it with New, run it with Run.
type Gateway struct {
	cfg *config.Config // as started; what a reload may change is in cur
	log hclog.Logger

	// The certificate in force and its roots: HBONE's client and server
	// read them at every new handshake (certs, an hbone.CertSource), so a
	// swap (SetCertificate; with the files, their watch in Run) reaches
	// new connections at once and leaves open ones alone. identity is its
	// SPIFFE ID, set by New (with the mesh on, the one the config names,
	// config.MeshIdentity) and the same for every certificate of this
	// node. certIn (hasCertificate) is closed when the first certificate
	// is in force.
	certMu   sync.Mutex
	cert     *tls.Certificate // nil until SetCertificate with the mesh on
	roots    *x509.CertPool
	notAfter time.Time // the leaf's expiry
	identity string
	certIn   chan struct{}
	certOnce sync.Once

	// ownPorts are the ports this gateway listens on; inbound streams to
	// them on one of this host's addresses are refused (a loop).
	ownPorts map[uint16]bool
	ownAddrs map[netip.Addr]bool

	pool   *hbone.Pool
	server *hbone.Server
	// eastWestSrv serves gateway.east_west (eastwest.go), nil when off.
	eastWestSrv *hbone.Server
	ready       atomic.Bool
	readyCh     chan struct{} // closed once Run is ready
	// servingCh is closed once Run has its device, stack and listeners
	// up: before ready when it still waits for istiod.
	servingCh chan struct{}
	draining  atomic.Bool
	flows     flowTable // every open flow; it writes the access log (flows.go)
	metrics   *metrics  // metrics.go

	// cur is the config, router and policies in force for new flows
	// (reload.go); Reload swaps it, serialized by reloadMu.
	cur      atomic.Pointer[snapshot]
	reloadMu sync.Mutex
	// The file's config in force and the mesh's latest state, merged
	// into cur (reload.go); guarded by reloadMu.
	file      *config.Config
	keys      *fileKeys  // what the file's entries hold (meshstate.go)
	mesh      *meshState // nil until the first state from istiod
	meshLog   meshLog
	meshStats meshCounters
	// clashes are the mesh's workloads and services dropped for a clash
	// with the file's, by entry ("w" or "s" and the resource name), why;
	// clashesBefore those of the snapshot a full rebuild replaces;
	// policyClashes the mesh's policies dropped.
	clashes       map[string]string
	clashesBefore map[string]string
	policyClashes int
	// meshReady is closed by the first ApplyMesh of a complete state;
	// with the mesh on, readiness waits for it.
	meshReady     chan struct{}
	meshReadyOnce sync.Once

	// drainSig are Quit, EndDrain and Draining (drain.go); draining above
	// is set once a drain begins: new captured flows are refused and
	// readiness fails.
	drainSig drainSignals
	// hboneProbe is the HBONE listener as Run serves it, for Check
	// (health.go); nil without hbone.listen.
	hboneProbe atomic.Pointer[probedListener]
}

// Options are what New takes besides the config.
type Options struct {
	// Certificate and Roots, if Certificate is set, are this gateway's
	// certificate (leaf first) and the roots peers' certificates must
	// chain to, in place of tls.cert, tls.key and tls.trust_bundle: with
	// [mesh] on, from Istio's CA. tls.trust_bundle, if set, adds roots.
	Certificate *tls.Certificate
	Roots       *x509.CertPool
}

// New loads what the gateway needs from cfg (certificates, trust bundle)
// and builds its routing table. It opens no device and no socket. cfg
// must come from config.Load (or Parse) without error.
func New(cfg *config.Config, log hclog.Logger) (*Gateway, error) {
	return NewWithOptions(cfg, log, Options{})
}

// NewWithOptions is New with a certificate given rather than loaded.
// With [mesh] on and none given, the gateway has none until
// SetCertificate, which may come before or during Run.
func NewWithOptions(cfg *config.Config, log hclog.Logger, opts Options) (*Gateway, error) {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	g := &Gateway{
		cfg:       cfg,
		file:      cfg,
		log:       log.Named("gateway"),
		ownPorts:  make(map[uint16]bool),
		ownAddrs:  make(map[netip.Addr]bool),
		readyCh:   make(chan struct{}),
		servingCh: make(chan struct{}),
		metrics:   newMetrics(),
		meshReady: make(chan struct{}),
		drainSig:  newDrainSignals(),
		// With the mesh on, the identity the CA is asked for: the only
		// one SetCertificate takes, known before any certificate is.
		identity: cfg.MeshIdentity(),
	}
	switch {
	case opts.Certificate != nil:
		if err := g.SetCertificate(*opts.Certificate, opts.Roots); err != nil {
			return nil, err
		}
	case cfg.Mesh.Enabled():
		// From the mesh's CA, once it answers (SetCertificate), which
		// may be after Run: until then HBONE handshakes fail with
		// hbone.ErrNoCertificate.
	default:
		cert, id, err := hbone.LoadKeyPair(cfg.TLS.Cert, cfg.TLS.Key)
		if err != nil {
			return nil, fmt.Errorf("gateway: tls.cert/tls.key: %w", err)
		}
		if parsed, _ := identity.Parse(id); parsed.TrustDomain() != cfg.Gateway.TrustDomain {
			return nil, fmt.Errorf("gateway: tls.cert: identity %s is not in gateway.trust_domain %q", id, cfg.Gateway.TrustDomain)
		}
		roots, err := g.bundle(nil)
		if err != nil {
			return nil, err
		}
		g.cert, g.roots, g.notAfter, g.identity = &cert, roots, cert.Leaf.NotAfter, id
		g.certMu.Lock()
		g.certInForceLocked()
		g.certMu.Unlock()
	}
	g.metrics.identity = g.identity
	g.metrics.openFlows = g.flows.open
	g.metrics.overLimit = g.flows.refusedOverLimit
	g.metrics.meshStats = func() (MeshStats, bool) { return g.MeshStats(), cfg.Mesh.Enabled() }
	g.keys, g.clashes = fileKeysOf(cfg), map[string]string{}
	g.cur.Store(newSnapshot(cfg, nil))
	if cfg.Log.AccessLog {
		g.flows.log = log.Named("access")
	}
	for _, l := range []string{cfg.HBONE.Listen, cfg.Gateway.EastWest, cfg.Admin.Listen, cfg.Admin.Metrics, cfg.Admin.Readiness} {
		if ap, err := netip.ParseAddrPort(l); err == nil {
			g.ownPorts[ap.Port()] = true
		}
	}
	if cfg.DNS.Enabled {
		g.ownPorts[cfg.DNS.Listen.Port()] = true // its TCP side
	}
	return g, nil
}

// bundle adds tls.trust_bundle's roots, if it is set, to roots (a copy;
// nil: none).
func (g *Gateway) bundle(roots *x509.CertPool) (*x509.CertPool, error) {
	if g.cfg.TLS.TrustBundle == "" {
		if roots == nil {
			return nil, errors.New("gateway: no roots to verify peers with")
		}
		return roots, nil
	}
	pem, err := os.ReadFile(g.cfg.TLS.TrustBundle)
	if err != nil {
		return nil, fmt.Errorf("gateway: tls.trust_bundle: %w", err)
	}
	if roots == nil {
		if roots, err = hbone.LoadRoots(pem); err != nil {
			return nil, fmt.Errorf("gateway: tls.trust_bundle %s: %w", g.cfg.TLS.TrustBundle, err)
		}
		return roots, nil
	}
	roots = roots.Clone()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("gateway: tls.trust_bundle %s: no certificate", g.cfg.TLS.TrustBundle)
	}
	return roots, nil
}

// SetCertificate gives the gateway its certificate (leaf first, with its
// key) and the roots peers must chain to (tls.trust_bundle's are added):
// with [mesh] on, the first one Istio's CA issued (before or while Run
// runs), then each renewal. Its SPIFFE ID must be in gateway.trust_domain
// and be the gateway's (config.MeshIdentity with the mesh on). New HBONE
// connections, both ways, use it from the next handshake; open ones keep
// theirs.
func (g *Gateway) SetCertificate(cert tls.Certificate, roots *x509.CertPool) error {
	roots, err := g.bundle(roots)
	if err != nil {
		return err
	}
	return g.installCertificate(&cert, roots)
}

// installCertificate checks cert and puts it, with roots, in force.
func (g *Gateway) installCertificate(cert *tls.Certificate, roots *x509.CertPool) error {
	if len(cert.Certificate) == 0 {
		return errors.New("gateway: certificate without a leaf")
	}
	leaf := cert.Leaf
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return fmt.Errorf("gateway: certificate: %w", err)
		}
	}
	parsed, err := identity.FromCertificate(leaf)
	if err != nil {
		return fmt.Errorf("gateway: certificate: %w", err)
	}
	id := parsed.String()
	if parsed.TrustDomain() != g.cfg.Gateway.TrustDomain {
		return fmt.Errorf("gateway: certificate: identity %s is not in gateway.trust_domain %q", id, g.cfg.Gateway.TrustDomain)
	}
	g.certMu.Lock()
	defer g.certMu.Unlock()
	switch g.identity {
	case id:
	case "":
		g.identity = id // once, in New (Options.Certificate): read without the lock afterwards
	default:
		return fmt.Errorf("gateway: certificate: identity %s, but this gateway is %s", id, g.identity)
	}
	g.cert, g.roots, g.notAfter = cert, roots, leaf.NotAfter
	g.certInForceLocked()
	return nil
}

// certInLocked is the channel closed once the first certificate is in
// force (made on first use).
func (g *Gateway) certInLocked() chan struct{} {
	if g.certIn == nil {
		g.certIn = make(chan struct{})
	}
	return g.certIn
}

// certInForceLocked closes certIn, once.
func (g *Gateway) certInForceLocked() {
	ch := g.certInLocked()
	g.certOnce.Do(func() { close(ch) })
}

// hasCertificate is closed once the first certificate is in force.
func (g *Gateway) hasCertificate() <-chan struct{} {
	g.certMu.Lock()
	defer g.certMu.Unlock()
	return g.certInLocked()
}

// AttachMesh tells the gateway of the mesh's clients, for its metrics
// and admin endpoints; either may be nil.
func (g *Gateway) AttachMesh(ca *mesh.CertManager, xds *mesh.XDSClient) {
	if ca != nil {
		g.metrics.ca.Store(ca)
	}
	if xds != nil {
		g.metrics.xds.Store(xds)
	}
}

// certs is the gateway as HBONE's certificate source.
func (g *Gateway) certs() certSource { return certSource{g} }

// certSource hands HBONE the certificate in force (hbone.CertSource).
type certSource struct{ g *Gateway }

var _ hbone.CertSource = certSource{}

// Current is the certificate in force, its roots and its expiry; a new
// certificate is a new pointer.
func (s certSource) Current() (*tls.Certificate, *x509.CertPool, time.Time) {
	s.g.certMu.Lock()
	defer s.g.certMu.Unlock()
	return s.g.cert, s.g.roots, s.g.notAfter
}

// Router is the routing table the gateway routes new captured flows with
// (`meshtun route` shows its plans).
func (g *Gateway) Router() *Router { return g.snapshot().router }

// Ready is closed once Run has its listeners, device and stack up and,
// with [mesh] on, its first certificate and istiod's first complete
// state: when readiness starts answering 200.
func (g *Gateway) Ready() <-chan struct{} { return g.readyCh }

// Serving is closed once Run has its listeners, device and stack up and
// serves what it can: the moment to tell a service manager it started.
// Without [mesh] it comes with Ready; with it, perhaps long before, while
// istiod does not answer (NotReady says what is missing).
func (g *Gateway) Serving() <-chan struct{} { return g.servingCh }

// NotReady says what the gateway still waits for before it is ready
// ("waiting for istiod: …"), "" when nothing (or while draining:
// "draining").
func (g *Gateway) NotReady() string { return g.notReady() }

// Identity is the SPIFFE ID this gateway presents (with the mesh on, the
// one it asks Istio's CA for, even before the first certificate).
func (g *Gateway) Identity() string { return g.identity }

// Run starts the gateway and blocks until ctx is cancelled, then drains
// and shuts down. It returns an error if anything fails to start; what it
// had started by then is undone.
func (g *Gateway) Run(ctx context.Context) (err error) {
	// closers undo what Run started, last first. The first one registered
	// (so the last to run) waits for the flows, which end once the stack,
	// the server and the pool below have closed their connections.
	var (
		closers  []func()
		routines sync.WaitGroup // goroutines Run starts; all end before Run returns
	)
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
		routines.Wait()
	}()
	closers = append(closers, g.flows.wait)
	g.loadOwnAddrs()
	if !g.cfg.Mesh.Enabled() {
		// tls.cert, tls.key and tls.trust_bundle are watched: a changed
		// set that loads is put in force, a broken one is refused and the
		// one in force kept (hbone/certfile).
		stop, err := g.watchCertFiles(&routines)
		if err != nil {
			return err
		}
		closers = append(closers, stop)
	}

	pool, err := hbone.NewPool(g.poolOptions())
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	g.pool = pool
	g.metrics.pool.Store(pool)
	closers = append(closers, func() { pool.Close() })

	// Listeners first: a port in use is the likeliest start-up failure,
	// and it should be reported before the device is touched.
	var hboneLn net.Listener
	if g.cfg.HBONE.Listen != "" {
		hboneLn, err = net.Listen("tcp", g.cfg.HBONE.Listen)
		if err != nil {
			return fmt.Errorf("gateway: hbone.listen: %w", err)
		}
		pl, err := newProbedListener(hboneLn, g.cfg.HBONE.Listen)
		if err != nil {
			hboneLn.Close()
			return err
		}
		hboneLn = pl // Check connects to it (health.go)
		g.hboneProbe.Store(pl)
		closers = append(closers, func() { hboneLn.Close() })
		srv, err := hbone.NewServer(hbone.ServerOptions{
			Source:               g.certs(),
			TrustDomain:          g.cfg.Gateway.TrustDomain,
			Handler:              g.handleInbound,
			NameAuthorities:      true, // through a network gateway (inbound.go)
			MaxConcurrentStreams: uint32(g.cfg.HBONE.MaxInboundStreamsPerConn),
			MaxConns:             g.cfg.HBONE.MaxInboundConns,
			HandshakeTimeout:     g.cfg.HBONE.HandshakeTimeout.Duration,
			Logger:               g.log.Named("hbone"),
		})
		if err != nil {
			return fmt.Errorf("gateway: %w", err)
		}
		g.server = srv
		g.metrics.server.Store(srv)
		closers = append(closers, func() { srv.Close() })
	}
	var eastWestLn net.Listener
	if g.cfg.Gateway.EastWest != "" {
		eastWestLn, err = net.Listen("tcp", g.cfg.Gateway.EastWest)
		if err != nil {
			return fmt.Errorf("gateway: gateway.east_west: %w", err)
		}
		closers = append(closers, func() { eastWestLn.Close() })
		srv, err := hbone.NewServer(hbone.ServerOptions{
			Source:               g.certs(),
			TrustDomain:          g.cfg.Gateway.TrustDomain,
			Handler:              g.handleEastWest,
			NameAuthorities:      true,
			MaxConcurrentStreams: uint32(g.cfg.HBONE.MaxInboundStreamsPerConn),
			MaxConns:             g.cfg.HBONE.MaxInboundConns,
			HandshakeTimeout:     g.cfg.HBONE.HandshakeTimeout.Duration,
			Logger:               g.log.Named("east-west"),
		})
		if err != nil {
			return fmt.Errorf("gateway: %w", err)
		}
		g.eastWestSrv = srv
		closers = append(closers, func() { srv.Close() })
	}
	// The HTTP endpoints for operators: readiness, the admin listener
	// (localhost by default; admin.go) and metrics (metrics.go).
	for _, ep := range []struct {
		key, addr string
		h         http.Handler
	}{
		{"admin.readiness", g.cfg.Admin.Readiness, g.readinessHandler()},
		{"admin.listen", g.cfg.Admin.Listen, g.adminHandler()},
		{"admin.metrics", g.cfg.Admin.Metrics, g.metricsHandler()},
	} {
		if ep.addr == "" {
			continue
		}
		ln, err := net.Listen("tcp", ep.addr)
		if err != nil {
			return fmt.Errorf("gateway: %s: %w", ep.key, err)
		}
		hs := &http.Server{Handler: ep.h, ReadHeaderTimeout: 5 * time.Second}
		closers = append(closers, func() { hs.Close() })
		routines.Add(1)
		go func() { defer routines.Done(); hs.Serve(ln) }()
	}

	var stack *netstack.Stack
	if g.cfg.TUN.Name != "" {
		dev, err := tun.Open(tun.Options{
			Name:      g.cfg.TUN.Name,
			MTU:       g.cfg.TUN.MTU,
			Addresses: g.cfg.TUN.Addresses,
			Routes:    g.cfg.TUN.Routes,
			Offload:   g.cfg.TUN.Offload,
			Logger:    g.log.Named("tun"),
			// Capture routes behind a rule our marked sockets skip: direct
			// dials and HBONE dials never loop into the TUN.
			Bypass: true,
		})
		if err != nil {
			return fmt.Errorf("gateway: tun: %w", err)
		}
		closers = append(closers, func() { dev.Close() })
		// Self-repair (tun/repair.go): what something else removes or
		// changes of the device's configuration comes back. It runs
		// through the drain (open flows still need the routes) and is
		// stopped before dev.Close removes them.
		repair := tun.NewRepairer(dev, nil)
		repairCtx, stopRepair := context.WithCancel(context.Background())
		repairDone := make(chan struct{})
		routines.Add(1)
		go func() {
			defer routines.Done()
			defer close(repairDone)
			if err := repair.Run(repairCtx); err != nil {
				g.log.Error("self-repair is off", "error", err)
			}
		}()
		closers = append(closers, func() { stopRepair(); <-repairDone })
		g.metrics.repair.Store(repair)
		stack, err = netstack.New(netstack.Options{
			Device:      dev,
			MaxInFlight: g.cfg.Netstack.MaxInFlight,
			Handler:     g.handleOutbound,
			Logger:      g.log.Named("netstack"),
		})
		if err != nil {
			return fmt.Errorf("gateway: netstack: %w", err)
		}
		closers = append(closers, func() { stack.Close() })
		g.metrics.stack.Store(stack)
	}
	if g.cfg.DNS.Enabled {
		// After the device: dns.listen is the TUN's address by default.
		stop, err := g.startDNS()
		if err != nil {
			return err
		}
		closers = append(closers, stop)
	}

	serveErr := make(chan error, 2)
	if g.server != nil {
		routines.Add(1)
		go func() { defer routines.Done(); serveErr <- g.server.Serve(hboneLn) }()
	}
	if g.eastWestSrv != nil {
		routines.Add(1)
		go func() { defer routines.Done(); serveErr <- g.eastWestSrv.Serve(eastWestLn) }()
	}
	close(g.servingCh)
	if g.cfg.Mesh.Enabled() {
		// Serving what the file gives meanwhile (plain TCP entries;
		// HBONE handshakes fail with hbone.ErrNoCertificate until the
		// CA's first certificate is in); ready once both the certificate
		// and the mesh's complete state are here (notReady says which
		// is missing).
		if g.notReady() != "" {
			g.log.Info("serving the file's entries; waiting for istiod (the CA's first certificate and the first complete xDS push) before reporting ready",
				"xds", g.cfg.Mesh.XDSAddress, "ca", g.cfg.Mesh.CAAddress)
		}
		for _, ch := range []<-chan struct{}{g.hasCertificate(), g.meshReady} {
			select {
			case <-ch:
			case <-ctx.Done():
				g.drain(stack)
				return nil
			case <-g.drainSig.quit:
				g.drain(stack)
				return nil
			case err := <-serveErr:
				return fmt.Errorf("gateway: hbone server stopped: %w", err)
			}
		}
	}
	g.ready.Store(true)
	close(g.readyCh)
	g.log.Info("ready", "identity", g.identity, "tun", g.cfg.TUN.Name, "hbone", g.cfg.HBONE.Listen)

	select {
	case <-ctx.Done():
	case <-g.drainSig.quit:
	case err := <-serveErr:
		g.ready.Store(false)
		return fmt.Errorf("gateway: hbone server stopped: %w", err)
	}
	g.drain(stack)
	return nil
}

// poolOptions are the options of the gateway's HBONE client pool.
func (g *Gateway) poolOptions() hbone.PoolOptions {
	return hbone.PoolOptions{
		Source:            g.certs(),
		MaxStreamsPerConn: g.cfg.HBONE.MaxStreamsPerConn,
		ConnsPerKey:       g.cfg.HBONE.ConnsPerPeer,
		IdleTimeout:       g.cfg.HBONE.IdleTimeout.Duration,
		ConnectTimeout:    g.cfg.HBONE.ConnectTimeout.Duration,
		Logger:            g.log.Named("hbone"),
		// Marked so that a peer's HBONE address inside a captured range
		// (ztunnel's convention is <workload ip>:15008) is reached over
		// the main table, not through our own TUN (tun/bypass.go).
		Control: tun.BypassControl,
	}
}

// drain refuses new flows, sends GOAWAY to HBONE peers and gives open
// flows the drain timeout to finish (or until EndDrain), and then the
// flows that ended the rest of it to deliver their last bytes: a flow ends
// in the gateway when its relay has written everything into the netstack
// Conn, and the stack's Close aborts every connection, so bytes not yet
// acknowledged by the client (the end of a reply, the FIN) would be lost
// and the client would read a RST instead (stack may be nil: no TUN).
// Run's deferred closers then end whatever is left.
func (g *Gateway) drain(stack *netstack.Stack) {
	timeout := g.snapshot().cfg.Gateway.DrainTimeout.Duration
	g.beginDrain()
	g.log.Info("draining", "timeout", timeout)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// EndDrain cuts it short: the HBONE shutdown and the wait below both
	// end with ctx. The goroutine ends with ctx, at the latest when drain
	// returns.
	go func() {
		select {
		case <-g.drainSig.hurry:
			cancel()
		case <-ctx.Done():
		}
	}()
	for _, srv := range []*hbone.Server{g.server, g.eastWestSrv} {
		if srv == nil {
			continue
		}
		if err := srv.Shutdown(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			g.log.Warn("hbone shutdown", "error", err)
		}
	}
	select {
	case <-g.flows.idleCh():
	case <-ctx.Done():
		select {
		case <-g.drainSig.hurry:
			g.log.Warn("drain ended early: closing the flows still open")
		default:
			g.log.Warn("drain timeout: closing the flows still open")
		}
		return
	}
	if stack != nil {
		if err := stack.WaitDelivered(ctx); err != nil {
			g.log.Warn("drain timeout: closing flows whose last bytes the client has not acknowledged", "error", err)
			return
		}
	}
	g.log.Info("drained")
}

func (g *Gateway) readinessHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz/ready", func(w http.ResponseWriter, r *http.Request) {
		if !g.ready.Load() || g.draining.Load() {
			reason := g.notReady()
			if reason == "" {
				reason = "starting"
			}
			http.Error(w, "not ready: "+reason, http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n"))
	})
	return mux
}

// notReady says what the gateway still waits for before it is ready, ""
// when nothing (Run may still be starting, or already draining).
func (g *Gateway) notReady() string {
	if g.draining.Load() {
		return "draining"
	}
	if !g.cfg.Mesh.Enabled() {
		return ""
	}
	var waits []string
	select {
	case <-g.hasCertificate():
	default:
		w := "waiting for istiod: no certificate from Istio's CA yet"
		if ca := g.metrics.ca.Load(); ca != nil {
			if e := ca.Stats().LastError; e != "" {
				w += " (last error: " + e + ")"
			}
		}
		waits = append(waits, w)
	}
	select {
	case <-g.meshReady:
	default:
		waits = append(waits, "waiting for istiod's first complete xDS push")
	}
	return strings.Join(waits, "; ")
}

// loadOwnAddrs records the host's addresses, for the loop check of
// inbound targets.
func (g *Gateway) loadOwnAddrs() {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		g.log.Warn("cannot list the host's addresses; loop protection covers loopback only", "error", err)
		return
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			g.ownAddrs[p.Addr().Unmap()] = true
		}
	}
}

// isOwnListener reports whether target is one of this gateway's own ports
// on one of this host's addresses.
func (g *Gateway) isOwnListener(target netip.AddrPort) bool {
	if !g.ownPorts[target.Port()] {
		return false
	}
	a := target.Addr().Unmap()
	return a.IsLoopback() || a.IsUnspecified() || g.ownAddrs[a]
}
