package mesh

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"istio.io/istio/pkg/workloadapi"
	"istio.io/istio/pkg/workloadapi/security"
)

// The two types meshtun subscribes to, both as wildcards.
const (
	AddressType       = "type.googleapis.com/istio.workload.Address"
	AuthorizationType = "type.googleapis.com/istio.security.Authorization"
)

// subscribed is the order of the initial requests on each stream.
var subscribed = []string{AddressType, AuthorizationType}

// XDSOptions configure an XDSClient.
type XDSOptions struct {
	// ControlPlane is istiod's xDS endpoint.
	ControlPlane ControlPlane
	// Node is this gateway's node id and metadata.
	Node Node
	// Validate, if set, is asked about each decoded resource; an error
	// rejects that resource alone (it is NACKed with the error; a previous
	// version of it stays in force). It runs on the client's goroutine.
	Validate func(Resource) error
	// OnUpdate, if set, receives the state after each response that changed
	// it (and after the first of each type). Calls are serial, on the
	// client's goroutine, before the response is ACKed: a slow OnUpdate holds
	// the stream back, it never races another call. It may read the
	// client's Snapshot and Stats but must not call Close (Close waits for
	// the goroutine OnUpdate runs on).
	OnUpdate func(Snapshot)
	// OnDelta, if set, receives what each such response changed, as
	// OnUpdate is called (serially, before the ACK), at the cost of the
	// resources the response names: the gateway's path. OnUpdate builds a
	// whole Snapshot on each call.
	OnDelta func(Update)
	// MinBackoff and MaxBackoff bound the reconnection delays (defaults
	// 100 ms and 30 s).
	MinBackoff, MaxBackoff time.Duration
	// Logger receives the client's log lines; nil discards them.
	Logger Logger
}

// Update is what one applied response changed, for XDSOptions.OnDelta.
type Update struct {
	Delta Delta
	// Ready is true once both types have had their first response.
	Ready bool
	// Generation counts the applied responses that changed the state.
	Generation uint64
}

// XDSStats is the client's state for metrics and /config_dump.
type XDSStats struct {
	// Connected is true while a stream is open and has delivered a response.
	Connected bool
	// Reconnects counts streams opened after the first.
	Reconnects uint64
	// LastError is why the last stream ended ("" before any ended).
	LastError string
	// UnknownTypeNACKs counts responses of a type we did not ask for.
	UnknownTypeNACKs uint64
	// Coalesced counts responses applied together with an earlier one
	// (received while that one was applied): istiod pushing faster than
	// the state is applied.
	Coalesced uint64
	// Types holds one entry per subscribed type URL.
	Types map[string]TypeStats
	// Apply is how long each response took from its receipt to its ACK:
	// waiting behind the one applied before it, decoding, and applying
	// what it changed to the routing state (OnDelta).
	Apply ApplyHistogram
}

// ApplyBounds are the upper bounds of ApplyHistogram's buckets.
var ApplyBounds = [...]time.Duration{
	100 * time.Microsecond, 250 * time.Microsecond, 500 * time.Microsecond,
	time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond,
	10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2500 * time.Millisecond, 5 * time.Second, 10 * time.Second,
}

// ApplyHistogram counts durations by ApplyBounds.
type ApplyHistogram struct {
	Count uint64
	Sum   time.Duration
	// Buckets[i] counts the durations at most ApplyBounds[i] and above
	// the bound before it; longer ones are only in Count.
	Buckets [len(ApplyBounds)]uint64
}

func (h *ApplyHistogram) observe(d time.Duration) {
	h.Count++
	h.Sum += d
	for i, b := range ApplyBounds {
		if d <= b {
			h.Buckets[i]++
			return
		}
	}
}

// TypeStats is the state of one subscribed type.
type TypeStats struct {
	// Resources is how many resources of the type are held.
	Resources int
	// Updates counts responses applied (wholly or in part).
	Updates uint64
	// NACKs counts responses with at least one rejected resource.
	NACKs uint64
	// Ready is true once the first response of the type was applied.
	Ready bool
}

// XDSClient holds one delta ADS stream to istiod, subscribed to Address and
// Authorization, and the resources it delivered.
type XDSClient struct {
	cp       ControlPlane
	conn     *grpc.ClientConn
	ads      discovery.AggregatedDiscoveryServiceClient
	node     Node
	validate func(Resource) error
	onUpdate func(Snapshot)
	onDelta  func(Update)
	log      Logger
	bcfg     backoffConfig

	ready     chan struct{}
	loop      routine // the stream, run
	closeOnce sync.Once
	closeErr  error

	mu    sync.Mutex
	store *store
	stats XDSStats
	// received counts what the stream's receiver read, applied or not.
	received atomic.Uint64
}

// NewXDSClient checks opts and makes the client; it does not connect until
// Start.
func NewXDSClient(opts XDSOptions) (*XDSClient, error) {
	if err := opts.ControlPlane.check("xds"); err != nil {
		return nil, err
	}
	if opts.Node.ClusterID == "" {
		opts.Node.ClusterID = opts.ControlPlane.ClusterID
	}
	if err := opts.Node.check(); err != nil {
		return nil, err
	}
	bcfg := newBackoffConfig(opts.MinBackoff, opts.MaxBackoff)
	conn, err := dial(opts.ControlPlane, bcfg)
	if err != nil {
		return nil, fmt.Errorf("xds: %w", err)
	}
	stats := XDSStats{Types: map[string]TypeStats{}}
	for _, t := range subscribed {
		stats.Types[t] = TypeStats{}
	}
	return &XDSClient{
		cp:       opts.ControlPlane,
		conn:     conn,
		ads:      discovery.NewAggregatedDiscoveryServiceClient(conn),
		node:     opts.Node,
		validate: opts.Validate,
		onUpdate: opts.OnUpdate,
		onDelta:  opts.OnDelta,
		log:      orNop(opts.Logger),
		bcfg:     bcfg,
		ready:    make(chan struct{}),
		store:    newStore(opts.OnUpdate != nil),
		stats:    stats,
	}, nil
}

// NodeID is the node id the client sends.
func (c *XDSClient) NodeID() string { return c.node.ID() }

// Start opens the stream in a goroutine Close ends, and keeps it open,
// reconnecting with backoff. It returns at once.
func (c *XDSClient) Start() { c.loop.start(c.run) }

// Close ends the stream, waits for the client's goroutine and closes the
// connection. Idempotent; safe without Start.
func (c *XDSClient) Close() error {
	c.closeOnce.Do(func() {
		c.loop.stop()
		c.closeErr = c.conn.Close()
	})
	return c.closeErr
}

// Ready is closed once the first response of each subscribed type has been
// applied.
func (c *XDSClient) Ready() <-chan struct{} { return c.ready }

// Snapshot returns the resources held now. Their messages are held only
// for a client with OnUpdate: one fed by OnDelta keeps its own
// conversion, and the store only the names and versions (a Snapshot's
// maps are then empty).
func (c *XDSClient) Snapshot() Snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.store.snapshot()
}

// Stats returns a copy of the client's state.
func (c *XDSClient) Stats() XDSStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.Types = make(map[string]TypeStats, len(c.stats.Types))
	for k, v := range c.stats.Types {
		s.Types[k] = v
	}
	return s
}

func (c *XDSClient) run(ctx context.Context) {
	b := newBackoff(c.bcfg)
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			c.mu.Lock()
			c.stats.Reconnects++
			c.mu.Unlock()
		}
		delivered, err := c.stream(ctx)
		if err != nil {
			err = c.cp.explainRefusal(err)
		}
		c.mu.Lock()
		c.stats.Connected = false
		if err != nil && ctx.Err() == nil {
			c.stats.LastError = err.Error()
		}
		c.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		if delivered {
			// The stream worked; it ended for a reason of its own (istiod's
			// maximum connection age, a restart). Come back quickly.
			b.reset()
		}
		wait := b.next()
		c.log.Warn("mesh: xds stream ended; reconnecting", "error", errString(err), "retry_in", wait.Round(time.Millisecond).String())
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func errString(err error) string {
	if err == nil {
		return "closed by the server"
	}
	return err.Error()
}

// stream runs one stream until it fails; delivered says whether it
// brought at least one response.
func (c *XDSClient) stream(ctx context.Context) (delivered bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.ads.DeltaAggregatedResources(ctx)
	if err != nil {
		return false, fmt.Errorf("open stream: %w", err)
	}
	node := c.node.proto()
	for _, typ := range subscribed {
		c.mu.Lock()
		versions := c.store.versions(typ)
		c.mu.Unlock()
		req := &discovery.DeltaDiscoveryRequest{
			Node:                    node,
			TypeUrl:                 typ,
			InitialResourceVersions: versions,
		}
		if err := st.Send(req); err != nil {
			return false, sendError(st, "subscribe", err)
		}
		c.log.Debug("mesh: xds subscribed", "type", typ, "initial_resources", len(versions))
	}
	// The receiver reads ahead of the applier, at most maxCoalesce
	// responses: what arrived while one was applied is applied with the
	// next, in one OnDelta, and each is ACKed once that is done.
	recv := make(chan received, maxCoalesce)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			resp, err := st.Recv()
			at := time.Now()
			c.received.Add(1)
			select {
			case recv <- received{resp, err, at}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	defer wg.Wait() // after cancel: Recv returns once the stream's context ends
	defer cancel()
	for {
		var r received
		select {
		case r = <-recv:
		case <-ctx.Done():
			return delivered, ctx.Err()
		}
		if r.err != nil {
			return delivered, receiveError(r.err)
		}
		batch := []*discovery.DeltaDiscoveryResponse{r.resp}
		arrived := []time.Time{r.at}
		var pending error
	more:
		for len(batch) < maxCoalesce {
			select {
			case r = <-recv:
				if r.err != nil {
					pending = r.err
					break more
				}
				batch = append(batch, r.resp)
				arrived = append(arrived, r.at)
			default:
				break more
			}
		}
		if !delivered {
			delivered = true
			c.mu.Lock()
			c.stats.Connected = true
			c.mu.Unlock()
			c.log.Info("mesh: xds connected", "address", c.conn.Target(), "node", c.node.ID())
		}
		acks := c.handle(batch)
		now := time.Now()
		c.mu.Lock()
		for _, at := range arrived {
			c.stats.Apply.observe(now.Sub(at))
		}
		c.mu.Unlock()
		for _, ack := range acks {
			if err := st.Send(ack); err != nil {
				return delivered, sendError(st, "ack", err)
			}
		}
		if pending != nil {
			return delivered, receiveError(pending)
		}
	}
}

// received is one Recv's result, and when it returned.
type received struct {
	resp *discovery.DeltaDiscoveryResponse
	err  error
	at   time.Time
}

// maxCoalesce bounds the responses read ahead and applied together: a
// control plane that pushes faster than they are applied is read no
// further ahead than this (gRPC's flow control holds the rest back), and
// the state is applied once per batch.
const maxCoalesce = 64

func receiveError(err error) error {
	if errors.Is(err, io.EOF) {
		return nil
	}
	return fmt.Errorf("receive: %w", err)
}

// sendError turns the io.EOF of a Send on a broken stream into the
// stream's real status, which only Recv reports.
func sendError(st discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient, what string, err error) error {
	if errors.Is(err, io.EOF) {
		for range maxDrainOnSendError {
			if _, rerr := st.Recv(); rerr != nil {
				return fmt.Errorf("%s: %w", what, rerr)
			}
		}
	}
	return fmt.Errorf("%s: %w", what, err)
}

// maxDrainOnSendError bounds how many responses sendError reads past to
// find the stream's status; after a failed Send they are useless anyway.
const maxDrainOnSendError = 16

// maxNACKReasons bounds the error_detail of one NACK: istiod logs it and
// keeps it per proxy, and a push with thousands of bad resources should not
// become a message of megabytes. The count of the rest is still given.
const maxNACKReasons = 20

// handle applies responses received together, in order, and returns
// their ACKs and NACKs in the same order. OnUpdate and OnDelta are called
// once for the batch, before any of it is ACKed: an ACK says the state is
// applied, as ztunnel's do.
func (c *XDSClient) handle(batch []*discovery.DeltaDiscoveryResponse) []*discovery.DeltaDiscoveryRequest {
	acks := make([]*discovery.DeltaDiscoveryRequest, 0, len(batch))
	var d Delta
	notify, becameReady := false, false
	applied := 0
	for _, resp := range batch {
		ack, changed, first, ready := c.handleOne(resp, &d)
		acks = append(acks, ack)
		if changed || first {
			notify = true
			applied++
		}
		becameReady = becameReady || first && ready
	}
	c.mu.Lock()
	if applied > 1 {
		c.stats.Coalesced += uint64(applied - 1)
	}
	var snap Snapshot
	if notify && c.onUpdate != nil {
		snap = c.store.snapshot()
	}
	up := Update{Delta: d, Ready: c.store.ready[AddressType] && c.store.ready[AuthorizationType], Generation: c.store.generation}
	c.mu.Unlock()

	if notify && c.onUpdate != nil {
		c.onUpdate(snap)
	}
	if notify && c.onDelta != nil {
		c.onDelta(up)
	}
	if becameReady {
		close(c.ready)
	}
	return acks
}

// handleOne applies one response to the store and adds what it changed
// to d. It returns the response's ACK or NACK, whether it changed the
// state, whether it was the first of its type, and whether every type has
// had its first response now.
func (c *XDSClient) handleOne(resp *discovery.DeltaDiscoveryResponse, d *Delta) (ack *discovery.DeltaDiscoveryRequest, changed, firstOfType, allReady bool) {
	typ := resp.GetTypeUrl()
	ack = &discovery.DeltaDiscoveryRequest{TypeUrl: typ, ResponseNonce: resp.GetNonce()}
	if !isSubscribed(typ) {
		c.mu.Lock()
		c.stats.UnknownTypeNACKs++
		c.mu.Unlock()
		msg := fmt.Sprintf("type %q was not subscribed to", typ)
		c.log.Warn("mesh: xds NACK", "type", typ, "nonce", resp.GetNonce(), "error", msg)
		ack.ErrorDetail = &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: msg}
		return ack, false, false, false
	}

	accepted, rejected := c.decode(typ, resp.GetResources())

	c.mu.Lock()
	gone, changed := c.store.apply(typ, accepted, resp.GetRemovedResources())
	ts := c.stats.Types[typ]
	firstOfType = !ts.Ready
	ts.Ready = true
	ts.Updates++
	if len(rejected) > 0 {
		ts.NACKs++
	}
	ts.Resources = c.store.count(typ)
	c.stats.Types[typ] = ts
	allReady = true
	for _, t := range subscribed {
		allReady = allReady && c.stats.Types[t].Ready
	}
	c.store.ready[typ] = true
	c.mu.Unlock()
	if changed {
		d.add(typ, accepted, gone)
	}

	c.log.Debug("mesh: xds applied", "type", typ, "nonce", resp.GetNonce(),
		"updated", len(accepted), "removed", len(resp.GetRemovedResources()), "rejected", len(rejected))
	if len(rejected) > 0 {
		msg := nackMessage(rejected)
		c.log.Warn("mesh: xds NACK", "type", typ, "nonce", resp.GetNonce(), "rejected", len(rejected), "error", msg)
		ack.ErrorDetail = &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: msg}
	}
	return ack, changed, firstOfType, allReady
}

// add adds to d what one applied response changed: d then says what d
// and the response did, one after the other (a name removed after it was
// added is removed; one added after it was removed is added: Tracker.Apply
// removes first).
func (d *Delta) add(typ string, accepted map[string]entry, gone []string) {
	switch typ {
	case AddressType:
		if d.Addresses == nil {
			d.Addresses = make(map[string]*workloadapi.Address, len(accepted))
		}
		for _, name := range gone {
			delete(d.Addresses, name)
		}
		d.RemovedAddresses = append(d.RemovedAddresses, gone...)
		for name, e := range accepted {
			d.Addresses[name] = e.msg.(*workloadapi.Address)
		}
	case AuthorizationType:
		if d.Authorizations == nil {
			d.Authorizations = make(map[string]*security.Authorization, len(accepted))
		}
		for _, name := range gone {
			delete(d.Authorizations, name)
		}
		d.RemovedAuthorizations = append(d.RemovedAuthorizations, gone...)
		for name, e := range accepted {
			d.Authorizations[name] = e.msg.(*security.Authorization)
		}
	}
}

func nackMessage(rejected []string) string {
	msg := ""
	for i, r := range rejected {
		if i == maxNACKReasons {
			msg += fmt.Sprintf("; and %d more", len(rejected)-i)
			break
		}
		if i > 0 {
			msg += "; "
		}
		msg += r
	}
	return msg
}

func isSubscribed(typ string) bool {
	for _, t := range subscribed {
		if t == typ {
			return true
		}
	}
	return false
}
