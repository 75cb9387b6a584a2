package dnsproxy

import (
	"testing"

	"go.uber.org/goleak"
)

// Every server's goroutines (serve loops, queries being answered or
// forwarded) must be gone once it is closed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
