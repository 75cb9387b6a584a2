package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"strings"

	"github.com/meshtun/meshtun/gateway"
)

// cmdRoute prints what the gateway would do with a flow to IP:PORT: the
// plan of the same Router the gateway routes with, loaded through the same
// path as run. Exit status 0 when the destination is routable, 1 when it is
// denied (or the config does not load), 2 for a wrong command line.
func cmdRoute(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("route", stderr)
	path := fs.String("config", defaultConfig, "the gateway's TOML config file")
	pick := fs.Int("endpoint", 0, "for a service: which of its endpoints to show, counting from 0 (the gateway takes them in turn)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: meshtun route [--config FILE] [--endpoint N] IP:PORT\n\nprints the plan for a flow to IP:PORT (IPv6 as [addr]:port)")
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
	if err != nil || dst.Port() == 0 || dst.Addr().Zone() != "" {
		fmt.Fprintf(stderr, "meshtun route: %q is not IP:PORT (like 10.96.0.10:80 or [fd00::5]:80)\n", rest[0])
		return errUsage
	}
	if *pick < 0 {
		fmt.Fprintf(stderr, "meshtun route: --endpoint %d: must be 0 or more\n", *pick)
		return errUsage
	}

	g, cfg, err := load(*path, stderr, nil)
	if err != nil {
		return err
	}
	plan := g.Router().Route(dst, func(string, int) int { return *pick })
	printPlan(stdout, plan)
	captured := false
	for _, r := range cfg.TUN.Routes {
		if r.Contains(plan.Dst.Addr()) {
			captured = true
		}
	}
	if !captured {
		fmt.Fprintf(stdout, "note:        %s is in none of tun.routes: the kernel does not send it to the gateway\n", plan.Dst.Addr())
	}
	if plan.Kind == gateway.Deny {
		return exitError{1}
	}
	return nil
}

// printPlan writes plan as aligned "key: value" lines.
func printPlan(w io.Writer, p gateway.Plan) {
	line := func(k, v string) { fmt.Fprintf(w, "%-12s %s\n", k+":", v) }
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
		line("mode", "HBONE")
		line("hbone", p.HBONEAddress.String())
		line("authority", p.Target.String())
		line("identities", strings.Join(p.Identities, ", "))
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
