package dnsproxy

import (
	"context"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/miekg/dns"
)

// FuzzAnswer feeds the query handler whatever decodes as a DNS message:
// it must answer every one (no upstream: forwarding is SERVFAIL at once)
// with a message that packs and carries the query's id, and count it
// exactly once.
func FuzzAnswer(f *testing.F) {
	for _, q := range []*dns.Msg{
		new(dns.Msg).SetQuestion("web.default.svc.cluster.local.", dns.TypeA),
		new(dns.Msg).SetQuestion("web.", dns.TypeAAAA),
		new(dns.Msg).SetQuestion("nope.cluster.local.", dns.TypeANY),
		new(dns.Msg).SetQuestion("example.org.", dns.TypeMX),
	} {
		b, _ := q.Pack()
		f.Add(b)
	}
	f.Add([]byte{0, 0, 0x28, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1}) // an UPDATE of the root
	s := &Server{
		opts:    Options{Zone: func() *Zone { return testZone("default") }},
		forward: make(chan struct{}, maxForwards),
	}
	s.log = hclog.NewNullLogger()
	f.Fuzz(func(t *testing.T, data []byte) {
		var r dns.Msg
		if r.Unpack(data) != nil {
			return
		}
		before := total(s.Stats())
		reply := s.answer(context.Background(), &r, "udp")
		if reply.Id != r.Id {
			t.Fatalf("reply id %d, query id %d", reply.Id, r.Id)
		}
		if _, err := reply.Pack(); err != nil {
			t.Fatalf("reply does not pack: %v\n%v", err, reply)
		}
		if n := total(s.Stats()) - before; n != 1 {
			t.Fatalf("one query counted %d times", n)
		}
	})
}

func total(s Stats) uint64 {
	return s.Answered + s.NXDomain + s.Forwarded + s.UpstreamError + s.Refused + s.RateLimited + s.Malformed
}
