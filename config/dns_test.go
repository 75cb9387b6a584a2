package config

import (
	"net/netip"
	"slices"
	"testing"
	"time"
)

func TestDNSDefaults(t *testing.T) {
	c := mustParse(t, base+"[tun]\naddresses = [\"100.64.0.7/32\", \"fd00::7/128\"]\n[dns]\nenabled = true\n")
	d := c.DNS
	if want := netip.MustParseAddrPort("100.64.0.7:53"); d.Listen != want {
		t.Errorf("dns.listen = %s, want %s (the first tun.addresses address, port 53)", d.Listen, want)
	}
	if !slices.Equal(d.Domains, []string{"cluster.local"}) || d.TTL.Duration != 30*time.Second || len(d.Upstream) != 0 || !d.Enabled || d.RateLimit != 1000 {
		t.Errorf("dns = %+v, want enabled, domains [cluster.local], ttl 30s, no upstream", d)
	}

	c = mustParse(t, base+"[tun]\naddresses = [\"100.64.0.7/32\"]\n[dns]\nlisten = \"127.0.0.53:5353\"\ndomains = [\"mesh.example\", \"cluster.local\"]\nupstream = [\"192.0.2.53:53\"]\nttl = \"5s\"\n")
	d = c.DNS
	if d.Listen != netip.MustParseAddrPort("127.0.0.53:5353") || !slices.Equal(d.Domains, []string{"mesh.example", "cluster.local"}) ||
		!slices.Equal(d.Upstream, []netip.AddrPort{netip.MustParseAddrPort("192.0.2.53:53")}) || d.TTL.Duration != 5*time.Second || d.Enabled {
		t.Errorf("dns = %+v: the values written are not kept", d)
	}
	if !ReloadApplied("dns.ttl") || ReloadApplied("dns.rate_limit") || ReloadApplied("dns.domains") || ReloadApplied("dns.listen") || ReloadApplied("dns.upstream") || ReloadApplied("dns.enabled") {
		t.Errorf("a reload applies dns.ttl only")
	}
}

func TestDNSErrors(t *testing.T) {
	for _, tc := range []struct {
		name, doc, want string
	}{
		{"on without an address", base + "[dns]\nenabled = true\n",
			`gateway.toml: dns.listen: required while dns.enabled is true: tun.addresses has no address to derive it from; write one like "100.64.0.1:53"`},
		{"no domain", base + "[dns]\nenabled = true\nlisten = \"127.0.0.1:53\"\ndomains = []\n",
			`gateway.toml: dns.domains: at least one domain while dns.enabled is true, like ["cluster.local"]`},
		{"bad domain", base + "[dns]\ndomains = [\"cluster..local\"]\n",
			`gateway.toml: dns.domains[0]: "cluster..local" is not a DNS domain, like "cluster.local"`},
		{"domain twice", base + "[dns]\ndomains = [\"cluster.local\", \"Cluster.Local.\"]\n",
			`gateway.toml: dns.domains[1]: "Cluster.Local." is listed twice (also dns.domains[0])`},
		{"listen port 0", base + "[dns]\nlisten = \"127.0.0.1:0\"\n",
			`gateway.toml: dns.listen: 127.0.0.1:0 is not an address to listen on: write an IP of this host and a port, like "100.64.0.1:53"`},
		{"listen a host name", base + "[dns]\nlisten = \"localhost:53\"\n",
			`gateway.toml: dns.listen: invalid ip:port "localhost:53" (unable to parse IP): write it like "192.0.2.2:15008" or "[fd00::2]:15008"`},
		{"upstream is listen", base + "[dns]\nlisten = \"127.0.0.1:53\"\nupstream = [\"127.0.0.1:53\"]\n",
			`gateway.toml: dns.upstream[0]: 127.0.0.1:53 is dns.listen: this server would forward to itself`},
		{"upstream unspecified", base + "[dns]\nupstream = [\"0.0.0.0:53\"]\n",
			`gateway.toml: dns.upstream[0]: 0.0.0.0:53 is not a resolver's address: write ip:port, like "192.0.2.53:53"`},
		{"rate limit 0", base + "[dns]\nrate_limit = 0\n",
			`gateway.toml: dns.rate_limit: must be at least 1 (got 0)`},
		{"ttl too long", base + "[dns]\nttl = \"48h\"\n",
			`gateway.toml: dns.ttl: 48h0m0s is out of range: whole seconds, 0s..24h`},
		{"ttl in parts of a second", base + "[dns]\nttl = \"1500ms\"\n",
			`gateway.toml: dns.ttl: 1.5s is out of range: whole seconds, 0s..24h`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantLines(t, parseErrors(t, tc.doc), tc.want)
		})
	}
}
