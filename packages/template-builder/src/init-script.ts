/** The sandbox init (/sbin/sandnode-init) every template carries. */
import path from 'node:path';
import { ROOTFS_PATHS } from './layout';

/**
 * initScript is /sbin/sandnode-init, PID 1 of a sandbox: a busybox sh script that runs podd (through
 * podd-boot.js, which turns on podd's compile cache) in
 * the background (stdout and stderr appended to /run/sandnode/podd.log), restarts it when it
 * dies (backoff 0.2 s, 0.5 s, 1 s, 2 s, then 5 s; reset after 10 s of uptime) with the init's
 * pid unchanged, reaps orphans (busybox ash waits with waitpid(-1)), and on SIGTERM or SIGINT
 * sends TERM to podd, waits for it (SIGKILL after 10 s) and exits 0.
 */
export function initScript(): string {
  const p = ROOTFS_PATHS;
  return `#!/bin/busybox sh
# sandnode-init: PID 1 of a sandnode sandbox (written by the template builder).
# Runs podd, restarts it when it dies, reaps orphans; SIGTERM/SIGINT: TERM podd, exit 0.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=\${HOME:-/root}
LOG=${p.poddLog}
mkdir -p ${path.dirname(p.poddSocket)}
podd=0
stopping=0
log() { echo "sandnode-init[$$] $(date -u +%Y-%m-%dT%H:%M:%SZ): $*" >>"$LOG"; }
on_term() {
  stopping=1
  if [ "$podd" -gt 0 ]; then
    kill -TERM "$podd" 2>/dev/null
    ( sleep 10; kill -KILL "$podd" 2>/dev/null ) &
  fi
}
trap on_term TERM INT
delay=0
log "starting"
while [ "$stopping" = 0 ]; do
  started=$(date +%s)
  # podd serves fd 3 when the host hands in its socket (SANDNODE_PODD_LISTEN_FD=3); --socket
  # is the fallback for a runtime that does not.
  # podd's soft RLIMIT_NOFILE is raised to the hard one (its Exec streams hold pipes).
  ( ulimit -n "$(ulimit -Hn)" 2>/dev/null; exec ${p.node} ${p.poddBoot} --socket ${p.poddSocket} ) </dev/null >>"$LOG" 2>&1 &
  podd=$!
  log "podd started, pid $podd"
  # wait returns early when a trapped signal arrives: wait again until podd is gone.
  while :; do
    wait "$podd"
    status=$?
    kill -0 "$podd" 2>/dev/null || break
  done
  podd=0
  [ "$stopping" = 0 ] || break
  ran=$(( $(date +%s) - started ))
  if [ "$ran" -ge 10 ]; then delay=0; fi
  case "$delay" in
    0) delay=0.2 ;;
    0.2) delay=0.5 ;;
    0.5) delay=1 ;;
    1) delay=2 ;;
    *) delay=5 ;;
  esac
  log "podd exited with status $status after \${ran}s; restarting in \${delay}s"
  sleep "$delay" &
  wait $!
done
log "stopped"
exit 0
`;
}
