#!/usr/bin/env bash
# docker-engine.sh: make sure a Docker engine answers on this machine (used by .ci/run before
# the container mode of the compat tests). Idempotent:
#   - `docker info` already works            -> prints "already running", exits 0
#   - no `docker`/`dockerd` binary            -> prints what is missing, exits 1
#   - not root (cannot start dockerd)         -> prints why, exits 1
#   - otherwise starts `dockerd` in the background (log: $DOCKERD_LOG, default
#     /tmp/dockerd.log) and waits until `docker info` works, at most $DOCKER_WAIT_S (30) s.
# Exit 0 when an engine answers at the end, 1 otherwise (the log tail is printed).
set -uo pipefail

LOG="${DOCKERD_LOG:-/tmp/dockerd.log}"
WAIT_S="${DOCKER_WAIT_S:-30}"
say() { printf 'docker-engine: %s\n' "$*"; }

if ! command -v docker >/dev/null 2>&1; then
  say "no docker CLI on PATH (apt-get install docker.io); container mode will be skipped"
  exit 1
fi
if docker info >/dev/null 2>&1; then
  say "already running ($(docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?'))"
  exit 0
fi
if ! command -v dockerd >/dev/null 2>&1; then
  say "docker CLI present but no dockerd binary and no engine answers"
  exit 1
fi
if [ "$(id -u)" != 0 ]; then
  say "no engine answers and dockerd needs root to start"
  exit 1
fi

# A dockerd may be starting already (another caller of this script): wait for it instead of
# starting a second one on the same socket.
if pgrep -x dockerd >/dev/null 2>&1; then
  say "dockerd process exists (pid $(pgrep -x dockerd | tr '\n' ' ')) but does not answer yet: waiting"
else
  say "starting dockerd (log: $LOG)"
  nohup dockerd >"$LOG" 2>&1 </dev/null &
  say "dockerd pid $!"
fi

for _ in $(seq 1 $((WAIT_S * 4))); do
  if docker info >/dev/null 2>&1; then
    say "engine answers ($(docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?'))"
    exit 0
  fi
  sleep 0.25
done
say "engine did not answer within ${WAIT_S}s; last lines of $LOG:"
tail -n 20 "$LOG" 2>/dev/null | sed 's/^/  /'
exit 1
