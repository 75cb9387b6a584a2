package identity

import (
	"strconv"
	"strings"
	"testing"
)

// FuzzParse checks that Parse never panics, that what it accepts prints
// back to its input and parses again to the same ID, and that the parts it
// reports are consistent with the string.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"spiffe://cluster.local/ns/default/sa/web",
		"spiffe://example.org/x",
		"spiffe://td/ns/a/sa/b/c",
		"spiffe://td/ns//sa/web",
		"spiffe://Cluster.Local/ns/a/sa/b",
		"spiffe://cluster.local:8080/ns/a",
		"spiffe://td/ns/../sa/x",
		"spiffe://",
		"spiffe:///",
		"https://cluster.local/ns/a/sa/b",
		"",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := Parse(s)
		if err != nil {
			if !id.IsZero() {
				t.Fatalf("Parse(%q) failed (%v) but returned %#v", s, err, id)
			}
			if !strings.Contains(err.Error(), strconv.Quote(s)) {
				t.Fatalf("Parse(%q): the error %q does not quote the input", s, err)
			}
			return
		}
		if id.IsZero() || id.String() != s {
			t.Fatalf("Parse(%q) = %#v, String %q", s, id, id.String())
		}
		again, err := Parse(id.String())
		if err != nil || again != id {
			t.Fatalf("Parse(String()) of %q = %#v, %v", s, again, err)
		}
		if p, ok := Principal(s); !ok || p != id.Principal() {
			t.Fatalf("Principal(%q) = %q, %v; ID.Principal %q", s, p, ok, id.Principal())
		}
		if err := CheckTrustDomain(id.TrustDomain()); err != nil {
			t.Fatalf("Parse(%q) accepted trust domain %q: %v", s, id.TrustDomain(), err)
		}
		if ns, sa := id.Namespace(), id.ServiceAccount(); (ns == "") != (sa == "") ||
			ns != "" && id.Path() != "/ns/"+ns+"/sa/"+sa {
			t.Fatalf("Parse(%q): namespace %q and service account %q do not make path %q", s, ns, sa, id.Path())
		}
	})
}
