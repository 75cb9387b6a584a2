// Command meshtun is the node gateway: it captures the node's mesh traffic
// in a TUN device and carries every TCP connection over HBONE to the
// destination's gateway, and it serves HBONE for the node's own
// destinations.
//
//	meshtun run --config gateway.toml       run the gateway
//	meshtun validate --config gateway.toml  check a config, print every error
//	meshtun route --config gateway.toml IP:PORT  print the plan for a destination
//	meshtun certs --out DIR NAME[=ID]...    make a development CA and certificates
//	meshtun cleanup --config gateway.toml   remove a device and routes left by a crash
//	meshtun version
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = ""

type command struct {
	name    string
	summary string
	run     func(args []string, stdout, stderr io.Writer) error
}

var commands = []command{
	{"run", "run the gateway", cmdRun},
	{"validate", "check a config file and print every problem", cmdValidate},
	{"init", "write a gateway.toml from Istio's VM files (istioctl x workload entry configure)", cmdInit},
	{"route", "print the plan for a destination IP:PORT", cmdRoute},
	{"status", "print what the running gateway is doing", cmdStatus},
	{"flows", "list the flows the running gateway relays", cmdFlows},
	{"certs", "make a development CA and SPIFFE certificates", cmdCerts},
	{"cleanup", "remove the TUN device and routes a crashed gateway left", cmdCleanup},
	{"version", "print the version", cmdVersion},
}

// errUsage is returned for a wrong command line; its message was printed.
var errUsage = errors.New("usage")

// exitError carries a specific exit status.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func main() {
	os.Exit(runMain(os.Args[1:], os.Stdout, os.Stderr))
}

func runMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands {
		if c.name != args[0] {
			continue
		}
		err := c.run(args[1:], stdout, stderr)
		var ee exitError
		switch {
		case err == nil:
			return 0
		case errors.Is(err, errUsage), errors.Is(err, flag.ErrHelp):
			return 2
		case errors.As(err, &ee):
			return ee.code
		default:
			fmt.Fprintf(stderr, "meshtun %s: %v\n", c.name, err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "meshtun: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: meshtun <command> [flags]\n\ncommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nrun 'meshtun <command> -h' for a command's flags")
}

func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("meshtun "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

func cmdVersion(args []string, stdout, stderr io.Writer) error {
	v := version
	if v == "" {
		v = "(devel)"
		if bi, ok := debug.ReadBuildInfo(); ok {
			if bi.Main.Version != "" {
				v = bi.Main.Version
			}
			for _, s := range bi.Settings {
				if s.Key == "vcs.revision" && len(s.Value) >= 12 {
					v += " " + s.Value[:12]
				}
			}
		}
	}
	fmt.Fprintln(stdout, "meshtun", v)
	return nil
}
