package interop

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/gateway"
)

// freePort is a loopback host:port nothing listens on now.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// The baggage a Node client sends, as ztunnel writes it for a
// Deployment's pod, reaches the labels of the gateway's /metrics: the
// source from it, the destination from the gateway's [gateway] keys.
func TestNodeClientBaggageToGateway(t *testing.T) {
	p := newPKI(t)
	server := p.issue("go-gateway", goServerID)
	client := p.issue("node-client", nodeClientID)
	echo := listen(t, echoTarget)
	hboneAddr, metricsAddr := freePort(t), freePort(t)

	dir := t.TempDir()
	path := filepath.Join(dir, "gateway.toml")
	text := fmt.Sprintf(`version = 1
[gateway]
name = "go-gateway"
cluster = "c-go"
workload_namespace = "go"
workload_name = "db-vm"
[tls]
cert = %q
key = %q
trust_bundle = %q
[hbone]
listen = %q
serve = ["127.0.0.1/32"]
[admin]
listen = ""
readiness = ""
metrics = %q
`, server.Cert, server.Key, p.CA, hboneAddr, metricsAddr)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg.TUN.Name = "" // no device: the HBONE server and the metrics only
	g, err := gateway.New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- g.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("gateway Run: %v", err)
		}
	})
	select {
	case <-g.Ready():
	case err := <-ran:
		t.Fatalf("gateway ended before ready: %v", err)
	case <-time.After(nodeWait):
		t.Fatal("gateway not ready")
	}

	const baggage = "k8s.cluster.name=c-node,k8s.namespace.name=node,k8s.deployment.name=web,service.name=web,service.version=v2"
	nc := nodeClientConfig{
		Addr: hboneAddr, CA: p.CA, Cert: &client.Cert, Key: &client.Key, ServerID: goServerID,
		Streams: []nodeStream{{Authority: echo.String(), Size: 1000}, {Authority: echo.String(), Size: 10}},
		Headers: map[string]string{"baggage": baggage},
	}
	var res nodeClientResult
	if err := runNode(t, "client.js", nc, &res); err != nil || res.Error != "" {
		t.Fatalf("node client failed: %v %s", err, res.Error)
	}
	if len(res.Streams) != len(nc.Streams) {
		t.Fatalf("%d stream results, want %d", len(res.Streams), len(nc.Streams))
	}
	for i, s := range res.Streams {
		if s.Sent != s.Received {
			t.Errorf("stream %d not echoed intact", i)
		}
	}

	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"reporter": "destination", "source_principal": nodeClientID, "destination_principal": goServerID,
		"source_workload": "web", "source_workload_namespace": "node", "source_canonical_service": "web",
		"source_canonical_revision": "v2", "source_cluster": "c-node",
		"destination_workload": "db-vm", "destination_workload_namespace": "go", "destination_canonical_service": "db-vm",
		"destination_canonical_revision": "latest", "destination_cluster": "c-go",
		"response_flags": "-", "connection_security_policy": "mutual_tls",
	}
	var opened float64
	var seen []string
	for _, m := range families["istio_tcp_connections_opened_total"].GetMetric() {
		got := map[string]string{}
		for _, lp := range m.GetLabel() {
			got[lp.GetName()] = lp.GetValue()
		}
		seen = append(seen, fmt.Sprint(got))
		match := true
		for k, v := range want {
			match = match && got[k] == v
		}
		if match {
			opened += m.GetCounter().GetValue()
		}
	}
	if opened != float64(len(nc.Streams)) {
		t.Errorf("istio_tcp_connections_opened_total%v = %v, want %d; series: %q", want, opened, len(nc.Streams), seen)
	}
}
