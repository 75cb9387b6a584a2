// Package config owns gateway.toml: its schema (version 1), the defaults of
// every key, and the checks that decide whether a file may run.
//
// The schema is written once, as the Config struct and its tags
// (config.go): toml:"key" names each key, default:"…" gives its default,
// values:"a|b" the values a string may take, reload:"apply" the keys a
// reload puts in force, if:"mesh" and unless:"mesh" when a required key is
// required. The decoder (decode.go), Default, the key paths of
// Validate's errors, Dump (/config_dump), Diff, ReloadApplied and InForce
// (reload.go) all read it (schema.go), and a test holds the shipped
// gateway.toml to it: every key documented with its default.
//
// [mesh] joins an Istio ambient mesh. It is on when mesh.xds_address is
// set (Mesh.Enabled); absent or without that key, meshtun runs from the
// file alone. With it on, istiod's CA issues this node's
// certificate, for the identity spiffe://<gateway.trust_domain>/ns/
// <mesh.namespace>/sa/<mesh.service_account> (Config.MeshIdentity), so
// tls.cert and tls.key must be left out, and tls.trust_bundle, optional,
// adds roots trusted beside the mesh's; [[peers]], [[workloads]],
// [[services]] and [[policies]] stay valid beside what istiod serves.
// mesh.namespace and mesh.service_account are then required, and the
// [tls] keys no longer are: the schema says so with the tags if:"mesh"
// and unless:"mesh", which Validate's required checks and the shipped-file
// tests read. mesh.ca_address and mesh.server_name are derived from
// mesh.xds_address. Load checks that mesh.root_cert and mesh.token_file
// can be read, only with the mesh on, and reads neither's content: the
// token is read anew on every call to istiod. No key of [mesh] is applied
// by a reload.
//
// There is one load path. Load reads the file, Parse decodes it strictly
// (unknown keys and wrong types are errors, with "did you mean" hints),
// Default supplies every value the file leaves out, Validate checks the
// result as a whole, and Load finally checks that the files the gateway
// will read can be read. `meshtun run` and `meshtun validate` both call
// Load, so a file that validates is a file that runs.
//
// Every problem is reported at once, as an *Errors listing each problem with
// its key path ("tun.mtu", "peers[1].cidrs[0]") and, for syntax errors, the
// line and column:
//
//	gateway.toml:3:7: syntax error: expected value but found '=' instead
//	gateway.toml: tun.mtuu: unknown key (did you mean "mtu"?)
//	gateway.toml: peers[1].cidrs[0]: invalid CIDR "10.244.2.0/33" (prefix length out of range): ...
//	gateway.toml: peers[1].identity: required: the SPIFFE ID the peer must present, ...
//
// A Config is a plain value: it is built once, never changed after Load
// returns, and may be shared between goroutines. A reload builds a new
// Config beside the running one and swaps only if Load succeeds.
package config
