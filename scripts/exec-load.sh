#!/usr/bin/env bash
# The 16-process exec load of issue 20: for each backend given, PROCS concurrent
# loops each run `distlock exec --verbose KEY -- true` ROUNDS times on one key, and the
# waits the execs report (`waited=` of --verbose) are summarised as p50, p99 and max.
# The backends run one after another in the same invocation, so their figures compare.
#
#   scripts/exec-load.sh [-n PROCS] [-r ROUNDS] [-c SECONDS] 'URL [EXEC FLAGS]'...
#
# PROCS defaults to 16, ROUNDS to 20; with -c the command is `sleep SECONDS` instead
# of `true`. Flags after a URL are added to its execs, for
# example 'redis://127.0.0.1:6379 --no-fifo' for Redis's unordered mode. DISTLOCK names
# the binary (default target/release/distlock). The servers must be running; this
# script starts none.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
distlock=${DISTLOCK:-target/release/distlock}
procs=16
rounds=20
command=(true)
while getopts "n:r:c:" opt; do
    case $opt in
        c) command=(sleep "$OPTARG") ;;
        n) procs=$OPTARG ;;
        r) rounds=$OPTARG ;;
        *) exit 2 ;;
    esac
done
shift $((OPTIND - 1))
if (($# == 0)); then
    echo "usage: $0 [-n PROCS] [-r ROUNDS] [-c SECONDS] 'URL [EXEC FLAGS]'..." >&2
    exit 2
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

printf '%-60s %6s %9s %9s %9s %8s\n' backend execs "wait p50" "wait p99" "wait max" "total s"
for spec in "$@"; do
    read -r url flags_text <<<"$spec"
    read -r -a flags <<<"${flags_text:-}"
    key="exec-load/$$-$RANDOM"
    started=$(date +%s.%N)
    for p in $(seq "$procs"); do
        (
            for _ in $(seq "$rounds"); do
                "$distlock" exec --verbose ${flags[@]+"${flags[@]}"} --backend "$url" "$key" -- "${command[@]}" 2>&1 >/dev/null |
                    sed -n 's/.* waited=\([^ ]*\) .*/\1/p'
            done
        ) >"$work/$p" &
    done
    wait
    ended=$(date +%s.%N)
    # Waits are printed as 12ms or 1.234s; in seconds, sorted.
    cat "$work"/* |
        awk '/ms$/ { sub(/ms$/, ""); print $0 / 1000; next } /s$/ { sub(/s$/, ""); print $0 }' |
        sort -g >"$work/all"
    n=$(wc -l <"$work/all")
    shown=$(sed 's#//[^@/]*@#//#' <<<"$url ${flags_text:-}") # no credentials in the table
    awk -v n="$n" -v url="$shown" -v total="$(echo "$ended - $started" | bc)" '
        { v[NR] = $1 }
        END {
            if (n == 0) { printf "%-60s %6d (no waits reported: did the execs fail?)\n", url, n; exit 1 }
            p50 = v[int((n - 1) * 0.50) + 1]; p99 = v[int((n - 1) * 0.99) + 1]
            printf "%-60s %6d %8.3fs %8.3fs %8.3fs %8.1f\n", url, n, p50, p99, v[n], total
        }' "$work/all"
    rm -f "$work"/[0-9]*
done
