package mesh

import (
	"context"
	"sync"
)

// routine is the one goroutine of a client (the CertManager's renewal
// loop, the XDSClient's stream): start runs it once, stop ends it and
// waits for it. Either may come first and each may come again; a start
// after stop does nothing.
type routine struct {
	mu      sync.Mutex
	stopped bool
	cancel  context.CancelFunc // set by the first start
	done    chan struct{}      // closed when run has returned; set with cancel
}

// start runs run on a goroutine of its own, with a context that stop
// cancels.
func (r *routine) start(run func(ctx context.Context)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped || r.cancel != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done = cancel, make(chan struct{})
	go func() {
		defer close(r.done)
		run(ctx)
	}()
}

// stop cancels the goroutine's context and waits for it to return.
func (r *routine) stop() {
	r.mu.Lock()
	r.stopped = true
	cancel, done := r.cancel, r.done
	r.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}
