package gateway

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// adminGet asks g's admin handler for path and decodes its JSON answer
// into v; it returns the status code.
func adminGet(t *testing.T, g *Gateway, path string, v any) int {
	t.Helper()
	rec := httptest.NewRecorder()
	g.AdminHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	if rec.Code == http.StatusOK && v != nil {
		if err := json.Unmarshal(rec.Body.Bytes(), v); err != nil {
			t.Fatalf("GET %s: %v in %s", path, err, rec.Body)
		}
	}
	return rec.Code
}

// A flow being relayed shows on both gateways' /flows, with its two
// ends, the peer's identity and its bytes so far, and in /status with
// the peer the pool holds; once it ends, neither lists it.
func TestStatusAndFlows(t *testing.T) {
	e := newOutboundEnv(t, "")
	target := echo(t)
	r := newFakeRequest(t, target)
	e.a.serveOutbound(r)
	r.app.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := r.app.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(r.app, make([]byte, 4)); err != nil {
		t.Fatal(err)
	}

	// The relay counts a write once it returned: the echo may be read
	// first.
	var fa FlowsAnswer
	for deadline := time.Now().Add(10 * time.Second); ; {
		if code := adminGet(t, e.a, "/flows", &fa); code != http.StatusOK {
			t.Fatalf("GET /flows: %d", code)
		}
		if len(fa.Flows) == 1 && fa.Flows[0].BytesRecv == 4 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond) // polling the counters for a bounded time
	}
	if fa.Total != 1 || fa.Setup != 0 || len(fa.Flows) != 1 {
		t.Fatalf("gateway A's /flows: %+v, want the one flow", fa)
	}
	f := fa.Flows[0]
	if f.Direction != outbound || f.Src != r.src || f.Dst != target || f.HBONEAddr != e.addr ||
		f.PeerIdentity != reloadServerID || f.BytesSent != 4 || f.BytesRecv != 4 || f.AgeSeconds < 0 || f.Started.IsZero() {
		t.Errorf("gateway A's flow: %+v", f)
	}
	var fb FlowsAnswer
	adminGet(t, e.g, "/flows", &fb)
	if len(fb.Flows) != 1 || fb.Flows[0].Direction != inbound || fb.Flows[0].Dst != target || fb.Flows[0].PeerIdentity != reloadClientID {
		t.Errorf("gateway B's /flows: %+v, want the flow inbound from %s", fb, reloadClientID)
	}

	var st StatusAnswer
	if code := adminGet(t, e.a, "/status", &st); code != http.StatusOK {
		t.Fatalf("GET /status: %d", code)
	}
	if st.Identity != reloadClientID || st.Name != "node-a" || st.Flows.Outbound != 1 || st.Flows.Inbound != 0 ||
		st.Pool.Conns != 1 || st.Pool.Streams != 1 || st.XDS != nil || st.Certificate.Source != "file" || st.Certificate.NotAfter.IsZero() {
		t.Errorf("gateway A's /status: %+v", st)
	}
	if len(st.Peers) != 1 || st.Peers[0].Address != e.addr || st.Peers[0].Identity != reloadServerID || st.Peers[0].Streams != 1 {
		t.Errorf("gateway A's peers: %+v, want %s (%s) carrying one stream", st.Peers, e.addr, reloadServerID)
	}

	// Pages.
	var page FlowsAnswer
	if adminGet(t, e.a, "/flows?limit=0", &page); page.Total != 1 || len(page.Flows) != 0 {
		t.Errorf("limit=0: %+v", page)
	}
	if adminGet(t, e.a, "/flows?offset=1", &page); page.Total != 1 || len(page.Flows) != 0 {
		t.Errorf("offset=1 of 1: %+v", page)
	}
	for _, q := range []string{"limit=x", "limit=-1", "limit=1001", "offset=-3"} {
		rec := httptest.NewRecorder()
		e.a.AdminHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/flows?"+q, nil))
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), strings.Split(q, "=")[0]) {
			t.Errorf("GET /flows?%s: %d %q, want 400 naming the parameter", q, rec.Code, rec.Body)
		}
	}

	if err := r.app.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(r.app); err != nil {
		t.Fatal(err)
	}
	waitFlowsAtMost(t, &e.a.flows, outbound, 0)
	if adminGet(t, e.a, "/flows", &fa); fa.Total != 0 || len(fa.Flows) != 0 {
		t.Errorf("after the flow ended: %+v", fa)
	}
}
