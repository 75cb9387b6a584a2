package bench

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// Machine is where the figures came from.
type Machine struct {
	Hostname   string `json:"hostname"`
	NProc      int    `json:"nproc"`
	CPU        string `json:"cpu_model"`
	Kernel     string `json:"kernel"`
	GoVersion  string `json:"go_version"` // the harness's; the binary's is in Meshtun
	Meshtun    string `json:"meshtun_version"`
	GitRev     string `json:"git_revision"`
	LoadStart  string `json:"loadavg_start"`
	LoadEnd    string `json:"loadavg_end"`
	NoFile     string `json:"nofile_harness"`
	NoFileGwA  string `json:"nofile_gateway_a"`
	NoFileGwB  string `json:"nofile_gateway_b"`
	SharedNote string `json:"note"`
}

func machineInfo(e *env) Machine {
	m := Machine{
		NProc:      runtime.NumCPU(),
		GoVersion:  runtime.Version(),
		LoadStart:  loadavg(),
		NoFile:     procLimit(os.Getpid(), "Max open files"),
		SharedNote: "development machines are shared: other processes may have run during the bench (see loadavg)",
	}
	m.Hostname, _ = os.Hostname()
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				m.CPU = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:]) + " " + unix.ByteSliceToString(u.Version[:])
	}
	if out, err := exec.Command(e.cfg.Bin, "version").Output(); err == nil {
		m.Meshtun = strings.TrimSpace(string(out))
	}
	if out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		m.GitRev = strings.TrimSpace(string(out))
		if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
			m.GitRev += "-dirty"
		}
	}
	if e.pair.gwA != nil {
		m.NoFileGwA = procLimit(e.pair.gwA.PID(), "Max open files")
		m.NoFileGwB = procLimit(e.pair.gwB.PID(), "Max open files")
	}
	return m
}

func (m Machine) oneLine() string {
	return fmt.Sprintf("%d × %s, Linux %s, %s, meshtun %s (git %s), loadavg %s",
		m.NProc, m.CPU, strings.Fields(m.Kernel + " ?")[0], m.GoVersion, m.Meshtun, m.GitRev, m.LoadStart)
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
