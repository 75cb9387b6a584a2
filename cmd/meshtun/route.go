package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/gateway"
)

// cmdRoute prints what the gateway would do with a flow to IP:PORT (or
// to a service's NAME:PORT, resolved as the DNS server of [dns] answers
// it, from the services in force): the plan of the same Router the
// gateway routes with, built from the config file as run parses and
// checks it (--config; the certificate files are not needed), or asked of
// a running gateway's admin listener
// (--admin; GET /route), which answers with the routes in force, those
// from istiod included. Both print the same lines. Exit status 0 when the
// destination is routable, 1 when it is denied (or the config does not
// load), 2 for a wrong command line or an admin listener that does not
// answer.
func cmdRoute(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("route", stderr)
	path := fs.String("config", defaultConfig, "the gateway's TOML config file")
	admin := fs.String("admin", "", "instead of --config: the running gateway's admin.listen host:port, e.g. 127.0.0.1:15000")
	pick := fs.Int("endpoint", 0, "for a service: which of its endpoints to show, counting from 0 (the gateway takes them in turn)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: meshtun route [--config FILE | --admin HOST:PORT] [--endpoint N] IP:PORT|NAME:PORT\n\nprints the plan for a flow to IP:PORT (IPv6 as [addr]:port), or to a service's NAME:PORT (its hostname or a short form, resolved as [dns] answers it)")
		fs.PrintDefaults()
	}
	// Flags may come after the destination too.
	var rest []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return err
			}
			return errUsage // the flag package printed why
		}
		if fs.NArg() == 0 {
			break
		}
		rest = append(rest, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(rest) != 1 {
		fmt.Fprintf(stderr, "meshtun route: want one destination IP:PORT, got %d arguments\n", len(rest))
		fs.Usage()
		return errUsage
	}
	dst, err := netip.ParseAddrPort(rest[0])
	// A service's hostname works too: resolved as the DNS server would.
	name, port, nameErr := gateway.SplitNamePort(rest[0])
	if (err != nil || dst.Port() == 0 || dst.Addr().Zone() != "") && nameErr != nil {
		fmt.Fprintf(stderr, "meshtun route: %q is not IP:PORT or NAME:PORT (like 10.96.0.10:80, [fd00::5]:80 or web.default.svc.cluster.local:80)\n", rest[0])
		return errUsage
	}
	if *pick < 0 {
		fmt.Fprintf(stderr, "meshtun route: --endpoint %d: must be 0 or more\n", *pick)
		return errUsage
	}

	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var answer gateway.RouteAnswer
	if set["admin"] {
		if set["config"] {
			fmt.Fprintln(stderr, "meshtun route: --admin and --config exclude each other: ask a running gateway or read a file")
			return errUsage
		}
		if err := checkHostPort(*admin); err != nil {
			fmt.Fprintf(stderr, "meshtun route: --admin %q: %v\n", *admin, err)
			return errUsage
		}
		if answer, err = fetchRoute(*admin, rest[0], *pick); err != nil {
			fmt.Fprintf(stderr, "meshtun route: admin listener %s: %v\n", *admin, err)
			return exitError{2}
		}
	} else {
		// Parse, not Load: routing needs the config alone, not the
		// certificate files (a node's key may be readable by the
		// service's user only).
		data, err := os.ReadFile(*path)
		if err != nil {
			fmt.Fprintf(stderr, "meshtun route: %v\n", err)
			return exitError{1}
		}
		cfg, err := config.Parse(data, *path)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return exitError{1}
		}
		if nameErr != nil {
			answer = gateway.ExplainConfig(cfg, dst, *pick)
		} else if answer, err = gateway.ExplainConfigName(cfg, name, port, *pick); err != nil {
			fmt.Fprintf(stderr, "meshtun route: %v\n", err)
			return exitError{1}
		}
	}
	printRoute(stdout, answer)
	if answer.Kind == gateway.Deny {
		return exitError{1}
	}
	return nil
}

// checkHostPort accepts host:port with a port number, as admin.listen
// is written.
func checkHostPort(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return errors.New("not host:port (like 127.0.0.1:15000)")
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Errorf("port %q is not a number from 1 to 65535", port)
	}
	return nil
}

// adminTimeout bounds the question to the admin listener. It answers from
// memory, at once; one that takes this long is stuck, and the operator
// is better told so than left waiting.
const adminTimeout = 5 * time.Second

// fetchRoute asks the admin listener at addr for the plan of dst.
func fetchRoute(addr string, dst string, endpoint int) (gateway.RouteAnswer, error) {
	q := url.Values{"dst": {dst}, "endpoint": {strconv.Itoa(endpoint)}}
	var a gateway.RouteAnswer
	_, err := adminGetJSON(addr, "/route?"+q.Encode(), &a, "a plan")
	return a, err
}

// printRoute writes the plan of a, then a note if the device does not
// capture the destination: the one printer of --config and --admin.
func printRoute(w io.Writer, a gateway.RouteAnswer) {
	printPlan(w, a)
	if !a.Captured {
		fmt.Fprintf(w, "note:        %s is in none of tun.routes: the kernel does not send it to the gateway\n", a.Dst.Addr())
	}
}

// printPlan writes a's plan as aligned "key: value" lines, the name
// asked first.
func printPlan(w io.Writer, a gateway.RouteAnswer) {
	p := a.Plan
	line := func(k, v string) { fmt.Fprintf(w, "%-12s %s\n", k+":", v) }
	if a.Name != "" {
		line("name", a.Name)
	}
	line("destination", p.Dst.String())
	if p.Service != "" {
		s := p.Service
		if p.Host != "" {
			s += " (" + p.Host + ")"
		}
		line("service", s)
	}
	if p.Kind == gateway.Deny {
		line("denied", p.Reason)
		return
	}
	line("via", p.Via)
	if p.Endpoint != "" {
		e := fmt.Sprintf("%s (%d of %d", p.Endpoint, p.EndpointIndex+1, p.Endpoints)
		if p.Endpoints > 1 {
			e += "; the gateway takes them in turn"
		}
		line("endpoint", e+")")
	}
	switch p.Kind {
	case gateway.HBONE:
		authority := p.Target.String()
		if p.Authority != "" {
			authority = p.Authority
		}
		if g := p.Gateway; g != nil {
			line("mode", "double HBONE, through network "+strconv.Quote(g.Network)+"'s gateway")
			line("gateway", fmt.Sprintf("%s (%d of %d)", g.Name, g.Instance+1, g.Instances))
			line("outer hbone", g.Address.String())
			line("outer ids", strings.Join(g.Identities, ", "))
			line("authority", authority+" (outer and inner)")
			line("inner ids", strings.Join(p.Identities, ", "))
			line("target", fmt.Sprintf("%s (its HBONE at %s, reached by the gateway)", p.Target, p.HBONEAddress))
		} else {
			line("mode", "HBONE")
			line("hbone", p.HBONEAddress.String())
			line("authority", authority)
			line("identities", strings.Join(p.Identities, ", "))
		}
		fwd := `for="<client ip:port>"`
		if p.Host != "" {
			fwd += ";host=" + p.Host
		}
		line("forwarded", fwd)
	case gateway.Direct:
		line("mode", "direct TCP (no HBONE), socket marked to bypass the TUN")
		line("target", p.Target.String())
	}
}
