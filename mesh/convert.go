package mesh

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"
	"istio.io/istio/pkg/workloadapi"
	"istio.io/istio/pkg/workloadapi/security"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/identity"
)

// Conversion: a Snapshot of istiod's resources becomes the entries the
// file gives ([]config.Workload, []config.Service, []config.Policy), with
// the rules of ztunnel (istio/ztunnel src/state/workload.rs,
// src/state/service.rs, src/state.rs, src/proxy/outbound.rs, src/rbac.rs;
// read, not copied):
//
//   - A workload: its addresses, namespace, service account (default
//     "default"), trust domain (default cluster.local) and network.
//     Tunnel protocol HBONE is reached at <its first address>:15008 with
//     its SPIFFE identity; NONE is protocol "TCP", dialled directly. A
//     workload without an address (a hostname only) cannot be routed to
//     and is left out.
//   - A service "namespace/hostname": its VIPs (those of this node's
//     network; with none there, those of the others), its ports (service port → target port), hostname and
//     subject_alt_names. Its endpoints are the workloads whose services
//     map names it, each with its own target ports (which win over the
//     service's; ztunnel's find_upstream_from_service).
//   - A waypoint (GatewayAddress, by address or by hostname) is resolved
//     to the waypoint's own resources: a service's endpoints, or a
//     workload, at its hbone_mtls_port, with their identities.
//   - An authorization applies to this node as ztunnel scopes it
//     (state.rs assert_rbac): GLOBAL always, NAMESPACE in this node's
//     namespace, WORKLOAD_SELECTOR when this node's own workload lists it
//     in authorization_policies. Dry-run policies are not enforced (ztunnel
//     only logs them). Istio's groups are OR'ed, a group's rules AND'ed,
//     a rule's matches OR'ed; config's model is OR over rules of AND over
//     fields, so a group is expanded by distribution (a term for each
//     choice of one match per rule), bounded by MaxPolicyRules.

// HBONEPort is the port ztunnel and meshtun serve HBONE on, where a
// workload with tunnel protocol HBONE is reached.
const HBONEPort = 15008

// MaxPolicyRules bounds the rules one authorization expands to. Every
// inbound connection is checked against each of them in turn, and an
// expansion is a product (the matches of each of a group's rules
// multiplied): 256 covers any policy a person writes and stops one whose
// product explodes.
const MaxPolicyRules = 256

// State is the mesh as the gateway uses it: istiod's resources as config
// entries, merged with the file's by the gateway.
type State struct {
	Workloads []config.Workload
	Services  []config.Service
	Policies  []config.Policy
	// Self is this node's own workload (namespace and service account
	// ours, an address among the node's INSTANCE_IPS; for a VM, its
	// WorkloadEntry), nil while istiod sends none. Its addresses are what
	// inbound HBONE serves.
	Self *config.Workload
	// Network is Self's network ("" without Self).
	Network string
	// Rejections are the resources that could not be used, and why.
	Rejections []Rejection
	// Ready is true once both types have had their first response.
	Ready bool
	// Generation is the Snapshot's.
	Generation uint64
}

// Rejection is one resource left out of a State.
type Rejection struct {
	Name   string // the resource's name
	Reason string
}

func (r Rejection) String() string { return r.Name + ": " + r.Reason }

// Validate is the check XDSOptions.Validate asks for: a resource that
// cannot be converted whatever else is held (an address of the wrong
// length, a port out of range, a tunnel protocol or policy meshtun cannot
// enforce) is NACKed with the reason, and the rest applied.
func Validate(r Resource) error {
	switch m := r.Message.(type) {
	case *workloadapi.Address:
		switch a := m.GetType().(type) {
		case *workloadapi.Address_Workload:
			_, err := convertWorkload(a.Workload)
			return err
		case *workloadapi.Address_Service:
			_, err := convertService(a.Service, "")
			return err
		}
		return errors.New("address holds neither a workload nor a service")
	case *security.Authorization:
		_, err := convertPolicy(m)
		return err
	}
	return fmt.Errorf("unexpected message %T", r.Message)
}

// Convert turns snap into a State for node: the entries, this node's own
// workload, and what was rejected (Validate's reasons, for resources that
// reached the snapshot some other way, and clashes inside istiod's own
// state). It is a Tracker's conversion of the whole snapshot at once, so a
// Tracker fed the same resources in any order of Deltas gives the same
// State. The result is sorted by name and does not share memory with
// snap.
func Convert(snap Snapshot, node Node) State {
	t := NewTracker(node)
	t.Apply(Delta{Addresses: snap.Addresses, Authorizations: snap.Authorizations})
	st := t.State()
	st.Ready, st.Generation = snap.Ready(), snap.Generation
	return st
}

// applies reports whether a is in force for this node, as ztunnel scopes
// policies (state.rs assert_rbac, state/policy.rs).
func applies(a *security.Authorization, namespace string, selected map[string]bool) bool {
	switch a.GetScope() {
	case security.Scope_GLOBAL:
		return true
	case security.Scope_NAMESPACE:
		return a.GetNamespace() == namespace
	case security.Scope_WORKLOAD_SELECTOR:
		return selected[a.GetNamespace()+"/"+a.GetName()]
	}
	return false
}

func boolOrder(b bool) int {
	if b {
		return 1
	}
	return 0
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// unknownFields refuses a message carrying fields this build does not
// know: istiod asking for something meshtun would not enforce.
func unknownFields(what string, m proto.Message) error {
	if len(m.ProtoReflect().GetUnknown()) > 0 {
		return fmt.Errorf("%s carries fields meshtun does not know", what)
	}
	return nil
}

func convertWorkload(w *workloadapi.Workload) (config.Workload, error) {
	c := config.Workload{
		Name:           w.GetName(),
		Namespace:      w.GetNamespace(),
		ServiceAccount: w.GetServiceAccount(),
		Network:        w.GetNetwork(),
		Unhealthy:      w.GetStatus() == workloadapi.WorkloadStatus_UNHEALTHY,
		Source:         config.SourceXDS,
	}
	if c.Name == "" || c.Namespace == "" {
		return c, errors.New("workload without a name or namespace")
	}
	// What metrics and baggage describe it by (ztunnel's Workload.baggage):
	// a value that is not a name is left unknown rather than the workload
	// refused, as it routes the same without it.
	name := func(v string) string {
		if identity.CheckName(v) != nil {
			return ""
		}
		return v
	}
	c.Labels = &config.WorkloadLabels{
		WorkloadName: name(w.GetWorkloadName()), CanonicalService: name(w.GetCanonicalName()),
		CanonicalRevision: name(w.GetCanonicalRevision()), Cluster: name(w.GetClusterId()),
		WorkloadKind: strings.ToLower(w.GetWorkloadType().String()),
	}
	if c.ServiceAccount == "" {
		c.ServiceAccount = "default" // Kubernetes' and ztunnel's default
	}
	td := w.GetTrustDomain()
	if td == "" {
		td = "cluster.local" // ztunnel's default trust domain
	}
	id := identity.WorkloadString(td, c.Namespace, c.ServiceAccount)
	if _, err := identity.Parse(id); err != nil {
		return c, fmt.Errorf("workload %s/%s: identity: %w", c.Namespace, c.Name, err)
	}
	c.Identity = id
	for i, b := range w.GetAddresses() {
		ip, ok := netip.AddrFromSlice(b)
		if !ok {
			return c, fmt.Errorf("workload %s/%s: address %d is %d bytes, not an IPv4 or IPv6 address", c.Namespace, c.Name, i, len(b))
		}
		c.Addresses = append(c.Addresses, ip.Unmap())
	}
	switch w.GetTunnelProtocol() {
	case workloadapi.TunnelProtocol_HBONE:
		c.Protocol = "HBONE"
		if len(c.Addresses) > 0 {
			c.HBONEAddress = netip.AddrPortFrom(c.Addresses[0], HBONEPort)
		}
	case workloadapi.TunnelProtocol_NONE:
		c.Protocol = "TCP"
	default:
		return c, fmt.Errorf("workload %s/%s: tunnel protocol %s is not supported (HBONE or NONE)", c.Namespace, c.Name, w.GetTunnelProtocol())
	}
	for svc, pl := range w.GetServices() {
		for _, p := range pl.GetPorts() {
			if p.GetServicePort() == 0 || p.GetServicePort() > 65535 || p.GetTargetPort() > 65535 {
				return c, fmt.Errorf("workload %s/%s: service %s: port %d → %d out of range", c.Namespace, c.Name, svc, p.GetServicePort(), p.GetTargetPort())
			}
		}
	}
	return c, unknownFields("workload "+c.Namespace+"/"+c.Name, w)
}

// convertService converts s, keeping the VIPs of network.
func convertService(s *workloadapi.Service, network string) (config.Service, error) {
	key := s.GetNamespace() + "/" + s.GetHostname()
	c := config.Service{
		Name:            s.GetName(),
		Namespace:       s.GetNamespace(),
		Hostname:        s.GetHostname(),
		SubjectAltNames: slices.Clone(s.GetSubjectAltNames()),
		Ports:           map[uint16]uint16{},
		Source:          config.SourceXDS,
	}
	if c.Namespace == "" || c.Hostname == "" {
		return c, errors.New("service without a namespace or hostname")
	}
	if c.Name == "" {
		c.Name = c.Hostname
	}
	for _, p := range s.GetPorts() {
		if p.GetServicePort() == 0 || p.GetServicePort() > 65535 || p.GetTargetPort() > 65535 {
			return c, fmt.Errorf("service %s: port %d → %d out of range", key, p.GetServicePort(), p.GetTargetPort())
		}
		c.Ports[uint16(p.GetServicePort())] = uint16(p.GetTargetPort())
	}
	var others []netip.Addr
	for i, a := range s.GetAddresses() {
		ip, ok := netip.AddrFromSlice(a.GetAddress())
		if !ok {
			return c, fmt.Errorf("service %s: address %d is %d bytes, not an IPv4 or IPv6 address", key, i, len(a.GetAddress()))
		}
		if a.GetNetwork() == network {
			c.VIPs = append(c.VIPs, ip.Unmap())
		} else {
			others = append(others, ip.Unmap())
		}
	}
	// A service with no VIP in our network is addressed by its VIPs in
	// the others (our choice: ztunnel looks VIPs up in its own network
	// only). A multi-network istiod gives a cluster's services VIPs of
	// the cluster's network alone, so a VM in a network of its own could
	// otherwise reach no service by its VIP; its endpoints there are
	// reached through their network's gateway, or refused with the
	// reason.
	if len(c.VIPs) == 0 {
		c.VIPs = others
	}
	for _, san := range c.SubjectAltNames {
		if _, err := identity.Parse(san); err != nil {
			return c, fmt.Errorf("service %s: subject_alt_names: %w", key, err)
		}
	}
	return c, unknownFields("service "+key, s)
}

// convertPolicy turns an Authorization into a config.Policy, or says
// why it cannot be enforced.
func convertPolicy(a *security.Authorization) (config.Policy, error) {
	p := config.Policy{Name: a.GetNamespace() + "/" + a.GetName(), Source: config.SourceXDS}
	switch a.GetAction() {
	case security.Action_ALLOW:
		p.Action = "allow"
	case security.Action_DENY:
		p.Action = "deny"
	default:
		return p, fmt.Errorf("policy %s: action %s is not enforced (ALLOW or DENY)", p.Name, a.GetAction())
	}
	if err := unknownFields("policy "+p.Name, a); err != nil {
		return p, err
	}
	for gi, g := range a.GetGroups() {
		rules, err := expandGroup(g)
		if err != nil {
			return p, fmt.Errorf("policy %s: group %d: %w", p.Name, gi, err)
		}
		p.Rules = append(p.Rules, rules...)
		if len(p.Rules) > MaxPolicyRules {
			return p, fmt.Errorf("policy %s expands to more than %d rules", p.Name, MaxPolicyRules)
		}
	}
	return p, nil
}

// expandGroup turns one group (AND over its rules, each an OR over its
// matches) into config rules (OR over them). ztunnel's rbac.rs: a rule
// without matches holds; an empty match never matches; a group without
// rules holds.
func expandGroup(g *security.Group) ([]config.Rule, error) {
	terms := []config.Rule{{}} // the empty rule matches everything
	for ri, r := range g.GetRules() {
		if len(r.GetMatches()) == 0 {
			continue
		}
		var alts []config.Rule
		for mi, m := range r.GetMatches() {
			c, err := convertMatch(m)
			if err != nil {
				return nil, fmt.Errorf("rule %d: match %d: %w", ri, mi, err)
			}
			if c != nil {
				alts = append(alts, *c)
			}
		}
		if len(terms)*len(alts) > MaxPolicyRules {
			return nil, fmt.Errorf("expands to more than %d rules", MaxPolicyRules)
		}
		var next []config.Rule
		for _, t := range terms {
			for _, alt := range alts {
				both, ok, err := andRules(t, alt)
				if err != nil {
					return nil, fmt.Errorf("rule %d: %w", ri, err)
				}
				if ok {
					next = append(next, both)
				}
			}
		}
		terms = next
		if len(terms) == 0 {
			return nil, nil // this group can never match
		}
	}
	return terms, nil
}

// convertMatch converts one match; nil for an empty one (which matches
// nothing).
func convertMatch(m *security.Match) (*config.Rule, error) {
	if err := unknownFields("match", m); err != nil {
		return nil, err
	}
	var r config.Rule
	var err error
	// A prefix or suffix "" matches every value, the empty one too,
	// which no config pattern says ("*" wants a value): in a list it
	// makes the field hold whatever the value (no list), in a not_ list
	// it makes the match impossible.
	never := false
	conv := func(dst *[]string, in []*security.StringMatch, field string, negative bool) {
		all := false
		for _, s := range in {
			if err != nil {
				return
			}
			if matchesAll(s) {
				all = true
				continue
			}
			var pat string
			pat, err = pattern(s)
			if err != nil {
				err = fmt.Errorf("%s: %w", field, err)
				return
			}
			*dst = append(*dst, pat)
		}
		switch {
		case all && negative:
			never = true
		case all:
			*dst = nil
		}
	}
	conv(&r.Namespaces, m.GetNamespaces(), "namespaces", false)
	conv(&r.NotNamespaces, m.GetNotNamespaces(), "not_namespaces", true)
	conv(&r.Principals, m.GetPrincipals(), "principals", false)
	conv(&r.NotPrincipals, m.GetNotPrincipals(), "not_principals", true)
	if err != nil {
		return nil, err
	}
	// A service account match is a principal ending in its part of the
	// SPIFFE ID; AND'ed with the match's principals.
	var sas, notSAs []string
	for _, sa := range m.GetServiceAccounts() {
		sas = append(sas, "*/ns/"+sa.GetNamespace()+"/sa/"+sa.GetServiceAccount())
	}
	for _, sa := range m.GetNotServiceAccounts() {
		notSAs = append(notSAs, "*/ns/"+sa.GetNamespace()+"/sa/"+sa.GetServiceAccount())
	}
	r.NotPrincipals = append(r.NotPrincipals, notSAs...)
	if len(sas) > 0 {
		var ok bool
		r.Principals, ok, err = andPatterns(r.Principals, sas)
		if err != nil {
			return nil, fmt.Errorf("service_accounts: %w", err)
		}
		if !ok {
			return nil, nil
		}
	}
	for _, f := range []struct {
		dst  *[]netip.Prefix
		in   []*security.Address
		name string
	}{
		{&r.SourceIPs, m.GetSourceIps(), "source_ips"}, {&r.NotSourceIPs, m.GetNotSourceIps(), "not_source_ips"},
		{&r.DestinationIPs, m.GetDestinationIps(), "destination_ips"}, {&r.NotDestinationIPs, m.GetNotDestinationIps(), "not_destination_ips"},
	} {
		for _, a := range f.in {
			ip, ok := netip.AddrFromSlice(a.GetAddress())
			if !ok {
				return nil, fmt.Errorf("%s: address of %d bytes", f.name, len(a.GetAddress()))
			}
			ip = ip.Unmap()
			p, err := ip.Prefix(int(a.GetLength()))
			if err != nil || int(a.GetLength()) > ip.BitLen() {
				return nil, fmt.Errorf("%s: %s/%d is not a prefix", f.name, ip, a.GetLength())
			}
			*f.dst = append(*f.dst, p)
		}
	}
	for _, f := range []struct {
		dst  *[]uint16
		in   []uint32
		name string
	}{{&r.DestinationPorts, m.GetDestinationPorts(), "destination_ports"}, {&r.NotDestinationPorts, m.GetNotDestinationPorts(), "not_destination_ports"}} {
		for _, p := range f.in {
			if p == 0 || p > 65535 {
				return nil, fmt.Errorf("%s: port %d out of range", f.name, p)
			}
			*f.dst = append(*f.dst, uint16(p))
		}
	}
	if never || isEmptyMatch(m) {
		return nil, nil
	}
	return &r, nil
}

// matchesAll reports whether s matches every string, "" included.
func matchesAll(s *security.StringMatch) bool {
	switch m := s.GetMatchType().(type) {
	case *security.StringMatch_Prefix:
		return m.Prefix == ""
	case *security.StringMatch_Suffix:
		return m.Suffix == ""
	}
	return false
}

func isEmptyMatch(m *security.Match) bool {
	return len(m.GetNamespaces())+len(m.GetNotNamespaces())+len(m.GetServiceAccounts())+len(m.GetNotServiceAccounts())+
		len(m.GetPrincipals())+len(m.GetNotPrincipals())+len(m.GetSourceIps())+len(m.GetNotSourceIps())+
		len(m.GetDestinationIps())+len(m.GetNotDestinationIps())+len(m.GetDestinationPorts())+len(m.GetNotDestinationPorts()) == 0
}

// pattern writes a StringMatch in config's syntax: "x", "x*", "*x", "*".
func pattern(s *security.StringMatch) (string, error) {
	switch m := s.GetMatchType().(type) {
	case *security.StringMatch_Exact:
		if strings.Contains(m.Exact, "*") {
			return "", fmt.Errorf("exact match %q holds a '*', which config's patterns read as a wildcard", m.Exact)
		}
		return m.Exact, nil
	case *security.StringMatch_Prefix:
		if strings.Contains(m.Prefix, "*") {
			return "", fmt.Errorf("prefix %q holds a '*'", m.Prefix)
		}
		return m.Prefix + "*", nil
	case *security.StringMatch_Suffix:
		if strings.Contains(m.Suffix, "*") {
			return "", fmt.Errorf("suffix %q holds a '*'", m.Suffix)
		}
		return "*" + m.Suffix, nil
	case *security.StringMatch_Presence:
		return "*", nil
	}
	return "", errors.New("string match of no kind")
}

// andRules is the rule matching when both a and b do; ok is false when no
// connection can (an empty intersection).
func andRules(a, b config.Rule) (config.Rule, bool, error) {
	var r config.Rule
	var ok bool
	var err error
	if r.Principals, ok, err = andPatterns(a.Principals, b.Principals); err != nil || !ok {
		return r, false, err
	}
	if r.Namespaces, ok, err = andPatterns(a.Namespaces, b.Namespaces); err != nil || !ok {
		return r, false, err
	}
	if r.SourceIPs, ok = andPrefixes(a.SourceIPs, b.SourceIPs); !ok {
		return r, false, nil
	}
	if r.DestinationIPs, ok = andPrefixes(a.DestinationIPs, b.DestinationIPs); !ok {
		return r, false, nil
	}
	if r.DestinationPorts, ok = andPorts(a.DestinationPorts, b.DestinationPorts); !ok {
		return r, false, nil
	}
	// Not matching any of a's and any of b's: not matching any of both.
	r.NotPrincipals = union(a.NotPrincipals, b.NotPrincipals)
	r.NotNamespaces = union(a.NotNamespaces, b.NotNamespaces)
	r.NotSourceIPs = union(a.NotSourceIPs, b.NotSourceIPs)
	r.NotDestinationIPs = union(a.NotDestinationIPs, b.NotDestinationIPs)
	r.NotDestinationPorts = union(a.NotDestinationPorts, b.NotDestinationPorts)
	return r, true, nil
}

func union[T comparable](a, b []T) []T {
	out := slices.Clone(a)
	for _, x := range b {
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out
}

// andPatterns is the list matching a value both lists match (an empty
// list matches anything); ok false when none can.
func andPatterns(a, b []string) ([]string, bool, error) {
	if len(a) == 0 || len(b) == 0 {
		return union(a, b), true, nil
	}
	var out []string
	for _, x := range a {
		for _, y := range b {
			z, ok, err := andPattern(x, y)
			if err != nil {
				return nil, false, err
			}
			if ok && !slices.Contains(out, z) {
				out = append(out, z)
			}
		}
	}
	return out, len(out) > 0, nil
}

// andPattern is the pattern matching what both x and y match.
func andPattern(x, y string) (string, bool, error) {
	kind := func(p string) (byte, string) {
		switch {
		case p == "*":
			return '*', ""
		case strings.HasSuffix(p, "*"):
			return 'p', strings.TrimSuffix(p, "*")
		case strings.HasPrefix(p, "*"):
			return 's', strings.TrimPrefix(p, "*")
		}
		return '=', p
	}
	kx, vx := kind(x)
	ky, vy := kind(y)
	if kx == '*' {
		return y, true, nil
	}
	if ky == '*' {
		return x, true, nil
	}
	if ky == '=' {
		kx, vx, ky, vy = ky, vy, kx, vx
		x, y = y, x
	}
	switch {
	case kx == '=':
		match := ky == '=' && vx == vy || ky == 'p' && strings.HasPrefix(vx, vy) || ky == 's' && strings.HasSuffix(vx, vy)
		return x, match, nil
	case kx == 'p' && ky == 'p':
		if strings.HasPrefix(vx, vy) {
			return x, true, nil
		}
		return y, strings.HasPrefix(vy, vx), nil
	case kx == 's' && ky == 's':
		if strings.HasSuffix(vx, vy) {
			return x, true, nil
		}
		return y, strings.HasSuffix(vy, vx), nil
	}
	return "", false, fmt.Errorf("%q and %q in one rule: config's patterns cannot say both", x, y)
}

func andPrefixes(a, b []netip.Prefix) ([]netip.Prefix, bool) {
	if len(a) == 0 || len(b) == 0 {
		return union(a, b), true
	}
	var out []netip.Prefix
	for _, x := range a {
		for _, y := range b {
			if !x.Overlaps(y) {
				continue
			}
			z := x
			if y.Bits() > x.Bits() {
				z = y
			}
			if !slices.Contains(out, z) {
				out = append(out, z)
			}
		}
	}
	return out, len(out) > 0
}

func andPorts(a, b []uint16) ([]uint16, bool) {
	if len(a) == 0 || len(b) == 0 {
		return union(a, b), true
	}
	var out []uint16
	for _, x := range a {
		if slices.Contains(b, x) && !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out, len(out) > 0
}
