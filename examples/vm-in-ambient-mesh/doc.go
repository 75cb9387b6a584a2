// Package vminambientmesh holds no code: this folder is the walkthrough of
// a VM joining an Istio ambient mesh (README.md, vm.yaml, gateway.toml),
// and its test keeps gateway.toml loadable by the gateway's own load path.
// `make demo-mesh` runs the walkthrough (interop/istiod/cmd/demo-mesh).
package vminambientmesh
