#!/usr/bin/env python3
"""PyTorch's own distributed test suite on the "topoccl" backend beside "gloo".

    TOPOCCL_NCCL_LIB=target/release/libnccl.so python3 python/tests/torch_suite.py \\
        [--world-sizes 2,4] [--backends gloo,topoccl] [-k PATTERN] [--jobs N] [--timeout S] [--list]

Runs ``DistributedTest._DistTestBase`` of ``torch/testing/_internal/distributed/distributed_test.py``
(the installed torch's; needs ``pip install expecttest``) the way torch's
``test/distributed/test_distributed_spawn.py`` does (env BACKEND, WORLD_SIZE, INIT_METHOD; TEMP_DIR
is made per test by the harness), except that ranks are *forked* from a worker process that
imported torch once (``MultiProcessTestCase._start_processes`` with the fork context), not spawned.

What is changed in torch's suite, and only for the backend under test (never for gloo):

* ``DistTestCases.backend_feature``: "topoccl" joins the sets gloo is in ("ddp", "subgroup",
  "gpu"), except "cuda" (CUDA tensors through the backend), and "plugin" (what
  ``require_backend_is_available`` asks of a third-party backend).
* ``--literal-gates alias`` (the default): distributed_test.py gates tests on the literal name
  ("Only gloo backend supports timeouts", ``require_backend_is_available({"gloo"})``, ...). Its
  source is loaded with ``BACKEND != "gloo"``, ``BACKEND == "gloo"`` and
  ``require_backend_is_available({"gloo"})`` rewritten to also accept "topoccl" (same lines, so
  tracebacks point at the real file). Nothing else changes: a test runs for topoccl exactly where
  it runs for gloo. ``--literal-gates strict`` loads the file unchanged (those tests skip);
  ``--list`` prints which tests the literal gates alone would skip.
* ``--profiler-events`` (off by default) also adds the plugin to PROFILING_SUPPORTED_BACKENDS and
  SEND_RECV_PROFILING_SUPPORTED_BACKENDS, the run-time lists under which the collective and p2p
  tests check profiler events named "<backend>:all_reduce", "<backend>:send", ... Off, those
  tests check results but not events for the plugin (as torch does for any backend not listed).
* GPUs are hidden (CUDA_VISIBLE_DEVICES=""), so CUDA tests skip for both backends (the harness
  skips *every* test on a machine with fewer GPUs than ranks otherwise).
* ``import topoccl`` is whatever package comes first with ``--pythonpath`` (default: this
  checkout's python/) in front of PYTHONPATH; the library is $TOPOCCL_NCCL_LIB, else the
  package's lib/libnccl.so.2 or cargo's target/{release,debug}/libnccl.so.

Each (backend, world size) runs in worker subprocesses (``--jobs`` of them at a time) that take
one test at a time; a test that outlives ``--timeout`` (torch's own per-test timeout is set to it)
by 60 s, or kills its worker, is recorded as timeout/crash and a fresh worker goes on.

Exit status 1 when a test passes on gloo and fails (fail/timeout/crash) on topoccl at the same
world size, unless it is listed in ``torch_suite_known.txt`` (``test_name`` or
``test_name@WORLD``, then ``# reason``). ``--gloo-cache FILE`` reads gloo's results from FILE
(written by ``--write-gloo-cache FILE``) instead of running gloo, if its torch version matches;
gloo tests the file lacks still run.
"""

from __future__ import annotations

import argparse
import collections
import fnmatch
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import time

from torch_suite_child import PLUGIN, collect_main, worker_main

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
REPO = os.path.dirname(PYTHON_DIR)
KNOWN_FILE = os.path.join(HERE, "torch_suite_known.txt")
GRACE = float(os.environ.get("TORCH_SUITE_GRACE", "60"))
STATUSES = ("pass", "fail", "timeout", "crash", "skip")


# --------------------------------------------------------------------------------------------
# Runner
# --------------------------------------------------------------------------------------------


def find_library() -> str | None:
    env = os.environ.get("TOPOCCL_NCCL_LIB")
    if env:
        return env
    for p in (
        os.path.join(PYTHON_DIR, "topoccl", "lib", "libnccl.so.2"),
        os.path.join(REPO, "target", "release", "libnccl.so"),
        os.path.join(REPO, "target", "debug", "libnccl.so"),
    ):
        if os.path.exists(p):
            return p
    return None


def child_env(pythonpath: str) -> dict[str, str]:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTORCH_PRINT_REPRO_ON_FAILURE"] = "0"
    env["CUDA_VISIBLE_DEVICES"] = ""  # CPU comparison: CUDA tests skip for both backends
    env.setdefault("OMP_NUM_THREADS", "1")  # up to jobs x ranks processes share the cores
    env.pop("TORCH_DISTRIBUTED_DEBUG", None)
    env.pop("TOPOCCL_TIMEOUT", None)  # the library's deadline follows each group's timeout
    env.setdefault("TOPOCCL_CACHE_DIR", os.path.join(tempfile.gettempdir(), "topoccl-py-test-cache"))
    return env


def matches(name: str, patterns: list[str]) -> bool:
    if not patterns:
        return True
    for p in patterns:
        if any(c in p for c in "*?[") and fnmatch.fnmatchcase(name, p if p.startswith("*") else "*" + p + "*"):
            return True
        if p in name:
            return True
    return False


def read_known(path: str) -> dict[str, str]:
    """``test_name`` or ``test_name@WORLD``, then an optional ``# reason``."""
    known: dict[str, str] = {}
    if not os.path.exists(path):
        return known
    with open(path) as f:
        for line in f:
            body, _, reason = line.partition("#")
            body = body.strip()
            if body:
                known[body] = reason.strip()
    return known


def is_known(known: dict[str, str], name: str, world: int) -> str | None:
    for key in (f"{name}@{world}", name):
        if key in known:
            return known[key] or "(no reason given)"
    return None


def error_summary(detail: str, lines: int = 3) -> list[str]:
    """The exception lines of a failure: for each distinct rank error relayed by torch's harness
    ("Process N exited with error code 10 and exception: Traceback ..."), the lines after the
    traceback's last frame; else those of the harness's own traceback."""
    if not detail:
        return []
    chunks = re.split(r"Process \d+ exited with error code \d+ and exception:\n", detail)
    msgs: list[str] = []
    for c in chunks[1:] if len(chunks) > 1 else chunks:
        c = c.split("\nTo execute this test", 1)[0]
        tb = c.rstrip().splitlines()
        start = 0
        for i, ln in enumerate(tb):
            if ln.startswith("  File "):
                start = i + 1
                while start < len(tb) and tb[start].startswith("    "):
                    start += 1
        exc = [s.strip() for s in tb[start:] if s.strip()] or [s.strip() for s in tb[-1:]]
        msg = " | ".join(exc)
        msg = msg if len(msg) <= 400 else msg[:400] + " ..."
        if msg not in msgs:
            msgs.append(msg)
    return msgs[:lines]


class Worker:
    def __init__(self, backend: str, world: int, args, log_dir: str, serial: int, sel):
        self.backend, self.world = backend, world
        self.config = (backend, world)
        r, w = os.pipe()
        self.log_path = os.path.join(log_dir, f"{backend}-{world}-{serial}.log")
        self.log = open(self.log_path, "w")
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--_worker",
            "--backends",
            backend,
            "--world-sizes",
            str(world),
            "--timeout",
            str(args.timeout),
            "--literal-gates",
            args.literal_gates,
            "--_event-fd",
            str(w),
        ] + (["--profiler-events"] if args.profiler_events else [])
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            pass_fds=(w,),
            env=child_env(args.pythonpath),
            start_new_session=True,
            text=True,
            cwd=tempfile.gettempdir(),
        )
        os.close(w)
        self.events = os.fdopen(r, "r")
        self.buf = ""
        self.ready = False
        self.dead = False
        self.test: str | None = None
        self.started = time.monotonic()
        self.sel = sel
        sel.register(self.events, selectors.EVENT_READ, self)

    def send(self, name: str) -> None:
        self.test = name
        self.started = time.monotonic()
        assert self.proc.stdin is not None
        self.proc.stdin.write(name + "\n")
        self.proc.stdin.flush()

    def read_events(self) -> list[dict] | None:
        """Events now readable; None at EOF."""
        data = os.read(self.events.fileno(), 65536).decode()
        if not data:
            return None
        self.buf += data
        out = []
        while "\n" in self.buf:
            line, self.buf = self.buf.split("\n", 1)
            if line.strip():
                out.append(json.loads(line))
        return out

    def log_tail(self, n: int = 15) -> str:
        self.log.flush()
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def kill(self) -> None:
        if self.dead:
            return
        self.dead = True
        try:
            self.sel.unregister(self.events)
        except (KeyError, ValueError):
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the worker and its forked ranks
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.events.close()
        self.log.close()

    def close(self) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write("\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired, BrokenPipeError):
            pass
        self.kill()


def run_tests(pending: dict[tuple[str, int], list[str]], args, log_dir: str, results: dict) -> None:
    """Runs every pending test, ``args.jobs`` workers at a time; fills
    ``results[(backend, world)][test] = {status, detail, secs}``."""
    sel = selectors.DefaultSelector()
    queues = {c: collections.deque(v) for c, v in pending.items() if v}
    total = sum(len(q) for q in queues.values())
    done = 0
    workers: list[Worker] = []
    serial = 0
    t_start = time.monotonic()

    def record(config, name: str, status: str, detail: str, secs: float) -> None:
        nonlocal done
        results[config][name] = {"status": status, "detail": detail, "secs": round(secs, 2)}
        done += 1
        if args.verbose or status not in ("pass", "skip"):
            print(
                f"[{done}/{total} {time.monotonic() - t_start:4.0f}s] {config[0]}/{config[1]} {name}: {status} ({secs:.1f}s)",
                flush=True,
            )

    def finish(w: Worker, status: str, detail: str, secs: float) -> None:
        assert w.test is not None
        record(w.config, w.test, status, detail, secs)
        w.test = None

    def drop(w: Worker, why: str) -> None:
        """Ends a worker that died, hung or has nothing left to do."""
        now = time.monotonic()
        if w.test is not None:
            finish(w, "crash", f"{why}; worker log tail:\n{w.log_tail()}", now - w.started)
        elif not w.ready:
            # It never got going (the suite or the plugin failed to import): the config's tests
            # cannot run.
            tail = w.log_tail(25)
            print(f"{w.backend}/{w.world}: worker failed to start ({why}); {w.log_path}:\n{tail}", flush=True)
            for name in queues.pop(w.config, ()):
                record(w.config, name, "crash", f"worker failed to start: {why}\n{tail}", 0.0)
        w.kill()
        workers.remove(w)

    def start_workers() -> None:
        """Up to --jobs workers, on the configs with the most tests left per worker."""
        nonlocal serial
        while len(workers) < args.jobs:
            idle = collections.Counter(w.config for w in workers if w.test is None)
            live = [c for c, q in queues.items() if len(q) > idle[c]]
            if not live:
                return
            busy = collections.Counter(w.config for w in workers)
            c = max(live, key=lambda c: len(queues[c]) / (1 + busy[c]))
            serial += 1
            workers.append(Worker(c[0], c[1], args, log_dir, serial, sel))

    try:
        start_workers()
        while workers:
            for key, _ in sel.select(timeout=1.0):
                w = key.data
                if w not in workers:
                    continue
                evs = w.read_events()
                if evs is None:
                    drop(w, f"worker exited with status {w.proc.wait()}")
                    continue
                for e in evs:
                    if e["event"] == "ready":
                        w.ready = True
                    elif e["event"] == "end" and w.test is not None:
                        finish(w, e["status"], e["detail"], e["secs"])
                if w.ready and w.test is None:
                    if queues.get(w.config):
                        w.send(queues[w.config].popleft())
                    else:
                        w.close()
                        workers.remove(w)
            now = time.monotonic()
            for w in list(workers):
                if w.test is not None and now - w.started > args.timeout + GRACE:
                    finish(w, "timeout", f"killed by the runner after {now - w.started:.0f} s", now - w.started)
                    drop(w, "hung")
                elif w.proc.poll() is not None:
                    drop(w, f"worker exited with status {w.proc.returncode}")
                elif not w.ready and now - w.started > 300:
                    drop(w, "not ready after 300 s")
            if any(queues.values()):
                start_workers()
    finally:
        for w in workers:
            w.kill()
        sel.close()


def collect(args) -> dict:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--_collect",
        "--backends",
        args.backends,
        "--world-sizes",
        args.world_sizes,
        "--literal-gates",
        args.literal_gates,
    ] + (["--profiler-events"] if args.profiler_events else [])
    p = subprocess.run(cmd, capture_output=True, text=True, env=child_env(args.pythonpath), cwd=tempfile.gettempdir())
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-4000:])
        raise SystemExit(
            "torch_suite: could not load torch's distributed suite with these backends (see above); "
            f"`import {PLUGIN}` came from --pythonpath {args.pythonpath!r} first"
        )
    return json.loads(p.stdout)


def print_literal_gates(info: dict) -> None:
    for c in info["configs"]:
        if c["backend"] == "gloo" or "strict_skips" not in c:
            continue
        gated = {n: r for n, r in c["strict_skips"].items() if n not in c["skips"]}
        # Literal gates also show in tests that the gloo config skips for other reasons.
        print(f"{c['backend']}, {c['world']} ranks: {len(gated)} tests skipped only by a literal backend-name gate:")
        for n, r in sorted(gated.items()):
            print(f"    {n:60} {r}")
        if c["rewritten"]:
            lines = [str(ln) for ln, _ in c["rewritten"] if ln]
            lists = [txt for ln, txt in c["rewritten"] if not ln]
            print(f"  --literal-gates alias rewrites {len(lines)} gate sites of distributed_test.py, lines " + ", ".join(lines))
            if lists:
                print("  and sets " + "; ".join(lists))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-sizes", default="2,4", help="comma-separated (default 2,4)")
    ap.add_argument("--backends", default=f"gloo,{PLUGIN}", help=f"comma-separated (default gloo,{PLUGIN})")
    ap.add_argument("-k", action="append", default=[], metavar="PATTERN", help="only tests whose name contains PATTERN (or matches it as a glob); repeatable")
    ap.add_argument("--jobs", type=int, default=2, help="test processes at once (default 2)")
    ap.add_argument("--timeout", type=int, default=60, help="seconds per test (default 60: the suite's groups time out after 60 s; no test needs 5)")
    ap.add_argument("--list", action="store_true", help="list the tests, their import-time skips and the literal-gated ones, then exit")
    ap.add_argument("--literal-gates", choices=("alias", "strict"), default="alias", help="alias: literal gloo-name gates admit the plugin too (default); strict: leave them")
    ap.add_argument(
        "--profiler-events",
        action="store_true",
        help="also check the plugin's profiler events as gloo's are (PROFILING_SUPPORTED_BACKENDS and SEND_RECV_PROFILING_SUPPORTED_BACKENDS); off by default",
    )
    ap.add_argument(
        "--pythonpath",
        default=PYTHON_DIR,
        help="put this first on the tests' PYTHONPATH (default: this checkout's python/, so `import topoccl` is the checkout's; '' for the installed package)",
    )
    ap.add_argument("--known", default=KNOWN_FILE, help="known-failures file (default: torch_suite_known.txt beside this script)")
    ap.add_argument("--gloo-cache", metavar="FILE", help="take gloo's results from FILE instead of running gloo (if FILE's torch version is this torch's)")
    ap.add_argument("--write-gloo-cache", metavar="FILE", help="write gloo's results (all tests run) to FILE")
    ap.add_argument("--json", metavar="FILE", help="write every result to FILE")
    ap.add_argument("--log-dir", help="where workers' output goes (default: a new temporary folder)")
    ap.add_argument("--slowest", type=int, default=10, help="show the N slowest tests (default 10)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every result as it comes")
    ap.add_argument("--_worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--_collect", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--_event-fd", dest="event_fd", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args._worker:
        return worker_main(args)
    if args._collect:
        return collect_main(args)

    try:
        import expecttest  # noqa: F401  torch.testing._internal.common_utils imports it
    except ImportError:
        print("torch_suite: torch's test harness needs expecttest: python3 -m pip install expecttest", file=sys.stderr)
        return 2
    backends = [b for b in args.backends.split(",") if b]
    worlds = [int(w) for w in args.world_sizes.split(",") if w]
    if PLUGIN in backends:
        # The library the plugin loads: $TOPOCCL_NCCL_LIB, else the package's or cargo's build,
        # else whatever the package finds itself.
        lib = find_library()
        if lib and os.path.exists(lib):
            os.environ["TOPOCCL_NCCL_LIB"] = os.path.abspath(lib)
        if os.path.realpath(args.pythonpath or "") == os.path.realpath(PYTHON_DIR):
            # The checkout's package: its C++ backend compiled in place (a no-op when up to date).
            built = subprocess.run([sys.executable, os.path.join(PYTHON_DIR, "build_ext.py"), "--inplace"])
            if built.returncode != 0:
                print("torch_suite: building the C++ backend (python/build_ext.py --inplace) failed", file=sys.stderr)
                return 2

    t0 = time.monotonic()
    cache = None
    if args.gloo_cache and "gloo" in backends and os.path.exists(args.gloo_cache):
        with open(args.gloo_cache) as f:
            cache = json.load(f)
    info = collect(args)
    if cache is not None and cache.get("torch") != info["torch"]:
        print(f"gloo cache {args.gloo_cache} is for torch {cache.get('torch')}, not {info['torch']}: running gloo", flush=True)
        cache = None
    print(f"torch {info['torch']}; literal gates: {args.literal_gates}; collected in {time.monotonic() - t0:.1f} s", flush=True)
    if info.get("plugin_file"):
        print(f"{PLUGIN}: {info['plugin_file']} (TOPOCCL_NCCL_LIB={os.environ.get('TOPOCCL_NCCL_LIB')})", flush=True)
    if args.list:
        for c in info["configs"]:
            names = [n for n in c["tests"] if matches(n, args.k)]
            print(f"\n{c['backend']}, {c['world']} ranks: {len(names)} tests, {sum(n in c['skips'] for n in names)} skipped at import")
            for n in names:
                print(f"  {n}" + (f"   [skip: {c['skips'][n]}]" if n in c["skips"] else ""))
        print()
        print_literal_gates(info)
        return 0

    results: dict[tuple[str, int], dict[str, dict]] = {}
    pending: dict[tuple[str, int], list[str]] = {}
    for c in info["configs"]:
        cfg = (c["backend"], c["world"])
        results[cfg] = {}
        names = [n for n in c["tests"] if matches(n, args.k)]
        if c["backend"] == "gloo" and cache is not None:
            cached = cache["results"].get(str(c["world"]), {})
            missing = [n for n in names if n not in cached]
            for n in names:
                if n in cached:
                    results[cfg][n] = dict(cached[n], cached=True)
            names = missing
        for n in names:
            if n in c["skips"] and n not in results[cfg]:
                results[cfg][n] = {"status": "skip", "detail": c["skips"][n], "secs": 0.0}
        pending[cfg] = [n for n in names if n not in c["skips"]]
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="torch_suite_logs_")
    os.makedirs(log_dir, exist_ok=True)
    n_run = sum(len(v) for v in pending.values())
    print(f"running {n_run} tests ({args.jobs} at a time, {args.timeout} s each at most); worker logs in {log_dir}", flush=True)
    t_run = time.monotonic()
    run_tests(pending, args, log_dir, results)
    wall = time.monotonic() - t_run

    if args.write_gloo_cache:
        out = {"torch": info["torch"], "results": {}}
        for (b, w), res in results.items():
            if b == "gloo":
                out["results"][str(w)] = {n: {k: v for k, v in r.items() if k != "cached"} for n, r in sorted(res.items())}
        with open(args.write_gloo_cache, "w") as f:
            json.dump(out, f, indent=1, sort_keys=True)
            f.write("\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": info["torch"], "results": {f"{b}/{w}": r for (b, w), r in results.items()}}, f, indent=1)

    return report(results, backends, worlds, info, args, wall, time.monotonic() - t0)


def report(results, backends, worlds, info, args, wall: float, total: float) -> int:
    print()
    cols = [(b, w) for w in worlds for b in backends]
    head = "".join(f"{b + '/' + str(w):>14}" for b, w in cols)
    print(f"{'':10}{head}")
    for s in STATUSES:
        print(f"{s:10}" + "".join(f"{sum(r['status'] == s for r in results[c].values()):>14}" for c in cols))
    print(f"{'test s':10}" + "".join(f"{sum(r['secs'] for r in results[c].values() if not r.get('cached')):>14.0f}" for c in cols))
    cached = [c for c in cols if any(r.get("cached") for r in results[c].values())]
    if cached:
        print("(" + ", ".join(f"{b}/{w}" for b, w in cached) + f": from the gloo cache {args.gloo_cache})")
    print(f"wall: {wall:.0f} s running tests, {total:.0f} s in all")

    slow = sorted(
        ((r["secs"], b, w, n) for (b, w), res in results.items() for n, r in res.items() if not r.get("cached")),
        reverse=True,
    )[: args.slowest]
    if slow:
        print(f"\nslowest {len(slow)}:")
        for secs, b, w, n in slow:
            print(f"  {secs:7.1f} s  {b}/{w}  {n} ({results[(b, w)][n]['status']})")

    rc = 0
    if "gloo" not in backends or PLUGIN not in backends:
        return rc
    known = read_known(args.known)
    regress, known_hit, skipped_only, fixed = [], [], [], []
    for w in worlds:
        g, t = results.get(("gloo", w), {}), results.get((PLUGIN, w), {})
        for n in sorted(g):
            if g[n]["status"] != "pass" or n not in t:
                continue
            st = t[n]["status"]
            reason = is_known(known, n, w)
            if st in ("fail", "timeout", "crash"):
                (known_hit if reason else regress).append((n, w, st, t[n]["detail"], reason))
            elif st == "skip":
                skipped_only.append((n, w, t[n]["detail"]))
            elif reason:
                fixed.append((n, w))
    print(f"\npass on gloo, not on {PLUGIN}: {len(regress) + len(known_hit)} fail ({len(known_hit)} known), {len(skipped_only)} skipped")
    # Grouped by error (numbers aside), then by test over world sizes.
    groups: dict[tuple, dict[str, list[str]]] = {}
    shown: dict[tuple, list[str]] = {}
    for n, w, st, detail, reason in regress + known_hit:
        summary = error_summary(detail)
        key = (reason is None, st, tuple(re.sub(r"\d+(\.\d+)?", "#", ln) for ln in summary))
        shown.setdefault(key, summary)
        groups.setdefault(key, {}).setdefault(n, []).append(str(w))
    for key in sorted(groups, key=lambda k: (not k[0], k[1:])):
        new_, st = key[0], key[1]
        for n, ws in groups[key].items():
            reason = is_known(known, n, int(ws[0]))
            tag = "NEW" if new_ else f"known: {reason}"
            print(f"  {n} @{','.join(ws)}: {st} [{tag}]")
        for ln in shown[key]:
            print(f"      {ln}")
    for n, w, why in skipped_only:
        print(f"  {n} @{w}: skip ({why})")
    if fixed:
        print("\nlisted as known failures but passing now (remove from " + os.path.basename(args.known) + "):")
        for n, w in fixed:
            print(f"  {n} @{w}")
    same = sum(
        1
        for w in worlds
        for n, r in results.get(("gloo", w), {}).items()
        if r["status"] == "pass" and results.get((PLUGIN, w), {}).get(n, {}).get("status") == "pass"
    )
    if regress:
        print(f"\n{len(regress)} tests pass on gloo and fail on {PLUGIN} and are not in {os.path.basename(args.known)}")
        rc = 1
    # Closing line, over the tests that pass on gloo: passed on the plugin too, failed on it
    # (not known), skipped (known failures and tests it skips).
    print(f"\ntests passing on gloo, on {PLUGIN}:")
    print(f"{same} passed, {len(regress)} failed, {len(known_hit) + len(skipped_only)} skipped")
    return rc


if __name__ == "__main__":
    sys.exit(main())
