package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// The short-connection scenarios (issue "Short connections at the two-hop
// floor"): what a client without keep-alive feels. The server is the echo
// server, which closes once it reads the client's FIN. One connection is:
// connect (timed alone: the SYN, through the pair the dial-first CONNECT
// and the peer's dial), 64 B up, 64 B back, the client's FIN, and the
// server's FIN read as EOF (the whole connection, timed from the dial).
// short1 makes them one at a time, short8 eight at once; each run is
// Config.Conns ÷ 5 connections, and the figures are each run's
// percentiles of the connect and of the whole.

// peerConnect is why a peer has no connect figure.
const peerConnect = "connect() ends when proxy A's kernel accepts on node A's loopback, before the proxy dials on: not the event the pair's connect is (its SYN-ACK waits for gateway B's dial to the server); the whole connection is comparable"

// shortPercentiles are the figures each scenario reports.
var shortPercentiles = []float64{50, 90, 99}

// shortTimes is one connection's connect and whole durations.
type shortTimes struct{ connect, whole time.Duration }

func shortScenario(name string, parallel int) func(context.Context, *env) ([]*Figure, error) {
	return func(ctx context.Context, e *env) ([]*Figure, error) {
		label := "1 at a time"
		if parallel > 1 {
			label = fmt.Sprintf("%d at once", parallel)
		}
		var figs []*Figure
		connect := map[float64]*Figure{}
		whole := map[float64]*Figure{}
		for _, q := range shortPercentiles {
			connect[q] = &Figure{Scenario: name, Key: fmt.Sprintf("%s.connect.p%.0f", name, q), Name: fmt.Sprintf("connect p%.0f, %s", q, label), Unit: "µs"}
			whole[q] = &Figure{Scenario: name, Key: fmt.Sprintf("%s.whole.p%.0f", name, q), Name: fmt.Sprintf("short conn p%.0f, %s", q, label), Unit: "µs"}
			figs = append(figs, connect[q], whole[q])
		}
		// CPU per connection goes with the median of the whole.
		whole[50].WorkUnit = "conn"
		n := max(e.cfg.Conns/5, parallel)
		for run := 0; run < e.cfg.Runs; run++ {
			for _, p := range e.order(run, true) {
				if p.noHalfClose != "" {
					for _, f := range figs {
						f.notMeasuredOn(p.name, "the client half-closes, then waits for the server's FIN: "+p.noHalfClose)
					}
					continue
				}
				var times []shortTimes
				r, err := p.measure(func() (float64, float64, error) {
					var err error
					times, err = shortConns(ctx, p, p.target(EchoPort), n, parallel)
					return 0, float64(len(times)), err
				})
				if err != nil {
					return figs, fmt.Errorf("%s, run %d, %s path: %w", name, run+1, p.name, err)
				}
				var cs, ws []time.Duration
				for _, t := range times {
					cs, ws = append(cs, t.connect), append(ws, t.whole)
				}
				for _, q := range shortPercentiles {
					rc, rw := r, r
					rc.Value, rw.Value = micros(percentile(cs, q)), micros(percentile(ws, q))
					if q != 50 {
						rw.Work = 0 // CPU is shown once, beside the median
					}
					rc.Work = 0
					if p.entry == "" {
						e.add(connect[q], p, run, rc)
					} else {
						connect[q].notMeasuredOn(p.name, peerConnect)
					}
					e.add(whole[q], p, run, rw)
				}
			}
		}
		return figs, nil
	}
}

// shortConns makes n short connections to addr from node A, parallel at
// a time, and returns each one's times. The first failure stops it.
func shortConns(ctx context.Context, p *path, addr string, n, parallel int) ([]shortTimes, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	out := make([]shortTimes, n)
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	var wg sync.WaitGroup
	for range parallel {
		wg.Go(func() {
			err := p.tp.A.Do(func() error {
				d := net.Dialer{Timeout: dialTimeout}
				buf := make([]byte, MsgSize)
				for i := range next {
					if err := context.Cause(ctx); err != nil {
						return err
					}
					t, err := shortConnTimed(ctx, &d, addr, buf)
					if err != nil {
						return fmt.Errorf("connection %d: %w", i, err)
					}
					out[i] = t
				}
				return nil
			})
			if err != nil {
				cancel(err)
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	return out, nil
}

// shortConnTimed is one short connection: connect, 64 B each way, the
// client's FIN, the server's FIN.
func shortConnTimed(ctx context.Context, d *net.Dialer, addr string, buf []byte) (shortTimes, error) {
	start := time.Now()
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return shortTimes{}, fmt.Errorf("bench: dial %s: %w", addr, err)
	}
	connected := time.Since(start)
	defer c.Close()
	c.SetDeadline(time.Now().Add(d.Timeout + time.Second))
	if err := echo(c, buf); err != nil {
		return shortTimes{}, err
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return shortTimes{}, err
	}
	if n, err := c.Read(buf[:1]); n != 0 || !errors.Is(err, io.EOF) {
		return shortTimes{}, fmt.Errorf("bench: after the reply, read %d bytes, %v; want the server's FIN", n, err)
	}
	return shortTimes{connect: connected, whole: time.Since(start)}, nil
}
