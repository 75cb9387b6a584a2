// Package bench is meshtun's bench harness (`make bench`): it builds the
// standard two-node topology of internal/topo twice, side by side — once
// with a gateway pair (two meshtun processes from the examples/two-nodes
// configs) and once with plain routes over the veth (the kernel
// baseline) — and runs every scenario on both in the same run, with the
// same load generator (load.go). Each figure is the median of several runs
// with min and max, the ratio to the kernel, and CPU-seconds per unit of
// work for each gateway and for the load generator, read from /proc.
//
// Lifecycle: Run builds everything, runs the chosen scenarios, prints
// progress and the tables, writes bench/results/<timestamp>.json and
// removes the namespaces, gateways and temp files, also on failure and on
// cancellation. It needs root. See README.md for the data path and how to
// read the tables.
package bench
