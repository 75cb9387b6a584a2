package mesh

import (
	"testing"

	"go.uber.org/goleak"
)

// Every client's goroutines must be gone once it is closed and its test's
// servers are stopped.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
