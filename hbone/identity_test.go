package hbone

import (
	"crypto/x509"
	"net/url"
	"testing"
)

func TestParseID(t *testing.T) {
	tests := []struct {
		name, id, td string
		ok           bool
	}{
		{name: "workload", id: "spiffe://cluster.local/ns/default/sa/web", td: "cluster.local", ok: true},
		{name: "trust domain lower-cased", id: "spiffe://Cluster.Local/ns/a/sa/b", td: "cluster.local", ok: true},
		{name: "wrong scheme", id: "https://cluster.local/ns/a/sa/b"},
		{name: "no trust domain", id: "spiffe:///ns/a/sa/b"},
		{name: "no path", id: "spiffe://cluster.local"},
		{name: "root path", id: "spiffe://cluster.local/"},
		{name: "port", id: "spiffe://cluster.local:8080/ns/a"},
		{name: "user info", id: "spiffe://u@cluster.local/ns/a"},
		{name: "query", id: "spiffe://cluster.local/ns/a?x=1"},
		{name: "not a URI", id: "::"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			td, err := ParseID(tt.id)
			if (err == nil) != tt.ok {
				t.Fatalf("ParseID(%q) err = %v, want ok=%v", tt.id, err, tt.ok)
			}
			if tt.ok && td != tt.td {
				t.Errorf("trust domain = %q, want %q", td, tt.td)
			}
		})
	}
}

func TestIdentityOfTakesTheFirstValidSPIFFEURI(t *testing.T) {
	mk := func(uris ...string) *x509.Certificate {
		c := &x509.Certificate{DNSNames: []string{"web.default.svc"}}
		for _, s := range uris {
			u, err := url.Parse(s)
			if err != nil {
				t.Fatal(err)
			}
			c.URIs = append(c.URIs, u)
		}
		return c
	}
	id, err := IdentityOf(mk("https://example.com/x", "spiffe://td/ns/a/sa/one", "spiffe://td/ns/a/sa/two"))
	if err != nil || id != "spiffe://td/ns/a/sa/one" {
		t.Fatalf("IdentityOf = %q, %v", id, err)
	}
	if _, err := IdentityOf(mk()); err != ErrNoIdentity {
		t.Fatalf("a certificate with only DNS SANs: err = %v, want ErrNoIdentity", err)
	}
	if got := Principal("spiffe://td/ns/a/sa/one"); got != "td/ns/a/sa/one" {
		t.Errorf("Principal = %q", got)
	}
}
