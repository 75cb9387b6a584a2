package hbone

import (
	"net/url"
	"strings"

	"github.com/meshtun/meshtun/identity"
)

// Baggage is the description of a workload that Istio's ztunnel puts in
// the baggage header (W3C Baggage) of an HBONE CONNECT: the client
// describes its source workload (docs/hbone.md, "The CONNECT request").
// The receiving side reads it into the source_* labels of its metrics.
// An empty field is not known and is not sent.
type Baggage struct {
	Cluster   string // k8s.cluster.name
	Namespace string // k8s.namespace.name
	// WorkloadKind is the <kind> of k8s.<kind>.name, lowercase; one of
	// BaggageKinds. "" sends "pod", the kind Istio gives a WorkloadEntry
	// (a VM).
	WorkloadKind string
	WorkloadName string // k8s.<kind>.name: the workload (a Deployment's name, not a pod's)
	Service      string // service.name: the canonical service
	Revision     string // service.version: the canonical revision
}

// BaggageKinds are the workload kinds ztunnel reads from k8s.<kind>.name
// (Istio's WorkloadType values); a client should send one of them. The
// parser also reads the other workload kinds of OpenTelemetry's
// Kubernetes conventions (daemonset, statefulset, replicaset).
var BaggageKinds = []string{"deployment", "cronjob", "pod", "job"}

// baggageReadKinds are the kinds ParseBaggage takes a workload name from.
var baggageReadKinds = map[string]bool{
	"deployment": true, "cronjob": true, "pod": true, "job": true,
	"daemonset": true, "statefulset": true, "replicaset": true,
}

// Bounds of what ParseBaggage reads, W3C Baggage's own limits (§3.3.1:
// at most 64 list-members and 8192 bytes): a peer cannot make the
// server scan more, and the members past them are ignored, as the
// specification lets a receiver do.
const (
	maxBaggageBytes   = 8192
	maxBaggageMembers = 64
)

// IsZero reports whether b describes nothing.
func (b Baggage) IsZero() bool { return b == Baggage{} }

// String is b as a baggage header value, in ztunnel's order and form:
// k8s.cluster.name, k8s.namespace.name, k8s.<kind>.name, service.name,
// service.version, comma-separated, the unknown ones left out; "" when
// nothing is known. Values that are names (identity.CheckName) go as
// they are, as ztunnel sends them; any other byte a baggage value may
// not hold is percent-encoded.
func (b Baggage) String() string {
	var s strings.Builder
	add := func(key, v string) {
		if v == "" {
			return
		}
		if s.Len() > 0 {
			s.WriteByte(',')
		}
		s.WriteString(key)
		s.WriteByte('=')
		writeBaggageValue(&s, v)
	}
	add("k8s.cluster.name", b.Cluster)
	add("k8s.namespace.name", b.Namespace)
	kind := b.WorkloadKind
	if kind == "" {
		kind = "pod"
	}
	if b.WorkloadName != "" {
		add("k8s."+kind+".name", b.WorkloadName)
	}
	add("service.name", b.Service)
	add("service.version", b.Revision)
	return s.String()
}

// writeBaggageValue writes v, percent-encoding the bytes outside W3C's
// baggage-octet (controls, space, '"', ',', ';', '\', non-ASCII) and '%'.
func writeBaggageValue(s *strings.Builder, v string) {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c > 0x20 && c < 0x7f && c != '"' && c != ',' && c != ';' && c != '\\' && c != '%' {
			s.WriteByte(c)
			continue
		}
		s.WriteByte('%')
		s.WriteByte(hex[c>>4])
		s.WriteByte(hex[c&0xf])
	}
}

// ParseBaggage reads the workload description from the baggage header
// lines values (W3C Baggage: comma-separated key=value members, optional
// whitespace, ;properties ignored, percent-encoded values). It never
// fails: a member it cannot read, a key it does not know, a value that
// is empty or not a name once decoded (identity.CheckName) is ignored;
// of a key given twice the last counts. It reads at most 64 members and
// 8192 bytes; the rest is ignored. The values are the peer's claim, as
// trustworthy as the peer's identity.
func ParseBaggage(values []string) Baggage {
	var b Baggage
	read, members := 0, 0 // bytes and list-members read so far
	for _, line := range values {
		for member := range strings.SplitSeq(line, ",") {
			if read += len(member); read > maxBaggageBytes || members == maxBaggageMembers {
				return b
			}
			read++ // the separator
			if strings.TrimSpace(member) == "" {
				continue
			}
			members++
			b.set(member)
		}
	}
	return b
}

// set applies one list-member, if it is one this parser reads.
func (b *Baggage) set(member string) {
	member, _, _ = strings.Cut(member, ";") // properties
	key, value, ok := strings.Cut(member, "=")
	if !ok {
		return
	}
	key = strings.Trim(key, " \t")
	value, err := url.PathUnescape(strings.Trim(value, " \t"))
	if err != nil || identity.CheckName(value) != nil {
		return
	}
	switch key {
	case "k8s.cluster.name":
		b.Cluster = value
	case "k8s.namespace.name":
		b.Namespace = value
	case "service.name":
		b.Service = value
	case "service.version":
		b.Revision = value
	default:
		kind, ok := strings.CutPrefix(key, "k8s.")
		if kind, ok = strings.CutSuffix(kind, ".name"); ok && baggageReadKinds[kind] {
			b.WorkloadKind, b.WorkloadName = kind, value
		}
	}
}
