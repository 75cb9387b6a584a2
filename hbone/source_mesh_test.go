package hbone_test

import (
	"github.com/meshtun/meshtun/hbone"
	"github.com/meshtun/meshtun/mesh"
)

// Istio's CA feeds HBONE directly: its certificate manager is a source.
var _ hbone.CertSource = (*mesh.CertManager)(nil)
