package gateway

import (
	"errors"
	"io"
	"net/netip"
	"time"

	"github.com/hashicorp/go-hclog"
)

// direction of a connection, as in ztunnel's access log.
const (
	outbound = "outbound"
	inbound  = "inbound"
)

// Response flags of the access log (Istio's response_flags label, named
// as in docs/hbone.md, "Metrics and access log"): why a connection did not
// get through. "-" when it did.
const (
	flagDeny     = "DENY"     // an authorization policy denied it (401)
	flagNoRoute  = "NO_ROUTE" // outbound: no service, workload or peer matches
	flagConnect  = "CONNECT"  // the peer or the target could not be reached or refused
	flagOverflow = "OVERFLOW" // gateway.max_flows_per_source flows from its source are open already (inbound: 503)
)

// flowLog is what the access log says about one connection (a flow of
// the flow table, which fills flag and err from the flow's outcome).
type flowLog struct {
	direction   string
	src         netip.AddrPort // the client: outbound from the TUN, inbound from forwarded (else the HBONE peer)
	srcIdentity string
	dst         netip.AddrPort // the target: a service VIP resolved to its endpoint
	service     string         // the destination service ("namespace/name"), if any
	hboneAddr   netip.AddrPort // outbound: the peer's HBONE address; inbound: none
	dstIdentity string
	traceID     string // inbound: the trace id of the CONNECT's traceparent
	flag        string // a response flag, or "" for none
	start       time.Time
	sent, recv  int64 // bytes towards the destination, and back
	err         error
	metrics     *flowMetrics // set by openMetrics; emit counts the close
}

// openMetrics counts the flow as opened with labels l (metrics.go); emit
// then counts it as closed, with its response flag and bytes.
func (f *flowLog) openMetrics(m *metrics, l tcpLabels) {
	f.metrics = m.openFlow(l)
}

// emit ends a connection's bookkeeping: it counts the close in the
// metrics, when the flow was counted as opened, and writes the one
// "connection complete" line: INFO when it ended cleanly, WARN when it did
// not.
func (f *flowLog) emit(log hclog.Logger) {
	if f.metrics != nil {
		f.metrics.close(f.flag, f.sent, f.recv)
		f.metrics = nil
	}
	if log == nil {
		return
	}
	args := []any{
		"src.addr", addrOrDash(f.src),
		"src.identity", orDash(f.srcIdentity),
		"dst.addr", f.dst.String(),
		"dst.hbone_addr", addrOrDash(f.hboneAddr),
		"dst.identity", orDash(f.dstIdentity),
	}
	if f.service != "" {
		args = append(args, "dst.service", f.service)
	}
	if f.traceID != "" {
		args = append(args, "trace_id", f.traceID)
	}
	args = append(args,
		"direction", f.direction,
		"response_flags", orDash(f.flag),
		"bytes_sent", f.sent,
		"bytes_recv", f.recv,
		"duration", time.Since(f.start).Round(time.Microsecond).String(),
	)
	if f.err != nil && !errors.Is(f.err, io.EOF) {
		log.Warn("connection complete", append(args, "error", f.err.Error())...)
		return
	}
	log.Info("connection complete", args...)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func addrOrDash(a netip.AddrPort) string {
	if !a.IsValid() {
		return "-"
	}
	return a.String()
}
