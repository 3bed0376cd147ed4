#!/usr/bin/env python3
"""A/B of distlock's own bench rows between two builds of the `distlock` CLI (release,
with the `bench` feature where the build has it), alternating per round, each run
against a fresh server of the backend (`--spawn`; a temporary directory for `file`).
Prints per-row new/old ratios, median and range over rounds (> 1: NEW is faster, or
cheaper for CPU rows).

Usage: scripts/bench-ab.py OLD_BINARY NEW_BINARY BACKEND[,BACKEND...] [ROUNDS]"""
import json, subprocess, sys, statistics, tempfile
OLD, NEW = sys.argv[1], sys.argv[2]
backends = sys.argv[3].split(',')
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
common = ["bench", "--json", "--rounds", "1", "--slice", "1", "--concurrency", "1,16",
          "--hold", "0", "--handoffs", "500", "--hot-workers", "9"]
def takes_keys(binary, cache={}):
    if binary not in cache:
        h = subprocess.run([binary, "bench", "--help"], stdout=subprocess.PIPE, text=True).stdout
        cache[binary] = "--keys" in h
    return cache[binary]
def run(binary, backend):
    # Builds with `--keys` default to both modes; the old build reuses each worker's key.
    keys = ["--keys", "reused"] if takes_keys(binary) else []
    if backend == "file":
        d = tempfile.mkdtemp(prefix="ab-file-")
        args = [binary, *common, *keys, "--backend", f"file://{d}"]
    else:
        args = [binary, *common, *keys, "--spawn", backend]
    out = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"{args}: {out.stderr[-2000:]}")
    d = json.loads(out.stdout)
    rows = {}
    for t in d["throughput"]:
        for r in t["rates"]:
            rows[f"{r['side']} cycles/s @{t['concurrency']}"] = r["median"]
        for c in t.get("cpu", []):
            if c.get("client_us"):
                # inverse, so that > 1 is cheaper like the other rows
                rows[f"{c['side']} client CPU/cycle (inverse) @{t['concurrency']}"] = 1 / c["client_us"]
    for h in d["handoff"]:
        rows[f"{h['side']} hand-off p50 (inverse)"] = 1e6 / h["p50_us"] if h["p50_us"] else None
    return rows
for backend in backends:
    ratios = {}
    for i in range(rounds):
        order = [(OLD, "old"), (NEW, "new")] if i % 2 == 0 else [(NEW, "new"), (OLD, "old")]
        got = {name: run(b, backend) for b, name in order}
        for row, new in got["new"].items():
            old = got["old"].get(row)
            if old and new:
                ratios.setdefault(row, []).append(new / old)
    print(f"== {backend}: new/old over {rounds} rounds (median [min-max]); >1 is faster")
    for row, rs in sorted(ratios.items()):
        print(f"  {row:55s} {statistics.median(rs):5.2f} [{min(rs):.2f}-{max(rs):.2f}]")
    sys.stdout.flush()
