package hbone

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"golang.org/x/net/http/httpguts"

	"github.com/meshtun/meshtun/identity"
)

// What ztunnel sends for a Deployment's pod (src/baggage.rs,
// baggage_header_val), field for field.
const baggageZtunnel = "k8s.cluster.name=Kubernetes,k8s.namespace.name=prod,k8s.deployment.name=web,service.name=web,service.version=v1"

func TestBaggageString(t *testing.T) {
	tests := []struct {
		name string
		in   Baggage
		want string
	}{
		{"ztunnel's form", Baggage{Cluster: "Kubernetes", Namespace: "prod", WorkloadKind: "deployment", WorkloadName: "web", Service: "web", Revision: "v1"}, baggageZtunnel},
		{"kind defaults to pod", Baggage{Namespace: "vm", WorkloadName: "db-vm"}, "k8s.namespace.name=vm,k8s.pod.name=db-vm"},
		{"kind without a name sends nothing", Baggage{WorkloadKind: "job", Service: "batch"}, "service.name=batch"},
		{"nothing", Baggage{}, ""},
		{"bytes a value may not hold are encoded", Baggage{Service: `a b,c;d"e\f%g` + "\u00e9"}, "service.name=a%20b%2Cc%3Bd%22e%5Cf%25g%C3%A9"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.in.String()
			if got != tt.want {
				t.Errorf("String() = %q, want %q", got, tt.want)
			}
			if !httpguts.ValidHeaderFieldValue(got) {
				t.Errorf("String() = %q is not a valid header value", got)
			}
		})
	}
}

func TestParseBaggage(t *testing.T) {
	ztunnel := Baggage{Cluster: "Kubernetes", Namespace: "prod", WorkloadKind: "deployment", WorkloadName: "web", Service: "web", Revision: "v1"}
	many := strings.Repeat("other=x,", maxBaggageMembers-1)
	long := "junk=" + strings.Repeat("x", maxBaggageBytes-len("junk=")-len(",service.name=web")) // exactly at the bound with the member
	tests := []struct {
		name string
		in   []string
		want Baggage
	}{
		{"ztunnel's", []string{baggageZtunnel}, ztunnel},
		{"one member per line", strings.Split(baggageZtunnel, ","), ztunnel},
		{"whitespace and properties", []string{" k8s.namespace.name = prod ;p=1 , \tservice.name=web;x"}, Baggage{Namespace: "prod", Service: "web"}},
		{"percent-encoded", []string{"service.name=we%62"}, Baggage{Service: "web"}},
		{"other kinds", []string{"k8s.statefulset.name=db"}, Baggage{WorkloadKind: "statefulset", WorkloadName: "db"}},
		{"unknown kind", []string{"k8s.node.name=n1,k8s.container.name=c"}, Baggage{}},
		{"last wins", []string{"service.name=a,service.name=b"}, Baggage{Service: "b"}},
		{"empty values", []string{"k8s.cluster.name=,service.name="}, Baggage{}},
		{"not a name once decoded", []string{"service.name=a%2Cb,service.version=a%20b,k8s.namespace.name=x/y"}, Baggage{}},
		{"bad escape", []string{"service.name=a%zz"}, Baggage{}},
		{"value with =", []string{"service.name=a=b"}, Baggage{}},
		{"no =", []string{"service.name", ",,,"}, Baggage{}},
		{"key case matters", []string{"Service.Name=web"}, Baggage{}},
		{"too long a value", []string{"service.name=" + strings.Repeat("a", 254)}, Baggage{}},
		{"none", nil, Baggage{}},
		{"64th member read", []string{many + "service.name=web"}, Baggage{Service: "web"}},
		{"65th member ignored", []string{many + "other=x,service.name=web"}, Baggage{}},
		{"member ending at 8192 bytes read", []string{long + ",service.name=web"}, Baggage{Service: "web"}},
		{"member past 8192 bytes ignored", []string{long + "x,service.name=web"}, Baggage{}},
		{"the bounds span lines", []string{long + "x", "service.name=web"}, Baggage{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ParseBaggage(tt.in); got != tt.want {
				t.Errorf("ParseBaggage(%.80q) = %+v, want %+v", tt.in, got, tt.want)
			}
		})
	}
}

// Every value the parser returns is a name: safe as a label value and
// bounded; what String writes reads back the same.
func FuzzParseBaggage(f *testing.F) {
	f.Add(baggageZtunnel)
	f.Add(" k8s.namespace.name = prod ;p=1 ,service.name=we%62")
	f.Add("service.name=a%2,k8s.x.name=,=,;")
	f.Fuzz(func(t *testing.T, s string) {
		b := ParseBaggage([]string{s})
		for _, v := range []string{b.Cluster, b.Namespace, b.WorkloadName, b.Service, b.Revision} {
			if v != "" && identity.CheckName(v) != nil {
				t.Fatalf("ParseBaggage(%q) = %+v: %q is not a name", s, b, v)
			}
		}
		if (b.WorkloadKind == "") != (b.WorkloadName == "") {
			t.Fatalf("ParseBaggage(%q) = %+v: a kind without a name or a name without a kind", s, b)
		}
		if again := ParseBaggage([]string{b.String()}); again != b {
			t.Fatalf("ParseBaggage(%q) = %+v, but its String %q reads back as %+v", s, b, b.String(), again)
		}
	})
}

// The server's accessor reads what our own client sends, over real
// HTTP/2 and TLS.
func TestServerRequestBaggage(t *testing.T) {
	got := make(chan Baggage, 1)
	e := newSrvTest(t, func(r *Request) {
		got <- r.Baggage()
		r.Reject(http.StatusServiceUnavailable)
	}, nil)
	pki := &clientTestPKI{ca: e.ca}
	var err error
	if pki.client, err = e.ca.KeyPair(srvTestClientID); err != nil {
		t.Fatal(err)
	}
	pool := newClientTestPool(t, pki, nil)
	req := clientTestRequest(netip.MustParseAddrPort(e.addr))
	req.Identities = []string{srvTestServerID}
	want := Baggage{Cluster: "c1", Namespace: "vm", WorkloadKind: "pod", WorkloadName: "db-vm", Service: "db", Revision: "latest"}
	req.Baggage = want.String()
	if _, err := pool.Connect(clientCtx(t), req); err == nil {
		t.Fatal("Connect succeeded, want the handler's 503")
	}
	if b := clientRecv(t, got, "the handler"); b != want {
		t.Errorf("Request.Baggage() = %+v, want %+v", b, want)
	}
}
