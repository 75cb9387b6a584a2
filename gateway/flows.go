package gateway

import "sync"

// flowSet counts the connections the gateway is handling, so that drain
// and shutdown can wait for them. Unlike a sync.WaitGroup it allows a flow
// to begin while someone is already waiting (a SYN or a stream arriving
// during the drain), which WaitGroup forbids once its counter is zero.
type flowSet struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0; nil while nobody waits
}

// begin records a new flow. Pair it with end.
func (f *flowSet) begin() {
	f.mu.Lock()
	f.n++
	f.mu.Unlock()
}

// end records that a flow is over.
func (f *flowSet) end() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n--
	if f.n == 0 && f.idle != nil {
		close(f.idle)
		f.idle = nil
	}
}

// idleCh returns a channel closed once no flow is open.
func (f *flowSet) idleCh() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == 0 {
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	if f.idle == nil {
		f.idle = make(chan struct{})
	}
	return f.idle
}

// wait blocks until no flow is open.
func (f *flowSet) wait() { <-f.idleCh() }
