package gateway

import (
	"net/http"
	"sync"
)

// drainSignals are the gateway's ways into and out of its drain, besides
// the end of Run's context (SIGTERM in cmd/meshtun): Quit starts it
// (POST /quitquitquit), EndDrain cuts it short (a second SIGTERM), and
// draining is closed once it has begun, whichever started it.
type drainSignals struct {
	quit, hurry, draining          chan struct{}
	quitOnce, hurryOnce, drainOnce sync.Once
}

func newDrainSignals() drainSignals {
	return drainSignals{quit: make(chan struct{}), hurry: make(chan struct{}), draining: make(chan struct{})}
}

// Quit drains the gateway exactly as the end of Run's context does:
// readiness fails and new captured flows are refused at once, before Quit
// returns; Run then drains (GOAWAY to HBONE peers, open flows get
// gateway.drain_timeout) and returns nil. Safe to call more than once and
// before Run.
func (g *Gateway) Quit() {
	g.draining.Store(true)
	g.drainSig.quitOnce.Do(func() { close(g.drainSig.quit) })
}

// EndDrain ends a drain early (or the next one at once): the flows still
// open are closed now instead of at gateway.drain_timeout. Idempotent.
func (g *Gateway) EndDrain() {
	g.drainSig.hurryOnce.Do(func() { close(g.drainSig.hurry) })
}

// Draining is closed once the gateway has begun to drain: its context
// ended or Quit was called. cmd/meshtun tells systemd STOPPING=1 then.
func (g *Gateway) Draining() <-chan struct{} { return g.drainSig.draining }

// beginDrain marks the drain as begun (Draining, readiness, new flows).
func (g *Gateway) beginDrain() {
	g.draining.Store(true)
	g.ready.Store(false)
	g.drainSig.drainOnce.Do(func() { close(g.drainSig.draining) })
}

// serveQuit is POST /quitquitquit on the admin listener (Envoy's and
// Istio's name): it starts the drain and answers at once; the process
// exits when the drain is over. Other methods get 405 from the mux.
func (g *Gateway) serveQuit(w http.ResponseWriter, r *http.Request) {
	g.log.Info("drain requested", "by", "POST /quitquitquit", "remote", r.RemoteAddr)
	g.Quit()
	w.Write([]byte("draining\n"))
}
