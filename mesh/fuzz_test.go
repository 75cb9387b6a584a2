package mesh

import (
	"reflect"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
	"istio.io/istio/pkg/workloadapi"
	"istio.io/istio/pkg/workloadapi/security"
)

// FuzzConvert feeds the conversion any Address and Authorization istiod
// could send (as wire bytes, the form they arrive in). For every input:
// no panic; Validate, the NACK check, and Convert agree on a resource
// alone (what Validate accepts Convert keeps, what it refuses Convert
// rejects, with a reason); and Convert of a whole mesh with the resource
// in it is deterministic.
func FuzzConvert(f *testing.F) {
	snap := meshSnapshot()
	for _, name := range sortedKeys(snap.Addresses) {
		b, err := proto.Marshal(snap.Addresses[name])
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, []byte(nil))
	}
	for _, name := range sortedKeys(snap.Authorizations) {
		b, err := proto.Marshal(snap.Authorizations[name])
		if err != nil {
			f.Fatal(err)
		}
		f.Add([]byte(nil), b)
	}

	f.Fuzz(func(t *testing.T, addrWire, authzWire []byte) {
		addr, authz := &workloadapi.Address{}, &security.Authorization{}
		if proto.Unmarshal(addrWire, addr) != nil || proto.Unmarshal(authzWire, authz) != nil {
			return // istiod's gRPC stream refuses these before we see them
		}
		const addrName, authzName = "fuzz/address", "fuzz/authorization"
		alone := func(name string, s Snapshot, verr error) {
			t.Helper()
			s.AddressesReady, s.AuthorizationsReady = true, true
			st := Convert(s, convNode)
			rejected := slices.ContainsFunc(st.Rejections, func(r Rejection) bool { return r.Name == name && r.Reason != "" })
			if verr == nil && rejected {
				t.Errorf("%s: Validate accepts it, Convert rejects it: %v", name, st.Rejections)
			}
			if verr != nil && !rejected {
				t.Errorf("%s: Validate refuses it (%v), Convert keeps it", name, verr)
			}
		}
		if addr.GetType() != nil {
			alone(addrName, Snapshot{Addresses: map[string]*workloadapi.Address{addrName: addr}},
				Validate(Resource{Name: addrName, Message: addr}))
		}
		alone(authzName, Snapshot{Authorizations: map[string]*security.Authorization{authzName: authz}},
			Validate(Resource{Name: authzName, Message: authz}))

		whole := meshSnapshot()
		whole.Addresses[addrName] = addr
		whole.Authorizations[authzName] = authz
		if first, again := Convert(whole, convNode), Convert(whole, convNode); !reflect.DeepEqual(first, again) {
			t.Errorf("Convert of the same snapshot twice differs:\n%+v\n%+v", first, again)
		}
	})
}
