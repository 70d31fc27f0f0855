#!/usr/bin/env bash
# System tools the tests use: systemd-analyze (systemd), promtool and the prometheus server
# (prometheus) for the deployment tests; redis-server (redis-server) and haproxy (haproxy) for the
# shared snapshot tier and load-balancer tests; qemu-x86_64 (qemu-user), where it installs, to run the
# SSSE3 kernels on an emulated pre-AVX CPU (its test skips without it). Installs from Debian only
# what is missing; safe to run again.
set -euo pipefail
needed=() optional=()
for bin in systemd-analyze promtool prometheus; do
    command -v "$bin" >/dev/null 2>&1 || { needed=(systemd prometheus); break; }
done
for bin in redis-server haproxy; do
    command -v "$bin" >/dev/null 2>&1 || needed+=("$bin")
done
command -v qemu-x86_64 >/dev/null 2>&1 || optional=(qemu-user)
[ ${#needed[@]} = 0 ] && [ ${#optional[@]} = 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
    echo "ci_system_deps: missing tools and not root; run: sudo apt-get install -y --no-install-recommends" \
         "${needed[*]} ${optional[*]}" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
if [ ${#needed[@]} != 0 ]; then
    apt-get install -y -qq --no-install-recommends "${needed[@]}" >/dev/null
    # the package starts its own server where an init system runs; the tests start their own
    if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
        systemctl stop prometheus || true
    fi
    for unit in redis-server haproxy; do
        if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$unit" 2>/dev/null; then
            systemctl stop "$unit" || true
        fi
    done
fi
if [ ${#optional[@]} != 0 ]; then
    apt-get install -y -qq --no-install-recommends "${optional[@]}" >/dev/null ||
        echo "ci_system_deps: ${optional[*]} did not install; the emulated-CPU test will skip" >&2
fi
