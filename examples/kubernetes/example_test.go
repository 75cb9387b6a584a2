package kubernetes_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/internal/image"
	"github.com/meshtun/meshtun/internal/topo"
)

// The parts of the Kubernetes objects the example relies on.
type (
	object struct {
		APIVersion string `yaml:"apiVersion"`
		Kind       string `yaml:"kind"`
		Metadata   struct {
			Name      string `yaml:"name"`
			Namespace string `yaml:"namespace"`
		} `yaml:"metadata"`
		Data map[string]string `yaml:"data"` // ConfigMap
		Spec struct {          // DaemonSet
			Template struct {
				Spec podSpec `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	podSpec struct {
		HostNetwork                   bool        `yaml:"hostNetwork"`
		TerminationGracePeriodSeconds int         `yaml:"terminationGracePeriodSeconds"`
		InitContainers                []container `yaml:"initContainers"`
		Containers                    []container `yaml:"containers"`
		Volumes                       []struct {
			Name      string `yaml:"name"`
			ConfigMap *struct {
				Name string `yaml:"name"`
			} `yaml:"configMap"`
			Secret *struct {
				SecretName string `yaml:"secretName"`
			} `yaml:"secret"`
			HostPath *struct {
				Path string `yaml:"path"`
				Type string `yaml:"type"`
			} `yaml:"hostPath"`
		} `yaml:"volumes"`
	}
	container struct {
		Name            string   `yaml:"name"`
		Image           string   `yaml:"image"`
		Command         []string `yaml:"command"`
		SecurityContext struct {
			RunAsUser                *int  `yaml:"runAsUser"`
			AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
			ReadOnlyRootFilesystem   bool  `yaml:"readOnlyRootFilesystem"`
			Capabilities             struct {
				Drop []string `yaml:"drop"`
				Add  []string `yaml:"add"`
			} `yaml:"capabilities"`
		} `yaml:"securityContext"`
		Ports []struct {
			Name          string `yaml:"name"`
			ContainerPort uint16 `yaml:"containerPort"`
		} `yaml:"ports"`
		ReadinessProbe *struct {
			HTTPGet struct {
				Path string `yaml:"path"`
				Port uint16 `yaml:"port"`
			} `yaml:"httpGet"`
		} `yaml:"readinessProbe"`
		VolumeMounts []struct {
			Name      string `yaml:"name"`
			MountPath string `yaml:"mountPath"`
		} `yaml:"volumeMounts"`
	}
)

// binary is where the image puts meshtun (`make image`).
const binary = image.BinaryPath

// manifest is meshtun.yaml's objects by kind (one of each).
func manifest(t *testing.T) map[string]object {
	t.Helper()
	f, err := os.Open("meshtun.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	objs := map[string]object{}
	for {
		var o object
		if err := dec.Decode(&o); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("meshtun.yaml: %v", err)
		}
		if _, dup := objs[o.Kind]; dup {
			t.Fatalf("meshtun.yaml: two %s objects", o.Kind)
		}
		objs[o.Kind] = o
	}
	for _, k := range []string{"Namespace", "ConfigMap", "DaemonSet"} {
		if _, ok := objs[k]; !ok {
			t.Fatalf("meshtun.yaml has no %s", k)
		}
	}
	return objs
}

// mountOf is where c mounts the volume named name ("" if it does not).
func (c container) mountOf(name string) string {
	for _, m := range c.VolumeMounts {
		if m.Name == name {
			return m.MountPath
		}
	}
	return ""
}

// podFixture is the DaemonSet's pod spec, its main container, the
// ConfigMap's gateway.toml as the gateway loads it (from a copy whose
// [tls] files are development certificates made by the binary), and the
// path --config names in the containers.
type podFixture struct {
	pod      podSpec
	main     container
	cfg      *config.Config
	cfgPath  string // the copy
	inPod    string // --config of the containers
	bin, dir string
}

func setup(t *testing.T) *podFixture {
	t.Helper()
	objs := manifest(t)
	ds, cm := objs["DaemonSet"], objs["ConfigMap"]
	if ds.Metadata.Namespace != objs["Namespace"].Metadata.Name || cm.Metadata.Namespace != ds.Metadata.Namespace {
		t.Errorf("the DaemonSet (%s) and ConfigMap (%s) are not in the Namespace %s", ds.Metadata.Namespace, cm.Metadata.Namespace, objs["Namespace"].Metadata.Name)
	}
	f := &podFixture{pod: ds.Spec.Template.Spec, dir: t.TempDir()}
	if len(f.pod.Containers) != 1 {
		t.Fatalf("%d containers, want the gateway alone", len(f.pod.Containers))
	}
	f.main = f.pod.Containers[0]
	if c := f.main.Command; len(c) != 4 || c[0] != binary || c[1] != "run" || c[2] != "--config" {
		t.Fatalf("the container runs %q, want %s run --config FILE", c, binary)
	}
	f.inPod = f.main.Command[3]

	// --config is the ConfigMap's file, where the volume mounts it.
	var cmVolume string
	for _, v := range f.pod.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == cm.Metadata.Name {
			cmVolume = v.Name
		}
	}
	if dir := f.main.mountOf(cmVolume); dir == "" || path.Dir(f.inPod) != dir {
		t.Fatalf("--config %s is not in the ConfigMap's mount (%q)", f.inPod, dir)
	}
	text, ok := cm.Data[path.Base(f.inPod)]
	if !ok {
		t.Fatalf("the ConfigMap has no %s", path.Base(f.inPod))
	}

	// The binary, and certificates for the [tls] paths.
	f.bin = filepath.Join(f.dir, "meshtun")
	if out, err := exec.Command("go", "build", "-o", f.bin, "github.com/meshtun/meshtun/cmd/meshtun").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	if out, err := exec.Command(f.bin, "certs", "--out", f.dir, "meshtun").CombinedOutput(); err != nil {
		t.Fatalf("meshtun certs: %v\n%s", err, out)
	}
	repl := strings.NewReplacer(
		`"/etc/meshtun/tls/cert.pem"`, `"`+filepath.Join(f.dir, "meshtun.pem")+`"`,
		`"/etc/meshtun/tls/key.pem"`, `"`+filepath.Join(f.dir, "meshtun-key.pem")+`"`,
		`"/etc/meshtun/tls/ca.pem"`, `"`+filepath.Join(f.dir, "ca.pem")+`"`,
	)
	if n := strings.Count(text, `"/etc/meshtun/tls/`); n != 3 {
		t.Fatalf("gateway.toml names /etc/meshtun/tls/ %d times, want the three [tls] files", n)
	}
	f.cfgPath = filepath.Join(f.dir, "gateway.toml")
	if err := os.WriteFile(f.cfgPath, []byte(repl.Replace(text)), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(f.cfgPath)
	if err != nil {
		t.Fatalf("the ConfigMap's gateway.toml: %v", err)
	}
	f.cfg = cfg
	return f
}

// command is c's command for the binary built here, the config path
// replaced by the copy.
func (f *podFixture) command(t *testing.T, c container) []string {
	t.Helper()
	if len(c.Command) < 2 || c.Command[0] != binary {
		t.Fatalf("container %s runs %q, want %s", c.Name, c.Command, binary)
	}
	args := slices.Clone(c.Command[1:])
	for i, a := range args {
		if a == f.inPod {
			args[i] = f.cfgPath
		} else if strings.HasPrefix(a, "/") {
			t.Fatalf("container %s: unexpected path %s", c.Name, a)
		}
	}
	return args
}

// TestDaemonSet holds meshtun.yaml to what the gateway needs and the
// ConfigMap's gateway.toml to the gateway's load path.
func TestDaemonSet(t *testing.T) {
	f := setup(t)
	if !f.pod.HostNetwork {
		t.Error("hostNetwork is off: the TUN and its routes would be the pod's own")
	}
	if grace, drain := time.Duration(f.pod.TerminationGracePeriodSeconds)*time.Second, f.cfg.Gateway.DrainTimeout.Duration; grace <= drain {
		t.Errorf("terminationGracePeriodSeconds %v is not above gateway.drain_timeout %v: the kill would cut the drain", grace, drain)
	}
	for _, c := range append(slices.Clone(f.pod.InitContainers), f.main) {
		if c.Image != image.DefaultRef {
			t.Errorf("container %s: image %q, want %q, the one `make image` builds", c.Name, c.Image, image.DefaultRef)
		}
		sc := c.SecurityContext
		if !slices.Equal(sc.Capabilities.Add, []string{"NET_ADMIN"}) || !slices.Equal(sc.Capabilities.Drop, []string{"ALL"}) {
			t.Errorf("container %s: capabilities add %q drop %q, want NET_ADMIN only", c.Name, sc.Capabilities.Add, sc.Capabilities.Drop)
		}
		// Added capabilities reach a process only as root unless the
		// runtime sets ambient ones, which Kubernetes does not.
		if sc.RunAsUser == nil || *sc.RunAsUser != 0 || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || !sc.ReadOnlyRootFilesystem {
			t.Errorf("container %s: want runAsUser 0, allowPrivilegeEscalation false, readOnlyRootFilesystem", c.Name)
		}
	}

	// The TUN device, from the node.
	var tunVolume string
	for _, v := range f.pod.Volumes {
		if v.HostPath != nil && v.HostPath.Path == "/dev/net/tun" {
			if v.HostPath.Type != "CharDevice" {
				t.Errorf("hostPath /dev/net/tun of type %q, want CharDevice", v.HostPath.Type)
			}
			tunVolume = v.Name
		}
	}
	if m := f.main.mountOf(tunVolume); tunVolume == "" || m != "/dev/net/tun" {
		t.Errorf("/dev/net/tun: volume %q mounted at %q", tunVolume, m)
	}
	// The Secret holds the [tls] files, where the config reads them.
	for _, v := range f.pod.Volumes {
		if v.Secret == nil {
			continue
		}
		for _, c := range append(slices.Clone(f.pod.InitContainers), f.main) {
			if c.Command[1] == "cleanup" {
				continue // reads no certificate
			}
			if m := c.mountOf(v.Name); m != "/etc/meshtun/tls" {
				t.Errorf("container %s mounts the Secret %s at %q, want /etc/meshtun/tls, the [tls] paths' directory", c.Name, v.Secret.SecretName, m)
			}
		}
	}

	// Ports and the kubelet's probe match the config's listeners, and
	// the probed one listens where the kubelet reaches it.
	ports := map[string]uint16{}
	for _, p := range f.main.Ports {
		ports[p.Name] = p.ContainerPort
	}
	for name, listen := range map[string]string{"hbone": f.cfg.HBONE.Listen, "metrics": f.cfg.Admin.Metrics, "readiness": f.cfg.Admin.Readiness} {
		ap, err := netip.ParseAddrPort(listen)
		if err != nil || ports[name] != ap.Port() {
			t.Errorf("containerPort %s=%d, config listens on %q", name, ports[name], listen)
		}
	}
	rp := f.main.ReadinessProbe
	if rp == nil || rp.HTTPGet.Path != "/healthz/ready" || rp.HTTPGet.Port != ports["readiness"] {
		t.Errorf("readinessProbe %+v, want GET /healthz/ready on admin.readiness", rp)
	}
	if ap, _ := netip.ParseAddrPort(f.cfg.Admin.Readiness); !ap.Addr().IsUnspecified() {
		t.Errorf("admin.readiness %s: the kubelet probes the node's address, not loopback", f.cfg.Admin.Readiness)
	}

	// Every command line through the real binary's flags. validate runs
	// to the end; cleanup and run, which need root, go as far as reading
	// a config that does not exist: a wrong command or flag fails before
	// (exit 2), TestDaemonSetRuns runs them for real.
	missing := filepath.Join(f.dir, "missing.toml")
	for _, c := range append(slices.Clone(f.pod.InitContainers), f.main) {
		args := f.command(t, c)
		if args[0] == "validate" {
			if out, err := exec.Command(f.bin, args...).CombinedOutput(); err != nil {
				t.Errorf("container %s: meshtun %s: %v\n%s", c.Name, strings.Join(args, " "), err, out)
			}
			continue
		}
		for i := range args {
			if args[i] == f.cfgPath {
				args[i] = missing
			}
		}
		out, err := exec.Command(f.bin, args...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "no such file") {
			t.Errorf("container %s: meshtun %s: %v, want exit 1 reading the missing config:\n%s", c.Name, strings.Join(args, " "), err, out)
		}
	}
	if names := f.initNames(); !slices.Equal(names, []string{"cleanup", "validate"}) {
		t.Errorf("init containers run %q, want cleanup then validate", names)
	}
}

// initNames are the subcommands of the init containers, in order.
func (f *podFixture) initNames() []string {
	var names []string
	for _, c := range f.pod.InitContainers {
		if len(c.Command) > 1 {
			names = append(names, c.Command[1])
		}
	}
	return names
}

// TestDaemonSetRuns runs the pod's command lines as the kubelet would, in
// order, in a network namespace standing in for the node: the init
// containers' cleanup and validate, then the gateway, until it is ready
// on the probed endpoint; SIGTERM then drains it and it exits cleanly.
func TestDaemonSetRuns(t *testing.T) {
	if err := topo.Available(); err != nil {
		t.Skipf("needs a network namespace: %v", err)
	}
	f := setup(t)
	tp, err := topo.New("mtk8s")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tp.Close(); err != nil {
			t.Errorf("remove topology: %v", err)
		}
	})
	node := tp.A
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, c := range f.pod.InitContainers {
		args := f.command(t, c)
		if out, err := node.Command(ctx, f.bin, args...).CombinedOutput(); err != nil {
			t.Fatalf("init container %s: meshtun %s: %v\n%s", c.Name, strings.Join(args, " "), err, out)
		}
	}
	args := f.command(t, f.main)
	cmd := node.Command(ctx, f.bin, args...)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			cmd.Process.Kill()
			<-exited
		}
	})

	probe := f.main.ReadinessProbe.HTTPGet
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext:       node.Dial,
	}}
	url := "http://127.0.0.1:" + strconv.Itoa(int(probe.Port)) + probe.Path
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for ready := false; !ready; {
		if resp, err := client.Get(url); err == nil {
			resp.Body.Close()
			ready = resp.StatusCode == http.StatusOK
		}
		if ready {
			break
		}
		select {
		case err := <-exited:
			stopped = true
			t.Fatalf("the gateway exited before it was ready: %v\n%s", err, logs.String())
		case <-ctx.Done():
			t.Fatalf("the gateway was not ready at %s: %v\n%s", url, ctx.Err(), logs.String())
		case <-tick.C:
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		stopped = true
		if err != nil {
			t.Fatalf("the gateway after SIGTERM: %v\n%s", err, logs.String())
		}
	case <-ctx.Done():
		t.Fatalf("the gateway did not exit after SIGTERM\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "drained") {
		t.Errorf("no drain in the log:\n%s", logs.String())
	}
}
