package mesh

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
)

// ControlPlane says how to reach one istiod endpoint (the CA or xDS) and
// how to authenticate to it. The same values serve both clients.
type ControlPlane struct {
	// Address is host:port of the gRPC endpoint, e.g.
	// "istiod.istio-system.svc:15012".
	Address string
	// RootCert is a PEM file holding the roots that verify istiod's serving
	// certificate. It must be readable when the client is made, and it is
	// read again for each new connection, so a rotated root needs no
	// restart (a broken file fails that connection; the old roots are not
	// used for it).
	RootCert string
	// ServerName is the name istiod's serving certificate must carry (and
	// the TLS SNI). Empty: the host of Address.
	ServerName string
	// TokenFile holds the JWT (audience istio-ca) sent as
	// "authorization: Bearer <token>". It is read again for every call, so a
	// rotated token is used at once. Empty: no authorization header.
	TokenFile string
	// ClusterID is sent as the "clusterid" header on every call; istiod uses
	// it to pick the cluster that validates the token.
	ClusterID string
	// Control, if set, is called on each socket before it connects (as
	// net.Dialer.Control): the gateway marks its sockets so that istiod's
	// address, when it lies inside a captured range (a ClusterIP), is
	// reached over the main routing table and not through the TUN.
	Control func(network, address string, c syscall.RawConn) error
}

// Logger is what the clients log through. Both *slog.Logger and
// hclog.Logger satisfy it; args are alternating keys and values.
type Logger interface {
	Debug(msg string, args ...any)
	Info(msg string, args ...any)
	Warn(msg string, args ...any)
	Error(msg string, args ...any)
}

type nopLogger struct{}

func (nopLogger) Debug(string, ...any) {}
func (nopLogger) Info(string, ...any)  {}
func (nopLogger) Warn(string, ...any)  {}
func (nopLogger) Error(string, ...any) {}

func orNop(l Logger) Logger {
	if l == nil {
		return nopLogger{}
	}
	return l
}

const (
	// grpcKeepaliveTime matches the 30 s istiod uses for itself; istiod's
	// enforcement policy allows pings every Time/2, so this never earns a
	// "too_many_pings" GOAWAY, and it finds a dead istiod behind a silent
	// network path within a minute.
	grpcKeepaliveTime = 30 * time.Second
	// grpcKeepaliveTimeout is how long a ping may go unanswered (istiod's
	// own default).
	grpcKeepaliveTimeout = 10 * time.Second
	// grpcMaxRecvMsgSize bounds one xDS response. gRPC's default of 4 MiB is
	// exceeded by the first Address push of a mesh with some thousands of
	// pods; ztunnel allows 200 MiB for the same reason.
	grpcMaxRecvMsgSize = 200 << 20
	// grpcMinConnectTimeout bounds one TCP+TLS connection attempt.
	grpcMinConnectTimeout = 10 * time.Second
)

// check validates the fields and fills in the defaults; what is the name of
// the options block for error messages ("ca" or "xds").
func (cp *ControlPlane) check(what string) error {
	if cp.Address == "" {
		return fmt.Errorf("%s: address is required", what)
	}
	host, port, err := net.SplitHostPort(cp.Address)
	if err != nil || host == "" || port == "" {
		return fmt.Errorf("%s: address %q is not host:port", what, cp.Address)
	}
	if cp.ServerName == "" {
		cp.ServerName = host
	}
	if cp.RootCert == "" {
		return fmt.Errorf("%s: root certificate file is required", what)
	}
	return nil
}

// dial makes a gRPC client connection to cp (it connects lazily, on the
// first call). backoff bounds gRPC's own reconnection delays, so a server
// that comes back is found as quickly as the caller's retry loop expects.
func dial(cp ControlPlane, b backoffConfig) (*grpc.ClientConn, error) {
	roots, err := newRootFile(cp.RootCert)
	if err != nil {
		return nil, err
	}
	tlsConf := &tls.Config{
		ServerName: cp.ServerName,
		MinVersion: tls.VersionTLS12,
		// The chain is verified in VerifyConnection instead, against the
		// root file as it is at this handshake, so a rotated root is used
		// without a restart. Nothing else is skipped: the checks are those
		// of the default verification (chain, server auth usage, name).
		InsecureSkipVerify: true,
		VerifyConnection:   roots.verify(cp.ServerName),
	}
	dialer := &net.Dialer{Control: cp.Control}
	conn, err := grpc.NewClient(cp.Address,
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return dialer.DialContext(ctx, "tcp", addr)
		}),
		grpc.WithTransportCredentials(credentials.NewTLS(tlsConf)),
		grpc.WithPerRPCCredentials(tokenCredentials{file: cp.TokenFile, clusterID: cp.ClusterID}),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: grpcbackoff.Config{
				BaseDelay:  b.Min,
				Multiplier: 2,
				Jitter:     0.2,
				MaxDelay:   b.Max,
			},
			MinConnectTimeout: grpcMinConnectTimeout,
		}),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time:    grpcKeepaliveTime,
			Timeout: grpcKeepaliveTimeout,
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(grpcMaxRecvMsgSize)),
	)
	if err != nil {
		return nil, fmt.Errorf("grpc client for %s: %w", cp.Address, err)
	}
	return conn, nil
}

// explainRefusal adds to an error istiod answered Unauthenticated or
// PermissionDenied which token file it refused and what istiod checks, so
// the log points at what to fix: istiod's own message ("authentication
// failure") names neither. The status code is kept (the error wraps it).
// An error that names the file already is ours (reading it failed before
// any call) and is left as it is.
func (cp ControlPlane) explainRefusal(err error) error {
	if cp.TokenFile != "" && strings.Contains(err.Error(), cp.TokenFile) {
		return err
	}
	switch status.Code(err) {
	case codes.Unauthenticated:
		if cp.TokenFile == "" {
			return fmt.Errorf("%w (no token sent: mesh.token_file is empty)", err)
		}
		return fmt.Errorf("%w (istiod refused the token in %s: it must be a service account token with audience istio-ca that cluster %q accepts)",
			err, cp.TokenFile, cp.ClusterID)
	case codes.PermissionDenied:
		return fmt.Errorf("%w (istiod refused the token in %s for this node: its namespace and service account must be mesh.namespace and mesh.service_account)",
			err, cp.TokenFile)
	}
	return err
}

// tokenCredentials adds the bearer token, read from its file for each call
// (stream), and the cluster id.
type tokenCredentials struct {
	file      string
	clusterID string
}

var _ credentials.PerRPCCredentials = tokenCredentials{}

func (c tokenCredentials) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	md := map[string]string{}
	if c.clusterID != "" {
		md["clusterid"] = c.clusterID
	}
	if c.file == "" {
		return md, nil
	}
	token, err := readToken(c.file)
	if err != nil {
		// A status error keeps its code: the call fails as Unauthenticated
		// instead of a generic Unavailable.
		return nil, status.Error(codes.Unauthenticated, err.Error())
	}
	md["authorization"] = "Bearer " + token
	return md, nil
}

func (tokenCredentials) RequireTransportSecurity() bool { return true }

func readToken(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("read token: %w", err)
	}
	token := strings.TrimSpace(string(b))
	if token == "" {
		return "", errors.New("token file " + file + " is empty")
	}
	if strings.ContainsAny(token, "\r\n\t ") {
		return "", errors.New("token file " + file + " holds more than one token")
	}
	return token, nil
}

// rootFile is the root certificate file, read at each handshake (one per
// connection to istiod, so rare) and parsed again when its content changed.
type rootFile struct {
	path string

	mu   sync.Mutex
	raw  []byte
	pool *x509.CertPool
}

func newRootFile(path string) (*rootFile, error) {
	r := &rootFile{path: path}
	if _, err := r.current(); err != nil {
		return nil, err
	}
	return r, nil
}

// current returns the roots as the file holds them now.
func (r *rootFile) current() (*x509.CertPool, error) {
	pemData, err := os.ReadFile(r.path)
	if err != nil {
		return nil, fmt.Errorf("read root certificate: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pool != nil && bytes.Equal(pemData, r.raw) {
		return r.pool, nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemData) {
		return nil, fmt.Errorf("root certificate %s: no PEM certificate in it", r.path)
	}
	r.raw, r.pool = pemData, pool
	return pool, nil
}

// verify checks the server's chain against the current roots and name.
func (r *rootFile) verify(serverName string) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("tls: the control plane sent no certificate")
		}
		roots, err := r.current()
		if err != nil {
			return err
		}
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		_, err = cs.PeerCertificates[0].Verify(x509.VerifyOptions{
			DNSName:       serverName,
			Roots:         roots,
			Intermediates: inter,
			KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		})
		if err != nil {
			return fmt.Errorf("tls: control plane certificate: %w", err)
		}
		return nil
	}
}
