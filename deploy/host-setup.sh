#!/usr/bin/env bash
# host-setup.sh: make a fresh Debian 12 machine ready to build and run sandnode (idempotent).
# Installs the host parts sandnode drives (runc, busybox-static, e2fsprogs, xfsprogs for the
# ublk-manager's image pool (an XFS reflink file system in a file), util-linux,
# fio for benchmarks, shellcheck for npm run lint, openssl for `sandnode certs init`, acl: setfacl lets the user namespace root pass a 0700 parent of the run dir, nftables +
# iproute2 for sandbox networking (docs/network.md), iptables for Docker's DOCKER-USER chain, curl for the network tests, tmux for the CLI's `exec -it` test under a real terminal) with apt when missing; Node 24 (deploy/node-version) from the npm
# registry into .toolchain/ when the machine's node is older than 22 (deploy/toolchain.sh);
# then, on that Node (deploy/node-env.sh), the npm dependencies when node_modules is missing
# or was not installed from package-lock.json (deploy/lock-current.js compares the content), and a rebuild of the native addons when node_modules was
# built for another Node ABI (node_modules/.sandnode-node.json records the Node it was built
# for; `sandnode upgrade --from-build` runs a build's daemons on that Node). Needs root for
# apt; prints what it does.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
for pkg in runc busybox-static e2fsprogs xfsprogs mount fio shellcheck openssl acl nftables iproute2 iptables curl tmux; do
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

sys_major="$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)"
if [ "$sys_major" -lt 22 ]; then
  tc="$(bash deploy/toolchain.sh)"
  echo "host-setup: node $(node --version 2>/dev/null || echo '(none)') is older than 22: using node $("$tc/bin/node" --version) in ${tc#"$PWD"/}"
fi
# shellcheck source=deploy/node-env.sh
. deploy/node-env.sh

MARKER=node_modules/.sandnode-node.json
abi="$(node -p process.versions.modules)"
if ! stale="$(node deploy/lock-current.js)"; then
  echo "host-setup: npm ci (node $(node --version)): ${stale}"
  npm ci --no-audit --no-fund --loglevel=error
elif [ "$(node -e 'try { process.stdout.write(String(require(process.argv[1]).modules)) } catch {}' "$PWD/$MARKER")" != "$abi" ]; then
  echo "host-setup: node_modules was not built for node $(node --version) (ABI $abi): npm rebuild"
  npm rebuild --loglevel=error
fi
node -e 'require("fs").writeFileSync(process.argv[1], JSON.stringify({ node: process.execPath, version: process.versions.node, modules: process.versions.modules }) + "\n")' "$MARKER"

if [ "$(id -u)" = 0 ] && [ ! -e /dev/loop-control ]; then
  modprobe loop 2>/dev/null || echo "host-setup: warning: no /dev/loop-control (loop devices unavailable)" >&2
fi
echo "host-setup: ready (runc $(runc --version | head -1 | awk '{print $3}'), node $(node --version) at $(command -v node))"
