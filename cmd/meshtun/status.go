package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshtun/meshtun/config"
	"github.com/meshtun/meshtun/gateway"
)

// cmdStatus prints what a running gateway is doing, from its admin
// listener (GET /status): identity and certificate expiry, istiod
// connected or why not, the entries in force and their sources, peers and
// pooled HBONE connections, open flows and the latest errors; --json
// prints the answer as it came. Exit status 0 when the gateway answered,
// 2 for a wrong command line or an admin listener that does not answer.
func cmdStatus(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("status", stderr)
	admin := adminFlags(fs)
	asJSON := fs.Bool("json", false, "print the admin listener's JSON answer")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: meshtun status [--admin HOST:PORT | --config FILE] [--json]\n\nprints what the running gateway is doing, from its admin listener")
		fs.PrintDefaults()
	}
	if err := parseNoArgs(fs, args, "status"); err != nil {
		return err
	}
	addr, err := admin.addr(fs, stderr, "status")
	if err != nil {
		return err
	}
	var st gateway.StatusAnswer
	raw, err := adminGetJSON(addr, "/status", &st, "a status")
	if err != nil {
		fmt.Fprintf(stderr, "meshtun status: admin listener %s: %v\n", addr, err)
		return exitError{2}
	}
	if *asJSON {
		_, err := stdout.Write(raw)
		return err
	}
	printStatus(stdout, st)
	return nil
}

// cmdFlows lists the flows a running gateway relays (GET /flows), oldest
// first, a page at a time.
func cmdFlows(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("flows", stderr)
	admin := adminFlags(fs)
	asJSON := fs.Bool("json", false, "print the admin listener's JSON answer")
	limit := fs.Int("limit", 100, "flows to list, at most 1000")
	offset := fs.Int("offset", 0, "flows to skip, oldest first")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: meshtun flows [--admin HOST:PORT | --config FILE] [--limit N] [--offset M] [--json]\n\nlists the flows the running gateway relays, oldest first")
		fs.PrintDefaults()
	}
	if err := parseNoArgs(fs, args, "flows"); err != nil {
		return err
	}
	if *limit < 0 || *limit > 1000 || *offset < 0 {
		fmt.Fprintf(stderr, "meshtun flows: --limit %d --offset %d: want a limit from 0 to 1000 and an offset of 0 or more\n", *limit, *offset)
		return errUsage
	}
	addr, err := admin.addr(fs, stderr, "flows")
	if err != nil {
		return err
	}
	q := url.Values{"limit": {strconv.Itoa(*limit)}, "offset": {strconv.Itoa(*offset)}}
	var fa gateway.FlowsAnswer
	raw, err := adminGetJSON(addr, "/flows?"+q.Encode(), &fa, "a page of flows")
	if err != nil {
		fmt.Fprintf(stderr, "meshtun flows: admin listener %s: %v\n", addr, err)
		return exitError{2}
	}
	if *asJSON {
		_, err := stdout.Write(raw)
		return err
	}
	printFlows(stdout, fa)
	return nil
}

// adminTarget is where status and flows ask: --admin, or the
// admin.listen of --config.
type adminTarget struct {
	admin, config *string
}

func adminFlags(fs *flag.FlagSet) adminTarget {
	return adminTarget{
		admin:  fs.String("admin", "", "the running gateway's admin.listen host:port (default: admin.listen of --config)"),
		config: fs.String("config", defaultConfig, "the gateway's TOML config file, for its admin.listen"),
	}
}

func (a adminTarget) addr(fs *flag.FlagSet, stderr io.Writer, cmd string) (string, error) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["admin"] && set["config"] {
		fmt.Fprintf(stderr, "meshtun %s: --admin and --config exclude each other\n", cmd)
		return "", errUsage
	}
	addr := *a.admin
	if !set["admin"] {
		data, err := os.ReadFile(*a.config)
		if err != nil {
			fmt.Fprintf(stderr, "meshtun %s: %v (or name the admin listener with --admin HOST:PORT)\n", cmd, err)
			return "", exitError{2}
		}
		cfg, err := config.Parse(data, *a.config)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return "", exitError{2}
		}
		if addr = cfg.Admin.Listen; addr == "" {
			fmt.Fprintf(stderr, "meshtun %s: %s: admin.listen is empty: the gateway serves no admin listener to ask\n", cmd, *a.config)
			return "", exitError{2}
		}
	}
	if err := checkHostPort(addr); err != nil {
		fmt.Fprintf(stderr, "meshtun %s: admin listener %q: %v\n", cmd, addr, err)
		return "", errUsage
	}
	return addr, nil
}

// parseNoArgs parses args, which must hold flags only.
func parseNoArgs(fs *flag.FlagSet, args []string, cmd string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "meshtun %s: unexpected argument %q\n", cmd, fs.Arg(0))
		fs.Usage()
		return errUsage
	}
	return nil
}

// adminGetJSON asks the admin listener at addr for path and decodes its
// JSON answer into v, which is what (a plan, …); it returns the answer as
// it came. route, status and flows ask through it.
func adminGetJSON(addr, path string, v any, what string) ([]byte, error) {
	client := &http.Client{Timeout: adminTimeout}
	resp, err := client.Get("http://" + addr + path)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("cannot ask it (is the gateway running with admin.listen there?): %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAdminAnswer))
	if err != nil {
		return nil, fmt.Errorf("reading the answer: %w", err)
	}
	name := strings.SplitN(path, "?", 2)[0]
	if resp.StatusCode != http.StatusOK {
		msg := strings.TrimSpace(string(body))
		if len(msg) > 300 {
			msg = msg[:300] + "…"
		}
		hint := ""
		if resp.StatusCode == http.StatusNotFound {
			hint = " (not a meshtun admin listener, or one too old to have " + name + ")"
		}
		return nil, fmt.Errorf("GET %s answered %s%s: %s", name, resp.Status, hint, msg)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return nil, fmt.Errorf("the answer to GET %s is not %s: %w", name, what, err)
	}
	return body, nil
}

// maxAdminAnswer bounds what is read of an answer: a plan or /status is a
// few kilobytes, a page of /flows 1,000 flows of well under a kilobyte
// each, and an error body is shown, not stored.
const maxAdminAnswer = 4 << 20

func printStatus(w io.Writer, st gateway.StatusAnswer) {
	line := func(k, format string, a ...any) { fmt.Fprintf(w, "%-12s %s\n", k+":", fmt.Sprintf(format, a...)) }
	name := st.Name
	if name == "" {
		name = "-"
	}
	line("gateway", "%s", name)
	line("identity", "%s", orDash(st.Identity))
	c := st.Certificate
	switch {
	case c.NotAfter.IsZero():
		line("certificate", "none yet (%s)", c.Source)
	default:
		left := c.NotAfter.Sub(st.Now)
		state := "expires in " + roundDuration(left)
		if left <= 0 {
			state = "EXPIRED " + roundDuration(-left) + " ago"
		}
		line("certificate", "from %s, %s (%s)", c.Source, state, c.NotAfter.Format(time.RFC3339))
	}
	if x := st.XDS; x != nil {
		state := "connected"
		if !x.Connected {
			state = "NOT connected"
			if x.LastError != "" {
				state += ": " + x.LastError
			}
		}
		if x.Connected && !x.Ready {
			state += ", waiting for a complete state"
		}
		line("istiod", "%s %s (%d updates, %d reconnects)", x.Address, state, x.Updates, x.Reconnects)
	} else {
		line("istiod", "off (no [mesh]: the file's entries only)")
	}
	line("workloads", "%s", bySource(st.Workloads))
	line("services", "%s", bySource(st.Services))
	line("policies", "%s", bySource(st.Policies))
	if st.Rejected > 0 || st.Clashes > 0 {
		line("not used", "%d of istiod's resources rejected, %d dropped for the file's", st.Rejected, st.Clashes)
	}
	line("flows", "%d outbound, %d inbound open (%d refused at max_flows_per_source)",
		st.Flows.Outbound, st.Flows.Inbound, st.Flows.RefusedOverLimit)
	p := st.Pool
	line("hbone pool", "%d connections carrying %d streams (%d opened, %d dials failed; streams %d opened, %d failed)",
		p.Conns, p.Streams, p.ConnsOpened, p.DialsFailed, p.StreamsOpened, p.StreamsFailed)
	if len(st.Peers) > 0 {
		fmt.Fprintln(w, "\npeers:")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  ADDRESS\tIDENTITY\tCONNS\tSTREAMS")
		for _, pe := range st.Peers {
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\n", pe.Address, pe.Identity, pe.Conns, pe.Streams)
		}
		tw.Flush()
	}
	if len(st.Errors) > 0 {
		fmt.Fprintln(w, "\nlatest errors:")
		for _, e := range st.Errors {
			at := ""
			if !e.At.IsZero() {
				at = " (" + roundDuration(st.Now.Sub(e.At)) + " ago)"
			}
			fmt.Fprintf(w, "  %s: %s%s\n", e.Source, e.Message, at)
		}
	}
}

func printFlows(w io.Writer, fa gateway.FlowsAnswer) {
	if len(fa.Flows) == 0 {
		fmt.Fprintf(w, "no flows listed: %d relayed, %d being set up\n", fa.Total, fa.Setup)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DIRECTION\tSOURCE\tDESTINATION\tPEER\tSENT\tRECEIVED\tAGE")
	for _, f := range fa.Flows {
		dst := f.Dst.String()
		if f.Service != "" {
			dst += " (" + f.Service + ")"
		}
		peer := orDash(f.PeerIdentity)
		if f.HBONEAddr.IsValid() {
			peer += " @ " + f.HBONEAddr.String()
		}
		src := "-"
		if f.Src.IsValid() {
			src = f.Src.String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", f.Direction, src, dst, peer,
			byteCount(f.BytesSent), byteCount(f.BytesRecv), roundDuration(time.Duration(f.AgeSeconds*float64(time.Second))))
	}
	tw.Flush()
	shown := fmt.Sprintf("%d–%d", fa.Offset+1, fa.Offset+len(fa.Flows))
	fmt.Fprintf(w, "\nflows %s of %d relayed (%d being set up)", shown, fa.Total, fa.Setup)
	if next := fa.Offset + len(fa.Flows); next < fa.Total {
		fmt.Fprintf(w, "; the next page: --offset %d", next)
	}
	fmt.Fprintln(w)
}

// bySource writes counts by source as "12 (file 2, xds 10)".
func bySource(m map[string]int) string {
	total := 0
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		total += m[k]
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	if len(parts) == 0 {
		return "0"
	}
	return fmt.Sprintf("%d (%s)", total, strings.Join(parts, ", "))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// roundDuration writes d to a precision a person reads: 3d4h, 5h2m, 4m10s,
// 12s, 340ms.
func roundDuration(d time.Duration) string {
	switch {
	case d >= 48*time.Hour:
		days := d / (24 * time.Hour)
		return fmt.Sprintf("%dd%dh", days, (d-days*24*time.Hour)/time.Hour)
	case d >= time.Hour:
		return d.Truncate(time.Minute).String()
	case d >= time.Minute:
		return d.Truncate(time.Second).String()
	case d >= time.Second:
		return d.Truncate(100 * time.Millisecond).String()
	default:
		return d.Truncate(time.Millisecond).String()
	}
}

// byteCount writes n bytes as 512B, 1.5KiB, 3.2MiB, 1.1GiB.
func byteCount(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + "B"
	}
	v, suffix := float64(n)/unit, "KiB"
	for _, s := range []string{"MiB", "GiB", "TiB"} {
		if v < unit {
			break
		}
		v, suffix = v/unit, s
	}
	return strconv.FormatFloat(v, 'f', 1, 64) + suffix
}
