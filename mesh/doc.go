// Package mesh speaks to Istio's control plane the way ztunnel does: it
// gets this node's workload certificate from Istio's CA and the mesh's
// workloads, services and authorization policies from istiod over delta
// ADS. It knows nothing of the gateway: the gateway turns its snapshots
// into routes and policies, and hands its certificates to HBONE.
//
// # Connection
//
// Both clients dial a ControlPlane: gRPC over TLS (1.2 or later), istiod's
// serving certificate verified against the roots of the RootCert file
// (read again for each new connection) and ServerName (default: the host
// of Address). Every call (for ADS: every stream) carries
//
//	authorization: Bearer <the token file's content, read again for this call>
//	clusterid: <ClusterID>
//
// A token file that is missing or empty fails the call as Unauthenticated
// before anything is sent. gRPC's own reconnection delays are bounded by
// the same MinBackoff/MaxBackoff as the clients' retry loops; keepalive
// pings every 30 s (istiod allows one per 15 s).
//
// # Certificates
//
// CAClient.Fetch makes a new ECDSA P-256 key (in memory only, never
// written anywhere), a CSR whose only SAN is the URI
// spiffe://<TrustDomain>/ns/<Namespace>/sa/<ServiceAccount>, and calls
// istio.v1.auth.IstioCertificateService/CreateCertificate with
// validity_duration = CertTTL in seconds. The answer's cert_chain is
// [leaf, intermediates..., root], each element PEM; the leaf must hold our
// key, carry our URI and verify through the intermediates to the root.
// The result is a tls.Certificate (leaf + intermediates, the key) and the
// root(s) as a CertPool.
//
// CertManager lifecycle: NewCertManager (checks the options, nothing sent)
// → Start (one goroutine; first request at once) → Ready() closes with the
// first certificate → renewal at half the remaining life of each
// certificate, ±10% (never sooner than 100 ms) → Close (ends the
// goroutine, closes the connection and every Subscribe channel;
// idempotent). A failed request is retried after an exponential delay
// with jitter (MinBackoff doubling to MaxBackoff, each delay drawn from
// [d/2, d]); meanwhile the old certificate stays in force and each
// failure is logged with its expiry. Once it expires, Current returns no
// certificate (the log and the subscribers are told at that moment, not
// at the next retry) until a request succeeds. Stats gives the expiry, the
// next attempt, the last error and the renewals by result. CertManager is
// a CertSource, the interface the HBONE side consumes: Current and
// Subscribe.
//
// # Workloads and policies
//
// XDSClient holds one DeltaAggregatedResources stream. On each stream it
// sends two wildcard subscriptions (no resource names), first for
// type.googleapis.com/istio.workload.Address, then for
// type.googleapis.com/istio.security.Authorization, each with the node
//
//	id: ztunnel~<first instance IP>~<name>.<namespace>~<namespace>.svc.cluster.local
//	metadata: NAME, NAMESPACE, SERVICE_ACCOUNT, INSTANCE_IPS (comma separated),
//	          NODE_NAME (if set), CLUSTER_ID (if set), all strings
//
// and initial_resource_versions: name → version of every resource held of
// that type, so a reconnecting stream continues from our state (istiod
// then sends what changed and removes what is gone).
//
// Each response is handled in order: its resources are decoded (the Any's
// type must be the response's; an Address must hold a workload or a
// service), passed to Validate, and each one that fails is rejected alone
// (a previous version of it stays in force, and it is not counted as held
// in initial_resource_versions); the others replace their namesakes, and
// removed_resources are dropped. If anything changed (or it is the type's
// first response) OnUpdate gets a Snapshot of everything held, of both
// types. Then the client answers with the response's type and nonce: an
// ACK, or a NACK whose error_detail (InvalidArgument) names each rejected
// resource and why. A response of a type we did not subscribe to is NACKed
// whole. Ready() closes once both types have had a first response; a
// reconnect does not undo it.
//
// A stream that ends is opened again after a backoff like the CA's; the
// schedule starts over after a stream that delivered a response (istiod
// closes streams at their maximum age). Close ends the stream and the
// goroutine and closes the connection; Start and Close never block on the
// network.
package mesh
