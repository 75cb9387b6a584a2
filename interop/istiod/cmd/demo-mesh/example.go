package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"google.golang.org/protobuf/encoding/protojson"

	networkingapi "istio.io/api/networking/v1alpha3"
	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istioconfig "istio.io/istio/pkg/config"
	"istio.io/istio/pkg/config/validation"
	kubelib "istio.io/istio/pkg/kube"

	"github.com/meshtun/meshtun/interop/istiod/controlplane"
)

// The walkthrough's files, in examples/vm-in-ambient-mesh.
const (
	exampleYAML = "vm.yaml"
	exampleTOML = "gateway.toml"
)

// example is what the demo reads of the walkthrough: vm.yaml's objects,
// decoded strictly into Kubernetes' and Istio's own types, and the
// gateway.toml every node's config is made from.
type example struct {
	objects []runtime.Object
	// vm is vm.yaml's one WorkloadEntry; serviceAccount its ServiceAccount.
	vm             *networkingv1.WorkloadEntry
	serviceAccount *corev1.ServiceAccount
	// gatewayTOML is gateway.toml's text; namespace and serviceAccountName
	// its mesh.namespace and mesh.service_account.
	gatewayTOML                   string
	namespace, serviceAccountName string
}

// loadExample reads the walkthrough in dir and checks that its files agree
// with each other as README.md says they must: one WorkloadEntry, labelled
// to speak HBONE itself, whose namespace and service account are a
// ServiceAccount of vm.yaml and gateway.toml's mesh.namespace and
// mesh.service_account.
func loadExample(dir string) (*example, error) {
	data, err := os.ReadFile(filepath.Join(dir, exampleYAML))
	if err != nil {
		return nil, fmt.Errorf("example: %w", err)
	}
	e := &example{}
	if e.objects, err = decodeYAML(data); err != nil {
		return nil, fmt.Errorf("example %s: %w", exampleYAML, err)
	}
	for _, o := range e.objects {
		switch o := o.(type) {
		case *networkingv1.WorkloadEntry:
			if e.vm != nil {
				return nil, fmt.Errorf("example %s: two WorkloadEntries (%s, %s), want the VM's only", exampleYAML, e.vm.Name, o.Name)
			}
			e.vm = o
		case *corev1.ServiceAccount:
			if e.serviceAccount != nil {
				return nil, fmt.Errorf("example %s: two ServiceAccounts (%s, %s), want the VM's only", exampleYAML, e.serviceAccount.Name, o.Name)
			}
			e.serviceAccount = o
		}
	}
	if e.vm == nil || e.serviceAccount == nil {
		return nil, fmt.Errorf("example %s: want a WorkloadEntry and a ServiceAccount for the VM", exampleYAML)
	}
	if v := e.vm.Labels[controlplane.TunnelLabel]; v != "http" {
		return nil, fmt.Errorf("example %s: WorkloadEntry %s/%s has label %s=%q, want \"http\" (the VM speaks HBONE itself)",
			exampleYAML, e.vm.Namespace, e.vm.Name, controlplane.TunnelLabel, v)
	}
	if e.vm.Spec.ServiceAccount != e.serviceAccount.Name || e.vm.Namespace != e.serviceAccount.Namespace {
		return nil, fmt.Errorf("example %s: WorkloadEntry runs as %s/%s, but the ServiceAccount is %s/%s",
			exampleYAML, e.vm.Namespace, e.vm.Spec.ServiceAccount, e.serviceAccount.Namespace, e.serviceAccount.Name)
	}

	text, err := os.ReadFile(filepath.Join(dir, exampleTOML))
	if err != nil {
		return nil, fmt.Errorf("example: %w", err)
	}
	e.gatewayTOML = string(text)
	if e.namespace, err = stringKey(e.gatewayTOML, "mesh", "namespace"); err != nil {
		return nil, fmt.Errorf("example %s: %w", exampleTOML, err)
	}
	if e.serviceAccountName, err = stringKey(e.gatewayTOML, "mesh", "service_account"); err != nil {
		return nil, fmt.Errorf("example %s: %w", exampleTOML, err)
	}
	if e.namespace != e.vm.Namespace || e.serviceAccountName != e.vm.Spec.ServiceAccount {
		return nil, fmt.Errorf("example: %s joins as %s/%s, but %s's WorkloadEntry is %s/%s",
			exampleTOML, e.namespace, e.serviceAccountName, exampleYAML, e.vm.Namespace, e.vm.Spec.ServiceAccount)
	}
	return e, nil
}

// decodeYAML decodes every document of a Kubernetes YAML stream into its
// Go type from Istio's scheme (Kubernetes' and Istio's kinds), strictly:
// an unknown or duplicated field is an error, not silently dropped.
func decodeYAML(data []byte) ([]runtime.Object, error) {
	decoder := serializer.NewCodecFactory(kubelib.IstioScheme, serializer.EnableStrict).UniversalDeserializer()
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []runtime.Object
	for i := 1; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		obj, _, err := decoder.Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if we, ok := obj.(*networkingv1.WorkloadEntry); ok {
			if err := checkWorkloadEntry(doc, we); err != nil {
				return nil, fmt.Errorf("document %d: %w", i, err)
			}
		}
		out = append(out, obj)
	}
}

// checkWorkloadEntry checks what the strict decoder does not: Istio's
// specs unmarshal leniently (unknown fields dropped), so the spec of doc
// is decoded again with protojson, which refuses them, and then checked by
// Istio's own validation, as its admission webhook would.
func checkWorkloadEntry(doc []byte, we *networkingv1.WorkloadEntry) error {
	what := fmt.Sprintf("WorkloadEntry %s/%s", we.Namespace, we.Name)
	js, err := utilyaml.ToJSON(doc)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	var top struct {
		Spec json.RawMessage `json:"spec"`
	}
	if err := json.Unmarshal(js, &top); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := protojson.Unmarshal(top.Spec, &networkingapi.WorkloadEntry{}); err != nil {
		return fmt.Errorf("%s: spec: %w", what, err)
	}
	cfg := istioconfig.Config{
		Meta: istioconfig.Meta{Name: we.Name, Namespace: we.Namespace, Labels: we.Labels, Annotations: we.Annotations},
		Spec: &we.Spec,
	}
	if _, err := validation.ValidateWorkloadEntry(cfg); err != nil {
		return fmt.Errorf("%s: Istio's validation: %w", what, err)
	}
	return nil
}

// stripComments drops YAML comment lines, to tell a document of comments
// only from one with content.
func stripComments(doc []byte) []byte {
	var b bytes.Buffer
	for _, line := range bytes.Split(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			b.Write(line)
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}

// apply creates the example's objects in the control plane, as `kubectl
// apply -f vm.yaml` does in a cluster, with the VM's WorkloadEntry at
// vmAddress (vm.yaml holds an operator's placeholder).
func (e *example) apply(cp *controlplane.ControlPlane, vmAddress string) error {
	for _, o := range e.objects {
		var err error
		switch o := o.(type) {
		case *corev1.Namespace:
			err = cp.ApplyNamespace(o)
		case *corev1.ServiceAccount:
			err = applyServiceAccount(cp, o)
		case *corev1.Service:
			err = cp.ApplyService(o)
		case *networkingv1.WorkloadEntry:
			we := o.DeepCopy()
			we.Spec.Address = vmAddress
			err = cp.ApplyWorkloadEntry(we)
		default:
			err = fmt.Errorf("%T: not a kind the demo applies", o)
		}
		if err != nil {
			return fmt.Errorf("example %s: %w", exampleYAML, err)
		}
	}
	return nil
}

// applyServiceAccount creates sa in the control plane's Kubernetes, which
// the harness's typed helpers do not cover.
func applyServiceAccount(cp *controlplane.ControlPlane, sa *corev1.ServiceAccount) error {
	_, err := cp.KubeClient().Kube().CoreV1().ServiceAccounts(sa.Namespace).Create(context.Background(), sa, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("service account %s/%s: %w", sa.Namespace, sa.Name, err)
	}
	return nil
}

// The demo writes each node's gateway.toml from the example's by replacing
// the values of a few keys, line by line, so that everything else (the
// comments included) stays the operator's file. A TOML parser would lose
// the comments; the rewritten file is then checked by `meshtun validate`.

// keyLine finds key in [table] of text: the line's index and the byte
// range of its value within the line. Only single-line values are
// supported; a key in an array of tables ([[...]]) is never found.
func keyLine(lines []string, table, key string) (int, int, int, error) {
	current := ""
	for i, line := range lines {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "[") {
			current = ""
			if !strings.HasPrefix(trimmed, "[[") {
				if end := strings.Index(trimmed, "]"); end > 0 {
					current = strings.TrimSpace(trimmed[1:end])
				}
			}
			continue
		}
		if current != table {
			continue
		}
		name, _, ok := strings.Cut(trimmed, "=")
		if !ok || strings.TrimSpace(name) != key {
			continue
		}
		start := strings.Index(line, "=") + 1
		for start < len(line) && line[start] == ' ' {
			start++
		}
		end := start + valueLen(line[start:])
		if strings.Count(line[start:end], "[") != strings.Count(line[start:end], "]") {
			return 0, 0, 0, fmt.Errorf("%s.%s: its value spans lines, which the demo does not rewrite", table, key)
		}
		return i, start, end, nil
	}
	return 0, 0, 0, fmt.Errorf("%s.%s: not in the file", table, key)
}

// valueLen is the length of the TOML value at the start of s: up to a
// comment outside a string, trailing spaces left out.
func valueLen(s string) int {
	inString, escaped := false, false
	end := len(s)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case c == '"':
			inString = !inString
		case !inString && c == '#':
			end = i
			i = len(s)
		}
	}
	return len(strings.TrimRight(s[:end], " \t"))
}

// getKey returns the value of key in [table] of text as written (a TOML
// literal).
func getKey(text, table, key string) (string, error) {
	lines := strings.Split(text, "\n")
	i, start, end, err := keyLine(lines, table, key)
	if err != nil {
		return "", err
	}
	return lines[i][start:end], nil
}

// stringKey returns the value of a string key in [table] of text.
func stringKey(text, table, key string) (string, error) {
	v, err := getKey(text, table, key)
	if err != nil {
		return "", err
	}
	s, err := strconv.Unquote(v)
	if err != nil || !strings.HasPrefix(v, `"`) {
		return "", fmt.Errorf("%s.%s: %s is not a basic string", table, key, v)
	}
	return s, nil
}

// setKey returns text with the value of key in [table] replaced by value,
// a TOML literal; the rest of the line, its comment included, is kept.
func setKey(text, table, key, value string) (string, error) {
	lines := strings.Split(text, "\n")
	i, start, end, err := keyLine(lines, table, key)
	if err != nil {
		return "", err
	}
	lines[i] = lines[i][:start] + value + lines[i][end:]
	return strings.Join(lines, "\n"), nil
}

// tomlString is s as a TOML basic string.
func tomlString(s string) string { return strconv.Quote(s) }

// tomlStrings is list as a TOML array of basic strings.
func tomlStrings[T fmt.Stringer](list []T) string {
	quoted := make([]string, len(list))
	for i, v := range list {
		quoted[i] = tomlString(v.String())
	}
	return "[" + strings.Join(quoted, ", ") + "]"
}

// change is one key the demo rewrote in a node's gateway.toml.
type change struct {
	key, was, now string
}

// nodeConfig is what differs between the example's gateway.toml and the
// one a node of the demo runs: where its control plane is, the files it
// was given, and who it is.
type nodeConfig struct {
	values []struct{ table, key, value string }
	// added are keys the example does not have, inserted under their
	// table's header.
	added []struct{ table, key, value string }
}

// add inserts key = value in [table]; the example must not have it.
func (n *nodeConfig) add(table, key, value string) {
	n.added = append(n.added, struct{ table, key, value string }{table, key, value})
}

func (n *nodeConfig) set(table, key, value string) {
	n.values = append(n.values, struct{ table, key, value string }{table, key, value})
}

// render applies n to the example's text and lists what it changed.
func (n *nodeConfig) render(text string) (string, []change, error) {
	var changes []change
	for _, v := range n.values {
		was, err := getKey(text, v.table, v.key)
		if err != nil {
			return "", nil, err
		}
		if text, err = setKey(text, v.table, v.key, v.value); err != nil {
			return "", nil, err
		}
		if was != v.value {
			changes = append(changes, change{key: v.table + "." + v.key, was: was, now: v.value})
		}
	}
	for _, v := range n.added {
		if _, err := getKey(text, v.table, v.key); err == nil {
			return "", nil, fmt.Errorf("%s.%s: already in the example", v.table, v.key)
		}
		header := "[" + v.table + "]\n"
		if strings.Count(text, header) != 1 {
			return "", nil, fmt.Errorf("[%s]: not once in the example", v.table)
		}
		text = strings.Replace(text, header, header+v.key+" = "+v.value+"\n", 1)
		changes = append(changes, change{key: v.table + "." + v.key, was: "(unset)", now: v.value})
	}
	return text, changes, nil
}
