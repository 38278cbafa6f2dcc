#!/usr/bin/env bash
# Checks the minimum supported Rust version (the workspace's `rust-version`)
# as honestly as this machine allows, and says which check ran:
#
# - toolchain: `cargo +MSRV check` of the published crates, all features,
#   with that toolchain (installed now if rustup can reach its servers);
# - metadata (when it cannot): no package in the lock file declares a
#   `rust-version` above ours, our edition fits it, and clippy's
#   `incompatible_msrv` lint (std APIs newer than `rust-version`; run by the
#   workspace clippy step) is neither allowed anywhere nor silent here. It
#   does not catch language features newer than the MSRV.
#
# Both kinds run the metadata check first: it is cheap and names the culprit.
set -euo pipefail
cd "$(dirname "$0")/.."

metadata=$(mktemp)
control=$(mktemp -d)
trap 'rm -rf "$metadata" "$control"' EXIT
cargo metadata --format-version 1 --locked >"$metadata"

# Our rust-version (on stdout), checked against every package the lock file
# resolves (all platforms, dev-dependencies included); edition 2024 needs
# 1.85.
msrv=$(python3 - "$metadata" <<'PY'
import json, sys

def v(s):
    parts = [int(x) for x in s.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))

m = json.load(open(sys.argv[1]))
members = [p for p in m["packages"] if p["id"] in m["workspace_members"]]
ours = {p["rust_version"] for p in members}
if len(ours) != 1 or None in ours:
    sys.exit(f"msrv: the workspace members must share one rust-version, found {ours}")
msrv = ours.pop()
newer, unknown = [], 0
for p in members:
    if p["edition"] == "2024" and v(msrv) < v("1.85"):
        newer.append(f'{p["name"]} (edition 2024 needs 1.85)')
for p in m["packages"]:
    if p in members:
        continue
    rv = p.get("rust_version")
    if rv is None:
        unknown += 1
    elif v(rv) > v(msrv):
        newer.append(f'{p["name"]} {p["version"]} (rust-version {rv})')
if newer:
    sys.exit(f"msrv: needs a newer Rust than {msrv}: " + ", ".join(newer))
print(f"msrv: metadata: {len(m['packages']) - len(members)} dependencies, none declares a "
      f"rust-version above {msrv} ({unknown} declare none)", file=sys.stderr)
print(msrv)
PY
)

toolchain=""
if command -v rustup >/dev/null 2>&1; then
  if rustup run "$msrv" rustc --version >/dev/null 2>&1; then
    toolchain=$msrv
  elif timeout 180 rustup toolchain install "$msrv" --profile minimal --no-self-update >/dev/null 2>&1; then
    toolchain=$msrv
  fi
fi

if [ -n "$toolchain" ]; then
  echo "msrv: check kind: toolchain (cargo +$msrv check, leasehold and leasehold-pg, all features)"
  cargo "+$toolchain" check --locked -p leasehold -p leasehold-pg --all-features
  exit 0
fi

echo "msrv: check kind: metadata (Rust $msrv cannot be installed here: no compile with it)"
if grep -rnE '(allow|expect)\(.*incompatible_msrv' --include='*.rs' --include='*.toml' crates Cargo.toml clippy.toml .clippy.toml 2>/dev/null; then
  echo "msrv: clippy::incompatible_msrv must stay on" >&2
  exit 1
fi
# Negative control: the lint fires here for a std API newer than a crate's
# rust-version (std::iter::repeat_n is 1.82), so the clippy step is a check.
mkdir "$control/src"
printf '[package]\nname = "msrv-control"\nversion = "0.0.0"\nedition = "2021"\nrust-version = "1.80"\n[workspace]\n' >"$control/Cargo.toml"
printf 'pub fn three() -> usize {\n    std::iter::repeat_n(1, 3).count()\n}\n' >"$control/src/lib.rs"
refused=$(cargo clippy -q --manifest-path "$control/Cargo.toml" --target-dir "$control/target" \
  -- -D clippy::incompatible_msrv 2>&1 || true)
if ! grep -q 'stable since `1.82' <<<"$refused"; then
  echo "msrv: clippy's incompatible_msrv did not fire on its negative control" >&2
  exit 1
fi
echo "msrv: clippy's incompatible_msrv is on and fires (negative control refused)"
