// Package mesh speaks to Istio's control plane: certificates from Istio's
// CA and workloads, services and policies over delta ADS.
package mesh
