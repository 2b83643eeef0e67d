"""The side of ``torch_suite.py`` that runs in its child processes: loading torch's
``distributed_test.py`` for one backend (with the gates the runner documents) and running its
tests, one per line of stdin (``worker_main``), or listing them (``collect_main``). The runner
starts these as ``torch_suite.py --_worker`` / ``--_collect``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

SUITE_MODULE = "torch.testing._internal.distributed.distributed_test"
PLUGIN = "topoccl"
# Sets of DistTestCases.backend_feature that the backend under test joins (gloo is in all of
# these and in "cuda", which is left out: the backend takes CPU tensors only).
FEATURES = ("ddp", "subgroup", "gpu", "plugin")
# Seconds past --timeout before the runner kills a worker itself (torch's harness times the
# test out first, then takes up to ~10 s to collect the ranks' tracebacks).

# --------------------------------------------------------------------------------------------
# Loading the suite (in collector and worker processes)
# --------------------------------------------------------------------------------------------

# distributed_test.py's literal gates on the backend's name, and what --literal-gates alias
# makes of them. `_GLOO_ALIKE` is put in the module's namespace.
LITERAL_GATES = [
    ('BACKEND != "gloo"', "BACKEND not in _GLOO_ALIKE"),
    ('BACKEND == "gloo"', "BACKEND in _GLOO_ALIKE"),
    ('require_backend_is_available({"gloo"})', "require_backend_is_available(set(_GLOO_ALIKE))"),
]


# Module-level lists distributed_test.py checks at run time with `dist.get_backend() in ...`.
PROFILING_LISTS = ("PROFILING_SUPPORTED_BACKENDS", "SEND_RECV_PROFILING_SUPPORTED_BACKENDS")


def _suite_source() -> tuple[str, str]:
    import importlib.util

    spec = importlib.util.find_spec(SUITE_MODULE)
    with open(spec.origin) as f:
        return spec.origin, f.read()


def rewrite_literal_gates(src: str, backend: str) -> tuple[str, list[tuple[int, str]]]:
    """Rewrites the literal gloo-name gates to accept ``backend`` too; returns the new source
    and the (line, original text) of every site changed."""
    sites = []
    lines = src.split("\n")
    for i, line in enumerate(lines):
        new = line
        for old, repl in LITERAL_GATES:
            new = new.replace(old, repl)
        if new != line:
            sites.append((i + 1, line.strip()))
            lines[i] = new
    return "\n".join(lines), sites


def prepare_torch(backend: str) -> None:
    """Imports what the suite needs before it is loaded: the plugin (registering it) and
    DistTestCases with the plugin added where gloo is."""
    import torch  # noqa: F401

    if backend != "gloo":
        if backend == PLUGIN:
            import topoccl  # noqa: F401  registers "topoccl"
        from torch.testing._internal.common_distributed import DistTestCases

        for k in FEATURES:
            DistTestCases.backend_feature.setdefault(k, set()).add(backend)


def load_suite(backend: str, gates: str, register: bool = True, profiler_events: bool = False):
    """Executes distributed_test.py (rewritten if ``gates == "alias"`` and the backend is not
    gloo) as a fresh module; returns (module, rewritten sites). BACKEND and WORLD_SIZE must be in
    the environment: the file reads them at import."""
    import types

    origin, src = _suite_source()
    sites: list[tuple[int, str]] = []
    if gates == "alias" and backend != "gloo":
        src, sites = rewrite_literal_gates(src, backend)
    mod = types.ModuleType(SUITE_MODULE)
    mod.__file__ = origin
    mod.__dict__["_GLOO_ALIKE"] = ("gloo", backend)
    saved = sys.modules.get(SUITE_MODULE)
    sys.modules[SUITE_MODULE] = mod
    try:
        exec(compile(src, origin, "exec"), mod.__dict__)
        if profiler_events and backend != "gloo":
            # Runtime allowlists of the backends whose profiler events ("gloo:all_reduce",
            # "gloo:send", ...) the tests check: the plugin's events are checked as gloo's are.
            for name in PROFILING_LISTS:
                lst = getattr(mod, name, None)
                if isinstance(lst, list) and "gloo" in lst:
                    lst.append(backend)
                    sites.append((0, f"{name} += [{backend!r}]"))
    finally:
        if not register:
            if saved is None:
                sys.modules.pop(SUITE_MODULE, None)
            else:
                sys.modules[SUITE_MODULE] = saved
    return mod, sites


def test_names(mod) -> list[str]:
    base = mod.DistributedTest._DistTestBase
    return sorted(n for n in dir(base) if n.startswith("test_") and callable(getattr(base, n)))


def static_skips(mod) -> dict[str, str]:
    """Tests that a decorator skips at import (unittest.skip): name -> reason."""
    base = mod.DistributedTest._DistTestBase
    out = {}
    for n in test_names(mod):
        fn = getattr(base, n)
        if getattr(fn, "__unittest_skip__", False):
            out[n] = str(getattr(fn, "__unittest_skip_why__", "") or "skipped")
    return out


def _set_env(backend: str, world: int, init_file: str) -> None:
    os.environ["BACKEND"] = backend
    os.environ["WORLD_SIZE"] = str(world)
    # distributed_test reads INIT_METHOD at import (file:// enables test_barrier_timeout_global);
    # the worker points it at each test's own TEMP_DIR.
    os.environ["INIT_METHOD"] = "file://" + init_file


def collect_main(args) -> int:
    """Prints JSON: per backend and world size, the tests and their import-time skips (and for a
    plugin under alias gates, what the unchanged file would skip)."""
    out = {"torch": None, "configs": []}
    tmp = tempfile.mkdtemp(prefix="torch_suite_collect_")
    for backend in args.backends.split(","):
        prepare_torch(backend)
        for world in [int(w) for w in args.world_sizes.split(",")]:
            _set_env(backend, world, os.path.join(tmp, "init"))
            mod, sites = load_suite(backend, args.literal_gates, register=False, profiler_events=args.profiler_events)
            entry = {
                "backend": backend,
                "world": world,
                "tests": test_names(mod),
                "skips": static_skips(mod),
                "rewritten": sites,
            }
            if backend != "gloo":
                strict, _ = load_suite(backend, "strict", register=False)
                entry["strict_skips"] = static_skips(strict)
            out["configs"].append(entry)
    import torch

    out["torch"] = torch.__version__
    plugin = sys.modules.get(PLUGIN)
    out["plugin_file"] = getattr(plugin, "__file__", None)
    json.dump(out, sys.stdout)
    return 0


# --------------------------------------------------------------------------------------------
# Worker: runs tests of one (backend, world size), one per line of stdin
# --------------------------------------------------------------------------------------------


def worker_main(args) -> int:
    import unittest

    ev = os.fdopen(args.event_fd, "w", buffering=1)
    backend, world = args.backends, int(args.world_sizes)
    tmp = tempfile.mkdtemp(prefix="torch_suite_w_")
    _set_env(backend, world, os.path.join(tmp, "init"))
    prepare_torch(backend)
    mod, _ = load_suite(backend, args.literal_gates, profiler_events=args.profiler_events)
    import torch
    import torch.testing._internal.common_distributed as cd

    # torch's per-test timeout (MultiProcessTestCase._join_processes) is --timeout for every test.
    cd.TIMEOUT_DEFAULT = args.timeout
    for k in list(cd.TIMEOUT_OVERRIDE):
        cd.TIMEOUT_OVERRIDE[k] = args.timeout

    class TestDistBackendWithFork(mod.TestDistBackend, mod.DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()  # makes this test's TEMP_DIR and INIT_METHOD
            mod.INIT_METHOD = os.environ["INIT_METHOD"]
            self._start_processes(torch.multiprocessing.get_context("fork").Process)

    TestDistBackendWithFork.__module__ = "__main__"
    TestDistBackendWithFork.setUpClass()

    class Result(unittest.TestResult):
        def __init__(self):
            super().__init__()
            self.status, self.detail = "pass", ""

        def addError(self, test, err):
            super().addError(test, err)
            self.status, self.detail = "fail", self._exc_info_to_string(err, test)

        addFailure = addError

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            self.status, self.detail = "skip", str(reason)

        def addUnexpectedSuccess(self, test):
            super().addUnexpectedSuccess(test)
            self.status, self.detail = "fail", "unexpected success"

        def addExpectedFailure(self, test, err):
            super().addExpectedFailure(test, err)
            self.status, self.detail = "pass", "expected failure"

    ev.write(json.dumps({"event": "ready"}) + "\n")
    for line in sys.stdin:
        name = line.strip()
        if not name:
            break
        ev.write(json.dumps({"event": "start", "test": name}) + "\n")
        print(f"\n===== {name} ({backend}, {world} ranks) =====", flush=True)
        t0 = time.monotonic()
        r = Result()
        try:
            TestDistBackendWithFork(name).run(r)
        except BaseException as e:  # noqa: BLE001  the harness itself failed
            r.status, r.detail = "fail", f"{type(e).__name__}: {e}"
        status = r.status
        if status == "fail" and "terminated or timed out after" in r.detail:
            status = "timeout"
        sys.stdout.flush()
        sys.stderr.flush()
        ev.write(
            json.dumps(
                {"event": "end", "test": name, "status": status, "detail": r.detail, "secs": time.monotonic() - t0}
            )
            + "\n"
        )
    return 0
