package bench

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// userHZ is the unit of utime and stime in /proc/<pid>/stat: USER_HZ,
// 100 on every Linux architecture Go supports (the kernel converts to it
// whatever its internal HZ).
const userHZ = 100

// procCPU is the CPU time (user + system, all threads) of process pid, in
// seconds, from /proc/<pid>/stat.
func procCPU(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("bench: cpu of %d: %w", pid, err)
	}
	// The command name (field 2) may hold spaces and parentheses: the
	// fields after it start after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("bench: cpu of %d: unreadable stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("bench: cpu of %d: short stat", pid)
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("bench: cpu of %d: bad utime/stime", pid)
	}
	return float64(ut+st) / userHZ, nil
}

// selfCPU is this process's CPU time in seconds (the load generator:
// client, server and the kernel work done in their system calls).
func selfCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// procStatusKiB reads a "Key:   N kB" line of /proc/<pid>/status (VmRSS).
func procStatusKiB(pid int, key string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("bench: status of %d: %w", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key+":"); ok {
			f := strings.Fields(v)
			if len(f) == 0 {
				break
			}
			return strconv.ParseInt(f[0], 10, 64)
		}
	}
	return 0, fmt.Errorf("bench: %s not in /proc/%d/status", key, pid)
}

// procLimit is the "Max open files"-style soft limit line of
// /proc/<pid>/limits, as written there.
func procLimit(pid int, name string) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return "unknown"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, name); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				return f[0]
			}
		}
	}
	return "unknown"
}

// raiseNoFile lifts this process's RLIMIT_NOFILE (soft, and hard where
// allowed: CAP_SYS_RESOURCE) towards want, and returns the soft limit it
// got. The gateways started afterwards inherit it through `ip netns exec`
// (setting it with syscall.Setrlimit stops the Go runtime from restoring
// the original soft limit in children), and raise their own soft limit to
// the hard one at start, as every Go program does.
func raiseNoFile(want uint64) uint64 {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0
	}
	if b, err := os.ReadFile("/proc/sys/fs/nr_open"); err == nil {
		if n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil && n < want {
			want = n
		}
	}
	if r.Cur >= want {
		return r.Cur
	}
	if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: want, Max: max(r.Max, want)}) == nil {
		return want
	}
	// Not allowed above the hard limit: take all of it.
	r.Cur = r.Max
	syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r)
	return noFileLimit()
}

// noFileLimit is this process's soft RLIMIT_NOFILE.
func noFileLimit() uint64 {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0
	}
	return r.Cur
}
