package controlplane_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshtun/meshtun/internal/topo"
	"github.com/meshtun/meshtun/interop/istiod/controlplane"
)

// The control plane serves from inside a network namespace (node A of
// meshtun's test topology) and a client in node B reaches it over the
// veth: how the end-to-end tests run it.
func TestServesInsideNetns(t *testing.T) {
	top, err := topo.New("mtistiod")
	if errors.Is(err, topo.ErrNotPermitted) {
		t.Skipf("needs root for network namespaces: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = top.Close() })
	addr := netip.AddrPortFrom(top.A.VethIP4, 15012).String()
	cp, err := controlplane.Start(controlplane.Options{
		Addr: addr, Dir: t.TempDir(), Logf: t.Logf, IstioLogLevel: "none",
		Listen: func(addr string) (net.Listener, error) { return top.A.Listen("tcp", addr) },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Close)
	if cp.Addr() != addr {
		t.Fatalf("serving on %s, want %s", cp.Addr(), addr)
	}

	tokenFile := token(t, cp, "vm", "vm-sa")
	conn := connect(t, cp, clientTLS(t, cp),
		grpc.WithPerRPCCredentials(tokenCreds{tokenFile: tokenFile, clusterID: cp.ClusterID()}),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return top.B.Dial(ctx, "tcp", addr)
		}))
	check := func(when string) {
		t.Helper()
		resp, err := createCertificate(t, conn, "spiffe://cluster.local/ns/vm/sa/vm-sa")
		// Right after a restart the client may still hold the transport
		// the old server closed (READY until it reads the EOF): a call on
		// it fails Unavailable, and a client tries again, as meshtun's
		// does after a backoff. A few tries, each on a connection seen
		// ready again.
		for try := 0; try < 5 && status.Code(err) == codes.Unavailable; try++ {
			waitReady(t, conn)
			resp, err = createCertificate(t, conn, "spiffe://cluster.local/ns/vm/sa/vm-sa")
		}
		if err != nil {
			t.Fatalf("%s: CreateCertificate from node B: %v", when, err)
		}
		if got := uris(parseChain(t, resp.CertChain)[0]); !slices.Equal(got, []string{"spiffe://cluster.local/ns/vm/sa/vm-sa"}) {
			t.Errorf("%s: leaf URI SANs %v", when, got)
		}
	}
	check("first start")
	if err := cp.Restart(); err != nil {
		t.Fatal(err)
	}
	waitReady(t, conn)
	check("after restart")
}
