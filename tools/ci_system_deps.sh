#!/usr/bin/env bash
# System tools the deployment tests use: systemd-analyze (systemd), promtool and the prometheus
# server (prometheus). Installs from Debian only when one is missing; safe to run again.
set -euo pipefail
missing=0
for bin in systemd-analyze promtool prometheus; do
    command -v "$bin" >/dev/null 2>&1 || missing=1
done
[ "$missing" = 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
    echo "ci_system_deps: systemd-analyze/promtool/prometheus are missing and this is not root;" \
         "run: sudo apt-get install -y --no-install-recommends systemd prometheus" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends systemd prometheus >/dev/null
# the package starts its own server where an init system runs; the tests start their own
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
    systemctl stop prometheus || true
fi
