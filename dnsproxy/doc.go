// Package dnsproxy is the node's DNS server for the mesh's names, built on
// github.com/miekg/dns: kernel UDP and TCP sockets on one address (the
// TUN's, by default), A and AAAA answers for the hostnames of the
// services in force (a Zone, read once per query from the gateway's
// snapshot, so a reload or an xDS push changes the answers at once),
// NXDOMAIN for other names within the mesh's domains, and every other
// name forwarded to the host's resolvers from sockets that bypass the TUN.
//
// Short forms are those ztunnel's DNS proxy accepts (its src/dns/server.rs):
// a name with one label is a service of the client's namespace
// (<name>.<ns>.svc.<domain>), two labels <name>.<ns>.svc.<domain>, three
// ending in svc <name>.<ns>.svc.<domain>. ztunnel knows each client's
// namespace from the workload at the source address; every client of a
// node gateway is the node itself, so its namespace is the node's own
// (mesh.namespace), and with the mesh off one-label names are not
// expanded.
//
// What a query cannot do: stall the server. Each source address has a
// token bucket (queries over it are dropped and counted), forwarded
// queries in flight are bounded (more are refused), TCP connections are
// bounded and time out, a datagram or TCP message longer than a query
// can be is dropped, a packet that does not decode is counted and
// dropped, and an upstream that does not answer turns into SERVFAIL
// within a bounded time.
//
// RegisterResolved tells systemd-resolved, through resolvectl, to send
// the mesh's domains (and only those) to this server on the TUN link;
// Close and RevertResolved take it back.
package dnsproxy
