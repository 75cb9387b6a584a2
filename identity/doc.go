// Package identity owns the names of the mesh: SPIFFE IDs
// (spiffe://<trust domain>/<path>, Istio's spiffe://<td>/ns/<ns>/sa/<sa>
// among them), their trust domain, namespace and service account, the
// principal form that authorization policies and metrics use (the ID
// without "spiffe://"), and the checks of trust domains and DNS host names.
//
// It imports only the standard library, so config, hbone and gateway can
// all share it: a SPIFFE ID is parsed the same way when the config names a
// peer, when a certificate presents one and when a policy matches one.
//
// The rules are those of the SPIFFE ID specification: the scheme is
// exactly "spiffe", the trust domain holds only lowercase letters, digits,
// '.', '-' and '_', and the path is one or more segments of letters,
// digits, '.', '-' and '_', none empty, "." or "..". No port, user, query
// or fragment. An ID that breaks a rule is refused, not repaired.
//
// The errors of Parse and the checks quote the value and say which rule it
// breaks, with no package prefix: callers put them after their own context,
// a key path ("peers[0].identity: …") or a certificate.
package identity
