#!/usr/bin/env python3
"""Runs test binaries that `cargo test --no-run --message-format=json` built, several at once.

scripts/test.sh calls it. `cargo test` runs its test binaries one after another, and
most of their time is spent waiting (server start-up, TTLs, watches, failovers), not
computing, so running a few side by side cuts the test command's wall time to a
fraction on two cores. Each binary still runs its own tests as libtest does (its
threads, its in-process locks such as the fault kit's `serial()`, its shared servers);
only whole binaries overlap.

Usage: run-tests.py [--jobs N] [--cmd SHELL_COMMAND]... BUILD_JSON... [-- TEST_ARGS...]

BUILD_JSON: files holding cargo's JSON messages; every test executable in them runs,
in its package's directory (as cargo does), with TEST_ARGS. Each --cmd runs in the
same pool through bash (the doc tests, which cargo cannot build ahead). The
slowest jobs start first, by the times of the last run (target/test-times.json) or,
on a first run, by the built-in estimates below. Each job's output is printed whole
when it ends; a summary table of wall times follows. Exits non-zero if any job failed.
"""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMES = os.path.join(ROOT, "target", "test-times.json")

# Seconds each slow binary took in a sequential run on the 2-core machine; they only
# order a first run (slowest first, so a long one does not start last).
ESTIMATES = {
    "conformance/test:self_test": 128,
    "backend-postgres/test:conformance": 110,
    "cli/test:postgres_tls": 90,
    "backend-redis/test:cluster": 90,
    "backend-redis/test:fault_conformance": 76,
    "cli/test:cli_servers": 72,
    "backend-postgres/test:tls": 62,
    "backend-etcd/test:fault_conformance": 59,
    "backend-redis/test:sentinel": 59,
    "backend-zookeeper/test:failover": 45,
    "backend-postgres/test:election": 44,
    "backend-zookeeper/test:fault_conformance": 44,
    "backend-postgres/test:fault_conformance": 42,
    "backend-redis/test:conformance": 39,
    "cli/test:redis_topologies": 37,
    "doc-tests": 36,
    "backend-zookeeper/test:secure_conformance": 35,
    "backend-etcd/test:conformance": 33,
    "backend-zookeeper/test:conformance": 23,
}


def executables(path):
    """(label, argv0, cwd) of every test executable in a file of cargo JSON messages."""
    found = []
    with open(path, encoding="utf-8") as messages:
        for line in messages:
            if not line.startswith("{"):
                continue
            msg = json.loads(line)
            if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
                continue
            if not msg.get("profile", {}).get("test"):
                continue
            cwd = os.path.dirname(msg["manifest_path"])
            package = os.path.relpath(cwd, ROOT)
            target = msg["target"]
            label = f"{package}/{target['kind'][0]}:{target['name']}"
            found.append((label, [msg["executable"]], cwd))
    return found


def load_times():
    try:
        with open(TIMES, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def main(argv):
    jobs = int(os.environ.get("DISTLOCK_TEST_JOBS", "4"))
    commands, builds, test_args = [], [], []
    args = iter(argv)
    for arg in args:
        if arg == "--":
            test_args = list(args)
        elif arg == "--jobs":
            jobs = int(next(args))
        elif arg == "--cmd":
            commands.append(next(args))
        else:
            builds.append(arg)

    work = []
    for build in builds:
        for label, cmd, cwd in executables(build):
            work.append((label, cmd + test_args, cwd, False))
    for i, command in enumerate(commands):
        label = "doc-tests" if i == 0 else f"doc-tests-{i + 1}"
        work.append((label, command, ROOT, True))
    # The same binary may be listed by two builds (a crate both selections build alike).
    seen, unique = set(), []
    for job in work:
        key = job[1] if job[3] else job[1][0]
        if key not in seen:
            seen.add(key)
            unique.append(job)
    times = load_times()
    unique.sort(key=lambda job: -times.get(job[0], ESTIMATES.get(job[0], 0)))

    print_lock = threading.Lock()
    results = {}

    def run(job):
        label, cmd, cwd, shell = job
        with tempfile.TemporaryFile() as out:
            start = time.monotonic()
            if shell:
                code = subprocess.call(
                    cmd, shell=True, executable="/bin/bash", cwd=cwd,
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                )
            else:
                code = subprocess.call(
                    cmd, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
                )
            took = time.monotonic() - start
            out.seek(0)
            text = out.read().decode("utf-8", "replace")
        with print_lock:
            verdict = "ok" if code == 0 else f"FAILED (exit {code})"
            print(f"\n==> {label}: {verdict} in {took:.1f}s", flush=True)
            sys.stdout.write(text)
            sys.stdout.flush()
        return label, code, took

    wall = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for done in as_completed([pool.submit(run, job) for job in unique]):
            label, code, took = done.result()
            results[label] = (code, took)
    wall = time.monotonic() - wall

    times.update({label: round(took, 1) for label, (_, took) in results.items()})
    try:
        with open(TIMES, "w", encoding="utf-8") as f:
            json.dump(times, f, indent=1, sort_keys=True)
    except OSError:
        pass

    print(f"\n==> wall time of each job ({len(results)} jobs, {jobs} at once):")
    for label, (code, took) in sorted(results.items(), key=lambda r: -r[1][1]):
        print(f"{took:8.1f}s  {'ok' if code == 0 else 'FAILED'}  {label}")
    busy = sum(took for _, took in results.values())
    print(f"==> {busy:.0f}s of test time in {wall:.0f}s wall")
    failed = sorted(label for label, (code, _) in results.items() if code != 0)
    if failed:
        print("==> FAILED: " + ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
