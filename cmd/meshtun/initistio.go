package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// cmdInit writes a gateway.toml from what Istio gives a VM that joins its
// mesh: the files `istioctl x workload entry configure` writes
// (cluster.env, mesh.yaml, root-cert.pem, istio-token, hosts), in one
// directory or where Istio's VM guide installs them, then validates it as
// run would. What it cannot infer is written commented, with a note.
func cmdInit(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("init", stderr)
	dir := fs.String("istio", "", "the directory istioctl x workload entry configure wrote (-o), or / for the files where Istio's VM guide installs them")
	out := fs.String("out", "gateway.toml", "the gateway.toml to write (- for standard output); an existing file is not overwritten")
	force := fs.Bool("force", false, "overwrite --out if it exists")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: meshtun init --istio DIR [--out FILE] [--force]\n\nwrites a gateway.toml that joins this machine to Istio's mesh, from the files\n`istioctl x workload entry configure -o DIR` writes, then validates it")
		fs.PrintDefaults()
	}
	if err := parseNoArgs(fs, args, "init"); err != nil {
		return err
	}
	if *dir == "" {
		fmt.Fprintln(stderr, "meshtun init: --istio DIR is required: the directory of Istio's VM files")
		fs.Usage()
		return errUsage
	}
	files, err := findIstioFiles(*dir)
	if err != nil {
		fmt.Fprintf(stderr, "meshtun init: %v\n", err)
		return exitError{1}
	}
	vm, err := readIstioVM(files)
	if err != nil {
		fmt.Fprintf(stderr, "meshtun init: %v\n", err)
		return exitError{1}
	}
	text := vm.gatewayTOML()
	if *out == "-" {
		_, err := io.WriteString(stdout, text)
		return err
	}
	if _, err := os.Stat(*out); err == nil && !*force {
		fmt.Fprintf(stderr, "meshtun init: %s exists: not overwritten (--force, or another --out)\n", *out)
		return exitError{1}
	}
	if err := os.WriteFile(*out, []byte(text), 0o644); err != nil {
		fmt.Fprintf(stderr, "meshtun init: %v\n", err)
		return exitError{1}
	}
	fmt.Fprintf(stdout, "%s: written from %s\n", *out, files.describe())
	for _, n := range vm.notes {
		fmt.Fprintf(stdout, "  note: %s\n", n)
	}
	if _, _, err := load(*out, stderr, nil); err != nil {
		fmt.Fprintf(stderr, "meshtun init: %s does not validate yet: fix the keys above, then meshtun validate --config %s\n", *out, *out)
		return exitError{1}
	}
	fmt.Fprintf(stdout, "%s: ok; start it with meshtun run --config %s\n", *out, *out)
	return nil
}

// istioFiles are where Istio's VM files were found.
type istioFiles struct {
	clusterEnv, mesh, rootCert, token, hosts string
	installed                                bool // found where Istio's VM guide puts them
}

func (f istioFiles) describe() string {
	if f.installed {
		return "Istio's VM files where its guide installs them (" + f.clusterEnv + ", …)"
	}
	return filepath.Dir(f.clusterEnv)
}

// findIstioFiles looks for the files in dir as istioctl writes them, else
// where Istio's VM guide installs them under dir (/ on the VM itself).
func findIstioFiles(dir string) (istioFiles, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return istioFiles{}, err
	}
	flat := istioFiles{
		clusterEnv: filepath.Join(abs, "cluster.env"), mesh: filepath.Join(abs, "mesh.yaml"),
		rootCert: filepath.Join(abs, "root-cert.pem"), token: filepath.Join(abs, "istio-token"), hosts: filepath.Join(abs, "hosts"),
	}
	if exists(flat.clusterEnv) {
		return flat, nil
	}
	inst := istioFiles{
		clusterEnv: filepath.Join(abs, "var/lib/istio/envoy/cluster.env"), mesh: filepath.Join(abs, "etc/istio/config/mesh"),
		rootCert: filepath.Join(abs, "etc/certs/root-cert.pem"), token: filepath.Join(abs, "var/run/secrets/tokens/istio-token"),
		hosts: filepath.Join(abs, "etc/hosts"), installed: true,
	}
	if exists(inst.clusterEnv) {
		return inst, nil
	}
	return istioFiles{}, fmt.Errorf("%s holds no cluster.env, nor var/lib/istio/envoy/cluster.env: give the directory `istioctl x workload entry configure -o DIR` wrote", dir)
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// istioVM is what the files say of this machine and its mesh.
type istioVM struct {
	files istioFiles
	env   map[string]string // cluster.env

	discovery  string // mesh.yaml's defaultConfig.discoveryAddress: host:port
	dialAddr   string // where to dial it: the hosts file's address for its host, else the host
	serverName string
	notes      []string
}

func readIstioVM(files istioFiles) (*istioVM, error) {
	vm := &istioVM{files: files}
	var err error
	if vm.env, err = readClusterEnv(files.clusterEnv); err != nil {
		return nil, err
	}
	if exists(files.mesh) {
		if vm.discovery, err = readDiscoveryAddress(files.mesh); err != nil {
			return nil, err
		}
	}
	if vm.discovery == "" {
		// istioctl writes none for the default revision: istiod's own
		// address, or CA_ADDR for a revision.
		vm.discovery = vm.env["CA_ADDR"]
	}
	if vm.discovery == "" {
		vm.discovery = "istiod.istio-system.svc:15012"
		vm.note("%s names no discovery address: istiod.istio-system.svc:15012 assumed (Istio's default)", files.mesh)
	}
	host, port, err := net.SplitHostPort(vm.discovery)
	if err != nil {
		return nil, fmt.Errorf("%s: discoveryAddress %q is not host:port", files.mesh, vm.discovery)
	}
	vm.serverName, vm.dialAddr = host, vm.discovery
	if _, err := netip.ParseAddr(host); err == nil {
		vm.serverName = "" // an address: the name in istiod's certificate is not known from it
	} else if ip := lookupHosts(files.hosts, host); ip.IsValid() {
		vm.dialAddr = net.JoinHostPort(ip.String(), port)
	} else {
		vm.note("%s has no address for %s: the VM's resolver must find it", files.hosts, host)
	}
	for _, f := range []struct{ path, what string }{{files.rootCert, "root certificate"}, {files.token, "token"}} {
		if !exists(f.path) {
			vm.note("%s is missing: copy Istio's %s there before starting", f.path, f.what)
		}
	}
	if vm.namespace() == "" || vm.env["SERVICE_ACCOUNT"] == "" {
		return nil, fmt.Errorf("%s names no namespace (POD_NAMESPACE, ISTIO_NAMESPACE) or SERVICE_ACCOUNT: not what istioctl writes", files.clusterEnv)
	}
	return vm, nil
}

func (vm *istioVM) note(format string, a ...any) {
	vm.notes = append(vm.notes, fmt.Sprintf(format, a...))
}

func (vm *istioVM) namespace() string {
	if ns := vm.env["POD_NAMESPACE"]; ns != "" {
		return ns
	}
	return vm.env["ISTIO_NAMESPACE"]
}

// readClusterEnv reads KEY=VALUE lines, values quoted as a POSIX shell
// reads them (istioctl quotes every value with single quotes).
func readClusterEnv(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	env := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		line = strings.TrimPrefix(line, "export ")
		k, v, ok := strings.Cut(line, "=")
		if !ok || k == "" || strings.ContainsAny(k, " \t'\"") {
			return nil, fmt.Errorf("%s:%d: not KEY=VALUE: %q", path, n, line)
		}
		val, err := shellUnquote(v)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %s: %v", path, n, k, err)
		}
		env[k] = val
	}
	return env, sc.Err()
}

// shellUnquote reads one shell word made of unquoted, 'single-quoted' and
// "double-quoted" parts ('a'"'"'b' is a'b).
func shellUnquote(s string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); {
		switch c := s[i]; c {
		case '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return "", errors.New("a single quote is not closed")
			}
			b.WriteString(s[i+1 : i+1+j])
			i += j + 2
		case '"':
			j := i + 1
			for ; j < len(s) && s[j] != '"'; j++ {
				if s[j] == '\\' && j+1 < len(s) {
					j++
				}
				b.WriteByte(s[j])
			}
			if j >= len(s) {
				return "", errors.New("a double quote is not closed")
			}
			i = j + 1
		case ' ', '\t':
			return "", errors.New("more than one word (quote the value)")
		case '\\':
			if i+1 < len(s) {
				b.WriteByte(s[i+1])
			}
			i += 2
		default:
			b.WriteByte(c)
			i++
		}
	}
	return b.String(), nil
}

// readDiscoveryAddress reads defaultConfig.discoveryAddress of a mesh.yaml
// (ProxyConfig as istioctl writes it, or a whole MeshConfig).
func readDiscoveryAddress(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	var m struct {
		DefaultConfig struct {
			DiscoveryAddress string `yaml:"discoveryAddress"`
		} `yaml:"defaultConfig"`
	}
	if err := yaml.Unmarshal(data, &m); err != nil {
		return "", fmt.Errorf("%s: %v", path, err)
	}
	return m.DefaultConfig.DiscoveryAddress, nil
}

// lookupHosts is host's address in a hosts file ("ADDR NAME..." lines).
func lookupHosts(path, host string) netip.Addr {
	data, err := os.ReadFile(path)
	if err != nil {
		return netip.Addr{}
	}
	for _, line := range strings.Split(string(data), "\n") {
		line, _, _ = strings.Cut(line, "#")
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		ip, err := netip.ParseAddr(f[0])
		if err != nil {
			continue
		}
		for _, name := range f[1:] {
			if strings.EqualFold(name, host) {
				return ip
			}
		}
	}
	return netip.Addr{}
}

// gatewayTOML is the config for vm, every key explained.
func (vm *istioVM) gatewayTOML() string {
	e := vm.env
	q := strconv.Quote
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	w("# Written by `meshtun init --istio` from %s.\n", vm.files.describe())
	w("# Every key is explained in the repository's gateway.toml; check this file\n# with `meshtun validate --config`.\nversion = 1\n\n[gateway]\n")
	name, _ := os.Hostname()
	if wl := e["ISTIO_META_WORKLOAD_NAME"]; wl != "" {
		name = wl
	}
	if name != "" {
		w("name = %s\n", q(name))
	}
	if td := e["TRUST_DOMAIN"]; td != "" {
		w("trust_domain = %s\n", q(td))
	} else {
		w("trust_domain = \"cluster.local\"            # cluster.env's TRUST_DOMAIN is empty: Istio's default\n")
	}
	w("# What Istio's metrics say of this machine (istiod's WorkloadEntry says it too).\n")
	w("workload_namespace = %s\n", q(vm.namespace()))
	if v := e["ISTIO_META_WORKLOAD_NAME"]; v != "" {
		w("workload_name = %s\n", q(v))
	}
	if v := e["CANONICAL_SERVICE"]; v != "" {
		w("canonical_service = %s\n", q(v))
	}
	if v := e["CANONICAL_REVISION"]; v != "" {
		w("canonical_revision = %s\n", q(v))
	}
	if v := e["ISTIO_META_CLUSTER_ID"]; v != "" {
		w("cluster = %s\n", q(v))
	}

	w("\n# No [tls]: the certificate comes from Istio's CA, its key is made in memory.\n\n[mesh]\n")
	w("xds_address = %s\n", q(vm.dialAddr))
	if vm.serverName != "" {
		w("server_name = %s      # the name in istiod's certificate\n", q(vm.serverName))
	}
	w("root_cert = %s\n", q(vm.files.rootCert))
	w("token_file = %s\n", q(vm.files.token))
	if v := e["ISTIO_META_CLUSTER_ID"]; v != "" {
		w("cluster_id = %s\n", q(v))
	}
	w("namespace = %s\n", q(vm.namespace()))
	w("service_account = %s\n", q(e["SERVICE_ACCOUNT"]))
	if ip, err := netip.ParseAddr(e["ISTIO_SVC_IP"]); err == nil {
		w("instance_ips = [%s]            # the WorkloadEntry's address (istioctl --internalIP)\n", q(ip.String()))
	} else {
		w("# instance_ips = [\"10.0.0.5\"]   # cluster.env has no ISTIO_SVC_IP: the host's addresses are used\n")
	}
	if n := e["ISTIO_META_NETWORK"]; n != "" {
		w("# The WorkloadEntry's network is %s: istiod sends it with this node's workload.\n", q(n))
	}

	w("\n[tun]\nname = \"meshtun0\"\naddresses = [\"100.64.0.1/32\"]\n")
	if cidrs := captureCIDRs(e["ISTIO_SERVICE_CIDR"]); len(cidrs) > 0 {
		w("routes = [%s]   # cluster.env's ISTIO_SERVICE_CIDR\n", strings.Join(cidrs, ", "))
	} else {
		w("# The cluster's pod and service CIDRs, which this machine sends into the mesh:\n")
		w("# cluster.env's ISTIO_SERVICE_CIDR is %s, which names none.\n", q(e["ISTIO_SERVICE_CIDR"]))
		w("routes = []\n")
		vm.note("tun.routes is empty: write the cluster's pod and service CIDRs there (ISTIO_SERVICE_CIDR is %q)", e["ISTIO_SERVICE_CIDR"])
	}
	w("\n[hbone]\nlisten = \"0.0.0.0:15008\"\nserve = []\n")
	w("\n[dns]\n")
	if e["ISTIO_META_DNS_CAPTURE"] == "true" {
		w("enabled = true                  # cluster.env's ISTIO_META_DNS_CAPTURE\n")
	} else {
		w("enabled = false\n")
	}
	w("\n[admin]\nlisten = \"127.0.0.1:15000\"\n")
	return b.String()
}

// captureCIDRs are the prefixes of a comma-separated ISTIO_SERVICE_CIDR,
// quoted; none for "*" (everything: not a route to install).
func captureCIDRs(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			continue
		}
		out = append(out, strconv.Quote(p.Masked().String()))
	}
	return out
}
