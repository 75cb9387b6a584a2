// Package bench is meshtun's bench harness (`make bench`): it builds the
// standard two-node topology of internal/topo side by side, once with a
// gateway pair (two meshtun processes from the examples/two-nodes
// configs), once with plain routes over the veth (the kernel baseline)
// and once for each peer — a plain TCP relay pair (bench/relay, this
// executable in relay mode) and Istio's Go HBONE pair (hbone-pair from
// interop/istiod) — and runs every scenario on them in the same run, with
// the same load generator (load.go). Each figure is the median of several
// runs with min and max, the pair's ratio to the kernel and to each peer,
// and CPU-seconds per unit of work for each gateway or proxy and for the
// load generator, read from /proc.
//
// Lifecycle: Run builds everything, runs the chosen scenarios, prints
// progress and the tables, writes bench/results/<timestamp>.json and
// removes the namespaces, gateways and temp files, also on failure and on
// cancellation. It needs root. See README.md for the data path and how to
// read the tables.
package bench
