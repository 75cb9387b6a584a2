// Package kubernetes holds no code: this folder is meshtun as a
// Kubernetes DaemonSet (meshtun.yaml: its Namespace, the ConfigMap with
// gateway.toml, the DaemonSet, which runs the image `make image` builds;
// README.md), and its tests hold
// the manifest to the gateway's config and command line, and run the
// pod's commands in a network namespace.
package kubernetes
