package hbone

import (
	"net/http"
	"net/netip"
	"regexp"
	"testing"
)

func TestServerParseTraceID(t *testing.T) {
	const trace = "0af7651916cd43dd8448eb211c80319c"
	tests := []struct {
		name, in, want string
	}{
		{"valid", "00-" + trace + "-b7ad6b7169203331-01", trace},
		{"spaces around", "  00-" + trace + "-b7ad6b7169203331-00 ", trace},
		{"future version with more fields", "01-" + trace + "-b7ad6b7169203331-00-extra", trace},
		{"empty", "", ""},
		{"version 00 with more fields", "00-" + trace + "-b7ad6b7169203331-00-extra", ""},
		{"version ff", "ff-" + trace + "-b7ad6b7169203331-00", ""},
		{"uppercase", "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-00", ""},
		{"zero trace", "00-00000000000000000000000000000000-b7ad6b7169203331-00", ""},
		{"zero parent", "00-" + trace + "-0000000000000000-00", ""},
		{"short trace", "00-0af7651916cd43dd8448eb211c80319-b7ad6b7169203331-00", ""},
		{"wrong separators", "00_" + trace + "_b7ad6b7169203331_00", ""},
		{"not hex", "00-" + trace[:31] + "g-b7ad6b7169203331-00", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := parseTraceID(tt.in); got != tt.want {
				t.Errorf("parseTraceID(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestServerParseForwardedFor(t *testing.T) {
	tests := []struct {
		name string
		in   []string
		want string // "" for the zero AddrPort
	}{
		{"hbone client", []string{`for="10.1.0.5:43210"`}, "10.1.0.5:43210"},
		{"with host", []string{`for="10.1.0.5:43210";host=db.prod.svc`}, "10.1.0.5:43210"},
		{"v6", []string{`for="[2001:db8::7]:5000"`}, "[2001:db8::7]:5000"},
		{"v6 no port", []string{`for="[2001:db8::7]"`}, "[2001:db8::7]:0"},
		{"unquoted v4", []string{`for=192.0.2.60`}, "192.0.2.60:0"},
		{"case and spaces", []string{`proto=http; For = "10.0.0.1:1"`}, "10.0.0.1:1"},
		{"first element wins", []string{`for="10.0.0.1:1", for="10.0.0.2:2"`}, "10.0.0.1:1"},
		{"first line wins", []string{`host=x`, `for="10.0.0.3:3"`}, "10.0.0.3:3"},
		{"quoted comma and semicolon", []string{`host="a,b;c", for="10.0.0.4:4"`}, "10.0.0.4:4"},
		{"escaped quote", []string{`host="a\"", for="10.0.0.5:5"`}, "10.0.0.5:5"},
		{"unknown", []string{`for=unknown`}, ""},
		{"obfuscated", []string{`for="_hidden"`}, ""},
		{"unbracketed v6", []string{`for="2001:db8::7"`}, ""},
		{"none", nil, ""},
		{"garbage", []string{`for`}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := parseForwardedFor(tt.in)
			var want netip.AddrPort
			if tt.want != "" {
				want = netip.MustParseAddrPort(tt.want)
			}
			if got != want {
				t.Errorf("parseForwardedFor(%q) = %v, want %v", tt.in, got, want)
			}
		})
	}
}

var traceIDForm = regexp.MustCompile(`^[0-9a-f]{32}$`)

func FuzzServerParseTraceID(f *testing.F) {
	f.Add("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	f.Add("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00-x")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		if id := parseTraceID(s); id != "" && !traceIDForm.MatchString(id) {
			t.Fatalf("parseTraceID(%q) = %q, not 32 lowercase hex digits", s, id)
		}
	})
}

func FuzzServerParseForwardedFor(f *testing.F) {
	f.Add(`for="10.1.0.5:43210";host=db`)
	f.Add(`for="[2001:db8::7]:5000", for=unknown`)
	f.Add(`host="a\"b", for=1.2.3.4`)
	f.Fuzz(func(t *testing.T, s string) {
		ap := parseForwardedFor([]string{s})
		if ap != (netip.AddrPort{}) && !ap.Addr().IsValid() {
			t.Fatalf("parseForwardedFor(%q) = %v: set but invalid", s, ap)
		}
	})
}

// The accessors read what our own client sends: the trace id of a fresh
// traceparent, and the forwarded source.
func TestServerRequestTraceAndForwarded(t *testing.T) {
	type seen struct {
		trace string
		fwd   netip.AddrPort
	}
	got := make(chan seen, 2)
	e := newSrvTest(t, func(r *Request) {
		got <- seen{r.TraceID(), r.ForwardedFor()}
		r.Reject(http.StatusServiceUnavailable)
	}, nil)
	pki := &clientTestPKI{ca: e.ca}
	var err error
	if pki.client, err = e.ca.KeyPair(srvTestClientID); err != nil {
		t.Fatal(err)
	}
	pool := newClientTestPool(t, pki, nil)
	req := clientTestRequest(netip.MustParseAddrPort(e.addr))
	req.Identities = []string{srvTestServerID}
	req.Source = netip.MustParseAddrPort("[2001:db8::7]:5000")
	var traces []string
	for range 2 {
		if _, err := pool.Connect(clientCtx(t), req); err == nil {
			t.Fatal("Connect succeeded, want the handler's 503")
		}
		s := clientRecv(t, got, "the handler")
		if !traceIDForm.MatchString(s.trace) {
			t.Errorf("TraceID = %q, want 32 hex digits", s.trace)
		}
		if s.fwd != req.Source {
			t.Errorf("ForwardedFor = %v, want %v", s.fwd, req.Source)
		}
		traces = append(traces, s.trace)
	}
	if traces[0] == traces[1] {
		t.Errorf("two CONNECTs carried the same trace id %s", traces[0])
	}
}
