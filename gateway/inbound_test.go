package gateway

import (
	"net/http"
	"net/netip"
	"testing"
)

func TestTraceID(t *testing.T) {
	tests := []struct{ name, tp, want string }{
		{"valid", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "4bf92f3577b34da6a3ce929d0e0e4736"},
		{"surrounding space", " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00 ", "4bf92f3577b34da6a3ce929d0e0e4736"},
		{"future version with extra field", "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x", "4bf92f3577b34da6a3ce929d0e0e4736"},
		{"version 00 with extra field", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x", ""},
		{"version ff", "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", ""},
		{"all-zero trace id", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", ""},
		{"upper case", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", ""},
		{"short trace id", "00-4bf92f3577b34da6-00f067aa0ba902b7-01", ""},
		{"not hex", "00-4bf92f3577b34da6a3ce929d0e0e47zz-00f067aa0ba902b7-01", ""},
		{"empty", "", ""},
		{"log injection", "00-4bf92f3577b34da6a3ce929d0e0e4736\n-00f067aa0ba902b7-01", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := traceID(tt.tp); got != tt.want {
				t.Errorf("traceID(%q) = %q, want %q", tt.tp, got, tt.want)
			}
		})
	}
}

func TestForwardedFor(t *testing.T) {
	tests := []struct {
		name   string
		values []string
		want   string // "" for none
	}{
		{"quoted", []string{`for="10.244.1.5:4242"`}, "10.244.1.5:4242"},
		{"with host", []string{`for="10.244.1.5:4242";host=web.default.svc.cluster.local`}, "10.244.1.5:4242"},
		{"host first", []string{`host=web;for="[fd00::5]:80"`}, "[fd00::5]:80"},
		{"case", []string{`For="10.244.1.5:1"`}, "10.244.1.5:1"},
		{"IP without port is not used", []string{`for=10.244.1.5`}, ""},
		{"garbage", []string{`for="nope"`}, ""},
		{"absent", nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for _, v := range tt.values {
				h.Add("Forwarded", v)
			}
			got := forwardedFor(h)
			if tt.want == "" {
				if got.IsValid() {
					t.Errorf("got %v, want none", got)
				}
				return
			}
			if got != netip.MustParseAddrPort(tt.want) {
				t.Errorf("got %v, want %s", got, tt.want)
			}
		})
	}
}
