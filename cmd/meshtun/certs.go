package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/meshtun/meshtun/hbone/devca"
	"github.com/meshtun/meshtun/identity"
)

func cmdCerts(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("certs", stderr)
	out := fs.String("out", ".", "directory for ca.pem, ca-key.pem and NAME.pem, NAME-key.pem")
	td := fs.String("trust-domain", "cluster.local", "SPIFFE trust domain of a new CA, and of NAMEs given without an ID")
	ns := fs.String("namespace", "meshtun", "namespace of NAMEs given without an ID")
	fs.Usage = func() {
		fmt.Fprintln(stderr, `usage: meshtun certs [--out DIR] [--trust-domain TD] NAME[=SPIFFE_ID]...

Makes a development CA in DIR (or reuses the one there) and, for each NAME,
a key and certificate NAME.pem / NAME-key.pem whose URI SAN is SPIFFE_ID
(default spiffe://TD/ns/NAMESPACE/sa/NAME). Not for production.`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return errUsage
	}
	ca, created, err := devca.LoadOrCreate(*out, *td)
	if err != nil {
		return err
	}
	if created {
		fmt.Fprintf(stdout, "created CA %s/%s for trust domain %s\n", *out, devca.CAFile, *td)
	}
	for _, arg := range fs.Args() {
		name, id, ok := strings.Cut(arg, "=")
		if !ok {
			id = fmt.Sprintf("spiffe://%s/ns/%s/sa/%s", *td, *ns, name)
		}
		if name == "" || strings.ContainsAny(name, "/\\") {
			return fmt.Errorf("%q: NAME must be a plain file name", arg)
		}
		if _, err := identity.Parse(id); err != nil {
			return fmt.Errorf("%q: %w", arg, err)
		}
		certPath, keyPath, err := ca.WriteLeaf(*out, name, id)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s: %s, %s\n", id, certPath, keyPath)
	}
	return nil
}
