package controlplane_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	pb "istio.io/api/security/v1alpha1"

	"github.com/meshtun/meshtun/interop/istiod/controlplane"
)

// The type URLs istiod serves ztunnel.
const (
	addressType       = "type.googleapis.com/istio.workload.Address"
	authorizationType = "type.googleapis.com/istio.security.Authorization"
)

// rpcTimeout bounds one unary call or one stream open; generous because
// the first calls on a loaded 2-core machine pay for Istio's warm-up.
const rpcTimeout = 20 * time.Second

// maxResponses bounds how many responses a wait reads before giving up, so
// a server that keeps pushing something else cannot keep a test spinning.
const maxResponses = 200

// tokenCreds sends the token file's content as a bearer token and the
// cluster id, re-reading the file on every call, as ztunnel does.
type tokenCreds struct {
	tokenFile string
	clusterID string
}

var _ credentials.PerRPCCredentials = tokenCreds{}

func (c tokenCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	tok, err := os.ReadFile(c.tokenFile)
	if err != nil {
		return nil, fmt.Errorf("token: %w", err)
	}
	md := map[string]string{"authorization": "Bearer " + strings.TrimSpace(string(tok))}
	if c.clusterID != "" {
		md["clusterid"] = c.clusterID
	}
	return md, nil
}

func (tokenCreds) RequireTransportSecurity() bool { return true }

// dial opens a TLS gRPC connection to cp that verifies the serving
// certificate with the root file and server name, and authenticates with
// tokenFile.
func dial(t *testing.T, cp *controlplane.ControlPlane, tokenFile, clusterID string) *grpc.ClientConn {
	t.Helper()
	return connect(t, cp, clientTLS(t, cp),
		grpc.WithPerRPCCredentials(tokenCreds{tokenFile: tokenFile, clusterID: clusterID}))
}

// dialCert is dial with a client certificate (if cert has one) and no token.
func dialCert(t *testing.T, cp *controlplane.ControlPlane, cert tls.Certificate) *grpc.ClientConn {
	t.Helper()
	cfg := clientTLS(t, cp)
	if len(cert.Certificate) > 0 {
		cfg.Certificates = []tls.Certificate{cert}
	}
	return connect(t, cp, cfg)
}

// clientTLS trusts the root file and expects the server name.
func clientTLS(t *testing.T, cp *controlplane.ControlPlane) *tls.Config {
	t.Helper()
	rootPEM, err := os.ReadFile(cp.RootCertFile())
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(rootPEM) {
		t.Fatal("root file holds no certificate")
	}
	return &tls.Config{RootCAs: roots, ServerName: cp.ServerName(), MinVersion: tls.VersionTLS12}
}

func connect(t *testing.T, cp *controlplane.ControlPlane, cfg *tls.Config, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(cp.Addr(), append(opts, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// csr makes a P-256 key and a CSR carrying the SPIFFE URI SAN.
func csr(t *testing.T, spiffeID string) []byte {
	t.Helper()
	_, p := keyAndCSR(t, spiffeID)
	return p
}

// keyAndCSR is csr that also returns the key.
func keyAndCSR(t *testing.T, spiffeID string) (*ecdsa.PrivateKey, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(spiffeID)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{Organization: []string{"meshtun"}},
		URIs:    []*url.URL{u},
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	return key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

// createCertificate asks the CA for a one-hour certificate for spiffeID.
func createCertificate(t *testing.T, conn *grpc.ClientConn, spiffeID string) (*pb.IstioCertificateResponse, error) {
	t.Helper()
	return requestCertificate(conn, csr(t, spiffeID))
}

// requestCertificate sends one CSR to the CA, asking for one hour.
func requestCertificate(conn *grpc.ClientConn, csrPEM []byte) (*pb.IstioCertificateResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer cancel()
	return pb.NewIstioCertificateServiceClient(conn).CreateCertificate(ctx, &pb.IstioCertificateRequest{
		Csr:              string(csrPEM),
		ValidityDuration: int64(time.Hour / time.Second),
	})
}

// vmNode is the node a VM running meshtun sends: ztunnel's node id and
// metadata shape, with the VM's own namespace and service account, which
// istiod checks against the token.
func vmNode(t *testing.T, cp *controlplane.ControlPlane, name, namespace, serviceAccount, ip string) *corev3.Node {
	t.Helper()
	md, err := structpb.NewStruct(map[string]any{
		"NAME":            name,
		"NAMESPACE":       namespace,
		"SERVICE_ACCOUNT": serviceAccount,
		"INSTANCE_IPS":    ip,
		"NODE_NAME":       name,
		"CLUSTER_ID":      cp.ClusterID(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return &corev3.Node{
		Id:       fmt.Sprintf("ztunnel~%s~%s.%s~%s.svc.cluster.local", ip, name, namespace, namespace),
		Metadata: md,
	}
}

// wdsClient is a minimal delta ADS client for the two types istiod serves
// ztunnel: it keeps the resources it was sent and ACKs every response.
type wdsClient struct {
	t      *testing.T
	stream discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
	cancel context.CancelFunc
	recv   chan *discovery.DeltaDiscoveryResponse
	done   chan struct{}

	mu     sync.Mutex
	err    error
	state  map[string]map[string]*discovery.Resource // type URL -> name -> resource
	events []string                                  // "+name" / "-name" in arrival order
}

// openWDS opens a delta stream, subscribes (wildcard) to both types, and
// starts the receiving goroutine, which the test's cleanup ends.
// initial, if set, is sent as initial_resource_versions per type.
func openWDS(t *testing.T, conn *grpc.ClientConn, node *corev3.Node, initial map[string]map[string]string) *wdsClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		cancel()
		t.Fatalf("open delta stream: %v", err)
	}
	c := &wdsClient{
		t: t, stream: stream, cancel: cancel,
		recv:  make(chan *discovery.DeltaDiscoveryResponse),
		done:  make(chan struct{}),
		state: map[string]map[string]*discovery.Resource{addressType: {}, authorizationType: {}},
	}
	go c.receive()
	t.Cleanup(c.close)
	for i, typeURL := range []string{addressType, authorizationType} {
		req := &discovery.DeltaDiscoveryRequest{TypeUrl: typeURL, InitialResourceVersions: initial[typeURL]}
		if i == 0 {
			req.Node = node
		}
		err := stream.Send(req)
		if errors.Is(err, io.EOF) {
			break // the server ended the stream; its status comes from Recv
		}
		if err != nil {
			t.Fatalf("subscribe %s: %v", typeURL, err)
		}
	}
	return c
}

func (c *wdsClient) receive() {
	defer close(c.done)
	for {
		resp, err := c.stream.Recv()
		if err != nil {
			c.mu.Lock()
			c.err = err
			c.mu.Unlock()
			close(c.recv)
			return
		}
		c.recv <- resp
	}
}

func (c *wdsClient) close() {
	c.cancel()
	for range c.recv { // drain so receive can see the cancellation
	}
	<-c.done
}

// streamErr is the error that ended the stream, once it has ended.
func (c *wdsClient) streamErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// apply records a response and ACKs it with its nonce.
func (c *wdsClient) apply(resp *discovery.DeltaDiscoveryResponse) error {
	c.mu.Lock()
	have := c.state[resp.TypeUrl]
	if have == nil {
		c.mu.Unlock()
		return fmt.Errorf("response for unsubscribed type %q", resp.TypeUrl)
	}
	for _, r := range resp.Resources {
		have[r.Name] = r
		c.events = append(c.events, "+"+r.Name)
	}
	for _, name := range resp.RemovedResources {
		delete(have, name)
		c.events = append(c.events, "-"+name)
	}
	c.mu.Unlock()
	return c.stream.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resp.TypeUrl, ResponseNonce: resp.Nonce})
}

// nackNext reads the next response of typeURL (skipping, unapplied, any of
// other types), records it and NACKs it with reason, as a client does with
// a resource it cannot use.
func (c *wdsClient) nackNext(typeURL, reason string, timeout time.Duration) *discovery.DeltaDiscoveryResponse {
	c.t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for n := 0; n < maxResponses; n++ {
		select {
		case resp, open := <-c.recv:
			if !open {
				c.t.Fatalf("stream ended: %v", c.streamErr())
			}
			if resp.TypeUrl != typeURL {
				if err := c.apply(resp); err != nil {
					c.t.Fatal(err)
				}
				continue
			}
			err := c.stream.Send(&discovery.DeltaDiscoveryRequest{
				TypeUrl: typeURL, ResponseNonce: resp.Nonce,
				ErrorDetail: status.New(codes.InvalidArgument, reason).Proto(),
			})
			if err != nil {
				c.t.Fatalf("nack: %v", err)
			}
			return resp
		case <-deadline.C:
			c.t.Fatalf("no %s response within %v", typeURL, timeout)
		}
	}
	c.t.Fatalf("no %s response in %d responses", typeURL, maxResponses)
	return nil
}

// waitFor reads, applies and ACKs responses until cond holds on the
// client's state, failing the test after timeout or maxResponses.
func (c *wdsClient) waitFor(what string, timeout time.Duration, cond func(state map[string]map[string]*discovery.Resource) bool) {
	c.t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for n := 0; ; n++ {
		c.mu.Lock()
		ok := cond(c.state)
		c.mu.Unlock()
		if ok {
			return
		}
		if n == maxResponses {
			c.t.Fatalf("%s: not seen after %d responses; state %v", what, n, c.names())
		}
		select {
		case resp, open := <-c.recv:
			if !open {
				c.t.Fatalf("%s: stream ended: %v", what, c.streamErr())
			}
			if err := c.apply(resp); err != nil {
				c.t.Fatalf("%s: %v", what, err)
			}
		case <-deadline.C:
			c.t.Fatalf("%s: not seen within %v; state %v", what, timeout, c.names())
		}
	}
}

// waitEnd waits for the stream to end and returns its error.
func (c *wdsClient) waitEnd(timeout time.Duration) error {
	c.t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for n := 0; n < maxResponses; n++ {
		select {
		case _, open := <-c.recv:
			if !open {
				return c.streamErr()
			}
		case <-deadline.C:
			c.t.Fatalf("stream still open after %v", timeout)
		}
	}
	c.t.Fatalf("stream still open after %d responses", maxResponses)
	return errors.New("unreachable")
}

// names lists the resource names held, per type, for failure messages.
func (c *wdsClient) names() map[string][]string {
	out := map[string][]string{}
	for typeURL, m := range c.state {
		for name := range m {
			out[typeURL] = append(out[typeURL], name)
		}
	}
	return out
}

// snapshot copies the client's state for one type.
func (c *wdsClient) snapshot(typeURL string) map[string]*discovery.Resource {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]*discovery.Resource{}
	for k, v := range c.state[typeURL] {
		out[k] = v
	}
	return out
}

// takeEvents returns and clears the "+name"/"-name" events seen so far.
func (c *wdsClient) takeEvents() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	ev := c.events
	c.events = nil
	return ev
}
