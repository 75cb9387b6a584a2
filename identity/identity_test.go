package identity

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"net/url"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, in         string
		td, path, ns, sa string
		err              string // part of the error; "" for success
	}{
		{name: "workload", in: "spiffe://cluster.local/ns/default/sa/web", td: "cluster.local", path: "/ns/default/sa/web", ns: "default", sa: "web"},
		{name: "generic path", in: "spiffe://example.org/x", td: "example.org", path: "/x"},
		{name: "deep path", in: "spiffe://td/a/b/c", td: "td", path: "/a/b/c"},
		{name: "ns without sa", in: "spiffe://td/ns/default", td: "td", path: "/ns/default"},
		{name: "sa before ns", in: "spiffe://td/sa/web/ns/default", td: "td", path: "/sa/web/ns/default"},
		{name: "extra segment", in: "spiffe://td/ns/a/sa/b/c", td: "td", path: "/ns/a/sa/b/c"},
		{name: "ns named sa", in: "spiffe://td/ns/sa/sa/x", td: "td", path: "/ns/sa/sa/x", ns: "sa", sa: "x"},
		{name: "dots and dashes", in: "spiffe://my-td_1.org/ns/a-b.c/sa/D_e", td: "my-td_1.org", path: "/ns/a-b.c/sa/D_e", ns: "a-b.c", sa: "D_e"},
		{name: "wrong scheme", in: "https://cluster.local/ns/a/sa/b", err: "is not a SPIFFE ID"},
		{name: "scheme case", in: "SPIFFE://cluster.local/ns/a/sa/b", err: "is not a SPIFFE ID"},
		{name: "no scheme", in: "cluster.local/ns/a/sa/b", err: "is not a SPIFFE ID"},
		{name: "empty", in: "", err: "is not a SPIFFE ID"},
		{name: "no path", in: "spiffe://cluster.local", err: "has no path"},
		{name: "root path", in: "spiffe://cluster.local/", err: "has no path"},
		{name: "no trust domain", in: "spiffe:///ns/a/sa/b", err: "required"},
		{name: "upper-case trust domain", in: "spiffe://Cluster.Local/ns/a/sa/b", err: "invalid trust domain"},
		{name: "port", in: "spiffe://cluster.local:8080/ns/a", err: "invalid trust domain"},
		{name: "user info", in: "spiffe://u@cluster.local/ns/a", err: "invalid trust domain"},
		{name: "query", in: "spiffe://cluster.local/ns/a?x=1", err: `path segment "a?x=1"`},
		{name: "fragment", in: "spiffe://cluster.local/ns/a#x", err: `path segment "a#x"`},
		{name: "empty segment", in: "spiffe://td/ns//sa/web", err: `path segment ""`},
		{name: "trailing slash", in: "spiffe://td/ns/a/", err: `path segment ""`},
		{name: "dot segment", in: "spiffe://td/ns/./sa/web", err: `path segment "."`},
		{name: "dot-dot segment", in: "spiffe://td/ns/../sa/web", err: `path segment ".."`},
		{name: "percent", in: "spiffe://td/ns/a%20b", err: `path segment "a%20b"`},
		{name: "long trust domain", in: "spiffe://" + strings.Repeat("a", 256) + "/x", err: "invalid trust domain"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := Parse(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Parse(%q) = %v, %v; want an error containing %q", tc.in, id, err, tc.err)
				}
				if !id.IsZero() {
					t.Errorf("Parse(%q) failed but returned %v", tc.in, id)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%q): %v", tc.in, err)
			}
			for _, f := range []struct{ what, got, want string }{
				{"String", id.String(), tc.in},
				{"TrustDomain", id.TrustDomain(), tc.td},
				{"Path", id.Path(), tc.path},
				{"Principal", id.Principal(), strings.TrimPrefix(tc.in, "spiffe://")},
				{"Namespace", id.Namespace(), tc.ns},
				{"ServiceAccount", id.ServiceAccount(), tc.sa},
			} {
				if f.got != f.want {
					t.Errorf("%s = %q, want %q", f.what, f.got, f.want)
				}
			}
		})
	}
}

func TestZeroID(t *testing.T) {
	var id ID
	if !id.IsZero() || id.String() != "" || id.Principal() != "" || id.Namespace() != "" || id.ServiceAccount() != "" {
		t.Errorf("zero ID: IsZero %v, String %q, Principal %q, Namespace %q, ServiceAccount %q",
			id.IsZero(), id.String(), id.Principal(), id.Namespace(), id.ServiceAccount())
	}
}

func TestWorkload(t *testing.T) {
	id, err := Workload("cluster.local", "default", "web")
	if err != nil {
		t.Fatal(err)
	}
	if id.String() != "spiffe://cluster.local/ns/default/sa/web" || id.Namespace() != "default" || id.ServiceAccount() != "web" {
		t.Errorf("Workload = %v (ns %q, sa %q)", id, id.Namespace(), id.ServiceAccount())
	}
	if want, _ := Parse("spiffe://cluster.local/ns/default/sa/web"); id != want {
		t.Errorf("Workload = %#v, Parse gives %#v: IDs must compare with ==", id, want)
	}
	for _, bad := range [][3]string{{"", "a", "b"}, {"TD", "a", "b"}, {"td", "", "b"}, {"td", "a/b", "c"}, {"td", "a", ".."}} {
		if id, err := Workload(bad[0], bad[1], bad[2]); err == nil {
			t.Errorf("Workload(%q, %q, %q) = %v, want an error", bad[0], bad[1], bad[2], id)
		}
	}
}

func TestPrincipal(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"spiffe://td/ns/a/sa/b", "td/ns/a/sa/b", true},
		{"spiffe://anything at all", "anything at all", true},
		{"td/ns/a/sa/b", "td/ns/a/sa/b", false},
		{"", "", false},
	} {
		if got, ok := Principal(tc.in); got != tc.want || ok != tc.ok {
			t.Errorf("Principal(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestFromCertificate(t *testing.T) {
	mk := func(uris ...string) *x509.Certificate {
		c := &x509.Certificate{DNSNames: []string{"web.default.svc"}, Subject: pkix.Name{CommonName: "spiffe://td/ns/cn/sa/cn"}}
		for _, s := range uris {
			u, err := url.Parse(s)
			if err != nil {
				t.Fatal(err)
			}
			c.URIs = append(c.URIs, u)
		}
		return c
	}
	id, err := FromCertificate(mk("spiffe://td/ns/a/sa/one"))
	if err != nil || id.String() != "spiffe://td/ns/a/sa/one" {
		t.Fatalf("FromCertificate = %v, %v; want its one SPIFFE ID", id, err)
	}
	for _, tc := range []struct {
		name string
		uris []string
		want error
	}{
		{"only DNS SANs and a CN", nil, ErrNoIdentity},
		{"a URI that is no SPIFFE ID", []string{"https://example.com/x"}, ErrNoIdentity},
		{"an invalid SPIFFE ID", []string{"spiffe://TD/ns/a/sa/upper"}, ErrNoIdentity},
		{"two SPIFFE IDs", []string{"spiffe://td/ns/a/sa/one", "spiffe://td/ns/a/sa/two"}, ErrManyURIs},
		{"a SPIFFE ID after another URI", []string{"https://example.com/x", "spiffe://td/ns/a/sa/one"}, ErrManyURIs},
	} {
		if id, err := FromCertificate(mk(tc.uris...)); !errors.Is(err, tc.want) || !id.IsZero() {
			t.Errorf("%s: %v, %v; want %v", tc.name, id, err, tc.want)
		}
	}
}

func TestCheckTrustDomain(t *testing.T) {
	for _, tc := range []struct {
		td string
		ok bool
	}{
		{"cluster.local", true},
		{"a-b_c.0", true},
		{strings.Repeat("a", 255), true},
		{strings.Repeat("a", 256), false},
		{"", false},
		{"Cluster.Local", false},
		{"td:80", false},
		{"t d", false},
		{"tä", false},
	} {
		if err := CheckTrustDomain(tc.td); (err == nil) != tc.ok {
			t.Errorf("CheckTrustDomain(%q) = %v, want ok %v", tc.td, err, tc.ok)
		}
	}
}

func TestCheckSegment(t *testing.T) {
	for _, tc := range []struct {
		s  string
		ok bool
	}{
		{"default", true}, {"Web-1_a.b", true}, {"", false}, {".", false}, {"..", false}, {"a/b", false}, {"a b", false},
	} {
		if err := CheckSegment(tc.s); (err == nil) != tc.ok {
			t.Errorf("CheckSegment(%q) = %v, want ok %v", tc.s, err, tc.ok)
		}
	}
}

func TestCheckHostname(t *testing.T) {
	for _, tc := range []struct {
		h  string
		ok bool
	}{
		{"web.default.svc.cluster.local", true},
		{"localhost", true},
		{"Web-1.Example.", true},
		{"1.2.3.4", true}, // labels may be all digits; callers try IP addresses first
		{strings.Repeat("a", 63) + ".b", true},
		{strings.Repeat("a", 64) + ".b", false},
		{strings.Repeat("a.", 126) + "a", true}, // 253 bytes
		{strings.Repeat("a.", 126) + "ab", false},
		{"", false},
		{".", false},
		{"a..b", false},
		{"-a.b", false},
		{"a-.b", false},
		{"a_b.c", false},
		{"a b", false},
		{"a.b..", false},
	} {
		if err := CheckHostname(tc.h); (err == nil) != tc.ok {
			t.Errorf("CheckHostname(%q) = %v, want ok %v", tc.h, err, tc.ok)
		}
	}
}

func TestCheckName(t *testing.T) {
	for _, tc := range []struct {
		s  string
		ok bool
	}{
		{"Kubernetes", true},
		{"vm-1.prod_a", true},
		{"v1.2.3", true},
		{strings.Repeat("a", 253), true},
		{strings.Repeat("a", 254), false},
		{"", false},
		{"a b", false},
		{"a,b", false},
		{"a=b", false},
		{"a;b", false},
		{"a%2Cb", false},
		{"a/b", false},
		{"é", false},
		{"a\x00", false},
	} {
		if err := CheckName(tc.s); (err == nil) != tc.ok {
			t.Errorf("CheckName(%q) = %v, want ok %v", tc.s, err, tc.ok)
		}
	}
}
