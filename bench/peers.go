package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/meshtun/meshtun/internal/topo"
)

// The peers: what a user could run instead of the gateway pair, in the
// same two-node topology (a topology of their own each, like the kernel
// path), measured in the same run. Each is two proxy processes, one per
// node:
//
//	relay: client ─▶ 127.0.0.1:port (relay A) ─ TCP over veth ─▶ 192.0.2.2:port+relayPortOffset (relay B) ─▶ server
//	istio: client ─▶ 127.0.0.1:port (hbone-pair client: Istio's HBONE dialer) ═ mTLS, HTTP/2 CONNECT over veth ═▶ 192.0.2.2:15008 (hbone-pair server: Istio's HBONE server) ─▶ server
//
// The client dials proxy A's listener on node A's loopback (no redirect:
// node A of a peer has no route to node B's workloads at all, so nothing
// reaches the server except through both proxies).

// peerEntry is where a peer's proxy A listens in node A.
const peerEntry = "127.0.0.1"

// relayPortOffset: relay B listens on the veth address at the server's
// port plus this (the server already holds 0.0.0.0:port in node B).
const relayPortOffset = 10000

// istioHBONEPort is where hbone-pair's server listens in node B (HBONE's
// port).
const istioHBONEPort = 15008

// peerPorts are the server's ports the peers carry: bulk and echo.
var peerPorts = []int{BulkPort, EchoPort}

// istioNoHalfClose is why Istio's Go HBONE pair cannot take a figure
// that needs the client's half-close.
const istioNoHalfClose = "Istio's pkg/hbone dialer returns one end of a net.Pipe, which cannot half-close: the client's FIN can only be passed on by closing the stream both ways, which loses what the server sends after it (an upload's receipt, the server's FIN)"

// setupPeer builds a peer's topology and server and starts its proxies.
func (p *path) setupPeer(ctx context.Context) error {
	var err error
	if p.tp, err = topo.New("mtb" + p.name[:1]); err != nil {
		return err
	}
	if err := p.prepare(); err != nil {
		return err
	}
	if p.srv, err = NewServer(p.tp.B.Listen, "0.0.0.0"); err != nil {
		return err
	}
	p.entry = peerEntry
	switch p.name {
	case "relay":
		return p.startRelays(ctx)
	case "istio":
		return p.startIstio(ctx)
	}
	return fmt.Errorf("no peer %q", p.name)
}

// startRelays starts relay B, then relay A: this executable in relay
// mode (child.go).
func (p *path) startRelays(ctx context.Context) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	var fa, fb []string
	for _, port := range peerPorts {
		mid := net.JoinHostPort(p.tp.B.VethIP4.String(), fmt.Sprint(port+relayPortOffset))
		fa = append(fa, net.JoinHostPort(peerEntry, fmt.Sprint(port))+"="+mid)
		fb = append(fb, mid+"="+netAddr(p.tp.B.Workload4.String(), port))
	}
	if p.proxyB, err = startChild(ctx, p.tp.B, []string{relayEnv + "=" + strings.Join(fb, ",")}, p.e.logw, exe); err != nil {
		return err
	}
	p.proxyA, err = startChild(ctx, p.tp.A, []string{relayEnv + "=" + strings.Join(fa, ",")}, p.e.logw, exe)
	return err
}

// startIstio starts hbone-pair's server in node B, then its client in
// node A, with the gateways' certificates (each checks the other's
// SPIFFE ID).
func (p *path) startIstio(ctx context.Context) error {
	bin, err := filepath.Abs(p.e.cfg.IstioHBONE)
	if err != nil {
		return err
	}
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("hbone-pair binary: %w (cd interop/istiod && go build -o ../../bin/hbone-pair ./cmd/hbone-pair)", err)
	}
	id := func(n *topo.Node) string { return "spiffe://cluster.local/ns/meshtun/sa/" + n.Name }
	tlsArgs := func(self, peer *topo.Node) []string {
		return []string{
			"-cert", filepath.Join(p.e.dir, self.Name+".pem"),
			"-key", filepath.Join(p.e.dir, self.Name+"-key.pem"),
			"-ca", filepath.Join(p.e.dir, "ca.pem"),
			"-peer-id", id(peer),
		}
	}
	hbone := netAddr(p.tp.B.VethIP4.String(), istioHBONEPort)
	args := append([]string{"-mode", "server", "-listen", hbone}, tlsArgs(p.tp.B, p.tp.A)...)
	if p.proxyB, err = startChild(ctx, p.tp.B, nil, p.e.logw, bin, args...); err != nil {
		return err
	}
	var fwds []string
	for _, port := range peerPorts {
		fwds = append(fwds, netAddr(peerEntry, port)+"="+netAddr(p.tp.B.Workload4.String(), port))
	}
	args = append([]string{"-mode", "client", "-forward", strings.Join(fwds, ","), "-proxy", hbone}, tlsArgs(p.tp.A, p.tp.B)...)
	p.proxyA, err = startChild(ctx, p.tp.A, nil, p.e.logw, bin, args...)
	return err
}

func netAddr(host string, port int) string { return net.JoinHostPort(host, fmt.Sprint(port)) }

// stopProxies stops a peer's proxies, A first.
func (p *path) stopProxies() {
	for _, h := range []**helper{&p.proxyA, &p.proxyB} {
		if *h != nil {
			(*h).stop()
			*h = nil
		}
	}
}
