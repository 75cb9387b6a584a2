package gateway

import (
	"cmp"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/meshtun/meshtun/config"
)

// What `meshtun status` and `meshtun flows` show, served on the admin
// listener: GET /status, a summary small enough to read at a glance
// whatever the mesh's size, and GET /flows, the open flows a page at a
// time.

// StatusAnswer is GET /status: what the gateway is doing, in one answer.
type StatusAnswer struct {
	Name     string    `json:"name,omitempty"` // gateway.name
	Identity string    `json:"identity"`
	Now      time.Time `json:"now"` // the gateway's clock, for the ages below

	Certificate certificateDump `json:"certificate"`
	// XDS is the stream to istiod, with [mesh] on.
	XDS *StatusXDS `json:"xds,omitempty"`

	// Entries in force, by source ("file", "xds").
	Workloads map[string]int `json:"workloads"`
	Services  map[string]int `json:"services"`
	Policies  map[string]int `json:"policies"`
	// Rejected are istiod's resources that could not be used, Clashes its
	// entries dropped because the file has one like it.
	Rejected int64 `json:"rejected"`
	Clashes  int64 `json:"clashes"`

	Pool  StatusPool   `json:"pool"`
	Peers []StatusPeer `json:"peers"`
	Flows StatusFlows  `json:"flows"`

	// Errors are the latest problems known, newest first.
	Errors []StatusError `json:"errors"`
}

// StatusXDS is the stream to istiod.
type StatusXDS struct {
	Address    string `json:"address"` // mesh.discovery_address
	Connected  bool   `json:"connected"`
	Ready      bool   `json:"ready"` // a complete state was applied
	Reconnects uint64 `json:"reconnects"`
	LastError  string `json:"last_error,omitempty"`
	Updates    uint64 `json:"updates"`
}

// StatusPool is the outbound HBONE pool's counters.
type StatusPool struct {
	Conns         int    `json:"conns"`
	Streams       int    `json:"streams"`
	ConnsOpened   uint64 `json:"conns_opened"`
	DialsFailed   uint64 `json:"dials_failed"`
	StreamsOpened uint64 `json:"streams_opened"`
	StreamsFailed uint64 `json:"streams_failed"`
}

// StatusPeer is one peer the pool holds connections to.
type StatusPeer struct {
	Address  netip.AddrPort `json:"address"`
	Identity string         `json:"identity"`
	Conns    int            `json:"conns"`
	Streams  int            `json:"streams"`
}

// StatusFlows counts the open flows.
type StatusFlows struct {
	Outbound int `json:"outbound"`
	Inbound  int `json:"inbound"`
	// Refused counts flows refused at gateway.max_flows_per_source.
	RefusedOverLimit uint64 `json:"refused_over_limit"`
}

// StatusError is one problem: what it is about and what it says.
type StatusError struct {
	Source  string    `json:"source"` // "ca", "xds", "mesh"
	Message string    `json:"message"`
	At      time.Time `json:"at,omitzero"`
}

// maxStatusRejections bounds the rejections /status names; the rest are
// counted (Rejected), and /config_dump has them all.
const maxStatusRejections = 5

func (g *Gateway) status() StatusAnswer {
	snap := g.snapshot()
	cfg := snap.cfg
	a := StatusAnswer{Name: cfg.Gateway.Name, Identity: g.identity, Now: time.Now().UTC(),
		Workloads: map[string]int{}, Services: map[string]int{}, Policies: map[string]int{}, Errors: []StatusError{}}

	if ca := g.metrics.ca.Load(); ca != nil {
		st := ca.Stats()
		a.Certificate = meshCertificate(st)
		if cert, _, notAfter := g.certs().Current(); cert != nil && !st.Expiry.IsZero() {
			a.Certificate.NotAfter = notAfter.UTC()
		}
		if st.LastError != "" {
			a.Errors = append(a.Errors, StatusError{Source: "ca", Message: st.LastError, At: st.LastErrorAt.UTC()})
		}
	} else {
		a.Certificate = g.fileCertificate()
	}
	ms := g.MeshStats()
	if x := g.metrics.xds.Load(); x != nil {
		st := x.Stats()
		a.XDS = &StatusXDS{Address: cfg.Mesh.XDSAddress, Connected: st.Connected, Ready: ms.Ready,
			Reconnects: st.Reconnects, LastError: st.LastError, Updates: ms.Updates}
		if st.LastError != "" {
			a.Errors = append(a.Errors, StatusError{Source: "xds", Message: st.LastError})
		}
	}

	a.Workloads[config.SourceFile] = len(cfg.Workloads)
	a.Services[config.SourceFile] = len(cfg.Services)
	if cfg.Mesh.Enabled() {
		a.Workloads[config.SourceXDS] = snap.routed.workloads
		a.Services[config.SourceXDS] = snap.routed.svc.Len()
	}
	for _, p := range cfg.Policies {
		a.Policies[config.SourceOf(p.Source)]++
	}
	a.Rejected, a.Clashes = ms.Rejected, ms.Clashes
	for i, r := range snap.meshEntries.rejections {
		if i == maxStatusRejections {
			a.Errors = append(a.Errors, StatusError{Source: "mesh",
				Message: fmt.Sprintf("and %d more resources not used (/config_dump)", len(snap.meshEntries.rejections)-i)})
			break
		}
		a.Errors = append(a.Errors, StatusError{Source: "mesh", Message: "resource not used: " + r.String()})
	}
	slices.SortStableFunc(a.Errors, func(x, y StatusError) int { return y.At.Compare(x.At) })

	a.Peers = []StatusPeer{}
	if pool := g.metrics.pool.Load(); pool != nil {
		st := pool.Stats()
		a.Pool = StatusPool{Conns: st.ConnsOpen, Streams: st.StreamsOpen, ConnsOpened: st.ConnsOpened,
			DialsFailed: st.DialsFailed, StreamsOpened: st.StreamsOpened, StreamsFailed: st.StreamsFailed}
		for _, p := range pool.Peers() {
			a.Peers = append(a.Peers, StatusPeer{Address: p.Addr, Identity: p.Identity, Conns: p.Conns, Streams: p.Streams})
		}
	}
	a.Flows = StatusFlows{Outbound: g.flows.open(outbound), Inbound: g.flows.open(inbound),
		RefusedOverLimit: g.flows.refusedOverLimit(outbound) + g.flows.refusedOverLimit(inbound)}
	return a
}

func (g *Gateway) serveStatus(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, "status", g.status())
}

// FlowsAnswer is GET /flows: a page of the open flows, oldest first.
type FlowsAnswer struct {
	// Total is the flows being relayed; Setup those still being set up
	// (routing, dialling, authorizing), which are not listed.
	Total  int        `json:"total"`
	Setup  int        `json:"setup"`
	Offset int        `json:"offset"`
	Limit  int        `json:"limit"`
	Now    time.Time  `json:"now"`
	Flows  []FlowInfo `json:"flows"`
}

// FlowInfo is one open flow.
type FlowInfo struct {
	Direction string         `json:"direction"` // outbound or inbound
	Src       netip.AddrPort `json:"src"`
	Dst       netip.AddrPort `json:"dst"`
	Service   string         `json:"service,omitempty"`
	// HBONEAddr is where an outbound flow's CONNECT went.
	HBONEAddr netip.AddrPort `json:"hbone_addr,omitzero"`
	// PeerIdentity is the other gateway's (or ztunnel's) SPIFFE ID: the
	// destination's outbound, the source's inbound.
	PeerIdentity string    `json:"peer_identity,omitempty"`
	BytesSent    int64     `json:"bytes_sent"` // towards the destination
	BytesRecv    int64     `json:"bytes_recv"` // back from it
	Started      time.Time `json:"started"`
	AgeSeconds   float64   `json:"age_seconds"`
}

// Bounds of /flows' page.
const (
	defaultFlowsLimit = 100
	maxFlowsLimit     = 1000
)

func (g *Gateway) serveFlows(w http.ResponseWriter, r *http.Request) {
	num := func(key string, def, hi int) (int, bool) {
		v := r.URL.Query().Get(key)
		if v == "" {
			return def, true
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > hi {
			http.Error(w, fmt.Sprintf("%s=%q: want a number from 0 to %d", key, v, hi), http.StatusBadRequest)
			return 0, false
		}
		return n, true
	}
	limit, ok := num("limit", defaultFlowsLimit, maxFlowsLimit)
	if !ok {
		return
	}
	offset, ok := num("offset", 0, 1<<30)
	if !ok {
		return
	}
	writeJSON(w, "flows", g.flows.list(offset, limit, time.Now()))
}

// list is a page of the flows being relayed, oldest first.
func (t *flowTable) list(offset, limit int, now time.Time) FlowsAnswer {
	type listed struct {
		f    *flow
		info FlowInfo
	}
	t.mu.Lock()
	all := make([]listed, 0, len(t.flows))
	setup := 0
	for f := range t.flows {
		if f.info == nil {
			setup++
			continue
		}
		all = append(all, listed{f, *f.info})
	}
	t.mu.Unlock()
	slices.SortFunc(all, func(a, b listed) int {
		return cmp.Or(a.info.Started.Compare(b.info.Started), a.info.Src.Compare(b.info.Src), a.info.Dst.Compare(b.info.Dst))
	})
	ans := FlowsAnswer{Total: len(all), Setup: setup, Offset: offset, Limit: limit, Now: now.UTC(), Flows: []FlowInfo{}}
	if offset < len(all) {
		for _, l := range all[offset:min(len(all), offset+limit)] {
			fi := l.info
			fi.BytesSent, fi.BytesRecv = l.f.up.n.Load(), l.f.down.n.Load()
			fi.AgeSeconds = now.Sub(fi.Started).Seconds()
			ans.Flows = append(ans.Flows, fi)
		}
	}
	return ans
}

// relaying lists f from now on (/flows), as its setup left it.
func (t *flowTable) relaying(f *flow) {
	l := &f.log
	info := &FlowInfo{Direction: l.direction, Src: l.src, Dst: l.dst, Service: l.service, HBONEAddr: l.hboneAddr,
		PeerIdentity: l.dstIdentity, Started: l.start.UTC()}
	if l.direction == inbound {
		info.PeerIdentity = l.srcIdentity
	}
	t.mu.Lock()
	f.info = info
	t.mu.Unlock()
}

// liveBytes counts a direction's bytes as the relay writes them, for
// /flows, and passes them on to the flow's metrics.
type liveBytes struct {
	n    atomic.Int64
	next byteCounter
}

func (b *liveBytes) Add(v float64) {
	b.n.Add(int64(v))
	if b.next != nil {
		b.next.Add(v)
	}
}
