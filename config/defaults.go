package config

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"reflect"
	"strconv"

	"github.com/BurntSushi/toml"
)

// Default returns a Config holding every default: the default tags of the
// schema (config.go, where each default's reason is given), and the host
// name as gateway.name. Parse starts from it, and fills the entries of
// arrays of tables ([[workloads]] and the like) from the same tags.
//
// Version and the [tls] paths have no default: a file must say them (the
// paths unless [mesh] is on), so Default().Validate() fails until they
// are set.
func Default() *Config {
	c := &Config{}
	fillDefaults(reflect.ValueOf(c).Elem(), root, false)
	c.Gateway.Name, _ = os.Hostname() // "" if unknown; Validate then asks for gateway.name
	return c
}

// fillDefaults sets the keys of v, a struct of s's type, that have a
// default, its tables' keys included; onlyZero leaves keys that already
// hold a value alone.
func fillDefaults(v reflect.Value, s *tableSchema, onlyZero bool) {
	for _, k := range s.keys {
		f := v.Field(k.field)
		switch {
		case k.sub != nil && !k.array:
			fillDefaults(f, k.sub, onlyZero)
		case k.hasDef && !(onlyZero && !f.IsZero()):
			f.Set(defaultValue(&k))
		}
	}
}

// defaultValue is k's default, read from its tag by the decoder that reads
// the file, so a default is held to the same rules as a value written in
// gateway.toml. A default that does not decode is a bug of the schema.
func defaultValue(k *key) reflect.Value {
	var raw any = k.def
	switch k.typ.Kind() {
	case reflect.Int:
		n, err := strconv.ParseInt(k.def, 10, 64)
		if err != nil {
			panic(fmt.Sprintf("config: default of %s: %v", k.name, err))
		}
		raw = n
	case reflect.Bool:
		b, err := strconv.ParseBool(k.def)
		if err != nil {
			panic(fmt.Sprintf("config: default of %s: %v", k.name, err))
		}
		raw = b
	case reflect.Slice:
		var m map[string]any
		if _, err := toml.Decode("v = "+k.def, &m); err != nil {
			panic(fmt.Sprintf("config: default of %s: %v", k.name, err))
		}
		raw = m["v"]
	}
	d := decoder{order: make(map[string]int)}
	v, ok := d.value(k.name, raw, k.typ)
	if !ok {
		panic(fmt.Sprintf("config: default of %s: %v", k.name, d.list[0]))
	}
	return v
}

// defaultHBONEPort is the port of a workload's derived hbone_address:
// ztunnel's HBONE port, where the node's gateway captures it.
const defaultHBONEPort = 15008

// setDefaults fills the keys of w whose defaults are derived from its
// other keys; Parse calls it on each [[workloads]] entry after the entry's
// default tags are applied.
func (w *Workload) setDefaults() {
	if w.Protocol == "HBONE" && !w.HBONEAddress.IsValid() && len(w.Addresses) > 0 {
		w.HBONEAddress = netip.AddrPortFrom(w.Addresses[0], defaultHBONEPort)
	}
}

// setDefaults fills the keys derived from other tables: dns.listen from
// tun.addresses. decode calls it once the whole file is decoded.
func (c *Config) setDefaults() {
	c.DNS.setListen(&c.TUN)
}

// setDefaults fills the keys of [mesh] derived from mesh.xds_address;
// Parse calls it after decoding the table. istiod serves xDS and its CA on
// one port, under one certificate that names the host clients dial. An
// xds_address that is not host:port leaves server_name empty, for
// Validate to report the address.
func (m *Mesh) setDefaults() {
	if m.CAAddress == "" {
		m.CAAddress = m.XDSAddress
	}
	if m.ServerName == "" {
		if host, _, err := net.SplitHostPort(m.XDSAddress); err == nil {
			m.ServerName = host
		}
	}
}
