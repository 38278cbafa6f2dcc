#!/usr/bin/env bash
# What a service pays to depend on leasehold: for each feature set, a
# throwaway crate that depends on leasehold (and leasehold-pg), built clean
# (debug, a fresh target directory, dependencies from the local registry
# cache), interleaved round by round. Prints, per set, the number of
# crates in the build (normal dependencies, the crate itself excluded),
# the median clean build time and its spread, and the ratio to the first
# set. Usage: scripts/dep-weight.sh [ROUNDS]   (default 3)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
rounds=${1:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# name | leasehold dependency line | leasehold-pg dependency line (or empty)
lh="leasehold = { path = \"$root/crates/leasehold\""
pg="leasehold-pg = { path = \"$root/crates/leasehold-pg\""
sets=(
  "defaults, both crates|$lh }|$pg }"
  "leasehold without default features, with leasehold-pg|$lh, default-features = false }|$pg }"
  "both crates with tls|$lh, features = [\"tls\"] }|$pg, features = [\"tls\"] }"
  "both, the former defaults (tls, cluster, sentinel on)|$lh, features = [\"tls\", \"cluster\", \"sentinel\"] }|$pg, features = [\"tls\"] }"
  "leasehold defaults alone|$lh }|"
  "leasehold without default features alone|$lh, default-features = false }|"
  "leasehold defaults with etcd alone (tonic, prost)|$lh, features = [\"etcd\"] }|"
  "redis-rs alone (the baseline: tokio-comp, script)|redis = { version = \"1.8\", default-features = false, features = [\"tokio-comp\", \"script\"] }|"
)

i=0
for set in "${sets[@]}"; do
  IFS='|' read -r name lease pg <<<"$set"
  dir="$work/s$i"
  mkdir -p "$dir/src"
  cat >"$dir/Cargo.toml" <<EOF
[package]
name = "service$i"
version = "0.0.0"
edition = "2024"
publish = false

[workspace]

[dependencies]
$lease
$pg
tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
EOF
  echo 'fn main() {}' >"$dir/src/main.rs"
  # The lock file of the workspace, so that every set resolves the same versions.
  cp "$root/Cargo.lock" "$dir/Cargo.lock"
  crates=$(cd "$dir" && cargo tree --offline -e normal --prefix none 2>/dev/null | sed 's/ (\*)//' | sort -u | wc -l)
  echo "$((crates - 1))" >"$dir/crates"
  i=$((i + 1))
done

for round in $(seq 1 "$rounds"); do
  for j in $(seq 0 $((i - 1))); do
    dir="$work/s$j"
    rm -rf "$dir/target"
    start=$(date +%s.%N)
    (cd "$dir" && CARGO_INCREMENTAL=0 cargo build --offline -q 2>/dev/null)
    end=$(date +%s.%N)
    awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f\n", b - a }' >>"$dir/times"
    echo "round $round/$rounds: set $j built" >&2
  done
done

printf '%-62s %7s %10s %16s %6s\n' "set" "crates" "median s" "spread s" "ratio"
base=""
for j in $(seq 0 $((i - 1))); do
  IFS='|' read -r name _ _ <<<"${sets[$j]}"
  dir="$work/s$j"
  sorted=$(sort -g "$dir/times")
  n=$(echo "$sorted" | wc -l)
  median=$(echo "$sorted" | sed -n "$(((n + 1) / 2))p")
  spread="$(printf '%.1f..%.1f' "$(echo "$sorted" | head -1)" "$(echo "$sorted" | tail -1)")"
  [ -z "$base" ] && base=$median
  ratio=$(awk -v m="$median" -v b="$base" 'BEGIN { printf "%.2f", m / b }')
  printf '%-62s %7s %10.1f %16s %6s\n' "$name" "$(cat "$dir/crates")" "$median" "$spread" "$ratio"
done
