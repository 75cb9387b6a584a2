package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/dnsproxy"
	"github.com/meshtun/meshtun/gateway"
	"github.com/meshtun/meshtun/mesh"
	"github.com/meshtun/meshtun/tun"
)

// defaultConfig is where a node's config lives.
const defaultConfig = "/etc/meshtun/gateway.toml"

// load is the one path from a file to a gateway ready to run: parse,
// defaults, every semantic check, certificate files, then everything
// gateway.New checks. `run`, `validate` and a reload (SIGHUP) all go
// through it, so validate accepts exactly what run accepts. The config's
// own errors are printed to stderr (all of them) and reported as exit
// status 1.
func load(path string, stderr io.Writer, log func(*config.Config) hclog.Logger) (*gateway.Gateway, *config.Config, error) {
	g, cfg, err := check(path, log)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return nil, nil, exitError{1}
	}
	return g, cfg, nil
}

// check is load without the printing: config.Load, then gateway.New (which
// opens no device and no socket).
func check(path string, log func(*config.Config) hclog.Logger) (*gateway.Gateway, *config.Config, error) {
	cfg, err := config.Load(path)
	if err != nil {
		return nil, nil, err
	}
	var l hclog.Logger
	if log != nil {
		l = log(cfg)
	}
	g, err := gateway.New(cfg, l)
	if err != nil {
		return nil, nil, err
	}
	return g, cfg, nil
}

func cmdValidate(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("validate", stderr)
	path := fs.String("config", defaultConfig, "the gateway's TOML config file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	_, cfg, err := load(*path, stderr, nil)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: ok (%d peers, %d workloads, %d services, %d policies)\n",
		*path, len(cfg.Peers), len(cfg.Workloads), len(cfg.Services), len(cfg.Policies))
	return nil
}

func cmdRun(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("run", stderr)
	path := fs.String("config", defaultConfig, "the gateway's TOML config file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var log hclog.Logger
	g, cfg, err := load(*path, stderr, func(cfg *config.Config) hclog.Logger {
		log = newLogger(cfg, stderr)
		return log
	})
	if err != nil {
		return err
	}
	sd, err := newNotifier()
	if err != nil {
		log.Warn("not telling systemd our state", "error", err)
	}
	defer sd.Close()
	// SIGHUP reloads the config: `systemctl reload`, or kill -HUP.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// A second signal while draining ends the drain: the flows still open
	// are closed now, the device and routes removed as on any stop. A
	// third exits at once (ExecStopPost's cleanup removes what is left).
	// The goroutine ends when cmdRun returns (returned).
	returned := make(chan struct{})
	defer close(returned)
	go func() {
		select {
		case <-ctx.Done():
		case <-returned:
			return
		}
		stop()
		again := make(chan os.Signal, 2)
		signal.Notify(again, syscall.SIGTERM, syscall.SIGINT)
		defer signal.Stop(again)
		for n := 2; ; n++ {
			select {
			case <-again:
			case <-returned:
				return
			}
			if n == 2 {
				log.Warn("second signal: ending the drain now")
				g.EndDrain()
				continue
			}
			log.Warn("third signal: exiting without cleaning up")
			os.Exit(1)
		}
	}()
	log.Info("starting", "config", *path, "name", cfg.Gateway.Name)
	if cfg.Mesh.Enabled() {
		// The gateway runs at once, istiod reachable or not: it serves
		// what the file gives, and its HBONE handshakes fail cleanly
		// until the CA's first certificate is in. READY=1 goes out as it
		// serves, with a STATUS= saying what it waits for; readiness
		// (/healthz/ready) waits for that certificate and xDS's first
		// complete push (Gateway.Run).
		if percent, ok := meshGCPercent(os.LookupEnv); ok {
			debug.SetGCPercent(percent)
			log.Debug("mesh: the collector runs at a heap of 1.5 times what is live", "GOGC", percent)
		}
		m, err := startMesh(cfg, g, log)
		if err != nil {
			return err
		}
		defer m.Close()
	}
	runErr := make(chan error, 1)
	go func() { runErr <- g.Run(ctx) }()

	// systemd's watchdog (WatchdogSec=): fed from the self-check once
	// ready, until the drain (watchdog.go).
	interval, err := watchdogInterval()
	if err != nil {
		log.Warn("systemd watchdog off", "error", err)
	}
	var (
		wd       *watchdog
		wdTicker *time.Ticker
		wdTick   <-chan time.Time
		checked  = make(chan error, 1) // one check at a time: never blocks
		checking bool
		checks   sync.WaitGroup // the check goroutine; ends within wd.timeout()
		base     string         // STATUS= as the gateway's state has it; wd.status adds the health
	)
	defer checks.Wait()
	defer func() {
		if wdTicker != nil {
			wdTicker.Stop()
		}
	}()
	startCheck := func() {
		checking = true
		checks.Add(1)
		go func() { defer checks.Done(); checked <- wd.run() }()
	}

	// Draining: SIGTERM (ctx) or POST /quitquitquit. READY=1 when the
	// gateway serves; with [mesh] it may be ready (istiod answered) only
	// later, which STATUS= then says: ready is watched once serving was.
	serving, draining := g.Serving(), g.Draining()
	var ready <-chan struct{}
	for {
		select {
		case <-ready:
			ready = nil
			if draining == nil {
				continue
			}
			base = "serving, config " + *path
			notify(sd, log, "STATUS="+wd.status(base))
		case <-serving:
			serving = nil
			if draining == nil { // a SIGTERM during start-up already said STOPPING=1
				continue
			}
			base = "serving, config " + *path
			if why := g.NotReady(); why != "" {
				base = "serving the file's entries, " + why
				ready = g.Ready()
			}
			notify(sd, log, "READY=1", "STATUS="+base)
			if interval > 0 {
				wd = &watchdog{interval: interval, check: g.Check}
				wdTicker = time.NewTicker(wd.period())
				wdTick = wdTicker.C
				log.Info("systemd watchdog: pinging while the self-check passes", "every", wd.period(), "watchdog", interval)
				startCheck()
			}
		case <-wdTick:
			if !checking { // else the last check is still running: no ping this time
				startCheck()
			}
		case err := <-checked:
			checking = false
			if draining == nil {
				continue
			}
			lines, changed := wd.result(err)
			if changed {
				if err != nil {
					log.Error("self-check failed: not pinging systemd's watchdog, which restarts the gateway when WatchdogSec passes without one", "error", err)
				} else {
					log.Info("self-check passes again: pinging systemd's watchdog")
				}
				lines = append(lines, "STATUS="+wd.status(base))
			}
			if len(lines) > 0 {
				notify(sd, log, lines...)
			}
		case <-hup:
			if draining == nil {
				log.Warn("reload ignored: draining")
				continue
			}
			if serving != nil { // before READY=1 systemd expects no reload protocol
				reload(*path, g, log)
				continue
			}
			notify(sd, log, "RELOADING=1", monotonicUsec(), "STATUS=reloading "+*path)
			base = reload(*path, g, log)
			notify(sd, log, "READY=1", "STATUS="+wd.status(base))
		case <-draining:
			draining = nil
			if wdTicker != nil { // systemd watches no stopping service
				wdTicker.Stop()
				wdTick = nil
			}
			notify(sd, log, "STOPPING=1", "STATUS=draining")
		case err := <-runErr:
			if err != nil {
				return err
			}
			log.Info("stopped")
			return nil
		}
	}
}

// reload loads the config file again through the same path as at start and
// hands it to the gateway. A config with any error changes nothing: every
// error is logged with its key path (and line, when known) and the gateway
// keeps its running config. It returns a one-line status for systemd.
func reload(path string, g *gateway.Gateway, log hclog.Logger) string {
	log.Info("reload: loading the config again", "config", path)
	_, cfg, err := check(path, nil)
	if err == nil {
		var changed, restart []string
		changed, restart, err = g.Reload(cfg)
		if err == nil {
			status := "serving, reloaded " + path
			if len(changed) > 0 {
				status += "; applied " + strings.Join(changed, ",")
			}
			if len(restart) > 0 {
				status += "; needs a restart for " + strings.Join(restart, ",")
			}
			return status
		}
	}
	var cerrs *config.Errors
	if errors.As(err, &cerrs) {
		for _, e := range cerrs.List {
			args := []any{"config", path, "key", e.Path}
			if e.Line > 0 {
				args = append(args, "line", e.Line, "column", e.Column)
			}
			log.Error("reload: config error", append(args, "error", e.Msg)...)
		}
	}
	log.Error("reload failed; still running the previous config", "config", path, "error", err)
	return "serving the previous config; reload of " + path + " failed"
}

// notify sends one message to systemd, if it is listening.
func notify(sd *notifier, log hclog.Logger, lines ...string) {
	if err := sd.send(lines...); err != nil {
		log.Warn("systemd notify", "message", lines[0], "error", err)
	}
}

func cmdCleanup(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("cleanup", stderr)
	path := fs.String("config", defaultConfig, "the gateway's TOML config file")
	name := fs.String("tun", "", "the device name (default: tun.name from the config)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dev := *name
	if dev == "" {
		data, err := os.ReadFile(*path)
		if err != nil {
			return err
		}
		// Parse, not Load: cleanup must work even when the certificates
		// are gone.
		cfg, err := config.Parse(data, *path)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return exitError{1}
		}
		dev = cfg.TUN.Name
	}
	// systemd-resolved's settings for the link (dns.enabled) go first:
	// they die with the link, and a link already gone has none.
	if _, err := net.InterfaceByName(dev); err == nil {
		if err := dnsproxy.RevertResolved(dev); err != nil {
			fmt.Fprintf(stderr, "meshtun cleanup: %v\n", err)
		}
	}
	if err := tun.Cleanup(dev); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "removed %s and meshtun's routes and rules\n", dev)
	return nil
}

// newLogger builds the one root logger, from [log].
func newLogger(cfg *config.Config, w io.Writer) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:       "meshtun",
		Level:      hclog.LevelFromString(cfg.Log.Level),
		Output:     w,
		JSONFormat: cfg.Log.Format == "json",
	})
}

// meshWaitLog is how often `run` says it is still waiting for the first
// certificate: often enough to be seen while someone looks at a starting
// node, rarely enough not to flood a log while istiod is down for long
// (the CertManager also logs each failed request, at its backoff).
const meshWaitLog = 30 * time.Second

// meshNode is this node as istiod sees it, from [gateway] and [mesh]:
// NAME = gateway.name, NAMESPACE and SERVICE_ACCOUNT = mesh.namespace and
// mesh.service_account, INSTANCE_IPS = mesh.instance_ips or else the
// host's own addresses (hostAddrs).
func meshNode(cfg *config.Config, hostAddrs func() ([]netip.Addr, error)) (mesh.Node, error) {
	n := mesh.Node{
		Name:           cfg.Gateway.Name,
		Namespace:      cfg.Mesh.Namespace,
		ServiceAccount: cfg.Mesh.ServiceAccount,
		InstanceIPs:    cfg.Mesh.InstanceIPs,
		ClusterID:      cfg.Mesh.ClusterID,
		Network:        cfg.Mesh.Network,
	}
	if h, err := os.Hostname(); err == nil {
		n.NodeName = h
	}
	if len(n.InstanceIPs) == 0 {
		ips, err := hostAddrs()
		if err != nil {
			return n, fmt.Errorf("mesh: the host's addresses, for INSTANCE_IPS: %w", err)
		}
		if len(ips) == 0 {
			return n, errors.New("mesh: the host has no global unicast address for INSTANCE_IPS: set mesh.instance_ips")
		}
		n.InstanceIPs = ips
	}
	return n, nil
}

// meshClients are the mesh's CA and xDS clients of one run, and the
// goroutine that hands each certificate to the gateway (watch).
type meshClients struct {
	ca      *mesh.CertManager
	xds     *mesh.XDSClient
	watched chan struct{} // closed when watch has ended
}

// Close closes both clients and waits for watch, which ends when the
// CertManager closes its subscription.
func (m *meshClients) Close() {
	m.xds.Close()
	m.ca.Close()
	if m.watched != nil {
		<-m.watched
	}
}

// watch gives g each certificate the CertManager issues, the first and
// each renewal: HBONE's client and server take it from their next
// handshake; open connections keep theirs. Until the first, it says
// every interval (meshWaitLog) that it is still waiting and why. It
// subscribes before it returns, so call it before m.ca.Start.
func (m *meshClients) watch(g *gateway.Gateway, log hclog.Logger, caAddr string, every time.Duration) {
	changed, _ := m.ca.Subscribe() // closed by m.ca.Close
	m.watched = make(chan struct{})
	go func() {
		defer close(m.watched)
		tick := time.NewTicker(every)
		defer tick.Stop()
		first := true
		for {
			select {
			case _, ok := <-changed:
				if !ok {
					return
				}
			case <-tick.C:
				if first {
					log.Warn("mesh: still waiting for istiod: no certificate from Istio's CA yet; serving the file's entries",
						"ca", caAddr, "last_error", m.ca.Stats().LastError)
				}
				continue
			}
			cert, roots, expiry := m.ca.Current()
			if cert == nil {
				log.Error("mesh: the certificate has expired and the CA has not issued a new one: new HBONE connections fail")
				continue
			}
			if err := g.SetCertificate(*cert, roots); err != nil {
				log.Error("mesh: certificate from Istio's CA refused", "error", err)
				continue
			}
			if first {
				first = false
				tick.Stop()
				log.Info("mesh: certificate from Istio's CA; HBONE is on", "identity", m.ca.Identity(), "expiry", expiry)
				continue
			}
			log.Info("mesh: certificate renewed; new HBONE connections use it", "expiry", expiry)
		}
	}()
}

// startMesh starts the CA and xDS clients of [mesh] for g: what each xDS
// update changed is converted by a mesh.Tracker and applied
// (Gateway.ApplyMeshChanges), at the cost of the change; a resource
// the conversion refuses is NACKed (mesh.Validate); each certificate the
// CA issues is given to g (watch). It returns at once, istiod reachable or
// not: the clients retry with backoff, and g serves meanwhile. The caller
// closes the clients.
// meshGCPercent is the collector's target (GOGC) for a gateway in a mesh,
// and false when the environment sets GOGC itself. Such a gateway's heap
// is mostly the mesh's state, which lives as long as the process, and
// Go's default of 100 lets the heap grow to twice what is live before it
// collects: twice the memory of every workload in the mesh, for the
// garbage of a few pushes. 50 holds a 20,000-pod mesh in about a quarter
// less memory; the collections it adds cost the data path nothing
// measurable (issue "Scale with the mesh", docs/field-notes.md).
func meshGCPercent(lookup func(string) (string, bool)) (int, bool) {
	if _, set := lookup("GOGC"); set {
		return 0, false // the operator's choice
	}
	return 50, true
}

func startMesh(cfg *config.Config, g *gateway.Gateway, log hclog.Logger) (*meshClients, error) {
	node, err := meshNode(cfg, mesh.HostAddresses)
	if err != nil {
		return nil, err
	}
	cp := mesh.ControlPlane{
		Address:    cfg.Mesh.XDSAddress,
		RootCert:   cfg.Mesh.RootCert,
		ServerName: cfg.Mesh.ServerName,
		TokenFile:  cfg.Mesh.TokenFile,
		ClusterID:  cfg.Mesh.ClusterID,
	}
	if cfg.TUN.Name != "" {
		// istiod's address may be a ClusterIP inside tun.routes: the mark
		// sends these sockets by the main table, never into our own TUN.
		cp.Control = tun.BypassControl
	}
	caCP := cp
	caCP.Address = cfg.Mesh.CAAddress
	ca, err := mesh.NewCertManager(mesh.CAOptions{
		ControlPlane:   caCP,
		TrustDomain:    cfg.Gateway.TrustDomain,
		Namespace:      cfg.Mesh.Namespace,
		ServiceAccount: cfg.Mesh.ServiceAccount,
		CertTTL:        cfg.Mesh.CertTTL.Duration,
		Logger:         log.Named("mesh.ca"),
	})
	if err != nil {
		return nil, fmt.Errorf("mesh: %w", err)
	}
	// The Tracker is the XDSClient goroutine's: OnDelta calls are serial.
	tracker := mesh.NewTracker(node)
	xds, err := mesh.NewXDSClient(mesh.XDSOptions{
		ControlPlane: cp,
		Node:         node,
		Validate:     mesh.Validate,
		OnDelta:      func(u mesh.Update) { g.ApplyMeshChanges(tracker.Apply(u.Delta), u.Ready, u.Generation) },
		Logger:       log.Named("mesh.xds"),
	})
	if err != nil {
		ca.Close()
		return nil, fmt.Errorf("mesh: %w", err)
	}
	m := &meshClients{ca: ca, xds: xds}
	g.AttachMesh(ca, xds)
	m.watch(g, log, caCP.Address, meshWaitLog)
	ca.Start()
	xds.Start()
	log.Info("mesh: joining; waiting for istiod (the gateway serves the file's entries meanwhile)",
		"xds", cp.Address, "ca", caCP.Address, "identity", ca.Identity(), "node_id", xds.NodeID())
	return m, nil
}
