// Command hbone-pair is one half of the bench's "Istio's Go HBONE pair"
// (bench/README.md, "The peers"): the two proxies of the plain relay pair
// with Istio's own HBONE between them — istio.io/istio/pkg/hbone's dialer
// on node A, its server on node B, Go TLS (mTLS with the bench's
// certificates), x/net/http2, kernel TCP on both ends.
//
//	hbone-pair -mode server -listen 192.0.2.2:15008 -cert node-b.pem -key node-b-key.pem -ca ca.pem -peer-id spiffe://…/node-a
//	hbone-pair -mode client -forward 127.0.0.1:7102=10.244.2.5:7102 -proxy 192.0.2.2:15008 -cert node-a.pem -key node-a-key.pem -ca ca.pem -peer-id spiffe://…/node-b
//
// The server is hbone.NewServer() serving a TLS listener, as Istio's echo
// server does: each CONNECT dials its authority and copies both ways. The
// client accepts plain TCP on each -forward address and relays it
// (bench/relay.Pipe, the same copy the plain relay pair runs) to a
// connection from hbone.NewDialer, which CONNECTs to the forward's target
// through -proxy; every stream shares the dialer's HTTP/2 connection.
//
// It prints "ready" on stdout once it listens, and exits when its stdin
// closes (the bench holds it), closing everything. Istio's log (its
// default level: info, a few lines per connection) goes to stderr.
//
// The connection Istio's dialer returns is one end of a net.Pipe, which
// cannot half-close: the client's FIN can only be passed on by closing
// the stream both ways, so what needs the client to half-close and then
// read (an upload's receipt, the server's FIN after the client's) cannot
// go through this pair. The bench leaves those figures out for it.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"

	"github.com/meshtun/meshtun/bench/relay"
	"istio.io/istio/pkg/hbone"
	istiolog "istio.io/istio/pkg/log"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "hbone-pair:", err)
		os.Exit(1)
	}
}

// options are the flags.
type options struct {
	mode, listen, forward, proxy string
	cert, key, ca, peerID        string
}

func run() error {
	var o options
	flag.StringVar(&o.mode, "mode", "", "client (node A: plain TCP in, HBONE out) or server (node B: HBONE in, TCP out)")
	flag.StringVar(&o.listen, "listen", "", "server: the HBONE listen address, e.g. 192.0.2.2:15008")
	flag.StringVar(&o.forward, "forward", "", "client: LISTEN=TARGET,… — each TCP connection to LISTEN is CONNECTed to TARGET")
	flag.StringVar(&o.proxy, "proxy", "", "client: the HBONE server's address")
	flag.StringVar(&o.cert, "cert", "", "this side's certificate (PEM)")
	flag.StringVar(&o.key, "key", "", "this side's key (PEM)")
	flag.StringVar(&o.ca, "ca", "", "the CA both sides' certificates chain to (PEM)")
	flag.StringVar(&o.peerID, "peer-id", "", "the SPIFFE ID the other side's certificate must carry (empty: any the CA issued)")
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	logOpts := istiolog.DefaultOptions()
	logOpts.OutputPaths = []string{"stderr"}
	if err := istiolog.Configure(logOpts); err != nil {
		return err
	}
	c, _, err := start(o)
	if err != nil {
		return err
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin) // until the bench closes it or exits
	return c.Close()
}

// start listens as o says and serves until the returned Close; it
// returns the addresses it listens on.
func start(o options) (io.Closer, []net.Addr, error) {
	if o.cert == "" || o.key == "" || o.ca == "" {
		return nil, nil, errors.New("-cert, -key and -ca are required")
	}
	cert, err := tls.LoadX509KeyPair(o.cert, o.key)
	if err != nil {
		return nil, nil, err
	}
	roots, err := loadPool(o.ca)
	if err != nil {
		return nil, nil, err
	}
	verify := verifier(roots, o.peerID)
	switch o.mode {
	case "server":
		if o.listen == "" {
			return nil, nil, errors.New("server: -listen is required")
		}
		cfg := &tls.Config{
			Certificates: []tls.Certificate{cert},
			MinVersion:   tls.VersionTLS13,
			NextProtos:   []string{"h2"},
			// The certificates carry SPIFFE URIs, not names: the chain
			// and the ID are checked by verify.
			ClientAuth:            tls.RequireAnyClientCert,
			VerifyPeerCertificate: verify,
		}
		l, err := net.Listen("tcp", o.listen)
		if err != nil {
			return nil, nil, err
		}
		srv := hbone.NewServer()
		go srv.Serve(tls.NewListener(l, cfg))
		return srv, []net.Addr{l.Addr()}, nil
	case "client":
		if o.forward == "" || o.proxy == "" {
			return nil, nil, errors.New("client: -forward and -proxy are required")
		}
		fwds, err := relay.ParseForwards(o.forward)
		if err != nil {
			return nil, nil, err
		}
		// No Timeout: pkg/hbone applies it to its plaintext (h2c)
		// transport only.
		d := hbone.NewDialer(hbone.Config{
			ProxyAddress: o.proxy,
			TLS: &tls.Config{
				Certificates: []tls.Certificate{cert},
				MinVersion:   tls.VersionTLS13,
				// No DNS name to check: verify checks the chain and the
				// SPIFFE ID instead of the standard verification.
				InsecureSkipVerify:    true,
				VerifyPeerCertificate: verify,
			},
		})
		rs := relay.NewServer()
		for _, f := range fwds {
			l, err := net.Listen("tcp", f.Listen)
			if err != nil {
				rs.Close()
				return nil, nil, err
			}
			target := f.Dial
			rs.Serve(l, func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, "tcp", target) })
		}
		return rs, rs.Addrs(), nil
	}
	return nil, nil, fmt.Errorf("-mode must be client or server, not %q", o.mode)
}

func loadPool(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: no certificate", file)
	}
	return p, nil
}

// verifier checks that the peer's chain leads to roots and, when id is
// set, that its leaf carries the URI SAN id.
func verifier(roots *x509.CertPool, id string) func([][]byte, [][]*x509.Certificate) error {
	return func(raw [][]byte, _ [][]*x509.Certificate) error {
		if len(raw) == 0 {
			return errors.New("no peer certificate")
		}
		var certs []*x509.Certificate
		for _, r := range raw {
			c, err := x509.ParseCertificate(r)
			if err != nil {
				return err
			}
			certs = append(certs, c)
		}
		inter := x509.NewCertPool()
		for _, c := range certs[1:] {
			inter.AddCert(c)
		}
		if _, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			return err
		}
		if id == "" {
			return nil
		}
		for _, u := range certs[0].URIs {
			if u.String() == id {
				return nil
			}
		}
		return fmt.Errorf("peer certificate is not %s", id)
	}
}
