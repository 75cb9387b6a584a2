package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/meshtun/meshtun/internal/topo"
)

// adminAddr is the gateways' admin listener in examples/two-nodes (pprof
// under /debug/pprof/).
const adminAddr = "127.0.0.1:15000"

// profileGateways starts a CPU profile (with cfg.Trace an execution
// trace) of both gateways of p for cfg.ProfileSeconds, written to
// cfg.Profile as <scenario>-<n>-<node>.pprof (.trace); the returned wait blocks until both are
// written and reports the first error. A measurement shorter than the
// profile leaves idle time in it (percentages of the busy part are what
// matter; raise -bulk to fill it).
func (p *path) profileGateways(ctx context.Context) (wait func() error) {
	e := p.e
	e.profileSeq++
	secs := e.cfg.ProfileSeconds
	var (
		wg    sync.WaitGroup
		files []string
		errs  = make([]error, 2)
	)
	for i, n := range []*topo.Node{p.tp.A, p.tp.B} {
		kind, ext := "profile", "pprof"
		if e.cfg.Trace {
			kind, ext = "trace", "trace"
		}
		file := filepath.Join(e.cfg.Profile, fmt.Sprintf("%s-%d-%s.%s", e.scenario, e.profileSeq, n.Name, ext))
		files = append(files, file)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fetchProfile(ctx, n, fmt.Sprintf("%s?seconds=%d", kind, secs), secs, file)
		}()
	}
	// The progress is written here, by the measuring goroutine, never by
	// the fetchers: e.out is not safe for concurrent writes.
	return func() error {
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
		for _, f := range files {
			fmt.Fprintf(e.out, "   profile: %s\n", f)
		}
		return nil
	}
}

// snapshotGateways writes the heap and goroutine profiles of both gateways
// of p to cfg.Profile as <scenario>-<n>-<node>-{heap,goroutine}.pprof, and
// the Go runtime's memory statistics as ...-memstats.txt: what holds the
// memory of the idle scenario's flows. The heap profile is taken after a
// collection, so two builds' profiles compare live bytes, not the luck of
// where each one's last cycle fell.
func (p *path) snapshotGateways(ctx context.Context) error {
	e := p.e
	e.profileSeq++
	for _, n := range []*topo.Node{p.tp.A, p.tp.B} {
		for _, kind := range []struct{ what, file string }{
			{"heap?gc=1", "heap.pprof"}, // collected first: what is live, not when the last cycle ran
			{"goroutine", "goroutine.pprof"},
			{"heap?debug=1", "memstats.txt"}, // ends with runtime.MemStats: stacks, heap in use, idle, released
		} {
			file := filepath.Join(e.cfg.Profile, fmt.Sprintf("%s-%d-%s-%s", e.scenario, e.profileSeq, n.Name, kind.file))
			if err := fetchProfile(ctx, n, kind.what, 0, file); err != nil {
				return err
			}
			fmt.Fprintf(e.out, "   profile: %s\n", file)
		}
	}
	return nil
}

// fetchProfile GETs /debug/pprof/<what> (taking secs) from node n's
// gateway into file.
func fetchProfile(ctx context.Context, n *topo.Node, what string, secs int, file string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(secs)*time.Second+30*time.Second)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return n.Dial(ctx, network, addr)
		},
	}}
	url := fmt.Sprintf("http://%s/debug/pprof/%s", adminAddr, what)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("profile of %s: %w", n.Name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile of %s: %s", n.Name, resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("profile of %s: %w", n.Name, err)
	}
	return f.Close()
}
