package hbone

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"golang.org/x/net/http2/hpack"
)

func TestServerParseAuthority(t *testing.T) {
	tests := []struct {
		name, in string
		want     string // "" means an error
	}{
		{"IPv4", "10.1.2.3:8080", "10.1.2.3:8080"},
		{"IPv6", "[2001:db8::1]:443", "[2001:db8::1]:443"},
		{"IPv4-mapped IPv6", "[::ffff:10.0.0.1]:80", "[::ffff:10.0.0.1]:80"},
		{"max port", "127.0.0.1:65535", "127.0.0.1:65535"},
		{"hostname", "example.com:80", ""},
		{"no port", "10.0.0.1", ""},
		{"empty port", "10.0.0.1:", ""},
		{"port 0", "10.0.0.1:0", ""},
		{"port too big", "10.0.0.1:65536", ""},
		{"leading zero", "10.0.0.1:080", ""},
		{"sign", "10.0.0.1:+80", ""},
		{"IPv6 without port", "[::1]", ""},
		{"IPv6 without brackets", "::1:80", ""},
		{"IPv6 zone", "[fe80::1%eth0]:80", ""},
		{"IPv4 in brackets", "[10.0.0.1]:80", ""},
		{"empty", "", ""},
		{"userinfo", "user@10.0.0.1:80", ""},
		{"space", " 10.0.0.1:80", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := srvParseAuthority(tt.in)
			switch {
			case tt.want == "" && err == nil:
				t.Errorf("srvParseAuthority(%q) = %v, want an error", tt.in, got)
			case tt.want != "" && err != nil:
				t.Errorf("srvParseAuthority(%q): %v", tt.in, err)
			case tt.want != "" && got.String() != tt.want:
				t.Errorf("srvParseAuthority(%q) = %v, want %s", tt.in, got, tt.want)
			}
		})
	}
}

func FuzzServerParseAuthority(f *testing.F) {
	for _, s := range []string{"10.1.2.3:8080", "[2001:db8::1]:443", "[::1]", "10.0.0.1:0", "[fe80::1%eth0]:80", "a:1", "1.2.3.4:080"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ap, err := srvParseAuthority(s)
		if err != nil {
			return
		}
		if !ap.IsValid() || ap.Port() == 0 || ap.Addr().Zone() != "" {
			t.Fatalf("%q accepted as %v", s, ap)
		}
		// What we accept is what netip prints back, up to IPv6 spelling.
		again, err := srvParseAuthority(ap.String())
		if err != nil || again != ap {
			t.Fatalf("%q -> %v does not round-trip: %v, %v", s, ap, again, err)
		}
		if ap.Addr().Is4() && ap.String() != s {
			t.Fatalf("IPv4 %q accepted as %v", s, ap)
		}
	})
}

func TestServerParseRequest(t *testing.T) {
	fields := func(kv ...string) []hpack.HeaderField {
		var fs []hpack.HeaderField
		for i := 0; i+1 < len(kv); i += 2 {
			fs = append(fs, hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
		}
		return fs
	}
	tests := []struct {
		name    string
		fields  []hpack.HeaderField
		wantErr string
	}{
		{"ok", fields(":method", "CONNECT", ":authority", "10.0.0.1:80", "forwarded", `for="10.0.0.9:5555"`, "baggage", "k8s.namespace.name=default"), ""},
		{"te trailers", fields(":method", "CONNECT", ":authority", "10.0.0.1:80", "te", "trailers"), ""},
		{"GET", fields(":method", "GET", ":authority", "10.0.0.1:80"), "not CONNECT"},
		{"no method", fields(":authority", "10.0.0.1:80"), "not CONNECT"},
		{"path", fields(":method", "CONNECT", ":authority", "10.0.0.1:80", ":path", "/"), ":path"},
		{"scheme", fields(":method", "CONNECT", ":scheme", "https", ":authority", "10.0.0.1:80"), ":scheme"},
		{"extended CONNECT", fields(":method", "CONNECT", ":protocol", "websocket", ":authority", "10.0.0.1:80"), ":protocol"},
		{"no authority", fields(":method", "CONNECT"), "without :authority"},
		{"bad authority", fields(":method", "CONNECT", ":authority", "example.com:80"), "not ip:port"},
		{"upgrade", fields(":method", "CONNECT", ":authority", "10.0.0.1:80", "upgrade", "h2c"), "connection-specific"},
		{"te gzip", fields(":method", "CONNECT", ":authority", "10.0.0.1:80", "te", "gzip"), "te"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			target, header, err := srvParseRequest(tt.fields)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if target != netip.MustParseAddrPort("10.0.0.1:80") {
				t.Errorf("target %v", target)
			}
			if tt.name == "ok" && (header.Get("Forwarded") != `for="10.0.0.9:5555"` || header.Get("baggage") == "") {
				t.Errorf("header %v", header)
			}
			if _, ok := header[http.CanonicalHeaderKey(":authority")]; ok {
				t.Error("pseudo-header in Header")
			}
		})
	}
}
