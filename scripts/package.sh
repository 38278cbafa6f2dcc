#!/usr/bin/env bash
# Packages every crate meant for users (leasehold-testkit, leasehold,
# leasehold-pg, leasehold-etcd, leasehold-zookeeper, leasehold-chaos, leasehold-cli) as crates.io would get them
# and builds the packages (each against the packaged others, through cargo's
# local overlay), then installs the CLI's `leasehold` binary with `cargo
# install --path` from its package (its leasehold dependencies patched to
# their packages: they are not on crates.io yet). This also checks the
# minimum supported Rust version (the
# workspace's `rust-version`, MSRV) as honestly as this machine allows. It
# prints which kind of MSRV check ran:
#
# - toolchain: the packages are built by the MSRV's rustc (rustup installs
#   it if it can reach its servers). The current cargo drives it: publishing
#   several packages at once needs cargo 1.90.
# - metadata, when that rustc cannot be had: the packages are built by the
#   default toolchain; no package in the lock file declares a `rust-version`
#   above ours; and clippy's `incompatible_msrv` lint (std APIs newer than
#   `rust-version`, run by the workspace clippy step) is not turned off and
#   fires on a negative control. It does not catch language features newer
#   than the MSRV.
#
# The rust-version comparison runs in both cases: it is cheap and names the
# dependency that needs a newer Rust.
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
print(f"msrv: {len(m['packages']) - len(members)} dependencies, none declares a "
      f"rust-version above {msrv} ({unknown} declare none)", file=sys.stderr)
print(msrv)
PY
)

rustc_msrv=""
if command -v rustup >/dev/null 2>&1; then
  if ! rustup run "$msrv" rustc --version >/dev/null 2>&1; then
    timeout 180 rustup toolchain install "$msrv" --profile minimal --no-self-update \
      >/dev/null 2>&1 || true
  fi
  rustc_msrv=$(rustup which --toolchain "$msrv" rustc 2>/dev/null || true)
fi

# A clean checkout (CI) packages as it would publish; a working tree with
# uncommitted changes needs --allow-dirty.
dirty=()
if [ -z "${CI:-}" ] && [ -n "$(git status --porcelain)" ]; then
  dirty=(--allow-dirty)
fi
# Cargo verifies leasehold-pg against the packaged leasehold through a local
# overlay registry, and unpacks that package into $CARGO_HOME/registry/src/
# under a directory named after the overlay's path (`-<hash>`). It unpacks a
# package only once per name and version: a checkout at a path packaged before
# would build leasehold-pg against the leasehold of that earlier run (seen in
# CI: "no `CertificateProblem` in the root"). So the unpacked copies of our own
# packages from earlier overlays go first; nothing else in the cargo home is
# touched.
cargo_home=${CARGO_HOME:-$HOME/.cargo}
for stale in "$cargo_home"/registry/src/-*/leasehold-[0-9]* "$cargo_home"/registry/src/-*/leasehold-{pg,etcd,zookeeper,testkit,chaos,cli}-[0-9]*; do
  if [ -d "$stale" ]; then
    rm -rf "$stale"
  fi
done

# The integration tests stay out of the packages (cargo says "ignoring test
# ..."): they need the repository (its README, other crates' tests).
packages=(leasehold-testkit leasehold leasehold-pg leasehold-etcd leasehold-zookeeper leasehold-chaos leasehold-cli)
# The dry run builds each package against the packaged others, taken from a
# local registry: cargo takes a registry crate of one version for immutable,
# so a build of leasehold 0.1.0 left by an earlier run in this target
# directory would be used again, stale (a trait method added since was
# missing in leasehold-zookeeper's verification). Every artifact of ours
# goes first; the dependencies' builds stay.
cargo clean --locked "${packages[@]/#/-p}"
publish=(cargo publish --dry-run --locked "${packages[@]/#/-p}" "${dirty[@]}")

# `cargo install --path` of the packaged CLI, its path dependencies replaced
# by their packages (unpacked by the dry run under target/package/), into a
# throwaway root; the binary must answer --version. Not --locked: the
# package's Cargo.lock names leasehold from crates.io, where the patch sends
# it elsewhere.
install_cli() {
  local version root pkg patches=()
  version=$(cargo metadata --format-version 1 --no-deps --locked |
    python3 -c 'import json,sys; print({p["name"]: p["version"] for p in json.load(sys.stdin)["packages"]}["leasehold-cli"])')
  # Where the dry run unpacked the packages: the target directory's
  # package/ (CARGO_TARGET_DIR may put it outside the repository).
  pkg="$(cargo metadata --format-version 1 --no-deps --locked |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/package"
  for name in leasehold leasehold-pg leasehold-etcd leasehold-zookeeper leasehold-testkit leasehold-chaos; do
    patches+=(--config "patch.crates-io.$name.path=\"$pkg/$name-$version\"")
  done
  root="$control/install"
  cargo install --debug --quiet --path "$pkg/leasehold-cli-$version" \
    --root "$root" --target-dir "$pkg/install-target" "${patches[@]}"
  "$root/bin/leasehold" --version
  echo "install: cargo install --path target/package/leasehold-cli-$version installs a working leasehold"
}

if [ -n "$rustc_msrv" ]; then
  echo "msrv: check kind: toolchain (the packages, all features, built by rustc $msrv)"
  RUSTC="$rustc_msrv" "${publish[@]}"
  install_cli
  exit 0
fi

echo "msrv: check kind: metadata (rustc $msrv cannot be had here: nothing is built with it)"
"${publish[@]}"
install_cli
if grep -rnE 'incompatible_msrv.*allow|(allow|expect)\(.*incompatible_msrv|^msrv' \
  --include='*.rs' --include='*.toml' crates Cargo.toml clippy.toml .clippy.toml 2>/dev/null; then
  echo "msrv: clippy's incompatible_msrv must stay on, reading rust-version" >&2
  exit 1
fi
# Negative control: the lint fires for a std API newer than a crate's
# rust-version (std::iter::repeat_n is 1.82), so the clippy step is a check.
mkdir "$control/src"
printf '[package]\nname = "msrv-control"\nversion = "0.0.0"\nedition = "2021"\nrust-version = "1.80"\n[workspace]\n' \
  >"$control/Cargo.toml"
printf 'pub fn three() -> usize {\n    std::iter::repeat_n(1, 3).count()\n}\n' >"$control/src/lib.rs"
refused=$(cargo clippy -q --manifest-path "$control/Cargo.toml" --target-dir "$control/target" \
  -- -D clippy::incompatible_msrv 2>&1 || true)
if ! grep -q 'stable since `1.82' <<<"$refused"; then
  echo "msrv: clippy's incompatible_msrv did not fire on its negative control" >&2
  exit 1
fi
echo "msrv: clippy's incompatible_msrv is on and fires (negative control refused)"
