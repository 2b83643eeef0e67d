"""Starts N rank processes of ``rank_main.py`` and collects what they report.

Each rank is a fresh ``python3`` (torch's import is the expensive part of a job). The ranks
find each other through ``MASTER_ADDR=127.0.0.1`` and a free port; the package under test is
this checkout's ``python/topoccl`` (put first on ``PYTHONPATH``) with the library named by
``TOPOCCL_NCCL_LIB`` (the runner sets it).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RankResult:
    rank: int
    returncode: int | None
    output: str
    elapsed: float


@dataclass
class JobResult:
    case: str
    world: int
    ranks: list[RankResult] = field(default_factory=list)
    timed_out: bool = False
    elapsed: float = 0.0

    def output(self) -> str:
        return "\n".join(f"----- rank {r.rank} (exit {r.returncode}, {r.elapsed:.1f} s) -----\n{r.output}" for r in self.ranks)


def launch(case: str, world: int, timeout: float = 120.0, env: dict[str, str] | None = None, args: list[str] | None = None) -> JobResult:
    """Runs ``rank_main.py CASE`` as ``world`` ranks; kills them all after ``timeout`` s."""
    port = free_port()
    extra: list[int] = []
    while len(extra) < 4:  # distinct ports for the init-method stages
        q = free_port()
        if q != port and q not in extra:
            extra.append(q)
    base = dict(os.environ)
    base.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(world),
        PYTHONPATH=PYTHON_DIR + (os.pathsep + base["PYTHONPATH"] if base.get("PYTHONPATH") else ""),
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
        TOPOCCL_TEST_DIR=tempfile.mkdtemp(prefix=f"topoccl-{case}-"),
        TOPOCCL_TEST_PORTS=",".join(map(str, extra)),
    )
    base.pop("TORCH_DISTRIBUTED_DEBUG", None)
    if env:
        base.update(env)
    job = JobResult(case, world)
    procs = []
    logs = []
    t0 = time.monotonic()
    for r in range(world):
        e = dict(base, RANK=str(r), LOCAL_RANK=str(r))
        log = tempfile.TemporaryFile(mode="w+")
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [sys.executable, os.path.join(HERE, "rank_main.py"), case, *(args or [])],
                env=e,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    ends: list[float | None] = [None] * world
    deadline = t0 + timeout
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        for i, p in enumerate(procs):
            if ends[i] is None and p.poll() is not None:
                ends[i] = now
        if now > deadline:
            job.timed_out = True
            for p in procs:
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            break
        time.sleep(0.05)
    for i, p in enumerate(procs):
        p.wait()
        if ends[i] is None:
            ends[i] = time.monotonic()
        logs[i].seek(0)
        job.ranks.append(RankResult(i, p.returncode, logs[i].read(), ends[i] - t0))
        logs[i].close()
    job.elapsed = time.monotonic() - t0
    return job
