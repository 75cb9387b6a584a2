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

// flowLog is what the access log says about one connection.
type flowLog struct {
	direction   string
	src         netip.AddrPort
	srcIdentity string
	dst         netip.AddrPort // the destination the client asked for
	hboneAddr   netip.AddrPort // outbound: the peer's HBONE address; inbound: none
	dstIdentity string
	start       time.Time
	sent, recv  int64 // bytes towards the destination, and back
	err         error
}

// emit writes the one "connection complete" line of a connection: INFO when
// it ended cleanly, WARN when it did not.
func (f *flowLog) emit(log hclog.Logger) {
	if log == nil {
		return
	}
	args := []any{
		"src.addr", f.src.String(),
		"src.identity", orDash(f.srcIdentity),
		"dst.addr", f.dst.String(),
		"dst.hbone_addr", addrOrDash(f.hboneAddr),
		"dst.identity", orDash(f.dstIdentity),
		"direction", f.direction,
		"bytes_sent", f.sent,
		"bytes_recv", f.recv,
		"duration", time.Since(f.start).Round(time.Microsecond).String(),
	}
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
