#!/usr/bin/env python3
"""The topoccl torch backend's test suite: ``python3 python/tests/run_tests.py [-k NAME]``.

Runs each job (``rank_main.py`` cases) as 1, 2 or 4 processes and exits non-zero if any rank
of any job failed, or a job ran past its deadline (a hang). The package tested is this
checkout's ``python/topoccl``; the library is ``$TOPOCCL_NCCL_LIB``, else the one installed in
the package directory, else ``target/release/libnccl.so`` of the repository.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

from launcher import launch  # noqa: E402

# (name, case, world, extra environment, deadline in seconds); a rank's expected exit status
# is 0 except where EXIT says otherwise.
JOBS = [
    ("collectives-2", "collectives", 2, {}, 150),
    ("collectives-4", "collectives", 4, {}, 200),
    ("training-2", "training", 2, {}, 150),
    ("training-4", "training", 4, {"TOPOCCL_TEST_FSDP": "0"}, 150),
    ("dead-peer-2", "dead_peer", 2, {}, 90),
    ("dead-peer-4", "dead_peer", 4, {}, 90),
    ("init-methods-2", "init_methods", 2, {}, 120),
    ("hashstore-1", "hashstore", 1, {}, 60),
]


# The dead-peer victim (the last rank) ends itself with os._exit(17).
EXIT = {"dead_peer": lambda rank, world: 17 if rank == world - 1 else 0}


def find_library() -> str | None:
    env = os.environ.get("TOPOCCL_NCCL_LIB")
    if env:
        return env
    for p in (
        os.path.join(REPO, "python", "topoccl", "lib", "libnccl.so.2"),
        os.path.join(REPO, "target", "release", "libnccl.so"),
        os.path.join(REPO, "target", "debug", "libnccl.so"),
    ):
        if os.path.exists(p):
            return p
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", action="append", default=[], help="run only jobs whose name contains this (repeatable)")
    ap.add_argument("-v", action="store_true", help="print every rank's output, not only failing jobs'")
    ap.add_argument("--list", action="store_true", help="list the jobs")
    args = ap.parse_args()
    jobs = [j for j in JOBS if not args.k or any(k in j[0] for k in args.k)]
    if args.list:
        for j in jobs:
            print(j[0])
        return 0
    lib = find_library()
    if not lib or not os.path.exists(lib):
        print(f"no libnccl.so to test (TOPOCCL_NCCL_LIB={lib!r}): build it with `cargo build --release -p topoccl-ffi`")
        return 2
    os.environ["TOPOCCL_NCCL_LIB"] = os.path.abspath(lib)
    # The C++ backend, compiled in place against this torch (nothing to do when up to date).
    built = subprocess.run([sys.executable, os.path.join(REPO, "python", "build_ext.py"), "--inplace"])
    if built.returncode != 0:
        print("building the C++ backend (python/build_ext.py --inplace) failed")
        return 2
    os.environ.pop("TOPOCCL_TIMEOUT", None)  # the tests set it where they need it
    os.environ.setdefault("TOPOCCL_CACHE_DIR", os.path.join(os.environ.get("TMPDIR", "/tmp"), "topoccl-py-test-cache"))
    print(f"library: {os.environ['TOPOCCL_NCCL_LIB']}", flush=True)
    t0 = time.monotonic()
    failed = []
    for name, case, world, env, deadline in jobs:
        job = launch(case, world, timeout=deadline, env=env)
        want = EXIT.get(case, lambda rank, world: 0)
        bad = job.timed_out or any(r.returncode != want(r.rank, world) for r in job.ranks)
        status = "FAIL" if bad else "ok"
        extra = " (timed out: killed)" if job.timed_out else ""
        print(f"{status:4} {name:24} {job.elapsed:6.1f} s{extra}", flush=True)
        if bad or args.v:
            print(job.output(), flush=True)
        else:
            for r in job.ranks:
                for line in r.output.splitlines():
                    if line.startswith("NOTE") or " checks, " in line:
                        print(f"     {line}")
        if bad:
            failed.append(name)
    print(f"{len(jobs) - len(failed)}/{len(jobs)} jobs passed in {time.monotonic() - t0:.1f} s", flush=True)
    if failed:
        print("failed: " + ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
