package controlplane

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"

	"istio.io/istio/pkg/test"
)

// failer lets Istio's test constructors (which take a test.Failer) run
// outside a *testing.T: a fatal call records the first error and ends the
// calling goroutine, as testing.T does, and cleanups run, last first, when
// the control plane closes.
type failer struct {
	logf func(format string, args ...any)

	mu       sync.Mutex
	err      error
	cleanups []func()
}

var _ test.Failer = (*failer)(nil)

func (f *failer) Fail()    { f.Fatal("fail called") }
func (f *failer) FailNow() { f.Fatal("fail now called") }
func (f *failer) Helper()  {}

func (f *failer) Fatal(args ...any) {
	f.mu.Lock()
	if f.err == nil {
		f.err = errors.New(fmt.Sprint(args...))
	}
	f.mu.Unlock()
	f.Log(args...)
	runtime.Goexit()
}

func (f *failer) Fatalf(format string, args ...any) { f.Fatal(fmt.Sprintf(format, args...)) }
func (f *failer) Skip(args ...any)                  { f.Fatal(args...) }

func (f *failer) Log(args ...any) { f.logf("%s", fmt.Sprint(args...)) }

func (f *failer) Logf(format string, args ...any) { f.logf(format, args...) }

func (f *failer) TempDir() string {
	dir, err := os.MkdirTemp("", "fake-istiod-")
	if err != nil {
		f.Fatalf("controlplane: temp dir: %v", err)
	}
	f.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func (f *failer) Cleanup(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cleanups = append(f.cleanups, fn)
}

// failed reports the first fatal error, if any.
func (f *failer) failed() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// runCleanups runs every registered cleanup once, last registered first.
func (f *failer) runCleanups() {
	for {
		f.mu.Lock()
		n := len(f.cleanups)
		if n == 0 {
			f.mu.Unlock()
			return
		}
		fn := f.cleanups[n-1]
		f.cleanups = f.cleanups[:n-1]
		f.mu.Unlock()
		fn()
	}
}
