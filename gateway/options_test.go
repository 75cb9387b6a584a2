package gateway

import (
	"testing"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/hbone"
)

// The config's bound on hbone.conns_per_peer is the pool's: config does
// not import hbone, so the two constants are kept equal here.
func TestConnsPerPeerBound(t *testing.T) {
	if config.MaxConnsPerPeer != hbone.MaxConnsPerKey {
		t.Fatalf("config.MaxConnsPerPeer = %d, hbone.MaxConnsPerKey = %d", config.MaxConnsPerPeer, hbone.MaxConnsPerKey)
	}
}
