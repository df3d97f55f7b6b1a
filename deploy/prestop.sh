#!/usr/bin/env bash
# prestop.sh: the pre-stop hook of a sandnode node (ARCHITECTURE.md section 4 "Drain").
#
#   prestop.sh [drain]   pause and persist every running sandbox via `sandnode drain`, bounded
#                        by a deadline below the pod's grace period (server slot containers)
#   prestop.sh wait      hold this container's stop until that drain has finished, bounded by
#                        the same deadline (vmm and ublk containers: the drain needs them alive)
#
# Environment (all optional):
#   SANDNODE_PRESTOP_DEADLINE_S  whole budget of this hook, seconds (default 45)
#   SANDNODE_GRACE_PERIOD_S      the pod's terminationGracePeriodSeconds (default 60); the hook
#                                refuses to start (exit 2) when the deadline is not below it
#   SANDNODE_PRESTOP_MARGIN_S    what the drain leaves of the budget for reporting (default 5):
#                                the drain RPC gets deadline - margin, the CLI is killed at deadline
#   SANDNODE_CLI                 the operator CLI command (default: deploy/node-env.sh node <repo>/
#                                tools/cli/dist/main.js)
#   SANDNODE_RUN_DIR, SANDNODE_STATE_DIR   the node's dirs (read by the CLI too; defaults
#                                ./.sandnode/run and ./.sandnode/state, /run/sandnode and
#                                /var/lib/sandnode in the pod)
#
# Exit codes: 0 whenever the drain ran, even when it failed or timed out, so that the kubelet
# goes on stopping the pod (a failed drain is logged loudly, here and in
# <stateDir>/prestop.log, which is on the host and outlives the pod); 2 when the settings are
# invalid (the kubelet records FailedPreStopHook and stops the pod anyway).
set -uo pipefail

MODE="${1:-drain}"
DEADLINE_S="${SANDNODE_PRESTOP_DEADLINE_S:-45}"
GRACE_S="${SANDNODE_GRACE_PERIOD_S:-60}"
MARGIN_S="${SANDNODE_PRESTOP_MARGIN_S:-5}"
RUN_DIR="${SANDNODE_RUN_DIR:-./.sandnode/run}"
STATE_DIR="${SANDNODE_STATE_DIR:-./.sandnode/state}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
START_S="$(date +%s)"
LOG_FILE=""

log() { # log LEVEL MESSAGE...: one line on stderr (and in the log file when it is writable)
  local line
  line="$(date -u +%Y-%m-%dT%H:%M:%SZ) prestop[$$] $MODE $1: ${*:2}"
  printf '%s\n' "$line" >&2
  if [ -n "$LOG_FILE" ]; then printf '%s\n' "$line" >>"$LOG_FILE" 2>/dev/null || true; fi
}
refuse() { log ERROR "refusing to start: $*"; exit 2; }

case "$MODE" in drain | wait) ;; *) refuse "unknown mode \"$MODE\" (expected drain or wait)" ;; esac
for v in DEADLINE_S:SANDNODE_PRESTOP_DEADLINE_S GRACE_S:SANDNODE_GRACE_PERIOD_S MARGIN_S:SANDNODE_PRESTOP_MARGIN_S; do
  var="${v%%:*}"
  [[ "${!var}" =~ ^[0-9]+$ ]] || refuse "${v#*:}=${!var} is not a whole number of seconds"
done
if [ "$DEADLINE_S" -ge "$GRACE_S" ]; then
  refuse "SANDNODE_PRESTOP_DEADLINE_S=$DEADLINE_S must be below SANDNODE_GRACE_PERIOD_S=$GRACE_S (the kubelet kills the pod when the grace period ends, drained or not)"
fi
if [ "$DEADLINE_S" -le $((MARGIN_S + 1)) ]; then
  refuse "SANDNODE_PRESTOP_DEADLINE_S=$DEADLINE_S leaves no time for the drain (margin ${MARGIN_S}s + 1s)"
fi

mkdir -p "$RUN_DIR" 2>/dev/null || true
if mkdir -p "$STATE_DIR" 2>/dev/null && touch "$STATE_DIR/prestop.log" 2>/dev/null; then
  LOG_FILE="$STATE_DIR/prestop.log"
fi
LOCK="$RUN_DIR/prestop.lock"   # held by the process that drains
DONE="$RUN_DIR/prestop.done"   # written when a drain has finished (its summary)

# done_recently: a drain finished during this stop (within one deadline of our start; the run
# dir is an emptyDir in the pod, so an older file can only come from a local run).
done_recently() {
  [ -f "$DONE" ] || return 1
  local mtime
  mtime="$(stat -c %Y "$DONE" 2>/dev/null)" || return 1
  [ "$mtime" -ge $((START_S - DEADLINE_S)) ]
}
remaining() { echo $((DEADLINE_S - ($(date +%s) - START_S))); }

if [ "$MODE" = wait ]; then
  # Stay up while the drain runs; give up at the deadline, or after 5 s when nobody drains.
  while [ "$(remaining)" -gt 0 ]; do
    if done_recently; then
      log INFO "drain finished after $(($(date +%s) - START_S))s: $(tail -n 1 "$DONE" 2>/dev/null)"
      exit 0
    fi
    if [ $(($(date +%s) - START_S)) -ge 5 ] && flock -n "$LOCK" true 2>/dev/null; then
      log WARN "no drain is running (no server slot holds $LOCK); stopping without waiting"
      exit 0
    fi
    sleep 0.5
  done
  log ERROR "drain did not finish within ${DEADLINE_S}s; stopping anyway"
  exit 0
fi

# drain: one drain per stop, whichever server slot gets here first; the other waits for it.
if (: >>"$LOCK") 2>/dev/null; then
  exec 9>>"$LOCK"
  if ! flock -w "$((DEADLINE_S - 1))" 9; then
    log ERROR "another drain held $LOCK for ${DEADLINE_S}s; stopping anyway"
    exit 0
  fi
else
  log WARN "cannot open $LOCK; draining without the lock"
fi
if done_recently; then
  log INFO "another server slot already drained: $(tail -n 1 "$DONE" 2>/dev/null)"
  exit 0
fi

LEFT="$(remaining)"
if [ "$LEFT" -le $((MARGIN_S + 1)) ]; then
  log ERROR "only ${LEFT}s of the ${DEADLINE_S}s deadline left; no time to drain; sandboxes were NOT preserved by this hook"
  exit 0
fi
DRAIN_MS=$(((LEFT - MARGIN_S) * 1000))
if [ -n "${SANDNODE_CLI:-}" ]; then
  read -r -a CLI <<<"$SANDNODE_CLI"
else
  CLI=("$HERE/node-env.sh" node "$HERE/../tools/cli/dist/main.js")
fi

log INFO "draining: ${CLI[*]} drain --deadline-ms $DRAIN_MS --json (killed after $((LEFT - 1))s; grace period ${GRACE_S}s)"
OUT="$(mktemp)"
ERR="$(mktemp)"
trap 'rm -f "$OUT" "$ERR"' EXIT
timeout --kill-after=1 "$((LEFT - 1))" "${CLI[@]}" drain --deadline-ms "$DRAIN_MS" --json >"$OUT" 2>"$ERR"
RC=$?
ELAPSED=$(($(date +%s) - START_S))

# Summarise the CLI's JSON (DrainResponse: sandboxes[{sandbox_id, outcome, error}],
# duration_ms, device_manager_stopped); print it raw when it is not JSON.
# shellcheck disable=SC2016 # the single-quoted script is JavaScript, not shell
SUMMARY="$("$HERE/node-env.sh" node -e '
  const fs = require("node:fs");
  let r;
  try { r = JSON.parse(fs.readFileSync(process.argv[1], "utf8")); } catch { process.exit(3); }
  const list = Array.isArray(r.sandboxes) ? r.sandboxes : [];
  const id = (s) => s.sandbox_id ?? s.sandboxId ?? s.id ?? "?";
  const outcome = (s) => String(s.outcome ?? "").toUpperCase();
  const ok = list.filter((s) => outcome(s) === "1" || outcome(s).includes("PRESERVED"));
  const bad = list.filter((s) => !ok.includes(s));
  const dm = r.device_manager_stopped ?? r.deviceManagerStopped;
  const lines = [`preserved ${ok.length}, failed ${bad.length} of ${list.length} sandboxes; device manager stopped: ${dm === true ? "yes" : dm === false ? "NO" : "unknown"}; drain took ${r.duration_ms ?? r.durationMs ?? "?"} ms`];
  for (const s of ok) lines.push(`  preserved ${id(s)}${s.resume_method ?? s.resumeMethod ? ` (resume: ${s.resume_method ?? s.resumeMethod})` : ""}`);
  for (const s of bad) lines.push(`  FAILED    ${id(s)}: ${s.error || "no error given"}`);
  process.stdout.write(lines.join("\n"));
  process.exitCode = bad.length > 0 || dm === false ? 1 : 0;
' "$OUT" 2>/dev/null)"
SUMMARY_RC=$?

if [ "$RC" -eq 0 ] && [ "$SUMMARY_RC" -eq 0 ]; then
  log INFO "drain done in ${ELAPSED}s: ${SUMMARY%%$'\n'*}"
  while IFS= read -r l; do log INFO "$l"; done <<<"${SUMMARY#*$'\n'}"
else
  case "$RC" in
    0) why="the drain reported failures" ;;
    124 | 137) why="the drain did not return within $((LEFT - 1))s and was killed (exit $RC)" ;;
    *) why="the drain command failed (exit $RC)" ;;
  esac
  log ERROR "!!! DRAIN INCOMPLETE: $why; sandboxes not listed as preserved below may be LOST when the pod stops !!!"
  if [ "$SUMMARY_RC" -le 1 ] && [ -n "$SUMMARY" ]; then
    while IFS= read -r l; do log ERROR "$l"; done <<<"$SUMMARY"
  elif [ -s "$OUT" ]; then
    while IFS= read -r l; do log ERROR "drain output: $l"; done <"$OUT"
  fi
  while IFS= read -r l; do log ERROR "drain stderr: $l"; done < <(tail -n 20 "$ERR")
fi
printf '%s rc=%s %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$RC" "${SUMMARY%%$'\n'*}" >>"$DONE" 2>/dev/null || true
exit 0
