#!/usr/bin/env bash
# The one command that runs every distlock test against real servers.
#
# 1. Makes sure what the tests need is installed (scripts/install-deps.sh: the server
#    binaries the tests start, etcdctl, the interoperability peers, protoc for the
#    `etcd` feature). As root it installs what is missing with apt-get; otherwise it
#    names the packages and exits non-zero.
# 2. Runs `cargo test --workspace --all-features` with
#    DISTLOCK_REQUIRE_SERVERS=1, so a server that cannot start fails the run
#    instead of being skipped. The test binaries start (and clean up) their
#    own throwaway servers through distlock_test_servers; this script
#    starts none.
#
# Extra arguments are passed on to `cargo test`.
# Works from any directory.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/install-deps.sh

export DISTLOCK_REQUIRE_SERVERS=1
# The random-fault scenarios follow one seeded schedule here, so a run is reproducible;
# DISTLOCK_FAULT_SEED=random (or any other number) explores other schedules.
export DISTLOCK_FAULT_SEED="${DISTLOCK_FAULT_SEED:-42}"
# The CLI and the bench (feature `compare`) run on their own: the peer crate
# distributed-lock turns on sqlx's native-tls, and sqlx then uses OpenSSL instead of
# rustls in every crate of the same build, which would test the Postgres backend's TLS
# on a stack its users do not get by default (README, "Postgres TLS").
cargo test --no-fail-fast --workspace --exclude distlock-cli --exclude distlock-bench --all-features "$@"
cargo test --no-fail-fast -p distlock-cli -p distlock-bench --all-features "$@"
# With every backend feature off, connect() must name the feature a scheme needs.
cargo test -p distlock --no-default-features --lib "$@"
