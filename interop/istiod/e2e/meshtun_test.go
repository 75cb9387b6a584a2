package e2e

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	pb "istio.io/api/security/v1alpha1"
	securityapi "istio.io/api/security/v1beta1"
	typeapi "istio.io/api/type/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshtun/meshtun/internal/topo"
	"github.com/meshtun/meshtun/internal/xfer"
	"github.com/meshtun/meshtun/interop/istiod/controlplane"
)

// TestMeshtunInIstio runs the subtests in order on one setup: they share
// istiod and the two nodes, and a later one (istiod restarted) changes
// what the earlier ones look at.
func TestMeshtunInIstio(t *testing.T) {
	m := setup(t)
	serve(t, m.topo.A)
	serve(t, m.topo.B)
	t.Run("certificate", m.testCertificate)
	t.Run("routes match the ambient index", m.testRoutes)
	t.Run("traffic both ways", m.testTraffic)
	t.Run("pod recreated with a new IP", m.testPodChange)
	t.Run("deny policy", m.testDeny)
	t.Run("malformed resource NACKed", m.testNACK)
	t.Run("istiod restarted", m.testRestart)
	t.Run("istiod gone, certificate kept", m.testGone)
	t.Run("CA refuses or is slow", m.testCAFaults)
	t.Run("istiod unreachable at start", m.testUnreachableAtStart)
	t.Run("bad token", m.testBadToken)
}

// certDump is the certificate section of /config_dump.
type certDump struct {
	Source   string    `json:"source"`
	Identity string    `json:"identity"`
	NotAfter time.Time `json:"not_after"`
}

func configDump(t *testing.T, n *topo.Node) ([]byte, map[string]json.RawMessage) {
	t.Helper()
	b, err := get(n, adminAddr, "/config_dump")
	if err != nil {
		t.Fatal(err)
	}
	var d map[string]json.RawMessage
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("/config_dump of %s: %v", n.Name, err)
	}
	return b, d
}

// Each node holds the certificate Istio's CA issued for its service
// account, and node B's HBONE port presents it: a leaf with that URI SAN
// chaining to the mesh root, accepted with a client certificate from the
// same CA.
func (m *mesh) testCertificate(t *testing.T) {
	for _, n := range []*topo.Node{m.topo.A, m.topo.B} {
		_, d := configDump(t, n)
		var c certDump
		if err := json.Unmarshal(d["certificate"], &c); err != nil {
			t.Fatalf("%s: certificate section %s: %v", n.Name, d["certificate"], err)
		}
		if c.Source != "ca" || c.Identity != identity(n.Name) || c.NotAfter.Before(time.Now()) {
			t.Errorf("%s: certificate section %s, want source ca, identity %s, a not_after to come", n.Name, d["certificate"], identity(n.Name))
		}
		t.Logf("%s certificate: %s", n.Name, d["certificate"])
	}

	client := m.issue(t, m.topo.A, "node-a")
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(m.cp.RootCertPEM()) {
		t.Fatal("RootCertPEM holds no certificate")
	}
	var chain []*x509.Certificate
	cfg := &tls.Config{
		Certificates: []tls.Certificate{client},
		NextProtos:   []string{"h2"},
		// SPIFFE leaves carry no DNS name: the chain and URI are checked
		// below, as HBONE peers check them.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			chain = cs.PeerCertificates
			return nil
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	raw, err := m.topo.A.Dial(ctx, "tcp", netip.AddrPortFrom(m.topo.B.VethIP4, 15008).String())
	if err != nil {
		t.Fatal(err)
	}
	conn := tls.Client(raw, cfg)
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if err := conn.HandshakeContext(ctx); err != nil {
		t.Fatalf("TLS handshake with node B's :15008: %v", err)
	}
	if p := conn.ConnectionState().NegotiatedProtocol; p != "h2" {
		t.Errorf("ALPN %q, want h2", p)
	}
	if len(chain) == 0 {
		t.Fatal("node B presented no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Errorf("node B's leaf does not chain to Istio's root: %v", err)
	}
	if got := uriStrings(chain[0].URIs); !slices.Equal(got, []string{identity("node-b")}) {
		t.Errorf("node B's leaf URI SANs %v, want %s", got, identity("node-b"))
	}
	// Node B accepted our client certificate: its HTTP/2 server speaks
	// first with a SETTINGS frame (a refused certificate is an alert).
	if _, err := conn.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	var hdr [9]byte
	if _, err := io.ReadFull(conn, hdr[:]); err != nil {
		t.Fatalf("node B did not accept a client certificate from Istio's CA: %v", err)
	}
	if hdr[3] != 0x4 {
		t.Errorf("node B's first HTTP/2 frame has type %d, want SETTINGS (4)", hdr[3])
	}
	t.Logf("node B's leaf: URI %v, issuer %q, not after %v, chain of %d", uriStrings(chain[0].URIs), chain[0].Issuer, chain[0].NotAfter, len(chain))
}

func uriStrings(us []*url.URL) []string {
	var out []string
	for _, u := range us {
		out = append(out, u.String())
	}
	return out
}

// issue asks Istio's CA, from inside n, for a certificate of service
// account sa in the mesh namespace, as meshtun does.
func (m *mesh) issue(t *testing.T, n *topo.Node, sa string) tls.Certificate {
	t.Helper()
	tokFile, err := m.cp.Token(meshNS, sa)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := os.ReadFile(tokFile)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(identity(sa))
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{u}}, key)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(m.cp.RootCertPEM())
	conn, err := grpc.NewClient(m.cp.Addr(),
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: m.cp.ServerName()})),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return n.Dial(ctx, "tcp", addr) }))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+strings.TrimSpace(string(tok)), "clusterid", m.cp.ClusterID())
	resp, err := pb.NewIstioCertificateServiceClient(conn).CreateCertificate(ctx, &pb.IstioCertificateRequest{
		Csr: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})), ValidityDuration: 3600,
	})
	if err != nil {
		t.Fatalf("CreateCertificate for %s: %v", sa, err)
	}
	var cert tls.Certificate
	for _, p := range resp.GetCertChain() {
		for rest := []byte(p); ; {
			var b *pem.Block
			if b, rest = pem.Decode(rest); b == nil {
				break
			}
			cert.Certificate = append(cert.Certificate, b.Bytes)
		}
	}
	if len(cert.Certificate) == 0 {
		t.Fatal("CreateCertificate returned no certificate")
	}
	cert.PrivateKey = key
	return cert
}

// Node A's plans for node B's service, node B's workload and the ambient
// Pod are what Istio's ambient index holds for them: HBONE to the
// workload's address on 15008, at the service's target port, expecting
// the workload's service account.
func (m *mesh) testRoutes(t *testing.T) {
	x := m.cp.Index()
	weB := x.Workloads()[weUID(m.topo.B)]
	svcB := x.Services()[serviceKey("svc-b")]
	pod := x.Workloads()[controlplane.DefaultClusterID+"//Pod/"+meshNS+"/web"]
	if weB == nil || svcB == nil || pod == nil {
		t.Fatalf("the ambient index lacks node B's WorkloadEntry (%v), svc-b (%v) or the Pod (%v)", weB != nil, svcB != nil, pod != nil)
	}
	t.Logf("index: workload %s: %v", weUID(m.topo.B), weB)
	t.Logf("index: service %s: %v", serviceKey("svc-b"), svcB)
	t.Logf("index: workload Pod web: %v", pod)

	weAddr := onlyAddr(t, weB.GetAddresses())
	vip := netip.Addr{}
	for _, a := range svcB.GetAddresses() {
		vip, _ = netip.AddrFromSlice(a.GetAddress())
	}
	target := uint32(0)
	for _, pl := range weB.GetServices()[serviceKey("svc-b")].GetPorts() {
		if pl.GetServicePort() == svcPort {
			target = pl.GetTargetPort()
		}
	}
	if weAddr != m.topo.B.VethIP4 || vip.String() != vipB || target != xferPort || weB.GetServiceAccount() != "node-b" {
		t.Fatalf("index: node B's workload at %v (sa %q) serving svc-b at %v:%d → %d; want %v, %s:%d → %d",
			weAddr, weB.GetServiceAccount(), vip, svcPort, target, m.topo.B.VethIP4, vipB, svcPort, xferPort)
	}
	wantHBONE := netip.AddrPortFrom(weAddr, 15008).String()
	wantID := identity(weB.GetServiceAccount())

	svcDst := netip.AddrPortFrom(vip, svcPort).String()
	plan, _ := waitRoute(t, m.topo.A, svcDst, func(a routeAnswer) bool { return a.Kind == "hbone" })
	if plan.HBONEAddress != wantHBONE || plan.Target != netip.AddrPortFrom(weAddr, uint16(target)).String() ||
		!slices.Contains(plan.Identities, wantID) || plan.Endpoints != 1 || !plan.Captured {
		t.Errorf("node A's plan of %s: %+v; want HBONE to %s, target %v:%d, identity %s, 1 endpoint, captured", svcDst, plan, wantHBONE, weAddr, target, wantID)
	}
	out := m.routeCommand(t, m.topo.A, svcDst)
	t.Logf("meshtun route --admin %s %s:\n%s", adminAddr, svcDst, out)
	for _, want := range []string{wantHBONE, wantID, netip.AddrPortFrom(weAddr, uint16(target)).String()} {
		if !strings.Contains(out, want) {
			t.Errorf("meshtun route --admin %s does not print %s", svcDst, want)
		}
	}

	wlDst := netip.AddrPortFrom(weAddr, xferPort).String()
	if plan, err := route(m.topo.A, wlDst); err != nil || plan.Kind != "hbone" || plan.HBONEAddress != wantHBONE || !slices.Equal(plan.Identities, []string{wantID}) {
		t.Errorf("node A's plan of node B's workload %s: %+v, %v; want HBONE to %s as %s", wlDst, plan, err, wantHBONE, wantID)
	}
	wlOut := m.routeCommand(t, m.topo.A, wlDst)
	t.Logf("meshtun route --admin %s %s:\n%s", adminAddr, wlDst, wlOut)

	podAddr := onlyAddr(t, pod.GetAddresses())
	podDst := netip.AddrPortFrom(podAddr, xferPort).String()
	if plan, err := route(m.topo.A, podDst); err != nil || plan.Kind != "hbone" || plan.HBONEAddress != netip.AddrPortFrom(podAddr, 15008).String() ||
		!slices.Equal(plan.Identities, []string{identity(pod.GetServiceAccount())}) {
		t.Errorf("node A's plan of the Pod %s: %+v, %v", podDst, plan, err)
	}

	raw, d := configDump(t, m.topo.A)
	t.Logf("node A /config_dump:\n%s", indent(raw))
	var wls []struct {
		Name, Namespace, Source string
		Addresses               []string
	}
	if err := json.Unmarshal(d["workloads"], &wls); err != nil {
		t.Fatalf("/config_dump workloads: %v", err)
	}
	found := false
	for _, w := range wls {
		if slices.Contains(w.Addresses, weAddr.String()) {
			found = w.Source == "xds" && w.Namespace == meshNS
		}
	}
	if !found {
		t.Errorf("node A's /config_dump has no workload from xds at %v: %s", weAddr, d["workloads"])
	}
}

func onlyAddr(t *testing.T, addrs [][]byte) netip.Addr {
	t.Helper()
	if len(addrs) != 1 {
		t.Fatalf("%d addresses, want 1", len(addrs))
	}
	a, ok := netip.AddrFromSlice(addrs[0])
	if !ok {
		t.Fatalf("address %x", addrs[0])
	}
	return a
}

func indent(b []byte) string {
	var out bytes.Buffer
	if json.Indent(&out, b, "", "  ") != nil {
		return string(b)
	}
	return out.String()
}

// serve runs an xfer server and an echo server on n's veth address at
// the target ports, closed when t ends (the whole test: later subtests
// use them too).
func serve(t *testing.T, n *topo.Node) {
	t.Helper()
	for _, s := range []struct {
		port  int
		serve func(net.Listener)
	}{{xferPort, xfer.Serve}, {echoPort, echoServe}} {
		l, err := n.Listen("tcp", netip.AddrPortFrom(n.VethIP4, uint16(s.port)).String())
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { defer close(done); s.serve(l) }()
		t.Cleanup(func() { l.Close(); <-done })
	}
}

// echoServe copies back what each connection of l sends, until l closes;
// it closes the connections it holds then.
func echoServe(l net.Listener) {
	conns := make(chan net.Conn, 64)
	defer func() {
		close(conns)
		for c := range conns {
			c.Close()
		}
	}()
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		select {
		case conns <- c:
		default:
		}
		go func() { defer c.Close(); io.Copy(c, c) }()
	}
}

func dial(n *topo.Node, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return n.Dial(ctx, "tcp", addr)
}

// Real flows through each node's TUN to the other node's service, over
// HBONE with the certificates Istio's CA issued: data intact both ways
// (xfer checks a SHA-256 of each direction), and each side's access log
// names the peer's identity from the mesh.
func (m *mesh) testTraffic(t *testing.T) {
	for _, c := range []struct {
		from, to *topo.Node
		vip      string
		toGW     *topo.Gateway
	}{{m.topo.A, m.topo.B, vipB, m.gwB}, {m.topo.B, m.topo.A, vipA, m.gwA}} {
		dst := c.vip + ":" + fmt.Sprint(svcPort)
		for _, size := range []struct{ up, down int64 }{{1, 1}, {8 << 20, 1}, {1, 8 << 20}} {
			conn, err := dial(c.from, dst)
			if err != nil {
				t.Fatalf("%s → %s: dial: %v", c.from.Name, dst, err)
			}
			r, err := xfer.Run(conn, size.up, size.down)
			if err != nil {
				t.Fatalf("%s → %s, %d bytes up, %d down: %v", c.from.Name, dst, size.up, size.down, err)
			}
			t.Logf("%s → %s: %d bytes up, %d down in %v", c.from.Name, dst, size.up, size.down, r.Duration)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		line, err := c.toGW.WaitLog(ctx, "src.identity="+identity(c.from.Name))
		cancel()
		if err != nil {
			t.Errorf("%s's access log never names %s: %v", c.to.Name, identity(c.from.Name), err)
		} else if !strings.Contains(line, "direction=inbound") {
			t.Errorf("%s's access line: %s", c.to.Name, line)
		}
		// Each end is named as istiod describes its WorkloadEntry (the
		// workload name is the entry's, the canonical service its app
		// label, the revision Istio's default): the source by the
		// sender's baggage or the receiver's own state, the destination by
		// the receiver's own workload. Opened is counted before the
		// CONNECT's answer, so the transfers above prove it.
		end := func(side string, n *topo.Node) []string {
			return []string{
				side + `_workload="` + workloadEntryName(n) + `"`, side + `_workload_namespace="` + meshNS + `"`,
				side + `_canonical_service="` + n.Name + `"`, side + `_canonical_revision="latest"`,
				side + `_cluster="` + m.cp.ClusterID() + `"`,
			}
		}
		want := append(append([]string{`reporter="destination"`}, end("source", c.from)...), end("destination", c.to)...)
		if got, series := openedWith(t, c.to, want); got < 3 {
			t.Errorf("%s: istio_tcp_connections_opened_total with %v = %v, want ≥ 3; series:\n%s", c.to.Name, want, got, strings.Join(series, "\n"))
		}
	}
}

// openedWith sums n's istio_tcp_connections_opened_total samples that
// carry every label="value" of want, and returns every sample line.
func openedWith(t *testing.T, n *topo.Node, want []string) (float64, []string) {
	t.Helper()
	b, err := get(n, metricsAddr, "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	var series []string
	for l := range strings.SplitSeq(string(b), "\n") {
		rest, ok := strings.CutPrefix(l, "istio_tcp_connections_opened_total{")
		labels, value, cut := strings.Cut(rest, "} ")
		if !ok || !cut {
			continue
		}
		series = append(series, l)
		match := true
		for _, w := range want {
			match = match && slices.Contains(strings.Split(labels, ","), w)
		}
		if v, err := strconv.ParseFloat(value, 64); match && err == nil {
			sum += v
		}
	}
	return sum, series
}

// A Pod deleted and made again with a new IP moves node A's plan for its
// service to the new address; the time from each change to the plan is
// measured and logged, not asserted.
func (m *mesh) testPodChange(t *testing.T) {
	dst := vipWeb + ":" + fmt.Sprint(svcPort)
	waitRoute(t, m.topo.A, dst, func(a routeAnswer) bool { return a.Target == podIP+":"+fmt.Sprint(xferPort) })

	start := time.Now()
	must(t, m.cp.DeletePod(meshNS, "web"))
	plan, at := waitRoute(t, m.topo.A, dst, func(a routeAnswer) bool { return a.Kind == "deny" })
	t.Logf("pod deleted → node A's plan has no endpoint: %v (%s: %s)", at.Sub(start).Round(time.Millisecond), plan.Kind, plan.Reason)

	start = time.Now()
	must(t, m.cp.ApplyPod(controlplane.NewPod(meshNS, "web", "web", podIPNew, map[string]string{"app": "web"})))
	plan, at = waitRoute(t, m.topo.A, dst, func(a routeAnswer) bool { return a.Target == podIPNew+":"+fmt.Sprint(xferPort) })
	t.Logf("pod recreated at %s → node A's plan sends there: %v", podIPNew, at.Sub(start).Round(time.Millisecond))
	if plan.Kind != "hbone" || plan.HBONEAddress != podIPNew+":15008" || !slices.Equal(plan.Identities, []string{identity("web")}) {
		t.Errorf("plan after the new pod: %+v", plan)
	}
}

// A DENY AuthorizationPolicy selecting node B's workload: node B closes
// the open inbound flow it now denies (the client's connection ends) and
// answers a new one with 401 (the client gets a RST). Deleting the policy
// lets new flows through again.
func (m *mesh) testDeny(t *testing.T) {
	dst := vipB + ":" + fmt.Sprint(echoSvcPort)
	open, err := dial(m.topo.A, dst)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	echo := func(c net.Conn, msg string) error {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write([]byte(msg)); err != nil {
			return err
		}
		b := make([]byte, len(msg))
		if _, err := io.ReadFull(c, b); err != nil {
			return err
		}
		if string(b) != msg {
			return fmt.Errorf("echo %q, want %q", b, msg)
		}
		return nil
	}
	if err := echo(open, "before the policy"); err != nil {
		t.Fatalf("open flow before the policy: %v", err)
	}

	const name = "deny-node-a"
	policy := &securityv1.AuthorizationPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: meshNS},
		Spec: securityapi.AuthorizationPolicy{
			Selector: &typeapi.WorkloadSelector{MatchLabels: map[string]string{"app": m.topo.B.Name}},
			Action:   securityapi.AuthorizationPolicy_DENY,
			Rules: []*securityapi.Rule{{From: []*securityapi.Rule_From{{Source: &securityapi.Source{
				Principals: []string{strings.TrimPrefix(identity("node-a"), "spiffe://")},
			}}}}},
		},
	}
	start := time.Now()
	must(t, m.cp.ApplyAuthorizationPolicy(policy))
	t.Cleanup(func() { _ = m.cp.DeleteAuthorizationPolicy(meshNS, name) })

	// The open flow ends: node B resets it as the policy arrives.
	open.SetDeadline(time.Now().Add(planTimeout))
	_, err = io.Copy(io.Discard, open)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the open flow was not closed within %v of the DENY policy", planTimeout)
	}
	t.Logf("open flow ended %v after the policy was applied (%v)", time.Since(start).Round(time.Millisecond), err)

	if c, err := dial(m.topo.A, dst); !errors.Is(err, syscall.ECONNREFUSED) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("new flow under the DENY policy: %v, want connection refused", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	line, err := m.gwB.WaitLog(ctx, "response_flags=DENY")
	if err != nil {
		t.Fatalf("node B's access log has no DENY: %v", err)
	}
	t.Logf("node B: %s", line)
	if line, err := m.gwA.WaitLog(ctx, "CONNECT refused: 401"); err != nil {
		t.Errorf("node A's log does not say node B answered 401: %v", err)
	} else {
		t.Logf("node A: %s", line)
	}

	must(t, m.cp.DeleteAuthorizationPolicy(meshNS, name))
	deadline := time.Now().Add(planTimeout)
	for {
		c, err := dial(m.topo.A, dst)
		if err == nil {
			err = echo(c, "after the policy")
			c.Close()
			if err != nil {
				t.Fatalf("flow after the policy was deleted: %v", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("flows still refused %v after the policy was deleted: %v", planTimeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitMetric polls name on n's /metrics until it is want, up to within.
func waitMetric(t *testing.T, n *topo.Node, name string, want float64, within time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(within)
	var v float64
	var err error
	for time.Now().Before(deadline) {
		if v, err = metric(n, name); err == nil && v == want {
			return time.Now()
		}
		time.Sleep(pollEvery)
	}
	t.Fatalf("%s's %s is %v (error %v), want %v within %v", n.Name, name, v, err, want, within)
	return time.Time{}
}

// reconnectTimeout bounds the wait for a node to find istiod again: its
// backoff starts at 100 ms and doubles, and istiod is down for a few
// seconds at most here.
const reconnectTimeout = 40 * time.Second

// istiod stopped: both nodes see the stream end (meshtun_xds_connected 0)
// and keep serving; a Service made meanwhile is in node A's plan once
// istiod serves again and the nodes have reconnected.
func (m *mesh) testRestart(t *testing.T) {
	for _, n := range []*topo.Node{m.topo.A, m.topo.B} {
		waitMetric(t, n, "meshtun_xds_connected", 1, planTimeout)
	}
	m.cp.Stop()
	stopped := time.Now()
	for _, n := range []*topo.Node{m.topo.A, m.topo.B} {
		waitMetric(t, n, "meshtun_xds_connected", 0, planTimeout)
	}
	must(t, m.cp.ApplyService(controlplane.NewService(meshNS, "late", vipLate, map[string]string{"app": m.topo.B.Name},
		controlplane.ServicePort{Name: "xfer", Port: svcPort, TargetPort: xferPort})))
	ctx, cancel := context.WithTimeout(context.Background(), planTimeout)
	defer cancel()
	if _, err := m.cp.WaitIndex(ctx, func(x controlplane.Index) bool { return x.Services()[serviceKey("late")] != nil }); err != nil {
		t.Fatal(err)
	}
	lateDst := vipLate + ":" + fmt.Sprint(svcPort)
	if plan, err := route(m.topo.A, lateDst); err != nil || plan.Kind != "deny" {
		t.Fatalf("node A's plan of %s while istiod is down: %+v, %v; want deny (not learned yet)", lateDst, plan, err)
	}
	// The nodes keep what they learned while istiod is away.
	if plan, err := route(m.topo.A, vipB+":"+fmt.Sprint(svcPort)); err != nil || plan.Kind != "hbone" {
		t.Errorf("node A's plan of svc-b while istiod is down: %+v, %v", plan, err)
	}
	t.Logf("istiod down for %v", time.Since(stopped).Round(time.Millisecond))
	must(t, m.cp.Restart())
	restarted := time.Now()
	for _, n := range []*topo.Node{m.topo.A, m.topo.B} {
		at := waitMetric(t, n, "meshtun_xds_connected", 1, reconnectTimeout)
		t.Logf("%s reconnected %v after the restart", n.Name, at.Sub(restarted).Round(time.Millisecond))
	}
	plan, at := waitRoute(t, m.topo.A, lateDst, func(a routeAnswer) bool { return a.Kind == "hbone" })
	t.Logf("service made while istiod was down in node A's plan %v after the restart: %+v", at.Sub(restarted).Round(time.Millisecond), plan)
	if plan.HBONEAddress != netip.AddrPortFrom(m.topo.B.VethIP4, 15008).String() || !slices.Equal(plan.Identities, []string{identity("node-b")}) {
		t.Errorf("plan of %s: %+v, want node B's workload", lateDst, plan)
	}
	if r, err := metric(m.topo.A, "meshtun_xds_reconnects_total"); err != nil || r < 1 {
		t.Errorf("node A's meshtun_xds_reconnects_total %v, %v; want at least 1", r, err)
	}
}

// A token istiod's TokenReview does not know: the CA and the xDS stream
// refuse it as Unauthenticated, meshtun logs that for both and keeps
// trying without becoming ready or exiting, and stops cleanly on SIGTERM.
func (m *mesh) testBadToken(t *testing.T) {
	tok, err := m.cp.BadToken()
	if err != nil {
		t.Fatal(err)
	}
	path := m.writeConfig(t, m.topo.B, "node-c", tok, "-bad")
	// In node B's gateway's place (writeConfig): the last subtest.
	if err := m.gwB.Stop(15 * time.Second); err != nil {
		t.Fatalf("stop node B's gateway: %v", err)
	}
	g := m.start(t, m.topo.B, path)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, what := range []string{"CA request failed", "xds stream ended"} {
		line, err := waitLogWith(ctx, g, what, "Unauthenticated")
		if err != nil {
			t.Fatalf("no log line %q saying Unauthenticated: %v\n%s", what, err, strings.Join(g.Logs(), "\n"))
		}
		t.Logf("bad token: %s", line)
		if !strings.Contains(line, "refused the token in "+tok) {
			t.Errorf("the log line does not name the token file %s: %s", tok, line)
		}
	}
	// It keeps asking, with backoff, and stays up meanwhile.
	const attempts = 3
	for len(g.LogsContaining("CA request failed")) < attempts {
		select {
		case <-g.Exited():
			t.Fatalf("meshtun exited with a bad token:\n%s", strings.Join(g.Logs(), "\n"))
		case <-ctx.Done():
			t.Fatalf("fewer than %d CA attempts within the wait: %v", attempts, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	select {
	case <-g.Exited():
		t.Fatalf("meshtun exited with a bad token:\n%s", strings.Join(g.Logs(), "\n"))
	default:
	}
	if b, err := get(m.topo.B, readinessAddr, "/healthz/ready"); err == nil {
		t.Errorf("meshtun with a bad token reports ready: %s", b)
	}
}

// waitLogWith waits for a line of g's log holding all of subs.
func waitLogWith(ctx context.Context, g *topo.Gateway, subs ...string) (string, error) {
	for {
		for _, l := range g.LogsContaining(subs[0]) {
			all := true
			for _, s := range subs[1:] {
				all = all && strings.Contains(l, s)
			}
			if all {
				return l, nil
			}
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
