package gateway

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/meshtun/meshtun/config"
)

// drainGateway is a gateway as Run leaves it once ready, without its
// listeners: the admin and readiness handlers on test servers.
func drainGateway(t *testing.T, drain time.Duration) (g *Gateway, admin, ready *httptest.Server, logs *syncBuffer) {
	t.Helper()
	cfg := config.Default()
	cfg.Gateway.DrainTimeout.Duration = drain
	logs = &syncBuffer{}
	g = &Gateway{cfg: cfg, log: hclog.New(&hclog.LoggerOptions{Output: logs}), metrics: newMetrics(), drainSig: newDrainSignals()}
	g.cur.Store(newSnapshot(cfg, nil))
	g.ready.Store(true)
	admin = httptest.NewServer(g.adminHandler())
	t.Cleanup(admin.Close)
	ready = httptest.NewServer(g.readinessHandler())
	t.Cleanup(ready.Close)
	return g, admin, ready, logs
}

// POST /quitquitquit turns readiness before it answers; GET is refused
// and changes nothing; a second POST is harmless.
func TestQuitQuitQuit(t *testing.T) {
	g, admin, ready, _ := drainGateway(t, time.Hour)
	if code, _ := do(t, http.MethodGet, ready.URL+"/healthz/ready"); code != http.StatusOK {
		t.Fatalf("readiness before: %d", code)
	}
	if code, _ := do(t, http.MethodGet, admin.URL+"/quitquitquit"); code != http.StatusMethodNotAllowed {
		t.Fatalf("GET /quitquitquit: %d, want 405", code)
	}
	select {
	case <-g.drainSig.quit:
		t.Fatal("GET /quitquitquit started the drain")
	default:
	}
	if code, _ := do(t, http.MethodGet, ready.URL+"/healthz/ready"); code != http.StatusOK {
		t.Fatalf("readiness after GET /quitquitquit: %d", code)
	}
	for i := range 2 {
		if code, body := do(t, http.MethodPost, admin.URL+"/quitquitquit"); code != http.StatusOK || body != "draining\n" {
			t.Fatalf("POST /quitquitquit %d: %d %q", i, code, body)
		}
		if code, _ := do(t, http.MethodGet, ready.URL+"/healthz/ready"); code != http.StatusServiceUnavailable {
			t.Fatalf("readiness right after POST /quitquitquit: %d, want 503", code)
		}
	}
	select {
	case <-g.drainSig.quit: // what Run waits on besides its context
	default:
		t.Fatal("POST /quitquitquit did not tell Run")
	}
}

// EndDrain ends a drain that waits for an open flow, long before its
// timeout; Draining is closed as the drain begins.
func TestEndDrain(t *testing.T) {
	g, _, ready, logs := drainGateway(t, time.Hour)
	f := g.flows.begin(outbound)
	defer g.flows.end(f, outcome{})
	done := make(chan struct{})
	go func() { defer close(done); g.drain(nil) }()
	select {
	case <-g.Draining():
	case <-time.After(30 * time.Second):
		t.Fatal("Draining not closed by the drain")
	}
	if code, _ := do(t, http.MethodGet, ready.URL+"/healthz/ready"); code != http.StatusServiceUnavailable {
		t.Errorf("readiness while draining: %d, want 503", code)
	}
	select {
	case <-done:
		t.Fatal("the drain ended with a flow open, before EndDrain")
	default:
	}
	g.EndDrain()
	g.EndDrain() // idempotent
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the drain did not end after EndDrain")
	}
	if len(logs.lines("drain ended early")) != 1 {
		t.Errorf("no line of the early end in the log: %q", logs.lines(""))
	}
}
