#!/usr/bin/env bash
# Checks the workspace against its declared `rust-version` (the MSRV).
#
# 1. Every package in Cargo.lock must declare a rust-version no newer than ours
#    (the workspace uses resolver 3, so `cargo update` keeps to such versions).
# 2. With the MSRV toolchain installed, or installable through rustup, the whole
#    workspace is built with it (`cargo +MSRV check --locked`, all targets and
#    features). Where no such toolchain can be had (an offline machine), this step
#    says so and relies on step 1 plus clippy's `incompatible_msrv` lint (run by
#    .ci/run), which flags standard-library APIs newer than the rust-version but not
#    newer language features.
# Works from any directory.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

msrv="$(sed -n 's/^rust-version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)"
if [[ -z "$msrv" ]]; then
    echo "scripts/msrv.sh: no rust-version in Cargo.toml" >&2
    exit 1
fi

cargo metadata --format-version 1 --all-features --locked | python3 -c '
import json, sys
def version(text):
    parts = [int(p) for p in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))
msrv = version(sys.argv[1])
meta = json.load(sys.stdin)
resolved = {node["id"] for node in meta["resolve"]["nodes"]}
newer = []
for package in meta["packages"]:
    declared = package.get("rust_version")
    if package["id"] in resolved and declared:
        if version(declared) > msrv:
            newer.append("%s %s needs Rust %s" % (package["name"], package["version"], declared))
if newer:
    print("scripts/msrv.sh: dependencies newer than rust-version " + sys.argv[1] + ":", file=sys.stderr)
    for line in newer:
        print("  " + line, file=sys.stderr)
    print("  run `cargo update` (resolver 3 picks versions that fit)", file=sys.stderr)
    sys.exit(1)
' "$msrv"
echo "scripts/msrv.sh: every locked dependency fits Rust $msrv"

toolchain="$msrv"
if ! rustup run "$toolchain" rustc --version >/dev/null 2>&1; then
    if ! rustup toolchain install "$toolchain" --profile minimal >/dev/null 2>&1; then
        echo "scripts/msrv.sh: NOTE: no Rust $toolchain toolchain here and none could be installed;" >&2
        echo "  the build with it was skipped (clippy's incompatible_msrv lint still applies)" >&2
        exit 0
    fi
fi
cargo "+$toolchain" check --workspace --all-targets --all-features --locked
echo "scripts/msrv.sh: the workspace builds with Rust $toolchain"
