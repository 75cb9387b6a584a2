package tun_test

import (
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/meshtun/meshtun/tun"
	"github.com/meshtun/meshtun/tun/tuntest"
)

// TestOffloadModes: on opens with vnet headers, off and empty with water,
// auto with vnet headers on a kernel that has TSO for TUN (every kernel
// since 2.6.27, so the test machine); an unknown mode is refused. The
// device is configured and removed the same way in every mode.
func TestOffloadModes(t *testing.T) {
	tests := []struct {
		mode    string
		want    bool
		wantErr bool
	}{
		{"", false, false},
		{tun.OffloadOff, false, false},
		{tun.OffloadOn, true, false},
		{tun.OffloadAuto, true, false},
		{"yes", false, true},
	}
	for _, tt := range tests {
		t.Run("mode="+tt.mode, func(t *testing.T) {
			ns := tuntest.NewNetns(t, "mt-off")
			var dev *tun.Device
			var err error
			ns.Do(func() {
				dev, err = tun.Open(tun.Options{
					Name:      "mt0",
					MTU:       1500,
					Offload:   tt.mode,
					Addresses: []netip.Prefix{netip.MustParsePrefix("10.98.0.1/32")},
					Routes:    []netip.Prefix{netip.MustParsePrefix("10.98.1.0/24")},
				})
			})
			if tt.wantErr {
				if err == nil {
					dev.Close()
					t.Fatalf("Open with offload %q succeeded", tt.mode)
				}
				return
			}
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			t.Cleanup(func() { dev.Close() })
			if dev.Offload() != tt.want {
				t.Fatalf("Offload() = %v, want %v", dev.Offload(), tt.want)
			}
			st, err := inspect(ns, "mt0")
			if err != nil || !st.found || st.mtu != 1500 || !st.up {
				t.Fatalf("device state %+v, %v; want up with MTU 1500", st, err)
			}
			// The fd handed out is non-blocking in both modes (the Go
			// poller drives it).
			fd, err := dev.FD()
			if err != nil {
				t.Fatalf("FD: %v", err)
			}
			defer unix.Close(fd)
			if fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); err != nil || fl&unix.O_NONBLOCK == 0 {
				t.Fatalf("fd flags %#x, %v; want O_NONBLOCK", fl, err)
			}
			if err := dev.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if st, err := inspect(ns, "mt0"); err != nil || st.found {
				t.Fatalf("after Close: %+v, %v; want the device gone", st, err)
			}
		})
	}
}
