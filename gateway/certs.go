package gateway

import (
	"fmt"
	"sync"

	"github.com/meshtun/meshtun/hbone/certfile"
)

// watchCertFiles watches tls.cert, tls.key and tls.trust_bundle (without
// [mesh]) and puts each new set that loads and keeps this gateway's
// identity in force for new HBONE connections; certfile refuses a broken
// set and keeps the old one, and so does installCertificate for one with
// another identity. The goroutine it starts is counted in routines; stop
// ends the watch and, with it, that goroutine.
func (g *Gateway) watchCertFiles(routines *sync.WaitGroup) (stop func(), err error) {
	log := g.log.Named("certfile")
	fs, err := certfile.New(certfile.Options{
		CertFile:        g.cfg.TLS.Cert,
		KeyFile:         g.cfg.TLS.Key,
		TrustBundleFile: g.cfg.TLS.TrustBundle,
		TrustDomain:     g.cfg.Gateway.TrustDomain,
		Logger:          g.log, // certfile names its own logger "certfile"
	})
	if err != nil {
		return nil, fmt.Errorf("gateway: tls.cert/tls.key/tls.trust_bundle: %w", err)
	}
	changed, _ := fs.Subscribe() // closed by fs.Close
	routines.Add(1)
	go func() {
		defer routines.Done()
		for range changed {
			cert, roots, expiry := fs.Current()
			if cert == nil {
				continue // expired: certfile said so; HBONE refuses the expired one in force
			}
			if err := g.installCertificate(cert, roots); err != nil {
				log.Error("new certificate files refused; the certificate in force stays", "error", err)
				continue
			}
			log.Info("new certificate in force for new HBONE connections", "identity", g.identity, "expiry", expiry)
		}
	}()
	return func() { fs.Close() }, nil
}
