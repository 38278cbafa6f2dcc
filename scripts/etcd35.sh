#!/usr/bin/env bash
# Prints the path of an etcd 3.5 server, fetching it on first use from
# Debian trixie's etcd-server package into ~/.cache/leasehold (a static Go
# binary: it runs on bookworm and Ubuntu alike). Debian bookworm's own
# etcd-server is 3.4.23; scripts/test.sh runs the etcd suites on both
# (LEASEHOLD_ETCD, see leasehold-testkit), because 3.5.0 changed what
# matters to a lock: the Lock RPC no longer returns to a waiter whose
# session expired (etcd PR 11408), and later 3.5 releases fixed leases
# revoked by an old leader and renewals reported after a revoke.
#
# The package comes through apt (its signature checked against Debian's
# archive keyring, with a private list directory: the machine's own apt
# sources are not touched); where that fails, from a pinned address whose
# SHA-256 is checked here. Fails, saying why, where neither works.
set -euo pipefail

cache="${XDG_CACHE_HOME:-$HOME/.cache}/leasehold"
# The pinned fallback: trixie's package when this script was written.
PINNED_VERSION=3.5.16-4
PINNED_SHA256=0875921bb0d023f2af9b8e15cdfbe417a03e65731345fb832c40f9c2dd72967b
PINNED_URL="http://deb.debian.org/debian/pool/main/e/etcd/etcd-server_${PINNED_VERSION}_amd64.deb"

for bin in "$cache"/etcd-3.5*/usr/bin/etcd; do
  if [ -x "$bin" ]; then
    echo "$bin"
    exit 0
  fi
done
if [ "$(uname -m)" != x86_64 ]; then
  echo "etcd35.sh: fetches the amd64 package only; this machine is $(uname -m)" >&2
  exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
deb=""
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
if command -v apt-get >/dev/null && [ -r "$keyring" ]; then
  mkdir -p "$work/parts" "$work/lists/partial" "$work/cache/archives/partial"
  cat >"$work/parts/trixie.sources" <<EOF
Types: deb
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: $keyring
EOF
  opts=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$work/parts"
    -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache"
    -o Dir::State::status=/dev/null -o APT::Architectures=amd64
    -o APT::Sandbox::User="$(id -un)")
  if apt-get "${opts[@]}" -qq update >&2 &&
    (cd "$work" && apt-get "${opts[@]}" -qq download etcd-server >&2); then
    deb=$(ls "$work"/etcd-server_3.5*_amd64.deb 2>/dev/null | head -1 || true)
    [ -n "$deb" ] || echo "etcd35.sh: trixie's etcd-server is not a 3.5 release any more" >&2
  else
    echo "etcd35.sh: apt could not fetch trixie's etcd-server; trying the pinned package" >&2
  fi
fi
if [ -z "$deb" ]; then
  deb="$work/etcd-server_${PINNED_VERSION}_amd64.deb"
  curl -fsS --retry 3 -o "$deb" "$PINNED_URL" || {
    echo "etcd35.sh: could not download $PINNED_URL" >&2
    exit 1
  }
  echo "$PINNED_SHA256  $deb" | sha256sum -c --quiet - >&2 || {
    echo "etcd35.sh: $PINNED_URL does not have the pinned SHA-256" >&2
    exit 1
  }
fi
version=$(dpkg-deb -f "$deb" Version)
dir="$cache/etcd-$version"
mkdir -p "$cache"
rm -rf "$dir.partial"
dpkg-deb -x "$deb" "$dir.partial"
"$dir.partial/usr/bin/etcd" --version >/dev/null
mv "$dir.partial" "$dir"
echo "$dir/usr/bin/etcd"
