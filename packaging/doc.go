// Package packaging holds no code: this folder is meshtun's .deb and .rpm
// (nfpm.yaml, the maintainer scripts, the sysusers entry, the man page,
// lintian's overrides), which `make package` builds, and their test, which
// builds them the same way, checks both with Debian's and Red Hat's own
// tools, and installs, validates, removes and purges the .deb on this
// machine as root.
package packaging
