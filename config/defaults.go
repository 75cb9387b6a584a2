package config

import (
	"net/netip"
	"os"
	"time"
)

// Default returns a Config holding every default. It is the only place
// defaults live: Parse starts from it, and fills list entries ([[workloads]]
// and the like) with setDefaults below.
//
// Version and the [tls] paths have no default: a file must say them, so
// Default().Validate() fails until they are set.
func Default() *Config {
	host, _ := os.Hostname() // "" if unknown; Validate then asks for gateway.name
	return &Config{
		Gateway: Gateway{
			// Logs, metrics and access lines from a node are easiest to
			// read when they carry the node's own name.
			Name: host,
			// Kubernetes' and Istio's default, so certificates from a
			// stock istiod or cert-manager setup match.
			TrustDomain: "cluster.local",
			// Long enough for short requests to finish, short enough to
			// fit inside Kubernetes' 30s termination grace period.
			DrainTimeout: Duration{5 * time.Second},
		},
		Log: Log{
			Level:     "info", // one line per lifecycle event, none per packet
			Format:    "text", // read by people first; "json" for collectors
			AccessLog: true,   // one line per connection is cheap and is what operators ask for first
		},
		TUN: TUN{
			Name: "meshtun0", // names the product, fits in IFNAMSIZ (15 bytes)
			// Packets never leave the host on the TUN, so the MTU only
			// sets how many bytes cross the kernel boundary per read:
			// larger is faster (see field-notes.md).
			MTU:     65000,
			Offload: "auto", // use TSO/GRO where the kernel offers them, fall back silently
			// Addresses and Routes stay empty: they depend on the node's
			// address plan and nothing sensible can be guessed.
		},
		Netstack: Netstack{
			// Bounds memory for half-open handshakes under a SYN flood
			// while leaving room for bursts of thousands of real clients.
			MaxInFlight: 4096,
		},
		HBONE: HBONE{
			Listen: "0.0.0.0:15008", // ztunnel's HBONE port, so the two interoperate
			// Istio's default; above it a new connection spreads the load
			// and bounds what one lost connection takes down.
			MaxStreamsPerConn: 100,
			// One connection per pool key until it is full, as ztunnel
			// does and hbone-wire.md's pooling rules describe; more
			// spreads concurrent bulk flows over that many connections
			// (and their goroutines) on machines with cores to spare.
			ConnsPerPeer: 1,
			// Keeps warm connections across bursts without holding idle
			// sockets to departed peers for long.
			IdleTimeout: Duration{5 * time.Minute},
			// A peer that takes longer than this is unreachable in
			// practice; clients are better served by an error.
			ConnectTimeout: Duration{10 * time.Second},
		},
		Admin: Admin{
			Listen:    "127.0.0.1:15000", // ztunnel's admin port; local only, it can change the log level
			Metrics:   "0.0.0.0:15020",   // Istio's merged-metrics port, where scrapers look
			Readiness: "0.0.0.0:15021",   // Istio's readiness port, where kubelet probes look
		},
	}
}

// Defaults for the entries of arrays of tables, applied by Parse to each
// entry after decoding it.
const (
	// A pod without a service account runs as Kubernetes' "default" one.
	defaultServiceAccount = "default"
	// Workloads behind a meshtun or ztunnel node speak HBONE.
	defaultProtocol = "HBONE"
	// ztunnel's convention: a workload is reached over HBONE at its own
	// first address, port 15008, where the node's gateway captures it.
	defaultHBONEPort = 15008
)

// setDefaults fills the keys of w that the file left out.
func (w *Workload) setDefaults() {
	if w.ServiceAccount == "" {
		w.ServiceAccount = defaultServiceAccount
	}
	if w.Protocol == "" {
		w.Protocol = defaultProtocol
	}
	if w.Protocol == "HBONE" && !w.HBONEAddress.IsValid() && len(w.Addresses) > 0 {
		w.HBONEAddress = netip.AddrPortFrom(w.Addresses[0], defaultHBONEPort)
	}
}
