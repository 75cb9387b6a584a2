// Command demo-mesh is `make demo-mesh`: the walkthrough of
// examples/vm-in-ambient-mesh, run on one machine against Istio's own
// control plane (package controlplane: istiod's discovery server, ambient
// index and CA, in process). It builds the two-node topology of
// internal/topo in network namespaces; serves the control plane from node
// A, the VM; applies the walkthrough's vm.yaml (the VM's WorkloadEntry at
// node A's address) and, for node B, a WorkloadEntry and a Service (the
// "server" workload, standing in for a pod); writes each node's
// gateway.toml from the walkthrough's with the control plane's address,
// root certificate, server name and a token filled in; starts meshtun on
// both nodes; prints what node A learned from istiod (/config_dump, and
// `meshtun route --admin` for the service); pushes one transfer from node
// A through the service's VIP to the server on node B, sha256-checked both
// ways; and removes everything, on failure too. It exits 0 only if every
// step passed. It needs root.
//
//	cd interop/istiod && go run ./cmd/demo-mesh -bin ../../bin/meshtun -example ../../examples/vm-in-ambient-mesh
//
// It lives in the interop/istiod module because it imports Istio's
// control plane, whose dependency tree the project's own module keeps out.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"istio.io/istio/pkg/workloadapi"

	"github.com/meshtun/meshtun/internal/topo"
	"github.com/meshtun/meshtun/internal/xfer"
	"github.com/meshtun/meshtun/interop/istiod/controlplane"
)

// The server workload on node B, which the demo creates beside the
// walkthrough's VM: a WorkloadEntry that speaks HBONE (meshtun runs there
// too) and a ClusterIP Service selecting it.
const (
	serverNamespace = "demo"
	serverName      = "server"
	serverAccount   = "server"
	servicePort     = 80
	targetPort      = 8080
)

// serviceVIP is the server Service's ClusterIP, inside the service CIDR
// the walkthrough captures (10.96.0.0/12).
var serviceVIP = netip.MustParseAddr("10.96.10.10")

// Bounds of the steps that wait.
const (
	// indexTimeout bounds the wait for Istio's ambient index to hold the
	// applied objects; it follows them within istiod's debounce (100 ms)
	// on a quiet machine, a few seconds on a loaded one.
	indexTimeout = 30 * time.Second
	// readyTimeout bounds a gateway's readiness: the first certificate and
	// istiod's first complete push. Seconds normally; Istio's first pushes
	// after its start are slow on a loaded 2-core machine.
	readyTimeout = 2 * time.Minute
	// planTimeout bounds the wait for node A's plan for the service VIP to
	// be HBONE to node B (it already is at readiness, unless a push was
	// split).
	planTimeout = 30 * time.Second
	// transferTimeout bounds the transfer, far above its expected second.
	transferTimeout = 2 * time.Minute
	// stopTimeout is what a gateway gets to drain after SIGTERM
	// (gateway.drain_timeout is 5 s in the walkthrough) before it is killed.
	stopTimeout = 15 * time.Second
	// logTimeout bounds the wait for the transfer's access-log lines,
	// written as each gateway ends the flow, moments after the client.
	logTimeout = 10 * time.Second
	// adminTimeout bounds one question to a gateway's admin listener.
	adminTimeout = 5 * time.Second
	// pollEvery is how often a wait asks again.
	pollEvery = 100 * time.Millisecond
)

func main() {
	var o options
	flag.StringVar(&o.bin, "bin", "../../bin/meshtun", "the meshtun binary")
	flag.StringVar(&o.example, "example", "../../examples/vm-in-ambient-mesh", "the walkthrough's folder (vm.yaml, gateway.toml)")
	flag.Int64Var(&o.bytes, "bytes", 64<<20, "bytes of the transfer, each direction")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary directory (configs, tokens, root certificate, logs)")
	flag.StringVar(&o.istioLog, "istio-log", "none", "Istio's log level (debug, info, warn, error, none), into istiod.log")
	flag.BoolVar(&o.networks, "networks", false, "the walkthrough's second part: the VM in its own network, the server behind its network's east-west gateway (istiod with AMBIENT_ENABLE_MULTI_NETWORK)")
	flag.Parse()
	// Istio reads its feature flags as the program starts: re-run with
	// them in the environment (the arguments are kept).
	if o.networks && os.Getenv("AMBIENT_ENABLE_MULTI_NETWORK") != "true" {
		exe, err := os.Executable()
		if err == nil {
			err = syscall.Exec(exe, os.Args, append(os.Environ(), "AMBIENT_ENABLE_MULTI_NETWORK=true", "PILOT_ENABLE_AMBIENT=true"))
		}
		fmt.Fprintln(os.Stderr, "demo-mesh: re-exec with AMBIENT_ENABLE_MULTI_NETWORK:", err)
		os.Exit(1)
	}
	if err := controlplane.ReexecWithAmbient(); err != nil {
		fmt.Fprintln(os.Stderr, "demo-mesh:", err)
		os.Exit(1)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, o)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "\nDEMO FAILED: %v\n", err)
		os.Exit(1)
	}
	fmt.Println("\nDEMO PASSED")
}

type options struct {
	bin, example, istioLog string
	bytes                  int64
	keep                   bool
	// networks: the VM in vmNetwork, the server in clusterNetwork behind
	// node B as that network's east-west gateway (README, "The VM in its
	// own network").
	networks bool
}

// The networks of -networks, and node B's east-west listener.
const (
	vmNetwork      = "vm-net"
	clusterNetwork = "cluster-net"
	eastWestPort   = 15009
)

func step(format string, args ...any) {
	fmt.Printf("==> "+format+"\n", args...)
}

func detail(format string, args ...any) {
	fmt.Printf("    "+format+"\n", args...)
}

func run(ctx context.Context, o options) (err error) {
	if err := topo.Available(); err != nil {
		return fmt.Errorf("%w\n  make demo-mesh builds network namespaces and TUN devices: run it as root (sudo make demo-mesh)", err)
	}
	bin, err := filepath.Abs(o.bin)
	if err != nil {
		return err
	}
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("the meshtun binary: %w (make build)", err)
	}
	ex, err := loadExample(o.example)
	if err != nil {
		return err
	}
	vmIdentity := spiffeID(ex.namespace, ex.serviceAccountName)
	serverIdentity := spiffeID(serverNamespace, serverAccount)
	step("walkthrough %s: %s (WorkloadEntry %s/%s, ServiceAccount %s, HBONE by label %s=http), %s (identity %s)",
		o.example, exampleYAML, ex.vm.Namespace, ex.vm.Name, ex.serviceAccount.Name, controlplane.TunnelLabel, exampleTOML, vmIdentity)

	dir, err := os.MkdirTemp("", "meshtun-demo-mesh-")
	if err != nil {
		return err
	}
	if o.keep {
		detail("keeping %s", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	logFile, err := os.Create(filepath.Join(dir, "gateways.log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	istiodLog, err := os.Create(filepath.Join(dir, "istiod.log"))
	if err != nil {
		return err
	}
	defer istiodLog.Close()

	step("topology: namespaces node-a (the VM, 192.0.2.1) and node-b (a server workload, 10.244.2.5), joined by a veth")
	tp, err := topo.New("mtmesh")
	if err != nil {
		return err
	}
	defer func() {
		if cerr := tp.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	// A flat network, as ambient needs for a VM: the VM reaches pod IPs
	// (ztunnel's HBONE on <pod ip>:15008) and pods reach the VM. With
	// -networks the VM reaches only node B's own address, where the
	// east-west gateway listens.
	if !o.networks {
		if err := tp.Direct(); err != nil {
			return err
		}
	}
	vmAddr, serverAddr := tp.A.VethIP4, tp.B.Workload4

	step("control plane: Istio's discovery server, ambient index and CA, in process, serving from node-a (takes a few seconds)")
	start := time.Now()
	cp, err := controlplane.Start(controlplane.Options{
		Addr:          netip.AddrPortFrom(vmAddr, 15012).String(),
		Listen:        func(addr string) (net.Listener, error) { return tp.A.Listen("tcp", addr) },
		Dir:           filepath.Join(dir, "istiod"),
		IstioLogLevel: o.istioLog,
		Logf:          func(f string, a ...any) { fmt.Fprintf(istiodLog, f+"\n", a...) },
	})
	if err != nil {
		return err
	}
	defer cp.Close()
	detail("serving xDS and the CA on %s, certificate for %s, cluster %s (%v)", cp.Addr(), cp.ServerName(), cp.ClusterID(),
		time.Since(start).Round(100*time.Millisecond))
	detail("root certificate %s (in a cluster: the istio-ca-root-cert ConfigMap)", cp.RootCertFile())

	step("objects: %s with the WorkloadEntry's spec.address %s -> %s (node-a); for node-b a WorkloadEntry %s/%s at %s and a Service at %s:%d -> %d",
		exampleYAML, ex.vm.Spec.Address, vmAddr, serverNamespace, serverName, serverAddr, serviceVIP, servicePort, targetPort)
	if err := ex.apply(cp, vmAddr.String()); err != nil {
		return err
	}
	if o.networks {
		// The cluster's network first, before any workload of it: an
		// index that saw the server before the label could keep it
		// without its network's gateway (CI saw the wait below time out).
		if err := applyClusterNetwork(cp); err != nil {
			return err
		}
	}
	if err := applyServer(cp, serverAddr, o.networks); err != nil {
		return err
	}
	if o.networks {
		if err := applyNetworks(cp, ex, vmAddr, tp.B.VethIP4); err != nil {
			return err
		}
	}
	vmUID := workloadUID(cp, ex.vm.Namespace, ex.vm.Name)
	serverUID := workloadUID(cp, serverNamespace, serverName)
	serviceKey := serverNamespace + "/" + serviceHost()
	ictx, cancel := context.WithTimeout(ctx, indexTimeout)
	index, err := cp.WaitIndex(ictx, func(x controlplane.Index) bool {
		w := x.Workloads()
		_, svc := x.Services()[serviceKey]
		return (o.networks || w[vmUID].GetTunnelProtocol() == workloadapi.TunnelProtocol_HBONE) &&
			w[serverUID].GetServices()[serviceKey] != nil && svc &&
			(!o.networks || w[serverUID].GetNetworkGateway() != nil)
	})
	cancel()
	if err != nil {
		return fmt.Errorf("istio's ambient index: %w", err)
	}
	for _, uid := range []string{vmUID, serverUID} {
		w := index.Workloads()[uid]
		if w == nil {
			// A multi-network istiod keeps a workload of another network
			// (the VM) out of what it sends.
			detail("index: workload %s not sent on its own (another network than the cluster's)", uid)
			continue
		}
		detail("index: workload %s %v sa=%s tunnel=%v native_tunnel=%v network=%q network_gateway=%v", uid, ips(w.GetAddresses()),
			w.GetServiceAccount(), w.GetTunnelProtocol(), w.GetNativeTunnel(), w.GetNetwork(), w.GetNetworkGateway())
	}
	detail("index: service %s vips=%v", serviceKey, serviceVIPs(index.Services()[serviceKey]))

	step("tokens: service-account tokens with audience %s (in a cluster: kubectl create token SA -n NS --audience %s)",
		controlplane.Audience, controlplane.Audience)
	vmToken, err := cp.Token(ex.namespace, ex.serviceAccountName)
	if err != nil {
		return err
	}
	serverToken, err := cp.Token(serverNamespace, serverAccount)
	if err != nil {
		return err
	}
	detail("%s/%s: %s", ex.namespace, ex.serviceAccountName, vmToken)
	detail("%s/%s: %s", serverNamespace, serverAccount, serverToken)

	step("configs: each node's gateway.toml is the walkthrough's, with these keys changed")
	nodes := []struct {
		node   *topo.Node
		config *nodeConfig
	}{
		{tp.A, meshConfig(cp, ex.vm.Name, ex.namespace, ex.serviceAccountName, vmToken, vmAddr, tp.A.TUNAddr4)},
		{tp.B, meshConfig(cp, serverName, serverNamespace, serverAccount, serverToken, serverAddr, tp.B.TUNAddr4)},
	}
	if o.networks {
		nodes[0].config.add("mesh", "network", tomlString(vmNetwork))
		nodes[1].config.add("mesh", "network", tomlString(clusterNetwork))
		nodes[1].config.add("gateway", "east_west", tomlString(netip.AddrPortFrom(netip.IPv4Unspecified(), eastWestPort).String()))
	}
	configs := map[*topo.Node]string{}
	for _, n := range nodes {
		text, changes, err := n.config.render(ex.gatewayTOML)
		if err != nil {
			return fmt.Errorf("%s's config: %w", n.node.Name, err)
		}
		path := filepath.Join(dir, n.node.Name+".toml")
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			return err
		}
		configs[n.node] = path
		detail("%s:", path)
		for _, c := range changes {
			detail("  %-22s %s (was %s)", c.key, c.now, c.was)
		}
		out, err := exec.CommandContext(ctx, bin, "validate", "--config", path).CombinedOutput()
		detail("  meshtun validate: %s", strings.TrimSpace(string(out)))
		if err != nil {
			return fmt.Errorf("meshtun validate %s: %w", path, err)
		}
	}

	step("gateways: meshtun run on both nodes; ready once Istio's CA issued the certificate and istiod's first push is in")
	gws := map[*topo.Node]*topo.Gateway{}
	defer func() {
		step("teardown: gateways stopped (SIGTERM, drain), control plane closed, namespaces and files removed")
		if err != nil {
			for _, n := range []*topo.Node{tp.A, tp.B} {
				if g := gws[n]; g != nil {
					printTail(n.Name, g.Logs())
				}
			}
		}
		for _, n := range []*topo.Node{tp.A, tp.B} {
			if g := gws[n]; g != nil {
				if serr := g.Stop(stopTimeout); serr != nil && err == nil {
					err = fmt.Errorf("gateway %s: %w", n.Name, serr)
				}
			}
		}
	}()
	start = time.Now()
	for _, n := range []*topo.Node{tp.B, tp.A} {
		g, err := n.StartGateway(bin, configs[n], logFile)
		if err != nil {
			return err
		}
		gws[n] = g
	}
	for _, n := range []*topo.Node{tp.B, tp.A} {
		rctx, cancel := context.WithTimeout(ctx, readyTimeout)
		err := gws[n].WaitReady(rctx, "127.0.0.1:15021")
		cancel()
		if err != nil {
			return err
		}
		detail("%s ready %v after the start", n.Name, time.Since(start).Round(100*time.Millisecond))
	}

	step("what node-a (the VM) learned: GET /config_dump")
	dumpA, err := fetchDump(ctx, tp.A)
	if err != nil {
		return err
	}
	if err := showDump(dumpA, vmIdentity); err != nil {
		return fmt.Errorf("node-a's /config_dump: %w", err)
	}
	if err := checkLearned(dumpA, vmAddr, serverAddr, serverIdentity, o.networks); err != nil {
		return fmt.Errorf("node-a's /config_dump: %w", err)
	}
	dumpB, err := fetchDump(ctx, tp.B)
	if err != nil {
		return err
	}
	detail("node-b's certificate: %s", certificateLine(dumpB))
	if dumpB.Certificate.Identity != serverIdentity {
		return fmt.Errorf("node-b's certificate is %q, want %s", dumpB.Certificate.Identity, serverIdentity)
	}

	vip := netip.AddrPortFrom(serviceVIP, servicePort)
	step("node-a's plan for the service: meshtun route --admin 127.0.0.1:15000 %s", vip)
	if err := waitPlan(ctx, tp.A, vip, netip.AddrPortFrom(serverAddr, 15008), serverIdentity); err != nil {
		return err
	}
	if o.networks {
		if err := waitGatewayHop(ctx, tp.A, vip, netip.AddrPortFrom(tp.B.VethIP4, eastWestPort), serverIdentity); err != nil {
			return err
		}
	}
	out, err := tp.A.Command(ctx, bin, "route", "--admin", "127.0.0.1:15000", vip.String()).CombinedOutput()
	fmt.Print(indent(string(out)))
	if err != nil {
		return fmt.Errorf("meshtun route --admin: %w", err)
	}

	target := netip.AddrPortFrom(serverAddr, targetPort).String()
	step("transfer: %d MiB from node-a to %s (the service VIP) and %d MiB back, served at %s on node-b, sha256 checked both ends",
		o.bytes>>20, vip, o.bytes>>20, target)
	l, err := tp.B.Listen("tcp", target)
	if err != nil {
		return err
	}
	served := make(chan struct{})
	go func() { xfer.Serve(l); close(served) }()
	defer func() { l.Close(); <-served }()
	r, err := transfer(ctx, tp.A, vip.String(), o.bytes)
	if err != nil {
		return err
	}
	detail("sent %d bytes, received %d bytes, hashes equal, %v (%.0f MB/s each way)", r.Sent, r.Received,
		r.Duration.Round(time.Millisecond), float64(r.Sent)/r.Duration.Seconds()/1e6)

	step("access log, one line per connection: node-a sent it to the server's identity, node-b saw the VM's")
	lctx, cancel := context.WithTimeout(ctx, logTimeout)
	defer cancel()
	lineA, err := gws[tp.A].WaitLog(lctx, "connection complete")
	if err != nil {
		return err
	}
	detail("node-a: %s", lineA)
	lineB, err := gws[tp.B].WaitLog(lctx, "connection complete")
	if err != nil {
		return err
	}
	detail("node-b: %s", lineB)
	if !strings.Contains(lineA, serverIdentity) {
		return fmt.Errorf("node-a's access log does not name the server's identity %s", serverIdentity)
	}
	if !strings.Contains(lineB, vmIdentity) {
		return fmt.Errorf("node-b's access log does not name the VM's identity %s", vmIdentity)
	}
	if o.networks {
		// Node B carried the flow twice: as the gateway (the outer
		// CONNECT, the inner TLS passed on as bytes) and as its
		// destination (the inner CONNECT, the VM's identity from the
		// inner TLS).
		for _, dir := range []string{"direction=east-west", "direction=inbound"} {
			line, err := gws[tp.B].WaitLog(lctx, dir)
			if err != nil {
				return fmt.Errorf("node-b's access log has no %s line: %w", dir, err)
			}
			if !strings.Contains(line, vmIdentity) {
				return fmt.Errorf("node-b's %s line does not name the VM's identity %s: %s", dir, vmIdentity, line)
			}
			detail("node-b, %s: %s", dir, line)
		}
	}
	return nil
}

// applyClusterNetwork labels istio-system with the cluster's network, as
// a multi-network install does.
func applyClusterNetwork(cp *controlplane.ControlPlane) error {
	return cp.ApplyNamespace(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: "istio-system", Labels: map[string]string{controlplane.NetworkLabel: clusterNetwork},
	}})
}

// applyNetworks is the rest of the cluster side of "the VM in its own
// network" (after applyClusterNetwork): the VM's WorkloadEntry in
// vmNetwork, and the cluster network's east-west gateway as istiod reads
// one, at node B's own address: node B's meshtun is that gateway
// (gateway.east_west), so the Gateway names node B's service account.
func applyNetworks(cp *controlplane.ControlPlane, ex *example, vmAddr, gatewayAddr netip.Addr) error {
	vm := ex.vm.DeepCopy()
	vm.Spec.Address = vmAddr.String()
	vm.Spec.Network = vmNetwork
	if err := cp.ApplyWorkloadEntry(vm); err != nil {
		return err
	}
	gw := controlplane.NewNetworkGateway(serverNamespace, "eastwest", clusterNetwork, gatewayAddr.String(), eastWestPort)
	gw.Annotations = map[string]string{"gateway.istio.io/service-account": serverAccount}
	return cp.ApplyGateway(gw)
}

// waitGatewayHop waits until node's plan for dst goes through the
// network gateway at gw, expecting identity there.
func waitGatewayHop(ctx context.Context, node *topo.Node, dst, gw netip.AddrPort, identity string) error {
	var last routeAnswer
	ctx, cancel := context.WithTimeout(ctx, planTimeout)
	defer cancel()
	for {
		var p routeAnswer
		err := adminGet(ctx, node, "/route?dst="+dst.String(), &p)
		if err == nil && p.Gateway != nil && p.Gateway.Address == gw.String() && slices.Contains(p.Gateway.Identities, identity) {
			return nil
		}
		last = p
		select {
		case <-ctx.Done():
			return fmt.Errorf("node-a's plan for %s never went through the network gateway %s (%s): last %+v (%v)", dst, gw, identity, last, err)
		case <-time.After(pollEvery):
		}
	}
}

// spiffeID is the identity Istio's CA issues namespace/serviceAccount in
// the control plane's trust domain.
func spiffeID(namespace, serviceAccount string) string {
	return "spiffe://" + controlplane.TrustDomain + "/ns/" + namespace + "/sa/" + serviceAccount
}

// workloadUID is the xDS resource name of a WorkloadEntry's workload.
func workloadUID(cp *controlplane.ControlPlane, namespace, name string) string {
	return cp.ClusterID() + "/networking.istio.io/WorkloadEntry/" + namespace + "/" + name
}

func serviceHost() string {
	return serverName + "." + serverNamespace + ".svc.cluster.local"
}

// applyServer creates node B's server workload: its namespace and service
// account, a WorkloadEntry that speaks HBONE at addr, and a Service
// selecting it.
func applyServer(cp *controlplane.ControlPlane, addr netip.Addr, networks bool) error {
	if err := cp.ApplyNamespace(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: serverNamespace}}); err != nil {
		return err
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: serverAccount, Namespace: serverNamespace}}
	if err := applyServiceAccount(cp, sa); err != nil {
		return err
	}
	labels := map[string]string{"app": serverName}
	we := controlplane.NewWorkloadEntry(serverNamespace, serverName, serverAccount, addr.String(), labels)
	if networks {
		we.Spec.Network = clusterNetwork
	}
	if err := cp.ApplyWorkloadEntry(we); err != nil {
		return err
	}
	return cp.ApplyService(controlplane.NewService(serverNamespace, serverName, serviceVIP.String(), labels,
		controlplane.ServicePort{Name: "tcp", Port: servicePort, TargetPort: targetPort}))
}

// meshConfig is what a node's gateway.toml changes of the walkthrough's:
// its name, the control plane's address, root certificate, server name,
// its token and identity, its own address and its TUN address.
func meshConfig(cp *controlplane.ControlPlane, name, namespace, serviceAccount, token string, addr netip.Addr, tun netip.Prefix) *nodeConfig {
	n := &nodeConfig{}
	n.set("gateway", "name", tomlString(name))
	n.set("mesh", "xds_address", tomlString(cp.Addr()))
	n.set("mesh", "root_cert", tomlString(cp.RootCertFile()))
	n.set("mesh", "server_name", tomlString(cp.ServerName()))
	n.set("mesh", "token_file", tomlString(token))
	n.set("mesh", "cluster_id", tomlString(cp.ClusterID()))
	n.set("mesh", "namespace", tomlString(namespace))
	n.set("mesh", "service_account", tomlString(serviceAccount))
	n.set("mesh", "instance_ips", tomlStrings([]netip.Addr{addr}))
	n.set("tun", "addresses", tomlStrings([]netip.Prefix{tun}))
	return n
}

func ips(addrs [][]byte) []netip.Addr {
	var out []netip.Addr
	for _, b := range addrs {
		if a, ok := netip.AddrFromSlice(b); ok {
			out = append(out, a)
		}
	}
	return out
}

func serviceVIPs(s *workloadapi.Service) []netip.Addr {
	var out []netip.Addr
	for _, a := range s.GetAddresses() {
		if ip, ok := netip.AddrFromSlice(a.GetAddress()); ok {
			out = append(out, ip)
		}
	}
	return out
}

// adminGet asks a gateway's admin listener (inside node) for path.
func adminGet(ctx context.Context, node *topo.Node, path string, into any) error {
	client := &http.Client{
		Timeout: adminTimeout,
		Transport: &http.Transport{
			DialContext:       func(ctx context.Context, network, a string) (net.Conn, error) { return node.Dial(ctx, network, a) },
			DisableKeepAlives: true,
		},
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:15000"+path, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("%s's admin listener: %w", node.Name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("%s's admin listener: %w", node.Name, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s's admin listener: GET %s: %s: %s", node.Name, path, resp.Status, strings.TrimSpace(string(body)))
	}
	if err := json.Unmarshal(body, into); err != nil {
		return fmt.Errorf("%s's admin listener: GET %s: %w", node.Name, path, err)
	}
	return nil
}

// configDump is the part of /config_dump the demo shows.
type configDump struct {
	Certificate struct {
		Source   string    `json:"source"`
		Identity string    `json:"identity"`
		NotAfter time.Time `json:"not_after"`
		CA       *struct {
			Renewals    uint64    `json:"renewals"`
			NextAttempt time.Time `json:"next_attempt"`
		} `json:"ca"`
	} `json:"certificate"`
	XDS *struct {
		NodeID    string `json:"node_id"`
		Connected bool   `json:"connected"`
		Types     map[string]struct {
			Resources int  `json:"resources"`
			Ready     bool `json:"ready"`
		} `json:"types"`
	} `json:"xds"`
	Workloads []struct {
		Name         string   `json:"name"`
		Namespace    string   `json:"namespace"`
		Addresses    []string `json:"addresses"`
		Protocol     string   `json:"protocol"`
		HBONEAddress string   `json:"hbone_address"`
		Identity     string   `json:"identity"`
		Source       string   `json:"source"`
	} `json:"workloads"`
	Services []struct {
		Name      string           `json:"name"`
		Namespace string           `json:"namespace"`
		Hostname  string           `json:"hostname"`
		VIPs      []string         `json:"vips"`
		Ports     map[string]int64 `json:"ports"`
		Endpoints []string         `json:"endpoints"`
		Source    string           `json:"source"`
	} `json:"services"`
	Policies []struct {
		Name   string `json:"name"`
		Action string `json:"action"`
		Source string `json:"source"`
	} `json:"policies"`
}

func fetchDump(ctx context.Context, node *topo.Node) (*configDump, error) {
	var d configDump
	if err := adminGet(ctx, node, "/config_dump", &d); err != nil {
		return nil, err
	}
	return &d, nil
}

func certificateLine(d *configDump) string {
	c := d.Certificate
	s := fmt.Sprintf("%s (source %s), expires %s (in %v)", c.Identity, c.Source, c.NotAfter.Format(time.RFC3339),
		time.Until(c.NotAfter).Round(time.Minute))
	if c.CA != nil {
		s += fmt.Sprintf(", %d issued, next renewal %s", c.CA.Renewals, c.CA.NextAttempt.Format(time.RFC3339))
	}
	return s
}

// showDump prints the certificate, the xDS stream and every workload,
// service and policy in force, and checks the certificate is Istio's CA's
// for identity.
func showDump(d *configDump, identity string) error {
	detail("certificate: %s", certificateLine(d))
	if d.Certificate.Source != "ca" || d.Certificate.Identity != identity {
		return fmt.Errorf("certificate %s from %q, want %s from Istio's CA", d.Certificate.Identity, d.Certificate.Source, identity)
	}
	if !d.Certificate.NotAfter.After(time.Now()) {
		return fmt.Errorf("certificate expired at %v", d.Certificate.NotAfter)
	}
	if d.XDS == nil {
		return errors.New("no xds section: is [mesh] on?")
	}
	var types []string
	for name, t := range d.XDS.Types {
		types = append(types, fmt.Sprintf("%s: %d (ready %v)", name, t.Resources, t.Ready))
	}
	slices.Sort(types)
	detail("xds: node %s, connected %v; resources %s", d.XDS.NodeID, d.XDS.Connected, strings.Join(types, ", "))
	if !d.XDS.Connected {
		return errors.New("the xDS stream is not connected")
	}
	for _, w := range d.Workloads {
		detail("workload %s/%s %v %s hbone=%s identity=%s source=%s", w.Namespace, w.Name, w.Addresses, w.Protocol,
			w.HBONEAddress, w.Identity, w.Source)
	}
	for _, s := range d.Services {
		var ports []string
		for p, t := range s.Ports {
			ports = append(ports, fmt.Sprintf("%s->%d", p, t))
		}
		slices.Sort(ports)
		detail("service  %s/%s (%s) vips=%v ports=%v endpoints=%v source=%s", s.Namespace, s.Name, s.Hostname, s.VIPs,
			ports, s.Endpoints, s.Source)
	}
	for _, p := range d.Policies {
		detail("policy   %s %s source=%s", p.Name, p.Action, p.Source)
	}
	return nil
}

// checkLearned checks that the dump holds, from istiod, the VM's own
// workload, the server workload and the service with it as an endpoint.
// With networks, the VM's own workload is not required: a multi-network
// istiod sends a workload of another network than the cluster's only
// inside the services it serves (mesh.network says the VM's).
func checkLearned(d *configDump, vm, server netip.Addr, serverIdentity string, networks bool) error {
	var sawVM, sawServer bool
	for _, w := range d.Workloads {
		if w.Source != "xds" {
			continue
		}
		sawVM = sawVM || slices.Contains(w.Addresses, vm.String())
		if slices.Contains(w.Addresses, server.String()) {
			if w.Protocol != "HBONE" || w.Identity != serverIdentity {
				return fmt.Errorf("the server workload is %s with identity %s, want HBONE with %s", w.Protocol, w.Identity, serverIdentity)
			}
			sawServer = true
		}
	}
	if (!sawVM && !networks) || !sawServer {
		return fmt.Errorf("workloads from istiod: the VM's (%s) %v, the server's (%s) %v; want both", vm, sawVM, server, sawServer)
	}
	for _, s := range d.Services {
		if s.Source == "xds" && slices.Contains(s.VIPs, serviceVIP.String()) && len(s.Endpoints) > 0 {
			return nil
		}
	}
	return fmt.Errorf("no service from istiod at %s with an endpoint", serviceVIP)
}

// routeAnswer is the part of GET /route the demo checks.
type routeAnswer struct {
	Kind         string   `json:"kind"`
	HBONEAddress string   `json:"hbone_address"`
	Identities   []string `json:"identities"`
	Reason       string   `json:"reason"`
	Captured     bool     `json:"captured"`
	// Gateway is the outer hop of double HBONE, if any.
	Gateway *struct {
		Network    string   `json:"network"`
		Address    string   `json:"address"`
		Identities []string `json:"identities"`
	} `json:"gateway"`
}

// waitPlan waits until node's plan for dst is HBONE to hbone expecting
// identity, and captured by its TUN.
func waitPlan(ctx context.Context, node *topo.Node, dst, hbone netip.AddrPort, identity string) error {
	ctx, cancel := context.WithTimeout(ctx, planTimeout)
	defer cancel()
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		var a routeAnswer
		err := adminGet(ctx, node, "/route?dst="+dst.String(), &a)
		if err == nil && a.Kind == "hbone" && a.HBONEAddress == hbone.String() && slices.Contains(a.Identities, identity) && a.Captured {
			return nil
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = fmt.Errorf("kind %q, hbone %q, identities %v, captured %v, reason %q", a.Kind, a.HBONEAddress, a.Identities, a.Captured, a.Reason)
			}
			return fmt.Errorf("%s's plan for %s is not HBONE to %s as %s after %v: %w", node.Name, dst, hbone, identity, planTimeout, err)
		case <-tick.C:
		}
	}
}

// transfer runs one xfer exchange from node to dst, size bytes each way,
// ended early if ctx ends.
func transfer(ctx context.Context, node *topo.Node, dst string, size int64) (xfer.Result, error) {
	ctx, cancel := context.WithTimeout(ctx, transferTimeout)
	defer cancel()
	c, err := node.Dial(ctx, "tcp", dst)
	if err != nil {
		return xfer.Result{}, fmt.Errorf("dial %s from %s: %w", dst, node.Name, err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	r, err := xfer.Run(c, size, size)
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", err, ctx.Err())
		}
		return r, fmt.Errorf("transfer to %s: %w", dst, err)
	}
	return r, nil
}

// printTail prints the last lines a gateway logged, for a failed run.
func printTail(name string, lines []string) {
	const tail = 20
	fmt.Printf("--- %s: last %d log lines\n", name, min(tail, len(lines)))
	for _, l := range lines[max(0, len(lines)-tail):] {
		fmt.Println("    " + l)
	}
}

func indent(s string) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return ""
	}
	return "    " + strings.ReplaceAll(s, "\n", "\n    ") + "\n"
}
