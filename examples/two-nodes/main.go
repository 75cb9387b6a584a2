// Command two-nodes is `make demo`: it builds the standard two-node
// topology in network namespaces, starts a meshtun gateway on each node
// from the configs beside this file (embedded), pushes real traffic from
// node A through TUN → netstack → HBONE → node B's gateway → a server on
// node B, prints what happened, and removes everything. It exits 0 only if
// every check passed. It needs root.
//
//	go run ./examples/two-nodes -bin bin/meshtun
package main

import (
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshtun/meshtun/internal/topo"
	"github.com/meshtun/meshtun/internal/xfer"
)

var (
	//go:embed node-a.toml
	nodeAConfig []byte
	//go:embed node-b.toml
	nodeBConfig []byte
)

func main() {
	bin := flag.String("bin", "bin/meshtun", "the meshtun binary")
	bulk := flag.Int64("bulk", 200<<20, "bytes of the bulk transfer, each direction")
	short := flag.Int("conns", 1000, "short request/response connections")
	keep := flag.Bool("keep", false, "keep the temporary directory (configs, certificates, logs)")
	flag.Parse()
	if err := run(*bin, *bulk, *short, *keep); err != nil {
		fmt.Fprintf(os.Stderr, "\nDEMO FAILED: %v\n", err)
		os.Exit(1)
	}
	fmt.Println("\nDEMO PASSED")
}

func step(format string, args ...any) {
	fmt.Printf("==> "+format+"\n", args...)
}

func run(bin string, bulk int64, shortConns int, keep bool) (err error) {
	if err := topo.Available(); err != nil {
		return fmt.Errorf("%w\n  make demo builds network namespaces and TUN devices: run it as root (sudo make demo)", err)
	}
	bin, err = filepath.Abs(bin)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "meshtun-demo-")
	if err != nil {
		return err
	}
	if keep {
		fmt.Println("keeping", dir)
	} else {
		defer os.RemoveAll(dir)
	}

	step("certificates: a development CA and one SPIFFE identity per node (meshtun certs)")
	out, err := exec.Command(bin, "certs", "--out", dir, "node-a", "node-b").CombinedOutput()
	fmt.Print(indent(string(out)))
	if err != nil {
		return fmt.Errorf("meshtun certs: %v", err)
	}
	for name, b := range map[string][]byte{"node-a.toml": nodeAConfig, "node-b.toml": nodeBConfig} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return err
		}
	}

	step("topology: namespaces node-a and node-b, veth 192.0.2.1 <-> 192.0.2.2, server 10.244.2.5 on node-b")
	tp, err := topo.New("mtdemo")
	if err != nil {
		return err
	}
	defer func() {
		step("teardown: stop gateways (SIGTERM, drain), remove namespaces")
		if cerr := tp.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()

	logFile, err := os.Create(filepath.Join(dir, "gateways.log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	gws := map[string]*topo.Gateway{}
	for _, n := range []*topo.Node{tp.B, tp.A} {
		g, err := n.StartGateway(bin, filepath.Join(dir, n.Name+".toml"), logFile)
		if err != nil {
			return err
		}
		defer func() {
			if serr := g.Stop(15 * time.Second); serr != nil && err == nil {
				err = fmt.Errorf("gateway %s: %w", n.Name, serr)
			}
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = g.WaitReady(ctx, "127.0.0.1:15021")
		cancel()
		if err != nil {
			return err
		}
		gws[n.Name] = g
		step("gateway %s ready (%s)", n.Name, n.NS)
	}

	target := net.JoinHostPort(tp.B.Workload4.String(), "8080")
	l, err := tp.B.Listen("tcp", target)
	if err != nil {
		return err
	}
	served := make(chan struct{})
	go func() { xfer.Serve(l); close(served) }()
	defer func() { l.Close(); <-served }()

	dial := func() (net.Conn, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		return tp.A.Dial(ctx, "tcp", target)
	}

	step("bulk: %d MiB from node-a to %s and %d MiB back, sha256 checked both ends", bulk>>20, target, bulk>>20)
	for _, d := range []struct {
		name     string
		up, down int64
	}{{"node-a -> node-b", bulk, 0}, {"node-b -> node-a", 0, bulk}} {
		c, err := dial()
		if err != nil {
			return fmt.Errorf("dial %s: %w", target, err)
		}
		r, err := xfer.Run(c, d.up, d.down)
		if err != nil {
			return fmt.Errorf("bulk %s: %w", d.name, err)
		}
		n := max(d.up, d.down)
		fmt.Printf("    %s: %d bytes, hashes equal, %.2f Gbit/s (%v)\n", d.name, n,
			float64(n)*8/r.Duration.Seconds()/1e9, r.Duration.Round(time.Millisecond))
	}

	step("short connections: %d x (connect, 64 B request, 64 B reply, close), 8 at a time", shortConns)
	var ok, failed atomic.Int64
	var firstErr error
	var once sync.Once
	start := time.Now()
	jobs := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range jobs {
				c, err := dial()
				if err == nil {
					_, err = xfer.Run(c, 64, 64)
				}
				if err != nil {
					failed.Add(1)
					once.Do(func() { firstErr = err })
					continue
				}
				ok.Add(1)
			}
		}()
	}
	for i := 0; i < shortConns; i++ {
		jobs <- struct{}{}
	}
	close(jobs)
	wg.Wait()
	el := time.Since(start)
	fmt.Printf("    %d ok, %d failed, %.0f connections/s\n", ok.Load(), failed.Load(), float64(ok.Load())/el.Seconds())
	if failed.Load() > 0 {
		return fmt.Errorf("%d short connections failed; first: %v", failed.Load(), firstErr)
	}

	step("HBONE connections node-a -> node-b:15008 carrying all of that")
	conns, err := tp.B.Established(context.Background(), 15008)
	if err != nil {
		return err
	}
	fmt.Printf("    %d (pooled: every flow was a stream on them)\n", conns)
	if conns < 1 {
		return errors.New("no HBONE connection is open between the gateways")
	}

	step("access log excerpt (one line per connection, both gateways)")
	for _, name := range []string{"node-a", "node-b"} {
		lines := gws[name].LogsContaining("connection complete")
		fmt.Printf("    %s: %d lines; last:\n", name, len(lines))
		if len(lines) > 0 {
			fmt.Printf("      %s\n", lines[len(lines)-1])
		}
		if len(lines) < shortConns+2 {
			return fmt.Errorf("%s logged %d connections, want at least %d", name, len(lines), shortConns+2)
		}
	}

	step("metrics after the traffic: connections opened, with Istio's labels (each node's /metrics)")
	for _, n := range []*topo.Node{tp.A, tp.B} {
		lines, err := metricLines(n, "istio_tcp_connections_opened_total{")
		if err != nil {
			return fmt.Errorf("%s /metrics: %w", n.Name, err)
		}
		if len(lines) == 0 {
			return fmt.Errorf("%s /metrics has no istio_tcp_connections_opened_total", n.Name)
		}
		fmt.Printf("    %s:\n", n.Name)
		for _, l := range lines {
			fmt.Printf("      %s\n", l)
		}
	}
	return nil
}

// metricLines fetches the gateway's /metrics inside node n (the configs
// put it on 127.0.0.1:15020) and returns its lines that start with
// prefix.
func metricLines(n *topo.Node, prefix string) ([]string, error) {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return n.Dial(ctx, network, addr)
		},
	}}
	resp, err := c.Get("http://127.0.0.1:15020/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return out, nil
}

func indent(s string) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return ""
	}
	return "    " + strings.ReplaceAll(s, "\n", "\n    ") + "\n"
}
