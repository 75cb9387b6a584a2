package tun

import (
	"fmt"
	"testing"

	"golang.org/x/sys/unix"
)

// TestIsUnsupported: auto falls back to water only when the kernel lacks
// the offload, never when the device is busy or the caller lacks rights.
func TestIsUnsupported(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"TUNSETOFFLOAD refused", fmt.Errorf("x: %w", errUnsupported{unix.EINVAL}), true},
		{"no vnet header support", fmt.Errorf("TUNSETIFF: %w", unix.EINVAL), true},
		{"ioctl unknown", unix.ENOTTY, true},
		{"busy name", fmt.Errorf("TUNSETIFF: %w", unix.EBUSY), false},
		{"no permission", unix.EPERM, false},
		{"no /dev/net/tun", unix.ENOENT, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := isUnsupported(tt.err); got != tt.want {
				t.Fatalf("isUnsupported(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}
