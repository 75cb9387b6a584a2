package mesh

import (
	"errors"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"istio.io/istio/pkg/workloadapi"
	"istio.io/istio/pkg/workloadapi/security"
)

// fakeADS serves DeltaAggregatedResources and hands each stream to the
// test, which drives it request by request.
type fakeADS struct {
	discovery.UnimplementedAggregatedDiscoveryServiceServer
	streams chan *adsStream
}

type adsStream struct {
	md   metadata.MD
	reqs chan *discovery.DeltaDiscoveryRequest
	send chan *discovery.DeltaDiscoveryResponse
	end  chan error
}

func (f *fakeADS) DeltaAggregatedResources(s discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	md, _ := metadata.FromIncomingContext(s.Context())
	st := &adsStream{
		md:   md,
		reqs: make(chan *discovery.DeltaDiscoveryRequest, 64),
		send: make(chan *discovery.DeltaDiscoveryResponse),
		end:  make(chan error, 1),
	}
	select {
	case f.streams <- st:
	case <-s.Context().Done():
		return s.Context().Err()
	}
	// The receiver ends when the handler returns: gRPC then fails its Recv.
	go func() {
		defer close(st.reqs)
		for {
			req, err := s.Recv()
			if err != nil {
				return
			}
			st.reqs <- req
		}
	}()
	for {
		select {
		case resp := <-st.send:
			if err := s.Send(resp); err != nil {
				return err
			}
		case err := <-st.end:
			return err
		case <-s.Context().Done():
			return s.Context().Err()
		}
	}
}

func startADS(t *testing.T, p *testPKI, ln net.Listener) *fakeADS {
	t.Helper()
	ads := &fakeADS{streams: make(chan *adsStream, 4)}
	serveGRPC(t, p, ln, func(s *grpc.Server) { discovery.RegisterAggregatedDiscoveryServiceServer(s, ads) })
	return ads
}

func (f *fakeADS) next(t *testing.T) *adsStream {
	t.Helper()
	select {
	case st := <-f.streams:
		return st
	case <-time.After(waitFor):
		t.Fatal("no stream reached the server")
		return nil
	}
}

func (st *adsStream) next(t *testing.T) *discovery.DeltaDiscoveryRequest {
	t.Helper()
	select {
	case req, ok := <-st.reqs:
		if !ok {
			t.Fatal("stream ended while waiting for a request")
		}
		return req
	case <-time.After(waitFor):
		t.Fatal("no request within the wait")
		return nil
	}
}

// subscriptions reads the two initial requests, Address then
// Authorization.
func (st *adsStream) subscriptions(t *testing.T) (addr, authz *discovery.DeltaDiscoveryRequest) {
	t.Helper()
	addr, authz = st.next(t), st.next(t)
	if addr.GetTypeUrl() != AddressType || authz.GetTypeUrl() != AuthorizationType {
		t.Fatalf("initial requests for %q and %q", addr.GetTypeUrl(), authz.GetTypeUrl())
	}
	for _, r := range []*discovery.DeltaDiscoveryRequest{addr, authz} {
		if len(r.GetResourceNamesSubscribe())+len(r.GetResourceNamesUnsubscribe()) != 0 || r.GetResponseNonce() != "" {
			t.Errorf("initial request is not a plain wildcard subscription: %v", r)
		}
	}
	return addr, authz
}

// push sends resp and returns the client's answer to it.
func (st *adsStream) push(t *testing.T, resp *discovery.DeltaDiscoveryResponse) *discovery.DeltaDiscoveryRequest {
	t.Helper()
	select {
	case st.send <- resp:
	case <-time.After(waitFor):
		t.Fatal("could not push")
	}
	ack := st.next(t)
	if ack.GetResponseNonce() != resp.GetNonce() || ack.GetTypeUrl() != resp.GetTypeUrl() {
		t.Fatalf("answer to %s/%s is for %s/%s", resp.GetTypeUrl(), resp.GetNonce(), ack.GetTypeUrl(), ack.GetResponseNonce())
	}
	return ack
}

func mustAny(t *testing.T, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func workloadRes(t *testing.T, name, version, ip string) *discovery.Resource {
	t.Helper()
	return &discovery.Resource{Name: name, Version: version, Resource: mustAny(t, &workloadapi.Address{
		Type: &workloadapi.Address_Workload{Workload: &workloadapi.Workload{
			Uid: name, Name: name, Namespace: "default",
			Addresses: [][]byte{netip.MustParseAddr(ip).AsSlice()},
		}},
	})}
}

func serviceRes(t *testing.T, name string) *discovery.Resource {
	t.Helper()
	return &discovery.Resource{Name: name, Resource: mustAny(t, &workloadapi.Address{
		Type: &workloadapi.Address_Service{Service: &workloadapi.Service{Name: "svc", Namespace: "default", Hostname: name}},
	})}
}

func policyRes(t *testing.T, name string) *discovery.Resource {
	t.Helper()
	return &discovery.Resource{Name: name, Resource: mustAny(t, &security.Authorization{
		Name: strings.Split(name, "/")[1], Namespace: strings.Split(name, "/")[0], Action: security.Action_DENY,
	})}
}

// xdsHarness is one client with its server and the snapshots it handed
// out.
type xdsHarness struct {
	client *XDSClient
	ads    *fakeADS
	opts   XDSOptions
	snaps  chan Snapshot
}

func testNode() Node {
	return Node{
		Name:           "vm1",
		Namespace:      "vm",
		ServiceAccount: "vm-sa",
		NodeName:       "host-1",
		InstanceIPs:    []netip.Addr{netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("fd00::5")},
	}
}

func newXDSHarness(t *testing.T, edit func(*XDSOptions)) *xdsHarness {
	t.Helper()
	p := newTestPKI(t)
	ln := listen(t)
	h := &xdsHarness{ads: startADS(t, p, ln), snaps: make(chan Snapshot, 64)}
	h.opts = XDSOptions{
		ControlPlane: testControlPlane(t, p, ln.Addr().String(), "xds-token"),
		Node:         testNode(),
		OnUpdate: func(s Snapshot) {
			select {
			case h.snaps <- s:
			default:
				t.Errorf("more snapshots than the test reads")
			}
		},
		MinBackoff: 20 * time.Millisecond,
		MaxBackoff: 200 * time.Millisecond,
	}
	if edit != nil {
		edit(&h.opts)
	}
	h.client = newTestXDSClient(t, h.opts)
	return h
}

func newTestXDSClient(t *testing.T, opts XDSOptions) *XDSClient {
	t.Helper()
	c, err := NewXDSClient(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		closed := make(chan error, 1)
		go func() { closed <- c.Close() }()
		select {
		case err := <-closed:
			if err != nil {
				t.Errorf("Close: %v", err)
			}
		case <-time.After(waitFor):
			t.Errorf("Close hung")
		}
		if err := c.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
	})
	return c
}

func (h *xdsHarness) snapshot(t *testing.T) Snapshot {
	t.Helper()
	select {
	case s := <-h.snaps:
		return s
	case <-time.After(waitFor):
		t.Fatal("no snapshot")
		return Snapshot{}
	}
}

func (h *xdsHarness) noSnapshot(t *testing.T) {
	t.Helper()
	select {
	case s := <-h.snaps:
		t.Fatalf("unexpected snapshot %+v", s)
	default:
	}
}

// names lists the keys of m in order, for comparison.
func names[V any](m map[string]V) string {
	return strings.Join(slices.Sorted(maps.Keys(m)), ",")
}

func TestXDSNodeSubscribeAndACK(t *testing.T) {
	noLeaks(t)
	h := newXDSHarness(t, nil)
	h.client.Start()
	st := h.ads.next(t)

	if got := strings.Join(st.md.Get("authorization"), ","); got != "Bearer xds-token" {
		t.Errorf("authorization %q", got)
	}
	if got := strings.Join(st.md.Get("clusterid"), ","); got != "Kubernetes" {
		t.Errorf("clusterid %q", got)
	}
	addrReq, authzReq := st.subscriptions(t)
	for _, r := range []*discovery.DeltaDiscoveryRequest{addrReq, authzReq} {
		if got, want := r.GetNode().GetId(), "ztunnel~10.0.0.5~vm1.vm~vm.svc.cluster.local"; got != want {
			t.Errorf("node id %q, want %q", got, want)
		}
		got := map[string]string{}
		for k, v := range r.GetNode().GetMetadata().GetFields() {
			got[k] = v.GetStringValue()
		}
		want := map[string]string{
			"NAME": "vm1", "NAMESPACE": "vm", "SERVICE_ACCOUNT": "vm-sa", "NODE_NAME": "host-1",
			"INSTANCE_IPS": "10.0.0.5,fd00::5", "CLUSTER_ID": "Kubernetes",
		}
		if len(got) != len(want) {
			t.Errorf("metadata %v, want %v", got, want)
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("metadata %s = %q, want %q", k, got[k], v)
			}
		}
		if len(r.GetInitialResourceVersions()) != 0 {
			t.Errorf("first connection sent initial versions %v", r.GetInitialResourceVersions())
		}
	}

	ack := st.push(t, &discovery.DeltaDiscoveryResponse{TypeUrl: AddressType, Nonce: "n1", Resources: []*discovery.Resource{
		workloadRes(t, "Kubernetes//Pod/default/a", "v1", "10.1.0.1"),
		serviceRes(t, "default/svc.default.svc.cluster.local"),
	}})
	if ack.GetErrorDetail() != nil {
		t.Fatalf("ACK carries an error: %v", ack.GetErrorDetail())
	}
	s := h.snapshot(t)
	if names(s.Addresses) != "Kubernetes//Pod/default/a,default/svc.default.svc.cluster.local" || !s.AddressesReady || s.AuthorizationsReady || s.Ready() {
		t.Fatalf("snapshot after Address push: %v ready %v/%v", names(s.Addresses), s.AddressesReady, s.AuthorizationsReady)
	}
	if ip := s.Addresses["Kubernetes//Pod/default/a"].GetWorkload().GetAddresses()[0]; netip.AddrFrom4([4]byte(ip)).String() != "10.1.0.1" {
		t.Errorf("decoded workload address %v", ip)
	}
	select {
	case <-h.client.Ready():
		t.Fatal("Ready before the Authorization push")
	default:
	}

	// An empty first push still makes the type ready.
	if ack := st.push(t, &discovery.DeltaDiscoveryResponse{TypeUrl: AuthorizationType, Nonce: "n2"}); ack.GetErrorDetail() != nil {
		t.Fatalf("ACK carries an error: %v", ack.GetErrorDetail())
	}
	s = h.snapshot(t)
	if !s.Ready() || len(s.Authorizations) != 0 || len(s.Addresses) != 2 {
		t.Fatalf("snapshot after the Authorization push: %+v", s)
	}
	select {
	case <-h.client.Ready():
	case <-time.After(waitFor):
		t.Fatal("Ready not closed after both first pushes")
	}

	stats := h.client.Stats()
	if !stats.Connected || stats.Reconnects != 0 ||
		stats.Types[AddressType] != (TypeStats{Resources: 2, Updates: 1, Ready: true}) ||
		stats.Types[AuthorizationType] != (TypeStats{Updates: 1, Ready: true}) {
		t.Errorf("stats %+v", stats)
	}
	if h.client.NodeID() != "ztunnel~10.0.0.5~vm1.vm~vm.svc.cluster.local" {
		t.Errorf("NodeID %q", h.client.NodeID())
	}
}

func TestXDSNACKsBadResourcesAndAppliesTheRest(t *testing.T) {
	noLeaks(t)
	seen := make(chan Resource, 64) // what the hook was asked, in order
	h := newXDSHarness(t, func(o *XDSOptions) {
		o.Validate = func(r Resource) error {
			seen <- r
			if r.Name == "vetoed" {
				return errors.New("the hook says no")
			}
			return nil
		}
	})
	h.client.Start()
	st := h.ads.next(t)
	st.subscriptions(t)

	st.push(t, &discovery.DeltaDiscoveryResponse{TypeUrl: AddressType, Nonce: "n1", Resources: []*discovery.Resource{
		workloadRes(t, "kept", "v1", "10.1.0.1"),
	}})
	h.snapshot(t)
	r := nextResource(t, seen)
	if w, ok := r.Message.(*workloadapi.Address); r.TypeURL != AddressType || r.Name != "kept" || r.Version != "v1" || !ok || w.GetWorkload().GetName() != "kept" {
		t.Fatalf("the hook was asked about %+v", r)
	}

	wrongType := policyRes(t, "ns/p")
	wrongType.Name = "wrong-type"
	ack := st.push(t, &discovery.DeltaDiscoveryResponse{TypeUrl: AddressType, Nonce: "n2", Resources: []*discovery.Resource{
		workloadRes(t, "good", "v1", "10.1.0.2"),
		{Name: "garbage", Resource: &anypb.Any{TypeUrl: AddressType, Value: []byte{0xff, 0xff, 0xff}}},
		wrongType,
		{Name: "empty", Resource: mustAny(t, &workloadapi.Address{})},
		{Name: "nobody"},
		workloadRes(t, "vetoed", "v1", "10.1.0.3"),
		{Name: "kept", Version: "v2", Resource: &anypb.Any{TypeUrl: AddressType, Value: []byte{0xff, 0xff, 0xff}}},
	}})
	detail := ack.GetErrorDetail()
	if detail == nil {
		t.Fatal("bad resources were ACKed")
	}
	// Only the decoded resources reach the hook.
	if a, b := nextResource(t, seen), nextResource(t, seen); a.Name != "good" || b.Name != "vetoed" || len(seen) != 0 {
		t.Errorf("the hook was asked about %q, %q and %d more", a.Name, b.Name, len(seen))
	}
	for _, want := range []string{"garbage: ", "wrong-type: body of type", "empty: address holds neither", "nobody: resource without a body", "vetoed: the hook says no", "kept: "} {
		if !strings.Contains(detail.GetMessage(), want) {
			t.Errorf("NACK %q does not name %q", detail.GetMessage(), want)
		}
	}
	if strings.Contains(detail.GetMessage(), "good") || codes.Code(detail.GetCode()) != codes.InvalidArgument {
		t.Errorf("NACK %d %q", detail.GetCode(), detail.GetMessage())
	}
	s := h.snapshot(t)
	if names(s.Addresses) != "good,kept" {
		t.Fatalf("after the partial NACK the state holds %q, want good,kept", names(s.Addresses))
	}
	if ip := s.Addresses["kept"].GetWorkload().GetAddresses()[0]; netip.AddrFrom4([4]byte(ip)).String() != "10.1.0.1" {
		t.Error("the rejected version of kept replaced the one in force")
	}
	if ts := h.client.Stats().Types[AddressType]; ts.NACKs != 1 || ts.Updates != 2 || ts.Resources != 2 {
		t.Errorf("stats %+v", ts)
	}

	// The stream goes on: the next push is applied and ACKed.
	if ack := st.push(t, &discovery.DeltaDiscoveryResponse{TypeUrl: AddressType, Nonce: "n3", Resources: []*discovery.Resource{
		workloadRes(t, "vetoed2", "v1", "10.1.0.4"),
	}}); ack.GetErrorDetail() != nil {
		t.Fatalf("good push NACKed: %v", ack.GetErrorDetail())
	}
	if s := h.snapshot(t); names(s.Addresses) != "good,kept,vetoed2" {
		t.Fatalf("state %q", names(s.Addresses))
	}
}

func TestXDSUnknownTypeIsNACKed(t *testing.T) {
	noLeaks(t)
	h := newXDSHarness(t, nil)
	h.client.Start()
	st := h.ads.next(t)
	st.subscriptions(t)
	ack := st.push(t, &discovery.DeltaDiscoveryResponse{TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster", Nonce: "x",
		Resources: []*discovery.Resource{{Name: "c", Resource: &anypb.Any{TypeUrl: "junk", Value: []byte("junk")}}}})
	if !strings.Contains(ack.GetErrorDetail().GetMessage(), "was not subscribed to") {
		t.Fatalf("answer to an unknown type: %v", ack)
	}
	h.noSnapshot(t)
	if s := h.client.Stats(); s.UnknownTypeNACKs != 1 || s.Types[AddressType].Ready {
		t.Errorf("stats %+v", s)
	}
	// Still connected, same stream.
	if ack := st.push(t, &discovery.DeltaDiscoveryResponse{TypeUrl: AddressType, Nonce: "y"}); ack.GetErrorDetail() != nil {
		t.Fatal(ack.GetErrorDetail())
	}
	if s := h.snapshot(t); !s.AddressesReady {
		t.Fatal("first Address push after the garbage did not make the type ready")
	}
}

func TestXDSRemoval(t *testing.T) {
	noLeaks(t)
	h := newXDSHarness(t, nil)
	h.client.Start()
	st := h.ads.next(t)
	st.subscriptions(t)
	st.push(t, &discovery.DeltaDiscoveryResponse{TypeUrl: AuthorizationType, Nonce: "1", Resources: []*discovery.Resource{
		policyRes(t, "ns/a"), policyRes(t, "ns/b"),
	}})
	if s := h.snapshot(t); names(s.Authorizations) != "ns/a,ns/b" || s.Authorizations["ns/a"].GetAction() != security.Action_DENY {
		t.Fatalf("state %q", names(s.Authorizations))
	}
	before := h.client.Snapshot()
	st.push(t, &discovery.DeltaDiscoveryResponse{TypeUrl: AuthorizationType, Nonce: "2", RemovedResources: []string{"ns/a"}})
	s := h.snapshot(t)
	if names(s.Authorizations) != "ns/b" || s.Generation != before.Generation+1 {
		t.Fatalf("after removal %q generation %d", names(s.Authorizations), s.Generation)
	}
	if names(before.Authorizations) != "ns/a,ns/b" {
		t.Fatal("an earlier snapshot changed under its holder")
	}
	// Removing what is not held changes nothing: ACKed, no new snapshot.
	if ack := st.push(t, &discovery.DeltaDiscoveryResponse{TypeUrl: AuthorizationType, Nonce: "3", RemovedResources: []string{"ns/zz"}}); ack.GetErrorDetail() != nil {
		t.Fatal(ack.GetErrorDetail())
	}
	h.noSnapshot(t)
	if n := h.client.Stats().Types[AuthorizationType].Resources; n != 1 {
		t.Errorf("resources %d", n)
	}
}

func TestXDSReconnectSendsInitialVersions(t *testing.T) {
	noLeaks(t)
	h := newXDSHarness(t, nil)
	h.client.Start()
	st := h.ads.next(t)
	st.subscriptions(t)
	st.push(t, &discovery.DeltaDiscoveryResponse{TypeUrl: AddressType, Nonce: "1", Resources: []*discovery.Resource{
		workloadRes(t, "a", "va1", "10.1.0.1"), workloadRes(t, "b", "vb1", "10.1.0.2"),
		{Name: "bad", Version: "vbad", Resource: mustAny(t, &workloadapi.Address{})},
	}})
	h.snapshot(t)
	st.push(t, &discovery.DeltaDiscoveryResponse{TypeUrl: AuthorizationType, Nonce: "2", Resources: []*discovery.Resource{policyRes(t, "ns/p")}})
	h.snapshot(t)

	// The token rotates, then the server drops the stream (istiod
	// restarting): the new stream carries the new token.
	writeFile(t, h.opts.ControlPlane.TokenFile, "xds-token-2")
	st.end <- status.Error(codes.Unavailable, "istiod going away")
	st2 := h.ads.next(t)
	if got := strings.Join(st2.md.Get("authorization"), ","); got != "Bearer xds-token-2" {
		t.Errorf("new stream's authorization %q, want the rotated token", got)
	}
	addrReq, authzReq := st2.subscriptions(t)
	if got := addrReq.GetInitialResourceVersions(); len(got) != 2 || got["a"] != "va1" || got["b"] != "vb1" {
		t.Errorf("Address initial versions %v, want a=va1 b=vb1 (and not the rejected one)", got)
	}
	if got := authzReq.GetInitialResourceVersions(); len(got) != 1 || got["ns/p"] != "" {
		t.Errorf("Authorization initial versions %v", got)
	}
	if s := h.client.Stats(); s.Reconnects != 1 || !strings.Contains(s.LastError, "istiod going away") {
		t.Errorf("stats %+v", s)
	}
	// Until the new stream says otherwise, what we held stays.
	if s := h.client.Snapshot(); names(s.Addresses) != "a,b" || names(s.Authorizations) != "ns/p" || !s.Ready() {
		t.Fatalf("state between streams: %q %q", names(s.Addresses), names(s.Authorizations))
	}
	// The server's answer to the reconnect: b changed, a is gone.
	st2.push(t, &discovery.DeltaDiscoveryResponse{TypeUrl: AddressType, Nonce: "3",
		Resources: []*discovery.Resource{workloadRes(t, "b", "vb2", "10.1.0.9")}, RemovedResources: []string{"a"}})
	s := h.snapshot(t)
	if names(s.Addresses) != "b" {
		t.Fatalf("after the reconnect push: %q", names(s.Addresses))
	}
	if ip := s.Addresses["b"].GetWorkload().GetAddresses()[0]; netip.AddrFrom4([4]byte(ip)).String() != "10.1.0.9" {
		t.Error("b not updated")
	}
	if !h.client.Stats().Connected {
		t.Error("not connected after the reconnect push")
	}
}

func TestXDSServerDownAtStart(t *testing.T) {
	noLeaks(t)
	p := newTestPKI(t)
	ln := listen(t)
	addr := ln.Addr().String()
	ln.Close()
	snaps := make(chan Snapshot, 8)
	c := newTestXDSClient(t, XDSOptions{
		ControlPlane: testControlPlane(t, p, addr, "tok"),
		Node:         testNode(),
		OnUpdate:     func(s Snapshot) { snaps <- s },
		MinBackoff:   20 * time.Millisecond,
		MaxBackoff:   100 * time.Millisecond,
	})
	c.Start()
	// Bounded poll: the client must report the failure while it retries.
	deadline := time.Now().Add(waitFor)
	for c.Stats().Reconnects < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no retries while the server was down: %+v", c.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if s := c.Stats(); s.Connected || s.LastError == "" {
		t.Fatalf("stats while down: %+v", s)
	}

	ln2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listening again on the closed server's port %s: %v", addr, err)
	}
	ads := startADS(t, p, ln2)
	st := ads.next(t)
	st.subscriptions(t)
	st.push(t, &discovery.DeltaDiscoveryResponse{TypeUrl: AddressType, Nonce: "1", Resources: []*discovery.Resource{workloadRes(t, "a", "1", "10.1.0.1")}})
	select {
	case s := <-snaps:
		if names(s.Addresses) != "a" {
			t.Fatalf("state %q", names(s.Addresses))
		}
	case <-time.After(waitFor):
		t.Fatal("no snapshot after the server came up")
	}
	if !c.Stats().Connected {
		t.Error("not connected")
	}
}

func TestXDSRefusesWrongServerName(t *testing.T) {
	noLeaks(t)
	h := newXDSHarness(t, func(o *XDSOptions) { o.ControlPlane.ServerName = "not-istiod.example" })
	h.client.Start()
	deadline := time.Now().Add(waitFor)
	for !strings.Contains(h.client.Stats().LastError, "certificate") {
		if time.Now().After(deadline) {
			t.Fatalf("no certificate error: %+v", h.client.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case st := <-h.ads.streams:
		t.Fatalf("a stream reached the server through an unverified connection: %v", st.md)
	default:
	}
}

func TestXDSOptionsChecked(t *testing.T) {
	p := newTestPKI(t)
	good := func() XDSOptions {
		return XDSOptions{ControlPlane: testControlPlane(t, p, "127.0.0.1:1", "t"), Node: testNode()}
	}
	for _, tc := range []struct {
		name string
		edit func(*XDSOptions)
		want string
	}{
		{"no address", func(o *XDSOptions) { o.ControlPlane.Address = "" }, "xds: address is required"},
		{"no name", func(o *XDSOptions) { o.Node.Name = "" }, "xds: node name is required"},
		{"tilde", func(o *XDSOptions) { o.Node.Namespace = "a~b" }, "node namespace"},
		{"no sa", func(o *XDSOptions) { o.Node.ServiceAccount = "" }, "service account is required"},
		{"no ips", func(o *XDSOptions) { o.Node.InstanceIPs = nil }, "at least one instance IP"},
		{"zero ip", func(o *XDSOptions) { o.Node.InstanceIPs = []netip.Addr{{}} }, "not a valid address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := good()
			tc.edit(&o)
			c, err := NewXDSClient(o)
			if err == nil {
				_ = c.Close()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NewXDSClient = %v, want an error with %q", err, tc.want)
			}
		})
	}
	// Close without Start returns at once.
	c, err := NewXDSClient(good())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c.Start() // after Close: nothing runs
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestHostAddresses(t *testing.T) {
	addrs, err := HostAddresses()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if !a.IsGlobalUnicast() || a.IsLoopback() || a.Is4In6() {
			t.Errorf("HostAddresses returned %v", a)
		}
	}
}

func TestXDSMissingTokenSaysWhy(t *testing.T) {
	noLeaks(t)
	h := newXDSHarness(t, func(o *XDSOptions) { o.ControlPlane.TokenFile += ".missing" })
	h.client.Start()
	deadline := time.Now().Add(waitFor)
	for !strings.Contains(h.client.Stats().LastError, "read token") {
		if time.Now().After(deadline) {
			t.Fatalf("no token error: %+v", h.client.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(h.client.Stats().LastError, "Unauthenticated") {
		t.Errorf("last error %q does not say Unauthenticated", h.client.Stats().LastError)
	}
	select {
	case st := <-h.ads.streams:
		t.Fatalf("a stream reached the server without a token: %v", st.md)
	default:
	}
}

// nextResource returns what the hook was asked next; the push the test
// made is answered, so the hook has run already if it ran at all.
func nextResource(t *testing.T, seen chan Resource) Resource {
	t.Helper()
	select {
	case r := <-seen:
		return r
	default:
		t.Fatal("the hook was not asked")
		return Resource{}
	}
}

// istiod ending the stream Unauthenticated: the error in the stats (and
// the log) names the token file it refused.
func TestXDSRefusedTokenNamesTheFile(t *testing.T) {
	noLeaks(t)
	h := newXDSHarness(t, nil)
	h.client.Start()
	select {
	case st := <-h.ads.streams:
		st.end <- status.Error(codes.Unauthenticated, "authentication failure")
	case <-time.After(waitFor):
		t.Fatal("no stream")
	}
	want := "refused the token in " + h.opts.ControlPlane.TokenFile
	deadline := time.Now().Add(waitFor)
	for !strings.Contains(h.client.Stats().LastError, want) {
		if time.Now().After(deadline) {
			t.Fatalf("last error %q does not say %q", h.client.Stats().LastError, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(h.client.Stats().LastError, "Unauthenticated") {
		t.Errorf("last error %q does not say Unauthenticated", h.client.Stats().LastError)
	}
}

// OnDelta gets what each response changed: the resources it named and
// those of its removals that were held, before the ACK, beside OnUpdate's
// whole Snapshot of the same moment.
func TestXDSOnDelta(t *testing.T) {
	noLeaks(t)
	deltas := make(chan Update, 8)
	h := newXDSHarness(t, func(o *XDSOptions) { o.OnDelta = func(u Update) { deltas <- u } })
	h.client.Start()
	st := h.ads.next(t)
	st.subscriptions(t)
	next := func() Update {
		t.Helper()
		<-h.snaps
		select {
		case u := <-deltas:
			return u
		case <-time.After(waitFor):
			t.Fatal("no delta")
		}
		return Update{}
	}
	st.push(t, &discovery.DeltaDiscoveryResponse{TypeUrl: AddressType, Nonce: "1", Resources: []*discovery.Resource{workloadRes(t, "a", "1", "10.1.0.1"), workloadRes(t, "b", "1", "10.1.0.2")}})
	if u := next(); names(u.Delta.Addresses) != "a,b" || len(u.Delta.RemovedAddresses) != 0 || u.Ready {
		t.Fatalf("first delta: %q removed %v ready %v", names(u.Delta.Addresses), u.Delta.RemovedAddresses, u.Ready)
	}
	st.push(t, &discovery.DeltaDiscoveryResponse{TypeUrl: AddressType, Nonce: "2", Resources: []*discovery.Resource{workloadRes(t, "b", "2", "10.1.0.9")},
		RemovedResources: []string{"a", "never-held"}})
	u := next()
	if names(u.Delta.Addresses) != "b" || !slices.Equal(u.Delta.RemovedAddresses, []string{"a"}) {
		t.Fatalf("second delta: %q removed %v", names(u.Delta.Addresses), u.Delta.RemovedAddresses)
	}
	if ip := u.Delta.Addresses["b"].GetWorkload().GetAddresses()[0]; netip.AddrFrom4([4]byte(ip)).String() != "10.1.0.9" {
		t.Error("b's new version not delivered")
	}
	st.push(t, &discovery.DeltaDiscoveryResponse{TypeUrl: AuthorizationType, Nonce: "3"})
	if u := next(); !u.Ready || len(u.Delta.Addresses)+len(u.Delta.Authorizations) != 0 {
		t.Fatalf("the first (empty) authorization response: ready %v, %+v", u.Ready, u.Delta)
	}
}

// Responses that arrive while one is being applied are applied together,
// in one OnDelta, and counted; each is ACKed, in order, only once the
// state with it is applied.
func TestXDSCoalesces(t *testing.T) {
	noLeaks(t)
	deltas := make(chan Update, 8)
	release, started := make(chan struct{}), make(chan struct{})
	var applied atomic.Int32
	h := newXDSHarness(t, func(o *XDSOptions) {
		o.OnUpdate = nil
		o.OnDelta = func(u Update) {
			if applied.Add(1) == 1 {
				close(started)
				<-release // the first push is slow to apply
			}
			deltas <- u
		}
	})
	h.client.Start()
	st := h.ads.next(t)
	st.subscriptions(t)
	send := func(resp *discovery.DeltaDiscoveryResponse) {
		select {
		case st.send <- resp:
		case <-time.After(waitFor):
			t.Fatal("could not push")
		}
	}
	send(&discovery.DeltaDiscoveryResponse{TypeUrl: AddressType, Nonce: "1", Resources: []*discovery.Resource{workloadRes(t, "a", "1", "10.1.0.1")}})
	select {
	case <-started:
	case <-time.After(waitFor):
		t.Fatal("the first push was not applied")
	}
	heldFrom := time.Now() // the first push's apply is held from here at least
	send(&discovery.DeltaDiscoveryResponse{TypeUrl: AddressType, Nonce: "2", Resources: []*discovery.Resource{workloadRes(t, "b", "1", "10.1.0.2")}})
	send(&discovery.DeltaDiscoveryResponse{TypeUrl: AddressType, Nonce: "3", RemovedResources: []string{"a"}})
	send(&discovery.DeltaDiscoveryResponse{TypeUrl: AddressType, Nonce: "4", Resources: []*discovery.Resource{workloadRes(t, "c", "1", "10.1.0.3")}})
	// Bounded wait until the client has read all four (the first is
	// being applied, the rest wait for it).
	deadline := time.Now().Add(waitFor)
	for h.client.received.Load() < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("the client read %d responses", h.client.received.Load())
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case req := <-st.reqs:
		t.Fatalf("an ACK (%s) before the state was applied", req.GetResponseNonce())
	default:
	}
	held := time.Since(heldFrom)
	close(release)
	first, second := <-deltas, <-deltas
	if names(first.Delta.Addresses) != "a" {
		t.Errorf("first delta: %q", names(first.Delta.Addresses))
	}
	if names(second.Delta.Addresses) != "b,c" || !slices.Equal(second.Delta.RemovedAddresses, []string{"a"}) {
		t.Errorf("the three coalesced: %q removed %v", names(second.Delta.Addresses), second.Delta.RemovedAddresses)
	}
	for _, nonce := range []string{"1", "2", "3", "4"} {
		if ack := st.next(t); ack.GetResponseNonce() != nonce || ack.GetErrorDetail() != nil {
			t.Fatalf("answer %s, want the ACK of %s", ack.GetResponseNonce(), nonce)
		}
	}
	s := h.client.Stats()
	if s.Coalesced != 2 || s.Types[AddressType].Resources != 2 {
		t.Errorf("stats: coalesced %d, resources %d; want 2 and 2", s.Coalesced, s.Types[AddressType].Resources)
	}
	// Each response's time to its ACK is counted; the first one's holds
	// at least the time its apply was held (the other three arrived
	// while it was).
	var inBuckets uint64
	for _, n := range s.Apply.Buckets {
		inBuckets += n
	}
	if s.Apply.Count != 4 || inBuckets != 4 || s.Apply.Sum < held {
		t.Errorf("apply histogram %+v: want 4 responses, all in buckets, summing to at least %v", s.Apply, held)
	}
}
