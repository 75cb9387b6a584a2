package tun

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Offload modes for Options.Offload.
const (
	// OffloadOff opens the device with water (IFF_TUN|IFF_NO_PI): one
	// plain IP packet per read and write. The zero value means off.
	OffloadOff = "off"
	// OffloadOn opens the device with IFF_VNET_HDR and turns on TCP
	// segmentation offload (TUNSETOFFLOAD with TUN_F_CSUM|TUN_F_TSO4|
	// TUN_F_TSO6); Open fails if the kernel refuses.
	OffloadOn = "on"
	// OffloadAuto is OffloadOn where the kernel supports it, else
	// OffloadOff (logged).
	OffloadAuto = "auto"
)

// Flags of TUNSETOFFLOAD (linux/if_tun.h). TSO needs CSUM (EINVAL without
// it); unknown bits are EINVAL too, which is how support is probed. USO
// (TUN_F_USO4/6) stays off: the packet path does not split UDP
// super-packets, and gVisor would take one as a single huge datagram.
const (
	tunFCSUM = 0x01
	tunFTSO4 = 0x02
	tunFTSO6 = 0x04
)

// openOffloadFile creates (or attaches to) the TUN device name with
// IFF_VNET_HDR and TSO on. The fd is non-blocking and wrapped by
// os.NewFile, so the Go poller drives reads of it and of its dups. It
// returns the file and the device's name as the kernel has it.
func openOffloadFile(name string) (*os.File, string, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, "", fmt.Errorf("open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, "", err
	}
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, "", fmt.Errorf("TUNSETIFF: %w", err)
	}
	// TUNSETOFFLOAD takes the flags as the ioctl argument itself, not a
	// pointer to them.
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETOFFLOAD,
		tunFCSUM|tunFTSO4|tunFTSO6); errno != 0 {
		unix.Close(fd)
		return nil, "", fmt.Errorf("TUNSETOFFLOAD (TSO): %w", errUnsupported{errno})
	}
	return os.NewFile(uintptr(fd), "/dev/net/tun"), ifr.Name(), nil
}

// errUnsupported marks an offload the kernel refused, for auto's fallback.
type errUnsupported struct{ err error }

func (e errUnsupported) Error() string { return e.err.Error() + " (offload not supported)" }
func (e errUnsupported) Unwrap() error { return e.err }

// isUnsupported reports whether err says the kernel lacks the offload (as
// opposed to, say, the device name being busy).
func isUnsupported(err error) bool {
	var u errUnsupported
	return errors.As(err, &u) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EOPNOTSUPP)
}

// openOffload opens the device with offload if opts asks for it. With
// OffloadAuto and a kernel that refuses, it leaves d.file nil for Open to
// use water instead.
func (d *Device) openOffload(opts Options) error {
	switch opts.Offload {
	case "", OffloadOff:
		return nil
	case OffloadOn, OffloadAuto:
	default:
		return fmt.Errorf("tun: open %s: offload %q is not one of: auto | on | off", opts.Name, opts.Offload)
	}
	file, name, err := openOffloadFile(opts.Name)
	switch {
	case err == nil:
		d.file, d.name, d.offload = file, name, true
		return nil
	case opts.Offload == OffloadAuto && isUnsupported(err):
		d.log.Info("TUN offload not supported by the kernel; using plain packets", "error", err)
		return nil
	}
	return fmt.Errorf("tun: open %s with offload: %w", opts.Name, busyHint(err))
}

// Offload reports whether the device was opened with offload: each packet
// read from or written to its fd is preceded by a virtio_net_hdr
// (VirtioNetHdr, VnetHdrLen bytes), and TCP packets may be super-packets
// up to 64 KiB.
func (d *Device) Offload() bool { return d.offload }

// closeFile closes the device's fd, through water when water opened it.
func (d *Device) closeFile() error {
	if d.ifce != nil {
		return d.ifce.Close()
	}
	return d.file.Close()
}

// busyHint adds what to do when the device name is taken.
func busyHint(err error) error {
	if errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("%w (is another meshtun running? after a crash run `meshtun cleanup`)", err)
	}
	return err
}
