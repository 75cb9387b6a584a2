// Package tuntest helps tests that need a TUN device: it gives each test a
// fresh, named network namespace that is removed when the test ends, and
// runs code inside it.
//
// Tests that cannot get one (not root, no /dev/net/tun, namespaces not
// allowed) are skipped with the reason.
package tuntest

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

var seq atomic.Int64

// Netns is a named network namespace owned by one test.
type Netns struct {
	Name   string
	handle netns.NsHandle
}

// NewNetns creates a namespace named "<prefix>-<pid>-<n>" with its loopback
// up, and registers its removal with t.Cleanup. Register the cleanup of
// anything living in the namespace (devices, stacks) after calling NewNetns,
// so that it runs first. It skips the test when the machine does not allow
// it.
func NewNetns(t testing.TB, prefix string) *Netns {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root and /dev/net/tun: not running as root")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skipf("needs root and /dev/net/tun: %v", err)
	}
	name := fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), seq.Add(1))
	errc := make(chan error, 1)
	go func() {
		// netns.NewNamed moves the calling thread into the new namespace.
		// The goroutine ends locked, so the runtime discards the thread
		// instead of reusing it in the wrong namespace.
		runtime.LockOSThread()
		ns, err := netns.NewNamed(name)
		if err != nil {
			errc <- err
			return
		}
		ns.Close()
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		errc <- err
	}()
	if err := <-errc; err != nil {
		netns.DeleteNamed(name)
		if errors.Is(err, os.ErrPermission) {
			t.Skipf("needs root and /dev/net/tun: cannot create network namespace: %v", err)
		}
		t.Fatalf("create network namespace %s: %v", name, err)
	}
	h, err := netns.GetFromName(name)
	if err != nil {
		netns.DeleteNamed(name)
		t.Fatalf("open network namespace %s: %v", name, err)
	}
	n := &Netns{Name: name, handle: h}
	t.Cleanup(func() {
		h.Close()
		if err := netns.DeleteNamed(name); err != nil {
			t.Errorf("delete network namespace %s: %v", name, err)
		}
	})
	return n
}

// Do runs fn on an OS thread inside the namespace and returns when fn
// returns. Sockets and TUN devices created in fn belong to the namespace
// and may be used from any goroutine afterwards; goroutines that fn starts
// do not run inside the namespace. fn runs on another goroutine, so it
// must not call t.Fatal or t.FailNow: return what it found instead.
func (n *Netns) Do(fn func()) {
	done := make(chan struct{})
	var setErr error
	go func() {
		defer close(done)
		// Stays locked: the thread is discarded when the goroutine ends.
		runtime.LockOSThread()
		if setErr = netns.Set(n.handle); setErr != nil {
			return
		}
		fn()
	}()
	<-done
	if setErr != nil {
		panic(fmt.Sprintf("tuntest: enter network namespace %s: %v", n.Name, setErr))
	}
}
