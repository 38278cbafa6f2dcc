#!/usr/bin/env bash
# The whole test suite: formatting, lints, docs, and every test against real
# throwaway redis-server and PostgreSQL processes. CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  rustup component add rustfmt clippy
fi

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
set -x
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# The library without its default features (quorum, handoff), and with each
# feature alone; all of them is the workspace run above. The library target
# only: the tests' dev-dependencies turn every feature on. leasehold-pg
# without and with tls (rustls only then), the same way.
for features in "" quorum handoff cluster tls sentinel metrics postgres sqlx memory conformance; do
  cargo clippy -p leasehold --no-default-features ${features:+--features "$features"} \
    --lib --locked -- -D warnings
done
# leasehold-etcd builds with no protoc anywhere: its gRPC code is generated
# once and committed (scripts/gen-etcd-proto.sh), no build script runs it.
PROTOC=/nonexistent cargo build -p leasehold-etcd --lib --locked
for features in "" tls; do
  cargo clippy -p leasehold-pg --no-default-features ${features:+--features "$features"} \
    --lib --locked -- -D warnings
  cargo clippy -p leasehold-etcd --no-default-features ${features:+--features "$features"} \
    --lib --locked -- -D warnings
done
# leasehold-pg's locker on a deadpool pool (feature deadpool) alone.
cargo clippy -p leasehold-pg --no-default-features --features deadpool \
  --lib --locked -- -D warnings
if cargo tree --locked -e normal -p leasehold -p leasehold-pg --prefix none |
  grep -E '^(rustls|aws-lc-rs) v'; then
  echo "rustls in the default build of leasehold and leasehold-pg (above)" >&2
  exit 1
fi
# Dependencies point one way: no import cycle among a crate's top-level
# modules, and no module importing a name the crate root defines. The check
# prints what it finds; any output fails.
if ! cycles=$(python3 scripts/modcycles.py crates/*/src 2>&1) || [ -n "$cycles" ]; then
  printf '%s\n' "$cycles" >&2
  echo "module import cycles, or modules importing from the crate root (above)" >&2
  exit 1
fi
# Every test file is in a test binary: the crates list theirs (`autotests =
# false`, a few binaries by theme), so a file no binary names would not run.
for tests in crates/*/tests examples/*/tests; do
  for file in "$tests"/*.rs; do
    name=$(basename "$file")
    if ! grep -qs "^path = \"tests/$name\"" "$tests/../Cargo.toml" &&
      ! grep -qs "^#\[path = \"$name\"\]" "$tests"/*.rs; then
      echo "$file is in no test binary: add it to one in $tests/ or to Cargo.toml" >&2
      exit 1
    fi
  done
done
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
# One version each of rand and getrandom in what the published crates pull in.
if cargo tree --locked -d -e normal -p leasehold -p leasehold-pg --depth 0 --prefix none |
  grep -E '^(rand|getrandom) v'; then
  echo "two versions of rand or getrandom (above)" >&2
  exit 1
fi
cargo test --workspace --locked
# The same lease, fencing and hand-off suites, and the matrix's core rows,
# on Valkey 8.1 (a Redis-compatible server managed offerings run).
valkey=$(scripts/valkey.sh)
LEASEHOLD_REDIS_SERVER="$valkey" cargo test -p leasehold --locked --test core
LEASEHOLD_REDIS_SERVER="$valkey" cargo run -p leasehold-cli --locked --quiet -- chaos \
  --modes cas,guard,leader,handoff,quorum --faults none,holder-pause,key-loss,redis-restart,oom \
  --duration 2s
# The server's clock stepped forward and running fast: libfaketime drives
# this Valkey (built with libc malloc), not Debian's redis-server, on which
# the same tests see the rows say unsupported.
LEASEHOLD_REDIS_SERVER="$valkey" cargo test -p leasehold-testkit --locked --test it -- clock::
LEASEHOLD_REDIS_SERVER="$valkey" cargo test -p leasehold-cli --locked --test it -- chaos::a_clock
# A 300 ms lease (not the 100 ms default): both faults still break it (a
# 10 s step, a clock three times as fast), and a watchdog starved by a busy
# machine for a few scheduler slices does not lose it as unreachable, an
# error to callers these rows do not test (seen with two busy loops beside).
LEASEHOLD_REDIS_SERVER="$valkey" cargo run -p leasehold-cli --locked --quiet -- chaos \
  --modes leader --faults clock-jump,clock-fast --duration 3s --ttl 300ms
# The etcd suites again on etcd 3.5 (Debian trixie's package, fetched once
# by scripts/etcd35.sh); `cargo test` above ran them on bookworm's 3.4.23.
LEASEHOLD_ETCD="$(scripts/etcd35.sh)" cargo test -p leasehold-etcd --locked --test etcd
# Package leasehold and leasehold-pg as crates.io would get them, build the
# packages, and check the MSRV (it prints which kind of check ran).
scripts/package.sh
