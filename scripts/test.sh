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
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
cargo test --workspace --locked
