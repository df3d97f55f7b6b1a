#!/usr/bin/env bash
# host-setup.sh: make a fresh Debian 12 machine ready to build and run sandnode (idempotent).
# Installs the host parts sandnode drives (runc, busybox-static, e2fsprogs, util-linux,
# fio for benchmarks) with apt when missing, then the npm dependencies when node_modules is
# missing or older than package-lock.json. Needs root for apt; prints what it does.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
for pkg in runc busybox-static e2fsprogs mount fio; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "host-setup: missing ${need[*]}; run as root (or: sudo apt-get install ${need[*]})" >&2
    exit 1
  fi
  echo "host-setup: apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  echo "host-setup: npm ci"
  npm ci --no-audit --no-fund --loglevel=error
fi

if [ "$(id -u)" = 0 ] && [ ! -e /dev/loop-control ]; then
  modprobe loop 2>/dev/null || echo "host-setup: warning: no /dev/loop-control (loop devices unavailable)" >&2
fi
echo "host-setup: ready (runc $(runc --version | head -1 | awk '{print $3}'), node $(node --version))"
