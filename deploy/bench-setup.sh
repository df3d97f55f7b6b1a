#!/usr/bin/env bash
# bench-setup.sh: what `npm run bench` needs beyond deploy/host-setup.sh (which CI runs too, so
# it stays out of there and .ci/run does not get slower): Debian's nginx-light, the network
# section's baseline (an ingress figure beside nginx reverse-proxying the same port), when the
# network section is selected (BENCH_SECTIONS unset or naming it) and nginx is missing.
# Needs root for apt; without root it says so and the bench reports the nginx figure skipped.
set -euo pipefail
sections="${BENCH_SECTIONS:-network}"
case ",${sections// /}," in
  *,network,*) ;;
  *) exit 0 ;;
esac
if [ -x /usr/sbin/nginx ] || [ -x /usr/bin/nginx ]; then exit 0; fi
if [ "$(id -u)" != 0 ]; then
  echo "bench-setup: nginx is not installed and this is not root (sudo apt-get install nginx-light); the nginx figure will be skipped" >&2
  exit 0
fi
echo "bench-setup: apt-get install nginx-light (the network section's baseline)"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends nginx-light >/dev/null 2>&1 || {
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends nginx-light >/dev/null
}
