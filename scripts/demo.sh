#!/usr/bin/env bash
# Runs `leasehold demo`: every experiment of the tutorial on throwaway local
# servers, checked against what the tutorial shows. Extra arguments go to the
# CLI (for example --json, or --redis-url to use your own server).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
exec cargo run --quiet --release --locked -p leasehold-cli -- demo "$@"
