#!/bin/sh
# After removal systemd forgets the unit; a purge also removes what the
# gateway and the operator left in /etc/meshtun. The meshtun user stays,
# as Debian's policy asks (files it owned may remain elsewhere).
set -e
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi
if [ "$1" = "purge" ]; then
	rm -rf /etc/meshtun
fi
exit 0
