package mesh

import (
	"errors"
	"fmt"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"istio.io/istio/pkg/workloadapi"
	"istio.io/istio/pkg/workloadapi/security"

	"github.com/meshtun/meshtun/internal/pmap"
)

// Resource is one decoded resource of a response, as Validate sees it.
type Resource struct {
	TypeURL string
	Name    string
	Version string
	// Message is a *workloadapi.Address or a *security.Authorization.
	Message proto.Message
}

// Snapshot is the whole state after one applied response: every Address
// and Authorization held, by resource name. The maps and messages are
// shared with later snapshots and must not be modified.
type Snapshot struct {
	Addresses      map[string]*workloadapi.Address
	Authorizations map[string]*security.Authorization
	// AddressesReady and AuthorizationsReady are true once the first
	// response of the type has been applied.
	AddressesReady, AuthorizationsReady bool
	// Generation counts the applied responses that changed the state.
	Generation uint64
}

// Ready is true once both types have had their first response.
func (s Snapshot) Ready() bool { return s.AddressesReady && s.AuthorizationsReady }

type entry struct {
	version string
	msg     proto.Message
}

// store holds the resources by type and name, with the version each came
// with (for initial_resource_versions), in persistent maps: a response
// costs what it names, and an older version of the maps never changes.
// The XDSClient's mutex guards it.
type store struct {
	byName     map[string]pmap.Map[string, string] // by type: name → version
	ready      map[string]bool
	generation uint64
	// messages keeps each resource's message (msgs, by type), for
	// snapshot; without it only names and versions are held (what a
	// reconnect sends), and the message lives as long as its consumer
	// keeps it: the gateway's path, where an entry per resource of the
	// mesh is worth its every byte.
	messages bool
	msgs     map[string]pmap.Map[string, proto.Message]
}

func newStore(messages bool) *store {
	return &store{byName: map[string]pmap.Map[string, string]{}, msgs: map[string]pmap.Map[string, proto.Message]{},
		ready: map[string]bool{}, messages: messages}
}

// versions returns name → version of what is held of typ.
func (s *store) versions(typ string) map[string]string {
	out := make(map[string]string, s.byName[typ].Len())
	for name, v := range s.byName[typ].All() {
		out[name] = v
	}
	return out
}

func (s *store) count(typ string) int { return s.byName[typ].Len() }

// apply removes, then adds or replaces, and returns what changed: the
// resources accepted, and those of removed that were held.
func (s *store) apply(typ string, accepted map[string]entry, removed []string) (gone []string, changed bool) {
	versions, msgs := s.byName[typ], s.msgs[typ]
	for _, name := range removed {
		if _, ok := versions.Get(name); ok {
			if _, again := accepted[name]; !again {
				gone = append(gone, name)
			}
			versions, msgs = versions.Delete(name), msgs.Delete(name)
		}
	}
	if len(accepted) == 0 && len(gone) == 0 {
		return nil, false
	}
	for name, e := range accepted {
		versions = versions.Set(name, e.version)
		if s.messages {
			msgs = msgs.Set(name, e.msg)
		}
	}
	s.byName[typ], s.msgs[typ] = versions, msgs
	s.generation++
	return gone, true
}

// snapshot is every resource held, in Go maps: it costs what the mesh
// holds, for XDSOptions.OnUpdate and XDSClient.Snapshot, not for deltas.
func (s *store) snapshot() Snapshot {
	addresses := make(map[string]*workloadapi.Address, s.msgs[AddressType].Len())
	for name, m := range s.msgs[AddressType].All() {
		addresses[name] = m.(*workloadapi.Address)
	}
	authorizations := make(map[string]*security.Authorization, s.msgs[AuthorizationType].Len())
	for name, m := range s.msgs[AuthorizationType].All() {
		authorizations[name] = m.(*security.Authorization)
	}
	return Snapshot{
		Addresses:           addresses,
		Authorizations:      authorizations,
		AddressesReady:      s.ready[AddressType],
		AuthorizationsReady: s.ready[AuthorizationType],
		Generation:          s.generation,
	}
}

// decode turns the resources of one response into entries; each one that
// cannot be used gives a reason instead ("name: why").
func (c *XDSClient) decode(typ string, resources []*discovery.Resource) (map[string]entry, []string) {
	accepted := map[string]entry{}
	var rejected []string
	for i, r := range resources {
		msg, err := decodeResource(typ, r)
		if err == nil && c.validate != nil {
			err = c.validate(Resource{TypeURL: typ, Name: r.GetName(), Version: r.GetVersion(), Message: msg})
		}
		if err != nil {
			name := r.GetName()
			if name == "" {
				name = fmt.Sprintf("#%d", i)
			}
			rejected = append(rejected, name+": "+err.Error())
			continue
		}
		accepted[r.GetName()] = entry{version: r.GetVersion(), msg: msg}
	}
	return accepted, rejected
}

func decodeResource(typ string, r *discovery.Resource) (proto.Message, error) {
	if r.GetName() == "" {
		return nil, errors.New("resource without a name")
	}
	body := r.GetResource()
	if body == nil {
		return nil, errors.New("resource without a body")
	}
	if body.GetTypeUrl() != typ {
		return nil, fmt.Errorf("body of type %q in a response of type %q", body.GetTypeUrl(), typ)
	}
	var msg proto.Message
	switch typ {
	case AddressType:
		msg = &workloadapi.Address{}
	case AuthorizationType:
		msg = &security.Authorization{}
	default:
		return nil, fmt.Errorf("type %q was not subscribed to", typ)
	}
	if err := proto.Unmarshal(body.GetValue(), msg); err != nil {
		return nil, fmt.Errorf("decode %s: %w", typ, err)
	}
	if a, ok := msg.(*workloadapi.Address); ok && a.GetType() == nil {
		return nil, errors.New("address holds neither a workload nor a service")
	}
	return msg, nil
}
