#!/bin/sh
# Creates the meshtun user and tells systemd of the unit; starts nothing:
# the operator writes /etc/meshtun/gateway.toml and enables the service.
set -e
if command -v systemd-sysusers >/dev/null 2>&1; then
	systemd-sysusers /usr/lib/sysusers.d/meshtun.conf
elif ! getent passwd meshtun >/dev/null 2>&1; then
	useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin meshtun
fi
chgrp meshtun /etc/meshtun/gateway.toml /etc/meshtun/tls 2>/dev/null || true
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || true
fi
if [ "$1" = "configure" ] && [ -z "$2" ] || [ "$1" = "1" ]; then
	echo "meshtun: installed, not started. Write /etc/meshtun/gateway.toml (meshtun init --istio DIR writes one from Istio's VM files),"
	echo "         check it with meshtun validate, then: systemctl enable --now meshtun"
fi
exit 0
