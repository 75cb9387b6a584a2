// Package gateway assembles meshtun: it opens the TUN, starts the netstack
// over it, and turns every captured TCP flow into an HBONE stream to the
// destination's gateway (outbound); it serves HBONE and delivers the
// streams it accepts to local destinations (inbound).
//
// Routing is a pure function (Router.Route) from a destination to a Plan.
// Both directions end in the same relay, the one place where TCP half-close
// is carried across. Each connection produces one access-log line when it
// ends.
//
// Lifecycle: New checks and loads everything that can fail without side
// effects (certificates, trust bundle); Run opens the device, starts the
// listeners, reports ready, and on cancellation drains: new flows are
// refused, HBONE peers get GOAWAY, open flows get the drain timeout, then
// everything is closed and what the gateway added to the system is removed.
package gateway
