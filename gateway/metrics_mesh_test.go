package gateway

import (
	"fmt"
	"maps"
	"net"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshtun/meshtun/hbone/devca"
	"github.com/meshtun/meshtun/mesh"
)

// gatherSeries gathers c alone and returns each series' value, keyed
// "name{label=value}" (the one label of the mesh families, if any).
func gatherSeries(t *testing.T, c prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetHelp() == "" {
			t.Errorf("%s has no HELP", f.GetName())
		}
		for _, m := range f.GetMetric() {
			key := f.GetName()
			for _, lp := range m.GetLabel() {
				key += "{" + lp.GetName() + "=" + lp.GetValue() + "}"
			}
			if _, dup := out[key]; dup {
				t.Errorf("series twice: %s", key)
			}
			if h := m.GetHistogram(); h != nil {
				out[key+"_count"] = float64(h.GetSampleCount())
				out[key+"_sum"] = h.GetSampleSum()
				for _, b := range h.GetBucket() {
					out[fmt.Sprintf("%s_bucket{le=%g}", key, b.GetUpperBound())] = float64(b.GetCumulativeCount())
				}
				continue
			}
			out[key] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return out
}

// Each field of the mesh clients' Stats lands in its series, fed values
// that differ from field to field; a client not running has no sample.
func TestMetricsMeshStats(t *testing.T) {
	expiry := time.Date(2026, 12, 2, 15, 4, 5, 250e6, time.UTC)
	xds := mesh.XDSStats{
		Connected: true, Reconnects: 2, LastError: "stream ended", UnknownTypeNACKs: 3,
		Types: map[string]mesh.TypeStats{
			mesh.AddressType:       {Resources: 40, Updates: 5, NACKs: 6, Ready: true},
			mesh.AuthorizationType: {Resources: 7, Updates: 8, NACKs: 9, Ready: true},
		},
		Coalesced: 13,
	}
	xds.Apply.Count, xds.Apply.Sum = 21, 1500*time.Millisecond // one beyond the last bound
	xds.Apply.Buckets[0], xds.Apply.Buckets[3], xds.Apply.Buckets[len(mesh.ApplyBounds)-1] = 14, 5, 1
	ca := mesh.CAStats{Identity: "spiffe://cluster.local/ns/vm/sa/vm-sa", Expiry: expiry, Renewals: 11, RenewalFailures: 12}
	running := &meshCollector{
		xds: func() (mesh.XDSStats, bool) { return xds, true },
		ca:  func() (mesh.CAStats, bool) { return ca, true },
	}
	want := map[string]float64{
		"meshtun_xds_connected":                         1,
		"meshtun_xds_reconnects_total":                  2,
		"meshtun_xds_coalesced_total":                   13,
		"meshtun_xds_resources{type=address}":           40,
		"meshtun_xds_resources{type=authorization}":     7,
		"meshtun_xds_updates_total{type=address}":       5,
		"meshtun_xds_updates_total{type=authorization}": 8,
		"meshtun_xds_nacks_total{type=address}":         6,
		"meshtun_xds_nacks_total{type=authorization}":   9,
		"meshtun_xds_nacks_total{type=unknown}":         3,
		"meshtun_ca_renewals_total{result=success}":     11,
		"meshtun_ca_renewals_total{result=failure}":     12,
		"meshtun_ca_cert_expiry_seconds":                float64(expiry.Unix()) + 0.25,
		"meshtun_xds_apply_seconds_count":               21,
		"meshtun_xds_apply_seconds_sum":                 1.5,
	}
	// Cumulative: 14 by 100 µs, 19 from 1 ms on, 20 by the last bound.
	for i, b := range mesh.ApplyBounds {
		n := 14.0
		if i >= 3 {
			n = 19
		}
		if i == len(mesh.ApplyBounds)-1 {
			n = 20
		}
		want[fmt.Sprintf("meshtun_xds_apply_seconds_bucket{le=%g}", b.Seconds())] = n
	}
	if got := gatherSeries(t, running); !maps.Equal(got, want) {
		t.Errorf("gathered %v\nwant %v", got, want)
	}

	// Disconnected, before the first certificate: connected is 0 and the
	// expiry has no sample.
	xds.Connected = false
	ca.Expiry = time.Time{}
	got := gatherSeries(t, running)
	if v, ok := got["meshtun_xds_connected"]; !ok || v != 0 {
		t.Errorf("meshtun_xds_connected = %v (present %v), want 0", v, ok)
	}
	if v, ok := got["meshtun_ca_cert_expiry_seconds"]; ok {
		t.Errorf("meshtun_ca_cert_expiry_seconds = %v before any certificate", v)
	}

	stopped := &meshCollector{
		xds: func() (mesh.XDSStats, bool) { return mesh.XDSStats{}, false },
		ca:  func() (mesh.CAStats, bool) { return mesh.CAStats{}, false },
	}
	if got := gatherSeries(t, stopped); len(got) != 0 {
		t.Errorf("samples without clients: %v", got)
	}
}

// failedMeshClients are a real CertManager whose first request failed
// against a closed port (retries an hour apart: its counts hold still
// while a test reads them) and a real XDSClient, not started, for the
// same control plane; both closed at the test's end.
func failedMeshClients(t *testing.T) (*mesh.CertManager, *mesh.XDSClient) {
	t.Helper()
	dir := t.TempDir()
	ca, err := devca.New("cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "root-cert.pem")
	if err := os.WriteFile(root, ca.PEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	cp := mesh.ControlPlane{Address: closed, RootCert: root, ServerName: "istiod.istio-system.svc", ClusterID: "Kubernetes"}
	cm, err := mesh.NewCertManager(mesh.CAOptions{ControlPlane: cp, Namespace: "vm", ServiceAccount: "vm-sa",
		MinBackoff: time.Hour, MaxBackoff: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cm.Close() })
	xc, err := mesh.NewXDSClient(mesh.XDSOptions{ControlPlane: cp, Node: mesh.Node{
		Name: "vm-1", Namespace: "vm", ServiceAccount: "vm-sa", InstanceIPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { xc.Close() })

	cm.Start()
	deadline := time.Now().Add(10 * time.Second)
	for cm.Stats().RenewalFailures == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the CA request to a closed port did not fail within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return cm, xc
}

// The gateway's /metrics serves no mesh family until the clients are
// stored, and then what their Stats say: here a real CertManager whose
// first request failed against a closed port, and a real XDSClient not
// yet connected.
func TestMetricsMeshClients(t *testing.T) {
	cm, xc := failedMeshClients(t)
	g := metricsGateway(t)
	srv := httptest.NewServer(g.metricsHandler())
	defer srv.Close()
	for _, s := range scrape(t, srv.URL, "/metrics") {
		if strings.HasPrefix(s.name, "meshtun_xds_") || strings.HasPrefix(s.name, "meshtun_ca_") {
			t.Errorf("%s %v exported with no mesh client stored", s.name, s.labels)
		}
	}

	g.metrics.ca.Store(cm)
	g.metrics.xds.Store(xc)
	samples := scrape(t, srv.URL, "/metrics")
	cs, xs := cm.Stats(), xc.Stats()
	if cs.RenewalFailures != 1 || cs.Renewals != 0 {
		t.Fatalf("CA stats %+v: want one failure", cs)
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"meshtun_ca_renewals_total", map[string]string{"result": "failure"}, 1},
		{"meshtun_ca_renewals_total", map[string]string{"result": "success"}, 0},
		{"meshtun_xds_connected", nil, 0},
		{"meshtun_xds_reconnects_total", nil, float64(xs.Reconnects)},
		{"meshtun_xds_resources", map[string]string{"type": "address"}, float64(xs.Types[mesh.AddressType].Resources)},
		{"meshtun_xds_resources", map[string]string{"type": "authorization"}, float64(xs.Types[mesh.AuthorizationType].Resources)},
		{"meshtun_xds_updates_total", map[string]string{"type": "address"}, 0},
		{"meshtun_xds_nacks_total", map[string]string{"type": "authorization"}, 0},
		{"meshtun_xds_nacks_total", map[string]string{"type": "unknown"}, 0},
	} {
		if got, ok := find(t, samples, c.name, c.labels); !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if _, ok := find(t, samples, "meshtun_ca_cert_expiry_seconds", nil); ok {
		t.Error("meshtun_ca_cert_expiry_seconds has a sample before any certificate")
	}
}

// The merge of istiod's state is exported field by field (values that
// differ per field), and not at all with the mesh off.
func TestMetricsMeshState(t *testing.T) {
	st := MeshStats{Updates: 3, Rejected: 4, Clashes: 5, OtherNetwork: 6, Ready: true}
	on := &statsCollector[MeshStats]{stats: func() (MeshStats, bool) { return st, true }, families: meshStateFamilies}
	want := map[string]float64{
		"meshtun_mesh_updates_total":              3,
		"meshtun_mesh_rejected_resources":         4,
		"meshtun_mesh_clashes":                    5,
		"meshtun_mesh_other_network_denied_total": 6,
		"meshtun_mesh_ready":                      1,
	}
	if got := gatherSeries(t, on); !maps.Equal(got, want) {
		t.Errorf("gathered %v\nwant %v", got, want)
	}
	off := &statsCollector[MeshStats]{stats: func() (MeshStats, bool) { return MeshStats{}, false }, families: meshStateFamilies}
	if got := gatherSeries(t, off); len(got) != 0 {
		t.Errorf("samples with the mesh off: %v", got)
	}

	// Through a gateway's registry: none of them while [mesh] is off.
	g := metricsGateway(t)
	g.metrics.meshStats = func() (MeshStats, bool) { return g.MeshStats(), g.cfg.Mesh.Enabled() }
	srv := httptest.NewServer(g.metricsHandler())
	defer srv.Close()
	for _, s := range scrape(t, srv.URL, "/metrics") {
		if strings.HasPrefix(s.name, "meshtun_mesh_") {
			t.Errorf("%s with the mesh off", s.name)
		}
	}
}
