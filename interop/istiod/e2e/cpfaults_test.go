package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pb "istio.io/api/security/v1alpha1"
	securityapi "istio.io/api/security/v1beta1"
	securityv1 "istio.io/client-go/pkg/apis/security/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshtun/meshtun/internal/topo"
	"github.com/meshtun/meshtun/internal/xfer"
	"github.com/meshtun/meshtun/interop/istiod/controlplane"
	meshtun "github.com/meshtun/meshtun/mesh"
)

// The control-plane fault tests of issue 12: what meshtun does when istiod
// is unreachable, gone, sends what meshtun cannot use, or its CA answers
// slowly or refuses. They run inside TestMeshtunInIstio (one control plane
// per process).

const (
	caSuccess = `meshtun_ca_renewals_total{result="success"}`
	caFailure = `meshtun_ca_renewals_total{result="failure"}`
	// renewWithin bounds the wait for a node's next CA request: it renews
	// at half of certTTL (±10%), and a failed request is retried at most
	// a backoff later.
	renewWithin = certTTL
)

// servedCert dials n's HBONE port from inside from and returns the leaf
// it presents, or the handshake's error. No client certificate is sent:
// the server's certificate reaches the client before it is asked for one.
func servedCert(from, n *topo.Node, port uint16) (*x509.Certificate, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	raw, err := from.Dial(ctx, "tcp", netip.AddrPortFrom(n.VethIP4, port).String())
	if err != nil {
		return nil, err
	}
	defer raw.Close()
	var leaf *x509.Certificate
	conn := tls.Client(raw, &tls.Config{
		NextProtos: []string{"h2"},
		// Only the leaf is looked at here; testCertificate checks the chain.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) > 0 {
				leaf = cs.PeerCertificates[0]
			}
			return nil
		},
	})
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	herr := conn.HandshakeContext(ctx)
	if leaf != nil {
		return leaf, nil
	}
	if herr == nil {
		herr = errors.New("no certificate presented")
	}
	return nil, herr
}

// waitMetricAbove polls n's sample name until it exceeds than, up to
// within; it returns the value seen.
func waitMetricAbove(t *testing.T, n *topo.Node, name string, than float64, within time.Duration) float64 {
	t.Helper()
	deadline := time.Now().Add(within)
	var v float64
	var err error
	for time.Now().Before(deadline) {
		if v, err = metric(n, name); err == nil && v > than {
			return v
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s's %s is %v (error %v), want above %v within %v", n.Name, name, v, err, than, within)
	return 0
}

// mustMetric reads one sample or fails the test.
func mustMetric(t *testing.T, n *topo.Node, name string) float64 {
	t.Helper()
	v, err := metric(n, name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// waitNewCert polls node A's HBONE port until it presents a certificate
// other than old, up to within.
func (m *mesh) waitNewCert(t *testing.T, old *x509.Certificate, within time.Duration) *x509.Certificate {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if c, err := servedCert(m.topo.B, m.topo.A, 15008); err == nil && c.SerialNumber.Cmp(old.SerialNumber) != 0 {
			return c
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("node A still presents certificate %v %v after the CA came back", old.SerialNumber, within)
	return nil
}

// checkOldCertServed fails the test unless node A still presents old,
// while old is valid (checked only then: after its expiry nothing is to be
// served).
func (m *mesh) checkOldCertServed(t *testing.T, old *x509.Certificate, what string) {
	t.Helper()
	c, err := servedCert(m.topo.B, m.topo.A, 15008)
	if time.Now().After(old.NotAfter) {
		t.Logf("%s: the old certificate has expired meanwhile (%v); not checked", what, old.NotAfter)
		return
	}
	if err != nil || c.SerialNumber.Cmp(old.SerialNumber) != 0 {
		t.Errorf("%s: node A presents %v (error %v), want the certificate in force before, serial %v", what, serial(c), err, old.SerialNumber)
	}
}

func serial(c *x509.Certificate) string {
	if c == nil {
		return "nothing"
	}
	return "serial " + c.SerialNumber.String()
}

// certsValid reports whether node A's certificate a and node B's current
// one are both still valid: a flow from A to B needs both.
func (m *mesh) certsValid(a *x509.Certificate) bool {
	b, err := servedCert(m.topo.A, m.topo.B, 15008)
	return err == nil && time.Now().Before(a.NotAfter) && time.Now().Before(b.NotAfter)
}

// flowAtoB carries one small xfer flow from node A to node B's service.
func (m *mesh) flowAtoB() error {
	conn, err := dial(m.topo.A, vipB+":"+fmt.Sprint(svcPort))
	if err != nil {
		return err
	}
	_, err = xfer.Run(conn, 64<<10, 64<<10)
	return err
}

// A policy Istio sends and meshtun cannot enforce (a principal with a '*'
// inside, which Istio passes on as an exact match and config's patterns
// would read as a wildcard) and a usable one beside it: meshtun NACKs the
// first with the reason, which reaches istiod, applies the second, and
// counts the NACK.
func (m *mesh) testNACK(t *testing.T) {
	before := mustMetric(t, m.topo.A, `meshtun_xds_nacks_total{type="authorization"}`)
	deny := func(name, principal string) *securityv1.AuthorizationPolicy {
		return &securityv1.AuthorizationPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: meshNS},
			Spec: securityapi.AuthorizationPolicy{
				Action: securityapi.AuthorizationPolicy_DENY,
				Rules: []*securityapi.Rule{{From: []*securityapi.Rule_From{{Source: &securityapi.Source{
					Principals: []string{principal},
				}}}}},
			},
		}
	}
	const bad, good = "deny-star-inside", "deny-nobody"
	for _, p := range []*securityv1.AuthorizationPolicy{
		deny(bad, "cluster.local/ns/"+meshNS+"/sa/a*b"),
		deny(good, "cluster.local/ns/"+meshNS+"/sa/nobody"),
	} {
		must(t, m.cp.ApplyAuthorizationPolicy(p))
		name := p.Name
		t.Cleanup(func() { _ = m.cp.DeleteAuthorizationPolicy(meshNS, name) })
	}

	waitMetricAbove(t, m.topo.A, `meshtun_xds_nacks_total{type="authorization"}`, before, planTimeout)
	var reason string
	deadline := time.Now().Add(planTimeout)
	for reason == "" && time.Now().Before(deadline) {
		for id, r := range m.cp.NACKs(meshtun.AuthorizationType) {
			if strings.Contains(id, m.topo.A.Name) && strings.Contains(r, bad) { // the id starts with the proxy's, <name>.<ns>
				reason = r
			}
		}
		time.Sleep(pollEvery)
	}
	if reason == "" {
		t.Fatalf("istiod holds no NACK of %s from node A: %v", bad, m.cp.NACKs(meshtun.AuthorizationType))
	}
	t.Logf("istiod's record of node A's NACK: %s", reason)
	if !strings.Contains(reason, "a*b") {
		t.Errorf("the NACK does not say what was refused: %s", reason)
	}

	// The rest is applied: the good policy is in force, the bad one not.
	deadline = time.Now().Add(planTimeout)
	for {
		raw, _ := configDump(t, m.topo.A)
		dump := string(raw)
		if strings.Contains(dump, meshNS+"/"+good) {
			if strings.Contains(dump, meshNS+"/"+bad) {
				t.Errorf("node A's /config_dump holds the refused policy %s", bad)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node A never applied %s beside the NACKed %s", good, bad)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := m.flowAtoB(); err != nil {
		t.Errorf("a flow after the NACK: %v", err)
	}
	line, err := waitLogWith(context.Background(), m.gwA, "xds NACK", bad)
	if err == nil {
		t.Logf("node A: %s", line)
	}
}

// istiod gone for a while (longer than the rest of a certificate's half
// life): flows go on with the last state, the certificate's renewal fails
// and is retried with backoff while the old one stays in force, the xDS
// stream is down and retried; once istiod is back on the same address the
// node reconnects and renews.
func (m *mesh) testGone(t *testing.T) {
	waitMetric(t, m.topo.A, "meshtun_xds_connected", 1, reconnectTimeout)
	old, err := servedCert(m.topo.B, m.topo.A, 15008)
	if err != nil {
		t.Fatalf("node A's certificate: %v", err)
	}
	failures := mustMetric(t, m.topo.A, caFailure)
	reconnects := mustMetric(t, m.topo.A, "meshtun_xds_reconnects_total")

	m.cp.Stop()
	stopped := time.Now()
	restarted := false
	defer func() {
		if !restarted {
			_ = m.cp.Restart()
		}
	}()
	waitMetric(t, m.topo.A, "meshtun_xds_connected", 0, planTimeout)
	waitMetricAbove(t, m.topo.A, caFailure, failures, renewWithin)
	t.Logf("node A's first failed renewal %v after istiod stopped", time.Since(stopped).Round(time.Millisecond))
	m.checkOldCertServed(t, old, "renewal failed")
	if err := m.flowAtoB(); err != nil && m.certsValid(old) {
		t.Errorf("a new flow to svc-b while istiod is gone: %v", err)
	}
	// Retried with backoff: a further failure, or more, while it is down.
	waitMetricAbove(t, m.topo.A, caFailure, failures+1, renewWithin)
	m.checkOldCertServed(t, old, "renewal failed again")
	t.Logf("istiod down for %v", time.Since(stopped).Round(time.Millisecond))

	must(t, m.cp.Restart())
	restarted = true
	back := time.Now()
	waitMetric(t, m.topo.A, "meshtun_xds_connected", 1, reconnectTimeout)
	renewed := m.waitNewCert(t, old, reconnectTimeout)
	t.Logf("node A renewed %v after istiod came back: serial %v → %v, not after %v", time.Since(back).Round(time.Millisecond),
		old.SerialNumber, renewed.SerialNumber, renewed.NotAfter.Format(time.RFC3339))
	if r := mustMetric(t, m.topo.A, "meshtun_xds_reconnects_total"); r <= reconnects {
		t.Errorf("meshtun_xds_reconnects_total %v, was %v before istiod went away", r, reconnects)
	}
	if err := m.flowAtoB(); err != nil {
		t.Errorf("a flow after istiod came back: %v", err)
	}
}

// Istio's CA refuses (the hook answering Unauthenticated; then Istio's
// own authenticator refusing the token meshtun sends), then answers
// slowly: the old certificate stays in force throughout, the refusals
// are counted as failures and retried, and the slow answer, once it
// comes, is the next certificate.
func (m *mesh) testCAFaults(t *testing.T) {
	defer m.caFault.Store(nil)
	t.Run("refuses", func(t *testing.T) {
		refuse := controlplane.CAHook(func(context.Context, *pb.IstioCertificateRequest) error {
			return status.Error(codes.Unauthenticated, "refused by the fault test")
		})
		m.caFault.Store(&refuse)
		// Read after the fault is in: no renewal can succeed from here.
		old, err := servedCert(m.topo.B, m.topo.A, 15008)
		if err != nil {
			t.Fatal(err)
		}
		failures := mustMetric(t, m.topo.A, caFailure)
		waitMetricAbove(t, m.topo.A, caFailure, failures+1, renewWithin)
		m.checkOldCertServed(t, old, "CA refusing")
		line, err := waitLogWith(context.Background(), m.gwA, "renewal failed", "refused by the fault test")
		if err != nil {
			t.Errorf("node A does not log the refusal: %v", err)
		} else {
			t.Logf("node A: %s", line)
		}
		m.caFault.Store(nil)
		renewed := m.waitNewCert(t, old, reconnectTimeout)
		t.Logf("renewed after the refusals: serial %v → %v", old.SerialNumber, renewed.SerialNumber)
	})
	t.Run("token refused by Istio's authenticator", func(t *testing.T) {
		orig, err := os.ReadFile(m.tokenA)
		if err != nil {
			t.Fatal(err)
		}
		badFile, err := m.cp.BadToken()
		if err != nil {
			t.Fatal(err)
		}
		bad, err := os.ReadFile(badFile)
		if err != nil {
			t.Fatal(err)
		}
		// Replaced as kubelet rotates a token: a new file renamed over.
		swap := func(content []byte) {
			t.Helper()
			tmp := m.tokenA + ".new"
			must(t, os.WriteFile(tmp, content, 0o600))
			must(t, os.Rename(tmp, m.tokenA))
		}
		swap(bad)
		restored := false
		defer func() {
			if !restored {
				swap(orig)
			}
		}()
		// Read after the swap: no renewal can succeed from here (a call
		// already past the authenticator aside, which the next read shows).
		old, err := servedCert(m.topo.B, m.topo.A, 15008)
		if err != nil {
			t.Fatal(err)
		}
		failures := mustMetric(t, m.topo.A, caFailure)
		waitMetricAbove(t, m.topo.A, caFailure, failures+1, renewWithin)
		m.checkOldCertServed(t, old, "token refused")
		// Istio's own refusal ("request authenticate failure"), not the hook's.
		line, err := waitLogWith(context.Background(), m.gwA, "renewal failed", "Unauthenticated", "request authenticate failure", m.tokenA)
		if err != nil {
			t.Errorf("node A does not log the refused token: %v", err)
		} else {
			t.Logf("node A: %s", line)
		}
		swap(orig)
		restored = true
		renewed := m.waitNewCert(t, old, reconnectTimeout)
		t.Logf("renewed with the token restored: serial %v → %v", old.SerialNumber, renewed.SerialNumber)
	})
	t.Run("slow", func(t *testing.T) {
		held, release := make(chan struct{}, 8), make(chan struct{})
		slow := controlplane.CAHook(func(ctx context.Context, _ *pb.IstioCertificateRequest) error {
			select {
			case held <- struct{}{}:
			default:
			}
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		m.caFault.Store(&slow)
		// Read after the fault is in: no renewal can complete from here.
		old, err := servedCert(m.topo.B, m.topo.A, 15008)
		if err != nil {
			t.Fatal(err)
		}
		successes := mustMetric(t, m.topo.A, caSuccess)
		defer func() {
			m.caFault.Store(nil)
			select {
			case <-release:
			default:
				close(release)
			}
		}()
		select {
		case <-held:
		case <-time.After(renewWithin):
			t.Fatalf("no CA call within %v", renewWithin)
		}
		// A call is held (node A's or node B's): the certificates in
		// force stay meanwhile.
		m.checkOldCertServed(t, old, "CA call held")
		if err := m.flowAtoB(); err != nil && m.certsValid(old) {
			t.Errorf("a flow while the CA is slow: %v", err)
		}
		close(release)
		renewed := m.waitNewCert(t, old, reconnectTimeout)
		waitMetricAbove(t, m.topo.A, caSuccess, successes, planTimeout)
		t.Logf("the slow answer is in force: serial %v → %v", old.SerialNumber, renewed.SerialNumber)
	})
}

// istiod unreachable when a gateway starts (node B's own, restarted
// while istiod is stopped: a second gateway in a node cannot run, as both
// would install the same capture rule, tun.RulePriority): it runs anyway
// (listeners up, HBONE handshakes refused cleanly for want of a
// certificate), readiness says what it waits for, the log says it is
// waiting; once istiod is back it joins without a restart and carries
// flows.
func (m *mesh) testUnreachableAtStart(t *testing.T) {
	if err := m.gwB.Stop(15 * time.Second); err != nil {
		t.Fatalf("stop node B's gateway: %v", err)
	}
	m.cp.Stop()
	restarted := false
	defer func() {
		if !restarted {
			_ = m.cp.Restart()
		}
	}()
	g := m.start(t, m.topo.B, filepath.Join(m.dir, m.topo.B.Name+".toml"))
	m.gwB = g
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	for _, what := range []string{"waiting for istiod", "no certificate yet; CA request failed"} {
		line, err := waitLogWith(ctx, g, what)
		if err != nil {
			t.Fatalf("no log line %q: %v", what, err)
		}
		t.Logf("istiod unreachable: %s", line)
	}
	// Serving: readiness answers, not ready, with the reason.
	var body []byte
	var err error
	for {
		body, err = get(m.topo.B, readinessAddr, "/healthz/ready")
		if err != nil && strings.Contains(string(body), "no certificate from Istio's CA yet") {
			break
		}
		if err == nil {
			t.Fatalf("ready with istiod unreachable: %s", body)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("readiness never said why it is not ready: %q, %v", body, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Logf("readiness: %s", strings.TrimSpace(string(body)))
	if c, err := servedCert(m.topo.A, m.topo.B, 15008); err == nil {
		t.Errorf("node B presented a certificate before the CA issued one: %v", c.Subject)
	}
	if _, err := waitLogWith(ctx, g, "TLS handshake refused", "no certificate"); err != nil {
		t.Errorf("the refused handshake was not logged: %v", err)
	}
	select {
	case <-g.Exited():
		t.Fatal("meshtun exited while istiod was unreachable")
	default:
	}

	must(t, m.cp.Restart())
	restarted = true
	back := time.Now()
	if err := g.WaitReady(ctx, readinessAddr); err != nil {
		t.Fatalf("not ready after istiod came back: %v", err)
	}
	t.Logf("ready %v after istiod came back", time.Since(back).Round(time.Millisecond))
	c, err := servedCert(m.topo.A, m.topo.B, 15008)
	if err != nil {
		t.Fatalf("no certificate served once joined: %v", err)
	}
	if got := uriStrings(c.URIs); len(got) != 1 || got[0] != identity("node-b") {
		t.Errorf("certificate URIs %v, want %s", got, identity("node-b"))
	}
	// Joined: flows reach it over HBONE (node A may need a moment for a
	// new connection to the restarted node; bounded retries).
	deadline := time.Now().Add(planTimeout)
	for err := m.flowAtoB(); err != nil; err = m.flowAtoB() {
		if time.Now().After(deadline) {
			t.Fatalf("no flow from node A to the joined node B within %v: %v", planTimeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%d log lines said it was waiting (\"still waiting\", CA failures)",
		len(g.LogsContaining("still waiting"))+len(g.LogsContaining("CA request failed")))
}
