package gateway

import (
	"sync"
	"testing"
	"time"
)

func TestFlowSet(t *testing.T) {
	var f flowSet
	select {
	case <-f.idleCh():
	default:
		t.Fatal("an empty set is not idle")
	}
	f.begin()
	idle := f.idleCh()
	select {
	case <-idle:
		t.Fatal("idle with a flow open")
	default:
	}
	// Flows may begin and end while someone waits (a WaitGroup forbids
	// Add at zero during Wait; the race detector caught that in drain).
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); f.begin(); f.end() }()
	}
	wg.Wait()
	select {
	case <-idle:
		t.Fatal("idle while the first flow is still open")
	default:
	}
	f.end()
	select {
	case <-idle:
	case <-time.After(10 * time.Second):
		t.Fatal("not idle after the last flow ended")
	}
}
