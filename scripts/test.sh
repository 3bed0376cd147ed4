#!/usr/bin/env bash
# The one command that runs every distlock test against real servers.
#
# 1. Makes sure what the tests need is installed (scripts/install-deps.sh: the server
#    binaries the tests start, etcdctl, the interoperability peers, protoc for the
#    `etcd` feature). As root it installs what is missing with apt-get; otherwise it
#    names the packages and exits non-zero.
# 2. Builds the test binaries of `cargo test --workspace --all-features` (in the
#    selections below) and runs them with DISTLOCK_REQUIRE_SERVERS=1, so a server
#    that cannot start fails the run instead of being skipped. The test binaries start
#    (and clean up) their own throwaway servers through distlock_test_servers; this
#    script starts none.
# 3. Through scripts/run-tests.py: each binary starts as soon as it is linked, while
#    cargo compiles the rest, and DISTLOCK_TEST_JOBS (default 4) binaries run at
#    once. `cargo test` would compile everything first and then run the binaries one
#    after another, though they mostly wait on servers, TTLs and watches. Each binary
#    runs its own tests as under `cargo test`; a failed one fails the run once all
#    have run. Per-binary wall times end the output (README, "Testing").
#
# Arguments before `--` are passed on to `cargo test` (building and doc tests), those
# after it to every test binary (a name filter, `--nocapture`, `--test-threads N`).
# Works from any directory.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/install-deps.sh

export DISTLOCK_REQUIRE_SERVERS=1
# The random-fault scenarios follow one seeded schedule here, so a run is reproducible;
# DISTLOCK_FAULT_SEED=random (or any other number) explores other schedules.
export DISTLOCK_FAULT_SEED="${DISTLOCK_FAULT_SEED:-42}"

cargo_args=()
test_args=()
while (($#)); do
    if [[ $1 == -- ]]; then
        shift
        test_args=("$@")
        break
    fi
    cargo_args+=("$1")
    shift
done

# One selection: every crate, every feature. (No peer crate in the bench turns on
# sqlx's native-tls, which would switch the Postgres backend's TLS to OpenSSL.)
workspace="--workspace --all-features"
# With every backend feature off, connect() must name the feature a scheme needs.
no_default="-p distlock --no-default-features --lib"

q_cargo=""
q_test=""
((${#cargo_args[@]} == 0)) || q_cargo=$(printf ' %q' "${cargo_args[@]}")
((${#test_args[@]} == 0)) || q_test=$(printf ' %q' "${test_args[@]}")
# Doc tests cannot be built ahead; they run last, with the build's selection so that
# cargo finds the libraries built already.
doc="cargo test --doc $workspace$q_cargo --$q_test"

python3 scripts/run-tests.py \
    --build "$workspace$q_cargo" --build "$no_default$q_cargo" \
    --doc "$doc" -- "${test_args[@]}"
