#!/usr/bin/env bash
# node-env.sh: run a command (or, when sourced, this shell) on the project's Node.
#
#   bash deploy/node-env.sh CMD [ARGS...]   exec CMD with the project's Node first on PATH
#   . deploy/node-env.sh                    the same for the current shell (interactive work)
#
# The project's Node is <repo>/.toolchain/node-<deploy/node-version>/ when deploy/host-setup.sh
# put it there (the machine's node was older than 22); then PATH starts with its bin/ (so
# `node`, and npm/npx, whose shebang is `env node`, run on it) and npm_config_nodedir names
# its headers (native addons are compiled for its ABI, not for ~/.npmrc's nodedir). Without a
# toolchain the machine's node is used as it is, when it is 22 or newer; else this refuses
# (exit 1) and says to run deploy/host-setup.sh.
_sandnode_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_sandnode_tc="${SANDNODE_TOOLCHAIN_DIR:-$_sandnode_root/.toolchain}/node-$(tr -d '[:space:]' <"$_sandnode_root/deploy/node-version")"
_sandnode_ok=1
if [ -x "$_sandnode_tc/bin/node" ]; then
  case ":$PATH:" in
    "$_sandnode_tc/bin:"*) ;;
    *) PATH="$_sandnode_tc/bin:$PATH" ;;
  esac
  export PATH
  export npm_config_nodedir="$_sandnode_tc"
else
  _sandnode_major="$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)"
  if [ "$_sandnode_major" -lt 22 ]; then
    echo "node-env: node $(node --version 2>/dev/null || echo '(none)') is older than 22 and $_sandnode_tc is missing: run bash deploy/host-setup.sh" >&2
    _sandnode_ok=0
  fi
fi
unset _sandnode_root _sandnode_tc _sandnode_major
if [ "${BASH_SOURCE[0]}" != "$0" ]; then
  # sourced: keep the caller's shell (and its options) alive
  [ "$_sandnode_ok" = 1 ]
  _sandnode_rc=$?
  unset _sandnode_ok
  return "$_sandnode_rc"
fi
[ "$_sandnode_ok" = 1 ] || exit 1
if [ $# -eq 0 ]; then
  echo "usage: bash deploy/node-env.sh CMD [ARGS...]  (or: . deploy/node-env.sh)" >&2
  exit 2
fi
exec "$@"
