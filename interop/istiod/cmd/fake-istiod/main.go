// Command fake-istiod serves Istio's own discovery server and CA in one
// process, on one TLS gRPC port, as istiod serves ztunnel on 15012, over an
// in-memory Kubernetes: for demos and manual runs of a VM-in-mesh client.
//
//	fake-istiod -addr 127.0.0.1:15012 -dir /tmp/mesh -token vm/vm-sa -apply mesh.yaml
//
// It prints where the root certificate and tokens are, then what Istio's
// ambient index holds whenever that changes. SIGHUP restarts serving on the
// same address (clients see istiod go away and come back); SIGINT or SIGTERM
// stops it.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/meshtun/meshtun/interop/istiod/controlplane"
)

// indexReport is how often the index is compared with the last one printed.
const indexReport = 500 * time.Millisecond

type tokenFlags []string

func (f *tokenFlags) String() string { return strings.Join(*f, ",") }

func (f *tokenFlags) Set(v string) error {
	ns, sa, ok := strings.Cut(v, "/")
	if !ok || ns == "" || sa == "" {
		return fmt.Errorf("want namespace/serviceaccount, got %q", v)
	}
	*f = append(*f, v)
	return nil
}

func main() {
	if err := controlplane.ReexecWithAmbient(); err != nil {
		fmt.Fprintln(os.Stderr, "fake-istiod:", err)
		os.Exit(1)
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "fake-istiod:", err)
		os.Exit(1)
	}
}

func run() error {
	var tokens tokenFlags
	addr := flag.String("addr", "127.0.0.1:15012", "address to serve xDS and the CA on")
	dir := flag.String("dir", "", "directory for root-cert.pem and token files (default: a temporary one)")
	clusterID := flag.String("cluster-id", controlplane.DefaultClusterID, "cluster id")
	serverName := flag.String("server-name", controlplane.DefaultServerName, "DNS name of the serving certificate")
	apply := flag.String("apply", "", "Kubernetes YAML file of objects to create at start")
	logLevel := flag.String("istio-log", "none", "Istio log level: debug, info, warn, error, none")
	flag.Var(&tokens, "token", "namespace/serviceaccount to issue a token for (repeatable)")
	flag.Parse()

	cp, err := controlplane.Start(controlplane.Options{
		Addr: *addr, Dir: *dir, ClusterID: *clusterID, ServerName: *serverName,
		IstioLogLevel: *logLevel,
		Logf:          func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) },
	})
	if err != nil {
		return err
	}
	defer cp.Close()
	if *apply != "" {
		data, err := os.ReadFile(*apply)
		if err != nil {
			return fmt.Errorf("-apply: %w", err)
		}
		if err := cp.ApplyYAML(data); err != nil {
			return fmt.Errorf("-apply %s: %w", *apply, err)
		}
	}
	fmt.Printf("serving on %s (server name %s, cluster %s)\n", cp.Addr(), cp.ServerName(), cp.ClusterID())
	fmt.Printf("root cert: %s\n", cp.RootCertFile())
	for _, t := range tokens {
		ns, sa, _ := strings.Cut(t, "/")
		path, err := cp.Token(ns, sa)
		if err != nil {
			return err
		}
		fmt.Printf("token %s/%s: %s\n", ns, sa, path)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	tick := time.NewTicker(indexReport)
	defer tick.Stop()
	last := ""
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-hup:
			if err := cp.Restart(); err != nil {
				return err
			}
			fmt.Printf("restarted on %s\n", cp.Addr())
		case <-tick.C:
			if now := describe(cp.Index()); now != last {
				fmt.Print(now)
				last = now
			}
		}
	}
}

// describe renders the index one resource per line, sorted.
func describe(x controlplane.Index) string {
	var lines []string
	for name, w := range x.Workloads() {
		var ips []string
		for _, b := range w.Addresses {
			if a, ok := netip.AddrFromSlice(b); ok {
				ips = append(ips, a.String())
			}
		}
		lines = append(lines, fmt.Sprintf("workload %s ips=%v sa=%s tunnel=%v services=%d policies=%v",
			name, ips, w.ServiceAccount, w.TunnelProtocol, len(w.Services), w.AuthorizationPolicies))
	}
	for name, s := range x.Services() {
		var vips []string
		for _, a := range s.Addresses {
			if ip, ok := netip.AddrFromSlice(a.Address); ok {
				vips = append(vips, ip.String())
			}
		}
		var ports []string
		for _, p := range s.Ports {
			ports = append(ports, fmt.Sprintf("%d->%d", p.ServicePort, p.TargetPort))
		}
		lines = append(lines, fmt.Sprintf("service %s vips=%v ports=%v", name, vips, ports))
	}
	for name, p := range x.Authorizations {
		lines = append(lines, fmt.Sprintf("policy %s action=%v scope=%v groups=%d", name, p.Action, p.Scope, len(p.Groups)))
	}
	sort.Strings(lines)
	return "index:\n  " + strings.Join(lines, "\n  ") + "\n"
}
