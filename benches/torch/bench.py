#!/usr/bin/env python3
"""torch.distributed on CPU: gloo against topoccl in the same processes.

One rank of the benchmark (``run.sh`` starts the ranks). The default group is gloo; more groups
over the same ranks use topoccl's C++ backend (``"topoccl"``) and the Python backend it replaced
(``"topoccl_py"``, ``benches/torch/pybackend``), so all are timed on the same data, one after the
other, size by size.

  * all_reduce (sum, float32, async_op=False) from 8 B to 64 MiB, x4 steps: mean time per call
    (the slowest rank's), each backend timed for about BENCH_SECONDS per size.
  * ``backend``: the same all_reduce asked of each topoccl backend object itself
    (``backend.allreduce([t], opts).wait()``): what each backend costs without torch's
    ``dist.all_reduce`` dispatch, which a C++ backend pays and a Python ProcessGroup skips.
  * ``ctypes``: the same all_reduce as a plain ctypes call of ncclAllReduce on the C++ backend's
    communicator (no torch.distributed dispatch, no work object): the library's own cost plus
    ctypes' (``ncclGetVersion`` through ctypes, a call that does nothing, is printed beside it).
  * a DDP training step (MLP, SGD) with each backend, and the step without communication.

Rank 0 prints markdown tables.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])

import topoccl  # noqa: E402
import topoccl_py  # noqa: E402,F401  (registers "topoccl_py")


def sizes(lo: int = 8, hi: int = 64 << 20) -> list[int]:
    out, s = [], lo
    while s < hi:
        out.append(s)
        s *= 4
    out.append(hi)
    return out


def human(b: int) -> str:
    for unit, n in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= n:
            return f"{b // n} {unit}"
    return f"{b} B"


def sync_max(x: float, group) -> float:
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.item()


def time_loop(fn, budget: float, group) -> float:
    """Mean seconds per fn() over a count of iterations every rank agrees on."""
    fn()
    fn()
    t0 = time.perf_counter()
    fn()
    one = time.perf_counter() - t0
    iters = int(sync_max(min(2000.0, max(5.0, budget / max(one, 1e-7))), group))
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    dt = (time.perf_counter() - t0) / iters
    return sync_max(dt, group)


def library():
    """The library the C++ backend opened (the same handle: same path, RTLD_LOCAL)."""
    lib = ctypes.CDLL(topoccl.library_path, mode=os.RTLD_LOCAL)
    lib.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    lib.ncclGetVersion.argtypes = [ctypes.POINTER(ctypes.c_int)]
    return lib


def bench_all_reduce(gloo, topo, topo_py, budget: float, max_bytes: int) -> list[tuple]:
    lib = library()
    comm = topoccl.backend_of(topo).comm
    version = ctypes.c_int(0)
    nothing = time_loop(lambda: lib.ncclGetVersion(ctypes.byref(version)), budget, gloo)
    rows = []
    for nbytes in sizes(8, max_bytes):
        n = max(1, nbytes // 4)
        tg, tt, tp, td = (torch.ones(n) for _ in range(4))
        g = time_loop(lambda: dist.all_reduce(tg, group=gloo), budget, gloo)
        t = time_loop(lambda: dist.all_reduce(tt, group=topo), budget, gloo)
        p = time_loop(lambda: dist.all_reduce(tp, group=topo_py), budget, gloo)
        opts = dist.AllreduceOptions()
        opts.asyncOp = False
        cxx = topoccl.backend_of(topo)
        tb, tq = torch.ones(n), torch.ones(n)
        tb_ = time_loop(lambda: cxx.allreduce([tb], opts).wait(), budget, gloo)
        # (The Python backend returns no work for a synchronous call it ran on this thread.)
        tq_ = time_loop(lambda: (w := topo_py.allreduce([tq], opts)) is None or w.wait(), budget, gloo)
        ptr = td.data_ptr()

        def direct():
            rc = lib.ncclAllReduce(ptr, ptr, n, 7, 0, comm, None)
            if rc:
                raise RuntimeError(f"ncclAllReduce returned {rc}")

        d = time_loop(direct, budget, gloo)
        rows.append((nbytes, g, t, p, d, nothing, tb_, tq_))
        if RANK == 0:
            print(
                f"  {human(nbytes):>8}: gloo {g * 1e6:9.1f} us  topoccl {t * 1e6:9.1f} us  topoccl_py {p * 1e6:9.1f} us  "
                f"ctypes {d * 1e6:9.1f} us",
                file=sys.stderr,
                flush=True,
            )
    return rows


def make_model(width: int, depth: int) -> torch.nn.Module:
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(width, 16))
    return torch.nn.Sequential(*layers)


def bench_ddp(group, width: int, depth: int, batch: int, steps: int, barrier_group) -> float:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = make_model(width, depth)
    net = DDP(model, process_group=group) if group is not None else model
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(RANK)
    x, y = torch.randn(batch, width, generator=g), torch.randn(batch, 16, generator=g)

    def step():
        opt.zero_grad(set_to_none=False)
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()

    for _ in range(3):
        step()
    dist.barrier(group=barrier_group)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return sync_max(statistics.median(times), barrier_group)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=float(os.environ.get("BENCH_SECONDS", "0.25")))
    ap.add_argument("--max-bytes", type=int, default=64 << 20)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--skip-ddp", action="store_true")
    ap.add_argument("--skip-allreduce", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    dist.init_process_group("gloo", rank=RANK, world_size=WORLD)
    gloo = dist.group.WORLD
    topo = dist.new_group(list(range(WORLD)), backend="topoccl")
    topo_py = dist.new_group(list(range(WORLD)), backend="topoccl_py")
    if RANK == 0:
        print(f"\n### {WORLD} ranks (torch {torch.__version__}, {os.cpu_count()} CPUs)\n", flush=True)
    if not args.skip_allreduce:
        rows = bench_all_reduce(gloo, topo, topo_py, args.budget, args.max_bytes)
        if RANK == 0:
            print(
                "all_reduce, float32 sum, async_op=False; mean µs per call, slowest rank. topoccl: the C++ backend; "
                "topoccl_py: the Python backend it replaced; ctypes: ncclAllReduce called through ctypes on the C++ "
                f"backend's communicator (ctypes alone, ncclGetVersion: {rows[0][5] * 1e6:.1f} µs)\n"
            )
            print(
                "| size | gloo | topoccl | topoccl_py | gloo / topoccl | topoccl_py / topoccl | backend: topoccl | "
                "backend: topoccl_py | ctypes |"
            )
            print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            for nbytes, g, t, p, d, _, b, q in rows:
                print(
                    f"| {human(nbytes)} | {g * 1e6:.1f} | {t * 1e6:.1f} | {p * 1e6:.1f} | {g / t:.2f} | {p / t:.2f} | "
                    f"{b * 1e6:.1f} | {q * 1e6:.1f} | {d * 1e6:.1f} |"
                )
            print(flush=True)
    if not args.skip_ddp:
        params = sum(p.numel() for p in make_model(args.width, args.depth).parameters())
        local = bench_ddp(None, args.width, args.depth, args.batch, args.steps, gloo)
        g = bench_ddp(gloo, args.width, args.depth, args.batch, args.steps, gloo)
        t = bench_ddp(topo, args.width, args.depth, args.batch, args.steps, gloo)
        p = bench_ddp(topo_py, args.width, args.depth, args.batch, args.steps, gloo)
        if RANK == 0:
            print(
                f"DDP step (MLP {args.depth}x{args.width}, {params / 1e6:.2f} M params = {params * 4 / 2**20:.1f} MiB of "
                f"gradients, batch {args.batch}, SGD); median of {args.steps} steps, slowest rank\n"
            )
            print("| | step ms | vs. no communication |")
            print("|---|---:|---:|")
            print(f"| no DDP (local only) | {local * 1e3:.1f} | |")
            print(f"| DDP gloo | {g * 1e3:.1f} | +{(g - local) * 1e3:.1f} ms |")
            print(f"| DDP topoccl | {t * 1e3:.1f} | +{(t - local) * 1e3:.1f} ms |")
            print(f"| DDP topoccl_py | {p * 1e3:.1f} | +{(p - local) * 1e3:.1f} ms |")
            print(flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
