package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	pb "istio.io/api/security/v1alpha1"
	"istio.io/istio/pkg/workloadapi"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/gateway"
	"github.com/meshtun/meshtun/mesh"
)

// fakeIstiod is a control plane for run's mesh wiring: Istio's CA and
// delta ADS on one TLS gRPC port, as istiod serves 15012. Its CA signs
// whatever CSR it gets with a root of its own; its ADS answers the two
// subscriptions with the given Addresses and no Authorization, and hands
// the test the stream's requests.
type fakeIstiod struct {
	pb.UnimplementedIstioCertificateServiceServer
	root     *x509.Certificate
	rootKey  *ecdsa.PrivateKey
	rootFile string
	addrs    []*discovery.Resource
	reqs     chan *discovery.DeltaDiscoveryRequest
	leafTTL  time.Duration // lifetime of the certificates it issues; 0: an hour
}

const fakeIstiodName = "istiod.istio-system.svc"

func newFakeIstiod(t *testing.T, addrs []*discovery.Resource) (*fakeIstiod, string) {
	t.Helper()
	f := &fakeIstiod{addrs: addrs, reqs: make(chan *discovery.DeltaDiscoveryRequest, 64)}
	var err error
	if f.rootKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	f.root = f.sign(t, &x509.Certificate{Subject: pkix.Name{CommonName: "fake istiod root"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}, &f.rootKey.PublicKey, time.Hour)
	f.rootFile = filepath.Join(t.TempDir(), "root-cert.pem")
	if err := os.WriteFile(f.rootFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.root.Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	servingKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serving := f.sign(t, &x509.Certificate{Subject: pkix.Name{CommonName: "istiod"}, DNSNames: []string{fakeIstiodName},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, &servingKey.PublicKey, time.Hour)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{serving.Raw}, PrivateKey: servingKey}},
	})))
	pb.RegisterIstioCertificateServiceServer(srv, f)
	discovery.RegisterAggregatedDiscoveryServiceServer(srv, f)
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ln) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return f, ln.Addr().String()
}

var fakeSerial struct {
	sync.Mutex
	n int64
}

func (f *fakeIstiod) sign(t *testing.T, tmpl *x509.Certificate, pub *ecdsa.PublicKey, ttl time.Duration) *x509.Certificate {
	t.Helper()
	fakeSerial.Lock()
	fakeSerial.n++
	tmpl.SerialNumber = big.NewInt(fakeSerial.n)
	fakeSerial.Unlock()
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Minute), time.Now().Add(ttl)
	parent := f.root
	if parent == nil {
		parent = tmpl
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, f.rootKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (f *fakeIstiod) CreateCertificate(_ context.Context, req *pb.IstioCertificateRequest) (*pb.IstioCertificateResponse, error) {
	block, _ := pem.Decode([]byte(req.GetCsr()))
	if block == nil {
		return nil, fmt.Errorf("csr is not PEM")
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{URIs: csr.URIs, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	tmpl.SerialNumber = big.NewInt(time.Now().UnixNano())
	ttl := f.leafTTL
	if ttl == 0 {
		ttl = time.Hour
	}
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Minute), time.Now().Add(ttl)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, f.root, csr.PublicKey, f.rootKey)
	if err != nil {
		return nil, err
	}
	leaf := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	root := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.root.Raw})
	return &pb.IstioCertificateResponse{CertChain: []string{string(leaf), string(root)}}, nil
}

func (f *fakeIstiod) DeltaAggregatedResources(s discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	for n := 0; ; n++ {
		req, err := s.Recv()
		if err != nil {
			return err
		}
		select {
		case f.reqs <- req:
		default:
		}
		if req.GetResponseNonce() != "" {
			continue // an ACK or NACK
		}
		resp := &discovery.DeltaDiscoveryResponse{TypeUrl: req.GetTypeUrl(), Nonce: fmt.Sprintf("n%d", n), SystemVersionInfo: "1"}
		if req.GetTypeUrl() == mesh.AddressType {
			resp.Resources = f.addrs
		}
		if err := s.Send(resp); err != nil {
			return err
		}
	}
}

func (f *fakeIstiod) StreamAggregatedResources(discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	return fmt.Errorf("not served")
}

func addressResource(t *testing.T, name string, w *workloadapi.Workload) *discovery.Resource {
	t.Helper()
	body, err := proto.Marshal(&workloadapi.Address{Type: &workloadapi.Address_Workload{Workload: w}})
	if err != nil {
		t.Fatal(err)
	}
	return &discovery.Resource{Name: name, Version: "1", Resource: &anypb.Any{TypeUrl: mesh.AddressType, Value: body}}
}

// startFakeMesh runs startMesh for a [mesh] gateway.toml pointed at f, and
// returns the gateway and the mesh's clients (closed at cleanup).
func startFakeMesh(t *testing.T, f *fakeIstiod, addr string) (*gateway.Gateway, *meshClients) {
	t.Helper()
	dir := t.TempDir()
	token := filepath.Join(dir, "istio-token")
	if err := os.WriteFile(token, []byte("a-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "gateway.toml")
	text := fmt.Sprintf(`version = 1
[gateway]
name = "vm-1"
[mesh]
xds_address = %q
root_cert = %q
server_name = %q
token_file = %q
namespace = "vm"
service_account = "vm-sa"
instance_ips = ["127.0.0.1"]
`, addr, f.rootFile, fakeIstiodName, token)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "meshtun", Output: testLog{t}, Level: hclog.Debug})
	g, cfg, err := check(path, func(*config.Config) hclog.Logger { return log })
	if err != nil {
		t.Fatal(err)
	}
	m, err := startMesh(cfg, g, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	select {
	case <-m.ca.Ready():
	case <-time.After(20 * time.Second):
		t.Fatalf("no certificate from the fake CA within 20s: %+v", m.ca.Stats())
	}
	return g, m
}

// run's mesh wiring against a fake istiod: the node it announces, the
// certificate the gateway gets, the converted state applied, and a
// resource the conversion refuses NACKed with the reason.
func TestStartMeshAgainstFakeIstiod(t *testing.T) {
	f, addr := newFakeIstiod(t, nil)
	f.addrs = []*discovery.Resource{
		addressResource(t, "vm/vm-1", &workloadapi.Workload{Uid: "vm/vm-1", Name: "vm-1", Namespace: "vm", ServiceAccount: "vm-sa",
			Addresses: [][]byte{netip.MustParseAddr("127.0.0.1").AsSlice()}, TunnelProtocol: workloadapi.TunnelProtocol_HBONE}),
		addressResource(t, "broken", &workloadapi.Workload{Uid: "broken", Name: "broken", Namespace: "vm", Addresses: [][]byte{{1, 2, 3}}}),
	}
	g, _ := startFakeMesh(t, f, addr)
	if g.Identity() != "spiffe://cluster.local/ns/vm/sa/vm-sa" {
		t.Errorf("gateway identity %q", g.Identity())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	var nack, ack *discovery.DeltaDiscoveryRequest
	var first *discovery.DeltaDiscoveryRequest
	for nack == nil || ack == nil {
		select {
		case req := <-f.reqs:
			switch {
			case first == nil:
				first = req
			case req.GetResponseNonce() == "":
			case req.GetErrorDetail() != nil:
				nack = req
			case req.GetTypeUrl() == mesh.AuthorizationType:
				ack = req
			}
		case <-ctx.Done():
			t.Fatalf("no NACK of the addresses and ACK of the policies: nack %v, ack %v", nack, ack)
		}
	}
	if want := "ztunnel~127.0.0.1~vm-1.vm~vm.svc.cluster.local"; first.GetNode().GetId() != want {
		t.Errorf("node id %q, want %q", first.GetNode().GetId(), want)
	}
	if msg := nack.GetErrorDetail().GetMessage(); nack.GetTypeUrl() != mesh.AddressType || !strings.Contains(msg, "broken") || !strings.Contains(msg, "3 bytes") {
		t.Errorf("NACK %s: %q", nack.GetTypeUrl(), msg)
	}
	// The state was applied before the answers were sent.
	if st := g.MeshStats(); !st.Ready || st.Updates == 0 {
		t.Errorf("MeshStats = %+v", st)
	}
	if p := g.Router().Route(netip.MustParseAddrPort("127.0.0.1:80"), nil); p.Via != "workload vm/vm-1" || p.HBONEAddress.String() != "127.0.0.1:15008" {
		t.Errorf("plan of the node's own workload: %s", p)
	}
}

type testLog struct{ t *testing.T }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// A certificate the CA renews reaches the gateway (the one HBONE takes
// for its next handshakes, shown by /config_dump): the CertManager renews
// at half the certificate's life, here a few seconds.
func TestMeshRenewalReachesGateway(t *testing.T) {
	f, addr := newFakeIstiod(t, nil)
	f.leafTTL = 4 * time.Second
	g, _ := startFakeMesh(t, f, addr)
	admin := httptest.NewServer(g.AdminHandler())
	defer admin.Close()
	notAfter := func() string {
		t.Helper()
		resp, err := http.Get(admin.URL + "/config_dump")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var dump struct {
			Certificate struct {
				Identity string `json:"identity"`
				NotAfter string `json:"not_after"`
			} `json:"certificate"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&dump); err != nil {
			t.Fatal(err)
		}
		if dump.Certificate.Identity != "spiffe://cluster.local/ns/vm/sa/vm-sa" {
			t.Fatalf("certificate identity %q", dump.Certificate.Identity)
		}
		return dump.Certificate.NotAfter
	}
	first := notAfter()
	if first == "" {
		t.Fatal("no certificate in /config_dump")
	}
	// Polled, bounded: the renewal comes after about 2 s.
	for deadline := time.Now().Add(15 * time.Second); notAfter() == first; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the certificate in force (not after %s) was not renewed within 15s", first)
		}
	}
}
