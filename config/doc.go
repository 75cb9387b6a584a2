// Package config owns gateway.toml: its schema (version 1), the defaults of
// every key, and the checks that decide whether a file may run.
//
// The schema is written once, as the Config struct and its tags
// (config.go): toml:"key" names each key, default:"…" gives its default,
// values:"a|b" the values a string may take, reload:"apply" the keys a
// reload puts in force. The decoder (decode.go), Default, the key paths of
// Validate's errors, Dump (/config_dump), Diff, ReloadApplied and InForce
// (reload.go) all read it (schema.go), and a test holds the shipped
// gateway.toml to it: every key documented with its default.
//
// There is one load path. Load reads the file, Parse decodes it strictly
// (unknown keys and wrong types are errors, with "did you mean" hints),
// Default supplies every value the file leaves out, Validate checks the
// result as a whole, and Load finally checks that the TLS files it names can
// be read. `meshtun run` and `meshtun validate` both call Load, so a file
// that validates is a file that runs.
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
