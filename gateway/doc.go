// Package gateway assembles meshtun: it opens the TUN, starts the netstack
// over it, and turns every captured TCP flow into an HBONE stream to the
// destination's gateway (outbound); it serves HBONE and delivers the
// streams it accepts to local destinations (inbound).
//
// Routing is a pure function (Router.Route) from a destination to a Plan,
// most specific first: a service VIP and port (one of the service's
// endpoints, taken round robin, at the mapped target port; the endpoint's
// identity and the service's subject_alt_names are accepted; an undeclared
// port is denied), a workload address, then the longest peer CIDR. Protocol
// TCP workloads are dialled directly, from a socket marked so that the
// kernel routes it past our own TUN (tun/bypass.go); HBONE dials to peers
// carry the same mark. `meshtun route` prints the plans of the same Router.
//
// Inbound, every stream is authorized before its target is dialled, by the
// pure Authorizer (authz.go: ztunnel's L4 policy model); a denied stream is
// answered 401.
//
// Both directions end in the same relay, the one place where TCP half-close
// is carried across. Each connection produces one access-log line when it
// ends, with a response flag saying why one did not get through and, for
// inbound streams, the trace id of the CONNECT.
//
// Lifecycle: New checks and loads everything that can fail without side
// effects (certificates, trust bundle); Run opens the device, starts the
// listeners, reports ready, and on cancellation drains: new flows are
// refused, HBONE peers get GOAWAY, open flows get the drain timeout, then
// everything is closed and what the gateway added to the system is removed.
package gateway
