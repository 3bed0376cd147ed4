#!/usr/bin/env python3
"""Builds the test binaries with cargo and runs them as they come, several at once.

scripts/test.sh calls it. `cargo test` compiles every test binary first and then runs
them one after another, but most of their time is spent waiting (server start-up,
TTLs, watches, failovers), not computing. Here each binary starts as soon as cargo
has linked it, while cargo goes on compiling the rest, and up to --jobs binaries run
side by side. (cargo keeps its normal priority: niced, it starved behind other work
on a shared machine, at a load of 17 on two cores; the tests must bear such load
anyway.) A crate keeps its integration tests in one binary, `tests/it/main.rs`, with a
module per former test file, so the dependency tree is linked once per crate; each
top-level module of such a binary is a job of its own (the binary run with `--exact`
and the module's test names), so modules overlap as separate binaries did. Each job
runs its tests as `cargo test` would (its test threads, its in-process locks such as
the fault kit's `serial()`, its shared servers).

Usage: run-tests.py [--jobs N] (--build 'CARGO TEST ARGS')... [--doc 'SHELL COMMAND']...
                    [-- TEST_ARGS...]

Each --build runs `cargo test --no-run --message-format=json-render-diagnostics ARGS`
(ARGS split as by a shell), one after another; every test executable they produce
runs in its package's directory (as cargo does) with TEST_ARGS. Each --doc command
runs through bash once the builds are over (doc tests cannot be built ahead). Of the
jobs ready to start, the slowest start first, by the times of the last run
(target/test-times.json) or, on a first run, by the built-in estimates below. Each
job's output is printed whole when it ends, then a summary of the wall times. Exits
non-zero if a build or a job failed.

No job can hang the run: each runs in a process group of its own under a time limit
(time_limit below: several times its last or estimated time, at least 5 minutes;
DISTLOCK_TEST_LIMIT overrides it, in seconds). A job past its limit is named, its last
output printed, and its whole group (the servers it started included) terminated, then
killed; it counts as failed.
"""

import heapq
import itertools
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMES = os.path.join(ROOT, "target", "test-times.json")

# Seconds the slow jobs took, run one at a time on the 2-core machine; they only order a
# first run (a job is a test binary, or one module of a crate's `it` binary).
ESTIMATES = {
    "conformance/test:it::self_test": 128,
    "backend-postgres/test:it::conformance": 110,
    "cli/test:it::postgres_tls": 90,
    "backend-redis/test:it::cluster": 90,
    "backend-redis/test:it::fault_conformance": 76,
    "cli/test:it::cli_servers": 72,
    "backend-postgres/test:it::tls": 62,
    "backend-etcd/test:it::fault_conformance": 59,
    "backend-redis/test:it::sentinel": 59,
    "backend-redis/test:it::native": 76,
    "backend-mysql/test:it::fault_conformance": 52,
    "backend-redis/test:it::replicas": 40,
    "backend-zookeeper/test:it::failover": 45,
    "backend-postgres/test:it::election": 44,
    "backend-zookeeper/test:it::fault_conformance": 44,
    "backend-postgres/test:it::fault_conformance": 42,
    "backend-redis/test:it::conformance": 39,
    "cli/test:it::redis_topologies": 37,
    "doc-tests": 36,
    "backend-zookeeper/test:it::secure_conformance": 35,
    "backend-etcd/test:it::conformance": 33,
    "backend-mysql/test:it::conformance": 30,
    "cli/test:it::mysql_tls": 31,
    "backend-mysql/test:it::tls": 25,
    "backend-redis/test:it::failover_replicas": 60,
    "backend-zookeeper/test:it::conformance": 23,
}


# A job's time limit is this many times its last (or estimated) time...
LIMIT_FACTOR = 4
# ...but never under this many seconds, nor this for a job never timed.
LIMIT_FLOOR = 300
LIMIT_UNKNOWN = 900
# The lines of a job's output printed when it runs past its limit.
TAIL_LINES = 80


def time_limit(label, times):
    """Seconds `label` may run before it counts as hung."""
    override = os.environ.get("DISTLOCK_TEST_LIMIT")
    if override:
        return float(override)
    known = times.get(label, ESTIMATES.get(label))
    if known is None:
        return LIMIT_UNKNOWN
    return max(LIMIT_FLOOR, LIMIT_FACTOR * known)


def run_limited(cmd, cwd, shell, out, limit):
    """Runs a job in a process group of its own; returns its exit code, or None when
    it ran past `limit` seconds (the group is then terminated, and killed 10 s later)."""
    child = subprocess.Popen(
        cmd, cwd=cwd, shell=shell, executable="/bin/bash" if shell else None,
        stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        return child.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, None)):
            try:
                os.killpg(child.pid, sig)
            except ProcessLookupError:
                break
            try:
                child.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        child.wait()
        return None


class Jobs:
    """The jobs ready to run, slowest first, and whether more may come."""

    def __init__(self, times):
        self.times = times
        self.ready = []
        self.order = itertools.count()
        self.more = True
        self.cond = threading.Condition()

    def add(self, label, cmd, cwd, shell=False):
        weight = self.times.get(label, ESTIMATES.get(label, 0))
        with self.cond:
            heapq.heappush(self.ready, (-weight, next(self.order), label, cmd, cwd, shell))
            self.cond.notify()

    def close(self):
        with self.cond:
            self.more = False
            self.cond.notify_all()

    def take(self):
        with self.cond:
            while not self.ready and self.more:
                self.cond.wait()
            if not self.ready:
                return None
            return heapq.heappop(self.ready)[2:]


def test_executable(line):
    """(label, path, package dir) if `line` is cargo's message for a test executable."""
    if not line.startswith("{"):
        return None
    msg = json.loads(line)
    if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
        return None
    if not msg.get("profile", {}).get("test"):
        return None
    cwd = os.path.dirname(msg["manifest_path"])
    target = msg["target"]
    package = "(root)" if cwd == ROOT else os.path.relpath(cwd, ROOT)
    label = f"{package}/{target['kind'][0]}:{target['name']}"
    return label, msg["executable"], cwd


def load_times():
    try:
        with open(TIMES, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def main(argv):
    jobs_at_once = int(os.environ.get("DISTLOCK_TEST_JOBS", "4"))
    builds, docs, test_args = [], [], []
    args = iter(argv)
    for arg in args:
        if arg == "--":
            test_args = list(args)
        elif arg == "--jobs":
            jobs_at_once = int(next(args))
        elif arg == "--build":
            builds.append(shlex.split(next(args)))
        elif arg == "--doc":
            docs.append(next(args))
        else:
            sys.exit(f"run-tests.py: unexpected argument {arg!r}")

    times = load_times()
    jobs = Jobs(times)
    lock = threading.Lock()
    results = {}  # label -> (ok, seconds)
    hung = set()  # labels killed at their limit: their time is not a measurement

    def report(label, ok, took, text=""):
        with lock:
            results[label] = (ok, took)
            verdict = "ok" if ok else "FAILED"
            print(f"\n==> {label}: {verdict} in {took:.1f}s", flush=True)
            sys.stdout.write(text)
            sys.stdout.flush()

    # The tests of a package with binaries run them (CARGO_BIN_EXE_*), and cargo may
    # link a test before the binary, so those tests wait for the end of their build.
    metadata = json.loads(subprocess.run(
        ["cargo", "metadata", "--no-deps", "--format-version", "1"],
        cwd=ROOT, stdout=subprocess.PIPE, check=True,
    ).stdout)
    with_bins = {
        os.path.dirname(package["manifest_path"])
        for package in metadata["packages"]
        if any("bin" in target["kind"] for target in package["targets"])
    }

    def split(label, path, cwd):
        """The jobs of one test binary: a crate's integration-test binary (`it`, one
        module per former test file) runs each top-level module as a job of its own,
        so that they overlap and each has its own time limit; others run whole. With
        test arguments (a filter, say) every binary runs whole."""
        if not label.endswith(":it") or test_args:
            return [(label, [path, *test_args], cwd)]
        listed = subprocess.run([path, "--list", "--format", "terse"], cwd=cwd,
                                stdout=subprocess.PIPE, text=True)
        modules = {}
        for line in listed.stdout.splitlines():
            if line.endswith(": test"):
                name = line[: -len(": test")]
                modules.setdefault(name.split("::")[0], []).append(name)
        if listed.returncode != 0 or not modules:
            return [(label, [path], cwd)]
        return [(f"{label}::{module}", [path, "--exact", *names], cwd)
                for module, names in sorted(modules.items())]

    def build_all():
        seen = set()
        for i, args in enumerate(builds):
            held_back = []
            cmd = ["cargo", "test", "--no-run",
                   "--message-format=json-render-diagnostics", *args]
            start = time.monotonic()
            with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True) as cargo:
                for line in cargo.stdout:
                    found = test_executable(line)
                    if found and found[1] not in seen:
                        seen.add(found[1])
                        for job in split(*found):
                            if job[2] in with_bins:
                                held_back.append(job)
                            else:
                                jobs.add(*job)
            report(f"build {i + 1}: cargo test --no-run {shlex.join(args)}",
                   cargo.returncode == 0, time.monotonic() - start)
            for job in held_back:
                jobs.add(*job)
        for i, doc in enumerate(docs):
            jobs.add("doc-tests" if i == 0 else f"doc-tests-{i + 1}", doc, ROOT, shell=True)
        jobs.close()

    def work():
        while (job := jobs.take()) is not None:
            label, cmd, cwd, shell = job
            limit = time_limit(label, times)
            with tempfile.TemporaryFile() as out:
                start = time.monotonic()
                code = run_limited(cmd, cwd, shell, out, limit)
                took = time.monotonic() - start
                out.seek(0)
                text = out.read().decode("utf-8", "replace")
            if code is None:
                hung.add(label)
                tail = "\n".join(text.splitlines()[-TAIL_LINES:])
                text = (f"==> {label} ran past its limit of {limit:.0f}s and was killed; "
                        f"its last {TAIL_LINES} lines:\n{tail}\n")
            report(label, code == 0, took, text)

    wall = time.monotonic()
    threads = [threading.Thread(target=build_all)]
    threads += [threading.Thread(target=work) for _ in range(max(1, jobs_at_once))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.monotonic() - wall

    ran = {label: r for label, r in results.items() if not label.startswith("build ")}
    times.update({label: round(took, 1) for label, (_, took) in ran.items()
                  if label not in hung})
    try:
        with open(TIMES, "w", encoding="utf-8") as f:
            json.dump(times, f, indent=1, sort_keys=True)
    except OSError:
        pass

    print(f"\n==> wall times ({len(ran)} test jobs, {jobs_at_once} at once):")
    for label, (ok, took) in sorted(results.items(), key=lambda r: -r[1][1]):
        print(f"{took:8.1f}s  {'ok' if ok else 'FAILED'}  {label}")
    busy = sum(took for _, took in ran.values())
    print(f"==> {busy:.0f}s of tests in {wall:.0f}s wall, builds included")
    failed = sorted(label for label, (ok, _) in results.items() if not ok)
    if failed:
        print("==> FAILED:\n  " + "\n  ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
