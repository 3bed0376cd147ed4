#!/usr/bin/env bash
# The one command that runs every distlock test against real servers.
#
# 1. Makes sure the server binaries the tests start are installed:
#    redis-server (package redis-server), the ZooKeeper jars in
#    /usr/share/java plus a JRE (package zookeeper),
#    /usr/lib/postgresql/*/bin/initdb (package postgresql), openssl (test
#    certificates), python3-kazoo (a kazoo client for the ZooKeeper
#    interoperability test), Curator's jars (libcurator-*-java) and javac
#    (the Curator semaphore and read-write lock interoperability test).
#    ZooKeeper's TLS port also needs Debian's netty jars,
#    which the zookeeper package pulls in. As root it
#    installs what is missing with apt-get; otherwise it names the packages
#    and exits non-zero.
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

missing=()

if [[ -z "${DISTLOCK_REDIS_SERVER:-}" ]] && ! command -v redis-server >/dev/null 2>&1; then
    missing+=(redis-server)
fi

if [[ -z "${DISTLOCK_ZK_CLASSPATH:-}" ]]; then
    if [[ ! -f /usr/share/java/zookeeper.jar ]] || ! command -v java >/dev/null 2>&1; then
        missing+=(zookeeper)
    fi
elif [[ -z "${DISTLOCK_JAVA:-}" ]] && ! command -v java >/dev/null 2>&1; then
    missing+=(zookeeper)
fi

if [[ -z "${DISTLOCK_PG_BIN:-}" ]] && ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
    missing+=(postgresql)
fi

# The Sentinel and Cluster test servers are set up with redis-cli (--cluster create,
# SENTINEL queries), which Debian ships in redis-tools.
if ! command -v redis-cli >/dev/null 2>&1; then
    missing+=(redis-tools)
fi

# The TLS tests (Redis, Postgres, ZooKeeper) make throwaway certificates with the openssl tool.
if ! command -v openssl >/dev/null 2>&1; then
    missing+=(openssl)
fi

# The kazoo interoperability test drives a real kazoo Lock (Debian's python3-kazoo).
if ! /usr/bin/python3 -c 'import kazoo' >/dev/null 2>&1; then
    missing+=(python3-kazoo)
fi

# The Curator interoperability tests compile a Java driver against Debian's Curator
# jars, so they need javac too.
for jar in curator-client curator-framework curator-recipes; do
    if [[ ! -f "/usr/share/java/$jar.jar" ]]; then
        missing+=("lib$jar-java")
    fi
done
if ! command -v javac >/dev/null 2>&1; then
    missing+=(default-jdk-headless)
fi

if ((${#missing[@]} > 0)); then
    if [[ "$(id -u)" -eq 0 ]]; then
        echo "scripts/test.sh: installing ${missing[*]}" >&2
        apt-get update
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
    else
        echo "scripts/test.sh: missing server packages: ${missing[*]}" >&2
        echo "install them with:" >&2
        echo "  sudo apt-get update && sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
        exit 1
    fi
fi

export DISTLOCK_REQUIRE_SERVERS=1
# The random-fault scenarios follow one seeded schedule here, so a run is reproducible;
# DISTLOCK_FAULT_SEED=random (or any other number) explores other schedules.
export DISTLOCK_FAULT_SEED="${DISTLOCK_FAULT_SEED:-42}"
# The CLI and the bench (feature `compare`) run on their own: the peer crate
# distributed-lock turns on sqlx's native-tls, and sqlx then uses OpenSSL instead of
# rustls in every crate of the same build, which would test the Postgres backend's TLS
# on a stack its users do not get by default (README, "Postgres TLS").
cargo test --workspace --exclude distlock-cli --exclude distlock-bench --all-features "$@"
cargo test -p distlock-cli -p distlock-bench --all-features "$@"
# With every backend feature off, connect() must name the feature a scheme needs.
cargo test -p distlock --no-default-features --lib "$@"
