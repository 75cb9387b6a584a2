#!/bin/sh
# Stops the gateway before its files go (on removal, not on upgrade): its
# stop removes the TUN device and its routes.
set -e
case "$1" in
remove|0)
	if [ -d /run/systemd/system ]; then
		systemctl disable --now meshtun.service >/dev/null 2>&1 || true
	fi
	;;
esac
exit 0
