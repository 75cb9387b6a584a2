package hbone

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Request is a valid CONNECT waiting for the handler's decision.
type Request struct {
	st     *ServerStream
	srv    *Server
	target netip.AddrPort
	name   string // a hostname:port :authority (ServerOptions.NameAuthorities)
	header http.Header
	peerID string
	remote net.Addr
	local  net.Addr
}

// Target is the parsed :authority: where the client wants to go. It is
// the zero value when the :authority is a hostname (TargetName).
func (r *Request) Target() netip.AddrPort { return r.target }

// TargetName is the :authority when it is "hostname:port", the form
// ztunnel sends through a network gateway, accepted only with
// ServerOptions.NameAuthorities; "" when it is ip:port (Target).
func (r *Request) TargetName() string { return r.name }

// PeerIdentity is the client's SPIFFE ID, from its verified certificate.
func (r *Request) PeerIdentity() string { return r.peerID }

// Header holds the regular request headers (forwarded, traceparent,
// baggage...), keys canonicalized.
func (r *Request) Header() http.Header { return r.header }

// RemoteAddr is the TCP address of the HBONE connection's peer.
func (r *Request) RemoteAddr() net.Addr { return r.remote }

// LocalAddr is the TCP address the HBONE connection arrived at: for a
// hostname:port target (TargetName), the address of the destination
// the client's side chose, as ztunnel's inbound takes it.
func (r *Request) LocalAddr() net.Addr { return r.local }

// Context is done when the stream or its connection ends (and when the
// server closes): a handler dialling the target should give up then.
func (r *Request) Context() context.Context { return r.st.ctx }

// Accept answers 200 and returns the stream. It fails if the stream or the
// connection already died, or if a decision was already made.
func (r *Request) Accept() (*ServerStream, error) {
	s := r.st
	c := s.c
	c.mu.Lock()
	if s.decided {
		defer c.mu.Unlock()
		if s.reset && s.werr != nil {
			return nil, s.werr
		}
		return nil, errSrvDecided
	}
	s.decided = true
	if s.reset || !c.queueLocked(h2frame{kind: h2Headers, streamID: s.id, status: http.StatusOK}) {
		defer c.mu.Unlock()
		if s.werr != nil {
			return nil, s.werr
		}
		return nil, c.err
	}
	r.srv.streamsAccepted.Add(1) // before the answer can reach the client
	c.mu.Unlock()
	c.writeQueued()
	return s, nil
}

// Reject answers status (with END_STREAM) and ends the stream. Statuses
// outside 300..599 are sent as 500. Only the first decision counts.
func (r *Request) Reject(status int) {
	s := r.st
	c := s.c
	c.mu.Lock()
	if s.decided || s.reset || c.closed {
		s.decided = true
		c.mu.Unlock()
		return
	}
	s.decided = true
	if status < 300 || status > 599 {
		c.log.Warn("handler rejected a CONNECT with a non-error status, sending 500", "status", status)
		status = http.StatusInternalServerError
	}
	answerLocked(c, s.id, status, s.recvClosed)
	c.failLocked(&s.h2Stream, errSrvRejected)
	r.srv.streamsRejected.Add(1) // before the answer can reach the client
	c.mu.Unlock()
	c.writeQueued()
}

// answerLocked ends a stream with a status: HEADERS with END_STREAM and,
// if the client has not ended its side, RST_STREAM(NO_ERROR) so that it
// stops sending (RFC 9113 §8.1).
func answerLocked(c *h2Conn, id uint32, status int, peerEnded bool) {
	c.queueLocked(h2frame{kind: h2Headers, streamID: id, status: status, end: true})
	if !peerEnded {
		c.queueLocked(h2frame{kind: h2RST, streamID: id, code: http2.ErrCodeNo})
	}
}

// onRequestLocked handles the HEADERS that open a client's stream: a
// CONNECT, checked, refused or handed to a new handler goroutine. The
// engine holds c.mu and has recorded the stream ID.
func (c *srvConn) onRequestLocked(f *http2.MetaHeadersFrame) error {
	id := f.StreamID
	max := int(c.srv.opts.MaxConcurrentStreams)
	// Handlers may outlive their streams (a stream reset during a dial);
	// bounding them too keeps a client that opens and resets streams in a
	// loop from piling up goroutines.
	if c.goAwaySent || len(c.streams) >= max || c.handlers >= 2*max {
		if err := c.queueControlLocked(h2frame{kind: h2RST, streamID: id, code: http2.ErrCodeRefusedStream}); err != nil {
			return err
		}
		c.srv.streamsRefused.Add(1)
		return nil
	}
	if err := c.controlBudgetLocked(); err != nil {
		return err
	}
	status := http.StatusRequestHeaderFieldsTooLarge
	var target netip.AddrPort
	var name string
	var header http.Header
	var err error
	if !f.Truncated {
		target, header, err = srvParseRequest(f.Fields)
		if ne := (*srvNameAuthority)(nil); errors.As(err, &ne) && c.srv.opts.NameAuthorities {
			name, err = ne.authority, nil
		}
		status = http.StatusBadRequest
	}
	if f.Truncated || err != nil {
		c.srv.logRefusal(c.log, "CONNECT refused", "stream", id, "status", status, "error", err)
		answerLocked(c.h2Conn, id, status, f.StreamEnded())
		c.srv.streamsRejected.Add(1)
		return nil
	}

	ctx, cancel := context.WithCancel(c.ctx)
	st := &ServerStream{ctx: ctx}
	st.cancel = cancel
	c.initStreamLocked(&st.h2Stream, id)
	if f.StreamEnded() {
		c.endRecvLocked(&st.h2Stream)
	}
	req := &Request{
		st:     st,
		srv:    c.srv,
		target: target,
		name:   name,
		header: header,
		peerID: PeerIdentity(c.tls.ConnectionState()),
		remote: c.tls.RemoteAddr(),
		local:  c.tls.LocalAddr(),
	}
	c.handlers++
	c.wg.Add(1)
	go c.runHandler(req)
	return nil
}

// runHandler is the goroutine of one CONNECT; it answers 503 if the
// handler decided nothing.
func (c *srvConn) runHandler(req *Request) {
	defer c.wg.Done()
	defer func() {
		c.mu.Lock()
		c.handlers--
		c.mu.Unlock()
	}()
	defer req.Reject(http.StatusServiceUnavailable)
	c.srv.opts.Handler(req)
}

// srvHopHeaders are connection-specific fields, malformed in HTTP/2
// (RFC 9113 §8.2.2).
var srvHopHeaders = []string{"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"}

// srvParseRequest checks a CONNECT's header list (already checked by the
// Framer for valid names and values, pseudo fields first and not
// repeated) and returns its target and regular headers.
func srvParseRequest(fields []hpack.HeaderField) (netip.AddrPort, http.Header, error) {
	var method, authority string
	var sawAuthority bool
	header := make(http.Header)
	for _, f := range fields {
		switch f.Name {
		case ":method":
			method = f.Value
		case ":authority":
			authority, sawAuthority = f.Value, true
		case ":scheme", ":path", ":protocol":
			return netip.AddrPort{}, nil, fmt.Errorf("CONNECT must not carry %s", f.Name)
		default:
			if strings.HasPrefix(f.Name, ":") {
				return netip.AddrPort{}, nil, fmt.Errorf("unknown pseudo-header %s", f.Name)
			}
			for _, h := range srvHopHeaders {
				if f.Name == h {
					return netip.AddrPort{}, nil, fmt.Errorf("connection-specific header %s", f.Name)
				}
			}
			if f.Name == "te" && f.Value != "trailers" {
				return netip.AddrPort{}, nil, errors.New(`te other than "trailers"`)
			}
			header.Add(http.CanonicalHeaderKey(f.Name), f.Value)
		}
	}
	if method != http.MethodConnect {
		return netip.AddrPort{}, nil, fmt.Errorf("method %q is not CONNECT", method)
	}
	if !sawAuthority {
		return netip.AddrPort{}, nil, errors.New("CONNECT without :authority")
	}
	target, err := srvParseAuthority(authority)
	if err != nil {
		if _, _, nerr := ParseNameAuthority(authority); nerr == nil {
			return netip.AddrPort{}, header, &srvNameAuthority{authority, err}
		}
		return netip.AddrPort{}, nil, err
	}
	return target, header, nil
}

// srvNameAuthority is srvParseRequest's refusal of a valid request whose
// :authority is hostname:port: the server takes it with
// ServerOptions.NameAuthorities, and refuses it otherwise.
type srvNameAuthority struct {
	authority string
	err       error
}

func (e *srvNameAuthority) Error() string { return e.err.Error() }
