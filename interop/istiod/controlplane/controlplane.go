// Package controlplane runs Istio's own control-plane code in process and
// serves it the way istiod serves ztunnel on port 15012: one TLS gRPC
// listener carrying delta ADS (the Workload Discovery Service generators and
// ambient index of pilot/test/xds, over an in-memory Kubernetes client) and
// Istio's CA (IstioCertificateService with an in-memory IstioCA), both
// behind istiod's authenticators (client certificate, then Kubernetes JWT
// checked by a TokenReview).
//
// Tests create, change and delete Kubernetes objects through the
// ControlPlane and read back what Istio's ambient index holds, to compare
// it with what a client learned over the wire.
//
// Istio keeps process-wide state (feature flags read at init, metrics,
// krt debug handlers): run one ControlPlane at a time per process, and start
// the process with PILOT_ENABLE_AMBIENT=true (see ReexecWithAmbient).
package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	pb "istio.io/api/security/v1alpha1"
	"k8s.io/client-go/kubernetes/fake"

	"istio.io/istio/pilot/pkg/features"
	istiogrpc "istio.io/istio/pilot/pkg/grpc"
	fakexds "istio.io/istio/pilot/test/xds"
	"istio.io/istio/pkg/cluster"
	"istio.io/istio/pkg/keepalive"
	kubelib "istio.io/istio/pkg/kube"
	istiolog "istio.io/istio/pkg/log"
	"istio.io/istio/pkg/security"
	istioxds "istio.io/istio/pkg/xds"
	"istio.io/istio/security/pkg/pki/ca"
	caserver "istio.io/istio/security/pkg/server/ca"
	"istio.io/istio/security/pkg/server/ca/authenticate"
	"istio.io/istio/security/pkg/server/ca/authenticate/kubeauth"
)

// Defaults, each what a stock istiod uses unless said otherwise.
const (
	// DefaultClusterID is istiod's default CLUSTER_ID.
	DefaultClusterID = "Kubernetes"
	// DefaultServerName is the DNS name istiod's serving certificate carries
	// for in-cluster clients.
	DefaultServerName = "istiod.istio-system.svc"
	// TrustDomain is the default mesh config's trust domain.
	TrustDomain = "cluster.local"

	// defaultWorkloadCertTTL is istiod's DEFAULT_WORKLOAD_CERT_TTL.
	defaultWorkloadCertTTL = 24 * time.Hour
	// defaultMaxWorkloadCertTTL is istiod's MAX_WORKLOAD_CERT_TTL.
	defaultMaxWorkloadCertTTL = 90 * 24 * time.Hour
	// rootCertTTL is istiod's self-signed root lifetime
	// (CITADEL_SELF_SIGNED_CA_CERT_TTL, ten years).
	rootCertTTL = 10 * 365 * 24 * time.Hour
	// servingCertTTL outlives any test or demo run; istiod rotates its own
	// serving certificate, which the harness has no need to.
	servingCertTTL = 30 * 24 * time.Hour
	// caRSAKeySize is istiod's CITADEL_SELF_SIGNED_CA_RSA_KEY_SIZE.
	caRSAKeySize = 2048
	// defaultStartTimeout bounds the wait for Istio's informers and first
	// push; a cold start on a loaded 2-core machine takes a few seconds.
	defaultStartTimeout = 2 * time.Minute
)

// Options configures Start. The zero value serves on 127.0.0.1:0.
type Options struct {
	// Addr is the address to listen on; default "127.0.0.1:0". After Start
	// the resolved address is kept, so Restart serves on the same port.
	Addr string
	// Listen, if set, opens the listener (at Start and at every Restart)
	// instead of net.Listen("tcp", addr): e.g. to listen from inside a
	// network namespace.
	Listen func(addr string) (net.Listener, error)
	// Dir receives the root certificate and token files (created if
	// missing, left in place by Close); default a new temporary directory
	// removed by Close.
	Dir string
	// ClusterID is the cluster istiod serves; default "Kubernetes".
	ClusterID string
	// ServerName is the DNS SAN of the serving certificate; default
	// "istiod.istio-system.svc".
	ServerName string
	// WorkloadCertTTL is the lifetime of a workload certificate whose CSR
	// asks for none; default 24h.
	WorkloadCertTTL time.Duration
	// MaxWorkloadCertTTL caps what a CSR may ask for; default 90 days.
	MaxWorkloadCertTTL time.Duration
	// StartTimeout bounds Start; default 2 minutes.
	StartTimeout time.Duration
	// Logf receives the harness's and Istio's test-helper log lines;
	// default: discarded.
	Logf func(format string, args ...any)
	// IstioLogLevel sets the output level of every Istio log scope
	// ("debug", "info", "warn", "error", "none"); default "error".
	IstioLogLevel string
	// NoDebounce pushes every change as it comes (PILOT_DEBOUNCE_AFTER=0)
	// instead of merging the changes of istiod's 100 ms debounce: the
	// scale tests use it to make every change a push of its own. Changes
	// that arrive while a push is being made are merged all the same.
	NoDebounce bool
}

// ControlPlane is a running in-process istiod. Its methods are safe for
// concurrent use.
type ControlPlane struct {
	opts     Options
	failer   *failer
	fake     *fakexds.FakeDiscoveryServer
	ca       *ca.IstioCA
	caServer *caserver.Server
	tls      *tls.Config
	rootPEM  []byte
	rootFile string
	dir      string
	ownDir   bool
	tokens   *tokens

	caHook atomic.Pointer[CAHook]

	mu        sync.Mutex
	addr      string
	server    *grpc.Server
	serveDone chan struct{}
	closed    bool
}

// ReexecWithAmbient makes sure the process runs with PILOT_ENABLE_AMBIENT=true
// in its environment from the start, as an ambient istiod does: Istio's
// features package derives several ambient flags (waypoints, HBONE sending,
// status) from it while the program initializes, so setting it later is too
// late. If the variable is not already "true", it replaces the process with
// the same executable, arguments and environment plus that variable; it
// returns only when no re-exec was needed, or with the reason it failed.
// Call it first in main or TestMain.
func ReexecWithAmbient() error {
	if os.Getenv("PILOT_ENABLE_AMBIENT") == "true" {
		return nil
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("controlplane: re-exec with PILOT_ENABLE_AMBIENT: %w", err)
	}
	env := append(os.Environ(), "PILOT_ENABLE_AMBIENT=true")
	if err := syscall.Exec(exe, os.Args, env); err != nil {
		return fmt.Errorf("controlplane: re-exec with PILOT_ENABLE_AMBIENT: %w", err)
	}
	return nil
}

// Start runs Istio's discovery server and CA and serves them on one TLS gRPC
// listener. Close releases everything it started.
func Start(opts Options) (*ControlPlane, error) {
	if !features.EnableAmbient || !features.EnableAmbientWaypoints {
		return nil, errors.New("controlplane: Istio's ambient flags are off: start the process with " +
			"PILOT_ENABLE_AMBIENT=true (call controlplane.ReexecWithAmbient first in main or TestMain)")
	}
	if opts.Addr == "" {
		opts.Addr = "127.0.0.1:0"
	}
	if opts.Listen == nil {
		opts.Listen = func(addr string) (net.Listener, error) { return net.Listen("tcp", addr) }
	}
	if opts.ClusterID == "" {
		opts.ClusterID = DefaultClusterID
	}
	if opts.ServerName == "" {
		opts.ServerName = DefaultServerName
	}
	if opts.WorkloadCertTTL == 0 {
		opts.WorkloadCertTTL = defaultWorkloadCertTTL
	}
	if opts.MaxWorkloadCertTTL == 0 {
		opts.MaxWorkloadCertTTL = defaultMaxWorkloadCertTTL
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = defaultStartTimeout
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	if opts.IstioLogLevel == "" {
		opts.IstioLogLevel = "error"
	}
	if err := setIstioLogLevel(opts.IstioLogLevel); err != nil {
		return nil, err
	}

	c := &ControlPlane{opts: opts, failer: &failer{logf: opts.Logf}, dir: opts.Dir}
	if c.dir != "" {
		if err := os.MkdirAll(c.dir, 0o755); err != nil {
			return nil, fmt.Errorf("controlplane: %w", err)
		}
	} else {
		dir, err := os.MkdirTemp("", "fake-istiod-")
		if err != nil {
			return nil, fmt.Errorf("controlplane: %w", err)
		}
		c.dir, c.ownDir = dir, true
	}
	c.tokens = newTokens(c.dir)
	if err := c.start(); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *ControlPlane) start() error {
	srv, err := c.startDiscovery()
	if err != nil {
		return err
	}
	c.fake = srv

	caOpts, err := ca.NewSelfSignedDebugIstioCAOptions("", rootCertTTL, c.opts.WorkloadCertTTL,
		c.opts.MaxWorkloadCertTTL, TrustDomain, caRSAKeySize)
	if err != nil {
		return fmt.Errorf("controlplane: ca options: %w", err)
	}
	c.ca, err = ca.NewIstioCA(caOpts)
	if err != nil {
		return fmt.Errorf("controlplane: ca: %w", err)
	}
	c.rootPEM = c.ca.GetCAKeyCertBundle().GetRootCertPem()
	c.rootFile = filepath.Join(c.dir, "root-cert.pem")
	if err := os.WriteFile(c.rootFile, c.rootPEM, 0o644); err != nil {
		return fmt.Errorf("controlplane: root cert: %w", err)
	}
	if c.tls, err = c.servingTLS(); err != nil {
		return err
	}

	// The authenticators istiod installs for both xDS and the CA: a client
	// certificate from this CA, else a Kubernetes service-account JWT
	// reviewed by the API server of the cluster named in "clusterid".
	authenticators := []security.Authenticator{
		&authenticate.ClientCertAuthenticator{},
		kubeauth.NewKubeJWTAuthenticator(srv.Env().Watcher, srv.KubeClient().Kube(),
			cluster.ID(c.opts.ClusterID), nil, nil),
	}
	srv.Discovery.Authenticators = authenticators
	c.caServer, err = caserver.New(c.ca, c.opts.MaxWorkloadCertTTL, authenticators, nil)
	if err != nil {
		return fmt.Errorf("controlplane: ca server: %w", err)
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	c.addr = c.opts.Addr
	return c.serveLocked()
}

// startDiscovery builds Istio's FakeDiscoveryServer on the harness failer,
// bounded by StartTimeout.
func (c *ControlPlane) startDiscovery() (*fakexds.FakeDiscoveryServer, error) {
	done := make(chan struct{})
	var srv *fakexds.FakeDiscoveryServer
	// istiod's PILOT_DEBOUNCE_AFTER (100ms by default), not the test
	// default of none: the delay from a change to its push is then the
	// one a real mesh shows.
	debounce := features.DebounceAfter
	if c.opts.NoDebounce {
		debounce = 0
	}
	go func() {
		defer close(done)
		srv = fakexds.NewFakeDiscoveryServer(c.failer, fakexds.FakeOptions{
			DefaultClusterName: cluster.ID(c.opts.ClusterID),
			DebounceTime:       debounce,
			KubeClientModifier: func(client kubelib.Client) {
				client.Kube().(*fake.Clientset).PrependReactor("create", "tokenreviews", c.tokens.review)
			},
		})
	}()
	timer := time.NewTimer(c.opts.StartTimeout)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		return nil, fmt.Errorf("controlplane: discovery server not ready after %v", c.opts.StartTimeout)
	}
	if err := c.failer.failed(); err != nil {
		return nil, fmt.Errorf("controlplane: discovery server: %w", err)
	}
	if srv == nil || srv.AmbientIndex == nil {
		return nil, errors.New("controlplane: discovery server started without an ambient index")
	}
	return srv, nil
}

// servingTLS issues the listener's certificate from the CA for ServerName and
// builds the TLS config istiod uses on 15012: client certificates are
// verified if given (they authenticate a caller too), not required.
func (c *ControlPlane) servingTLS() (*tls.Config, error) {
	certPEM, keyPEM, err := c.ca.GenKeyCert([]string{c.opts.ServerName}, servingCertTTL, false)
	if err != nil {
		return nil, fmt.Errorf("controlplane: serving cert: %w", err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("controlplane: serving cert: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(c.rootPEM) {
		return nil, errors.New("controlplane: root cert: no certificate in PEM")
	}
	return &tls.Config{
		Certificates: []tls.Certificate{pair},
		ClientAuth:   tls.VerifyClientCertIfGiven,
		ClientCAs:    roots,
		MinVersion:   tls.VersionTLS12,
	}, nil
}

// serveLocked listens on c.addr and serves xDS and the CA on it.
func (c *ControlPlane) serveLocked() error {
	lis, err := c.opts.Listen(c.addr)
	if err != nil {
		return fmt.Errorf("controlplane: listen %s: %w", c.addr, err)
	}
	c.addr = lis.Addr().String()
	opts := istiogrpc.ServerOptions(keepalive.DefaultOption(), istioxds.RecordRecvSize)
	opts = append(opts, grpc.Creds(credentials.NewTLS(c.tls)), grpc.ChainUnaryInterceptor(c.interceptCA))
	server := grpc.NewServer(opts...)
	c.fake.Discovery.Register(server)
	c.caServer.Register(server)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := server.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			c.opts.Logf("controlplane: serve %s: %v", c.addr, err)
		}
	}()
	c.server, c.serveDone = server, done
	return nil
}

// stopLocked ends serving, dropping every open stream, and waits for the
// serving goroutine.
func (c *ControlPlane) stopLocked() {
	if c.server == nil {
		return
	}
	c.server.Stop()
	<-c.serveDone
	c.server, c.serveDone = nil, nil
}

// CAHook sees each CreateCertificate call before Istio's CA does, for
// fault tests: it may change the request (a shorter ValidityDuration: a CA
// that issues for less than asked), hold it (a slow CA; ctx ends with the
// call) or refuse it (a non-nil error is the call's answer; a gRPC status
// keeps its code).
type CAHook func(ctx context.Context, req *pb.IstioCertificateRequest) error

// SetCAHook puts h (nil: none) in front of Istio's CA for the calls that
// arrive from now on.
func (c *ControlPlane) SetCAHook(h CAHook) {
	if h == nil {
		c.caHook.Store(nil)
		return
	}
	c.caHook.Store(&h)
}

// interceptCA runs the CAHook, if any, before a CreateCertificate call.
func (c *ControlPlane) interceptCA(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	if h := c.caHook.Load(); h != nil {
		if r, ok := req.(*pb.IstioCertificateRequest); ok {
			if err := (*h)(ctx, r); err != nil {
				return nil, err
			}
		}
	}
	return next(ctx, req)
}

// NACKs returns, for each connected xDS client (by its connection id: the
// proxy id and a counter) that NACKed a response of typeURL, the reason it
// gave last: what istiod keeps of a NACK.
func (c *ControlPlane) NACKs(typeURL string) map[string]string {
	out := map[string]string{}
	for _, con := range c.fake.Discovery.AllClients() {
		p := con.Proxy()
		if p == nil {
			continue
		}
		if wr := p.GetWatchedResource(typeURL); wr != nil && wr.LastError != "" {
			out[con.ID()] = wr.LastError
		}
	}
	return out
}

// Addr is the address the control plane serves on ("127.0.0.1:port").
func (c *ControlPlane) Addr() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.addr
}

// ServerName is the DNS name in the serving certificate, for a client's TLS
// server_name.
func (c *ControlPlane) ServerName() string { return c.opts.ServerName }

// ClusterID is the cluster the control plane serves (the "clusterid" header
// and CLUSTER_ID node metadata a client sends).
func (c *ControlPlane) ClusterID() string { return c.opts.ClusterID }

// RootCertPEM is the CA's root certificate, which verifies both the serving
// certificate and every workload certificate the CA issues.
func (c *ControlPlane) RootCertPEM() []byte { return append([]byte(nil), c.rootPEM...) }

// RootCertFile is a file holding RootCertPEM.
func (c *ControlPlane) RootCertFile() string { return c.rootFile }

// Token issues a service-account token for namespace/serviceAccount with the
// audience istiod asks for ("istio-ca"), writes it to a new file and returns
// the file's path.
func (c *ControlPlane) Token(namespace, serviceAccount string) (string, error) {
	return c.tokens.issue(namespace, serviceAccount, []string{Audience})
}

// TokenWithAudience is Token with other audiences: a token whose audiences
// miss "istio-ca" is refused by the review.
func (c *ControlPlane) TokenWithAudience(namespace, serviceAccount string, audiences ...string) (string, error) {
	return c.tokens.issue(namespace, serviceAccount, audiences)
}

// BadToken writes a well-formed token this control plane never issued, which
// the review refuses, and returns the file's path.
func (c *ControlPlane) BadToken() (string, error) { return c.tokens.unknown() }

// Stop stops serving: the listener closes and every open stream ends, as when
// istiod goes away. Istio's state (objects, index) stays; Restart serves it
// again. Stop is idempotent.
func (c *ControlPlane) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopLocked()
}

// Restart stops serving if serving and serves again on the same address.
func (c *ControlPlane) Restart() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errors.New("controlplane: restart after close")
	}
	c.stopLocked()
	return c.serveLocked()
}

// Close stops serving and tears down Istio's servers, informers and files.
// It is idempotent.
func (c *ControlPlane) Close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.stopLocked()
	c.mu.Unlock()
	c.failer.runCleanups()
	if c.ownDir {
		_ = os.RemoveAll(c.dir)
	}
}

func setIstioLogLevel(name string) error {
	levels := map[string]istiolog.Level{
		"debug": istiolog.DebugLevel, "info": istiolog.InfoLevel, "warn": istiolog.WarnLevel,
		"error": istiolog.ErrorLevel, "none": istiolog.NoneLevel,
	}
	level, ok := levels[name]
	if !ok {
		return fmt.Errorf("controlplane: istio log level %q: want debug, info, warn, error or none", name)
	}
	for _, scope := range istiolog.Scopes() {
		scope.SetOutputLevel(level)
	}
	return nil
}
