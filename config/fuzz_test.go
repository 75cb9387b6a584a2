package config

import (
	"errors"
	"os"
	"testing"
)

// FuzzParse checks that Parse never panics, that a failure is an *Errors
// with at least one problem, and that a success validates.
func FuzzParse(f *testing.F) {
	for _, name := range []string{"../gateway.toml", "testdata/gateway-example.toml"} {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(base))
	f.Add([]byte(base + "[[workloads]]\nname = \"w\"\nnamespace = \"n\"\naddresses = [\"fd00::1\"]\n"))
	f.Add([]byte(base + "[[services]]\nports = { 80 = 8080, 0 = 1, x = 2 }\n"))
	f.Add([]byte(base + "[tun]\nroutes = [\"10.0.0.1/8\", 5, \"fe80::1%eth0\"]\n"))
	f.Add([]byte(meshFile(`instance_ips = ["192.0.2.10", "fd00::10"]`, `cert_ttl = "12h"`) + "[tls]\ntrust_bundle = \"b\"\n"))
	f.Add([]byte(meshFile(`xds_address = "[fd00::10]:0"`, `server_name = "a:1"`, `namespace = ""`) + "[tls]\ncert = \"c\"\n"))
	f.Add([]byte("version = 1\n[tun]\nmtu = = 5\n"))
	f.Add([]byte("peers = [{name = 1}, 2]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data, "fuzz.toml")
		if err != nil {
			var errs *Errors
			if !errors.As(err, &errs) || len(errs.List) == 0 {
				t.Fatalf("error %T %v is not an *Errors with problems", err, err)
			}
			if c != nil {
				t.Fatal("Parse returned a Config beside its error")
			}
			_ = errs.Error()
			return
		}
		if c == nil {
			t.Fatal("Parse returned neither a Config nor an error")
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Parse succeeded but Validate fails: %v", err)
		}
	})
}
