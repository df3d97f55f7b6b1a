#!/usr/bin/env bash
# bench-setup.sh: what `npm run bench` needs beyond deploy/host-setup.sh (which CI runs too, so
# it stays out of there and .ci/run does not get slower), when the network section is selected
# (BENCH_SECTIONS unset or naming it): Debian's nginx-light, the network section's baseline (an
# ingress figure beside nginx reverse-proxying the same port), and wrk and curl, its load
# clients for requests/s and downloads (C: a node:http client took more of the 2 cores than the
# proxies it measured). Needs root for apt; without root it says so and the bench reports the
# nginx figure skipped and drives the load with node:http.
set -euo pipefail
sections="${BENCH_SECTIONS:-network}"
case ",${sections// /}," in
  *,network,*) ;;
  *) exit 0 ;;
esac
want=()
if ! [ -x /usr/sbin/nginx ] && ! [ -x /usr/bin/nginx ]; then want+=(nginx-light); fi
command -v wrk >/dev/null 2>&1 || want+=(wrk)
command -v curl >/dev/null 2>&1 || want+=(curl)
if [ ${#want[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" != 0 ]; then
  echo "bench-setup: ${want[*]} not installed and this is not root (sudo apt-get install ${want[*]}); without nginx its figure is skipped, without wrk/curl node:http drives the load" >&2
  exit 0
fi
echo "bench-setup: apt-get install ${want[*]} (the network section's baseline and load clients)"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null 2>&1 || {
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null
}
