"""One rank of a test job: ``python3 rank_main.py CASE`` with RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT set (``launcher.py`` does). Every check that fails prints a ``FAIL`` line; the
process exits 1 if any did, 0 otherwise. Expected values are computed locally, from what every
rank contributed (each rank's inputs are a function of its rank).
"""

from __future__ import annotations

import datetime
import os
import sys
import threading
import time
import traceback

import torch
import torch.distributed as dist

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
TMP = os.environ.get("TOPOCCL_TEST_DIR", "/tmp")

import topoccl  # noqa: E402  (registers the backend)

RedOpType = dist.ReduceOp.RedOpType


class Checker:
    def __init__(self, name: str):
        self.name = name
        self.failures: list[str] = []
        self.checks = 0
        self.notes: list[str] = []

    def ok(self, cond: bool, what: str) -> None:
        self.checks += 1
        if not cond:
            self.failures.append(what)
            print(f"FAIL rank {RANK}: {what}", flush=True)

    def eq(self, got: torch.Tensor, want: torch.Tensor, what: str) -> None:
        g, w = _cmp(got), _cmp(want)
        same = g.shape == w.shape and bool(torch.equal(g, w))
        self.ok(same, f"{what}: got {got.reshape(-1)[:8].tolist()} want {want.reshape(-1)[:8].tolist()}")

    def raises(self, fn, exc, what: str, match: str = "") -> None:
        try:
            fn()
        except exc as e:  # noqa: PERF203
            self.ok(match.lower() in str(e).lower(), f"{what}: error text {str(e)!r} lacks {match!r}")
            return
        except Exception as e:  # noqa: BLE001
            self.ok(False, f"{what}: raised {type(e).__name__}: {e}, expected {exc.__name__}")
            return
        self.ok(False, f"{what}: did not raise")

    def guard(self, what: str, fn, *args) -> None:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001
            self.ok(False, f"{what} raised:\n{traceback.format_exc()}")

    def finish(self) -> int:
        for n in self.notes:
            print(f"NOTE rank {RANK}: {n}", flush=True)
        print(f"{self.name}: rank {RANK}: {self.checks} checks, {len(self.failures)} failed", flush=True)
        return 1 if self.failures else 0


def _cmp(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.dtype in (torch.bool,):
        return t.to(torch.uint8)
    if t.is_floating_point():
        return t.to(torch.float64)
    return t.to(torch.int64)


def _maybe(name: str):
    return getattr(torch, name, None)


INT_TYPES = [t for t in (torch.int8, torch.uint8, torch.int32, torch.int64, _maybe("uint32"), _maybe("uint64")) if t is not None]
FLOAT_TYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
FP8_TYPES = [t for t in (_maybe("float8_e4m3fn"), _maybe("float8_e5m2")) if t is not None]


def contribution(rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank ``rank``'s input: small integers, exact in every dtype and every reduction."""
    base = (torch.arange(n, dtype=torch.int64) + rank) % 3 + 1  # 1..3
    if dtype == torch.bool:
        return ((torch.arange(n) + rank) % 3) != 0
    if dtype in FP8_TYPES:
        return ((torch.arange(n) + rank) % 2).to(torch.float32).to(dtype)  # 0 or 1
    return base.to(dtype)


def expected(op, dtype: torch.dtype, n: int, world: int, factor: float = 2.0) -> torch.Tensor:
    xs = torch.stack([contribution(r, n, dtype).to(torch.float64) for r in range(world)])
    if op == RedOpType.SUM:
        v = xs.sum(0)
    elif op == RedOpType.PRODUCT:
        v = xs.prod(0)
    elif op == RedOpType.MIN:
        v = xs.min(0).values
    elif op == RedOpType.MAX:
        v = xs.max(0).values
    elif op == RedOpType.AVG:
        v = xs.sum(0) / world
        if not (dtype.is_floating_point):
            v = torch.div(xs.sum(0), world, rounding_mode="trunc")
    elif op == RedOpType.PREMUL_SUM:
        v = xs.sum(0) * factor
    else:
        raise AssertionError(op)
    if dtype == torch.bool:
        return v != 0 if op in (RedOpType.SUM, RedOpType.MAX) else (v != 0)
    return v.to(torch.int64).to(dtype) if not dtype.is_floating_point else v.to(dtype)


def ops_for(dtype: torch.dtype):
    if dtype == torch.bool:
        return [RedOpType.SUM, RedOpType.PRODUCT, RedOpType.MIN, RedOpType.MAX]
    if dtype in FP8_TYPES:
        return [RedOpType.SUM, RedOpType.MIN, RedOpType.MAX]
    ops = [RedOpType.SUM, RedOpType.PRODUCT, RedOpType.MIN, RedOpType.MAX, RedOpType.AVG]
    if dtype.is_floating_point:
        ops.append(RedOpType.PREMUL_SUM)
    return ops


def reduce_op(op, factor=2.0):
    if op == RedOpType.PREMUL_SUM:
        return dist._make_nccl_premul_sum(factor)
    return dist.ReduceOp(op) if not isinstance(op, dist.ReduceOp) else op


def init(backend: str = "topoccl", **kw):
    kw.setdefault("timeout", datetime.timedelta(seconds=60))
    dist.init_process_group(backend, rank=RANK, world_size=WORLD, **kw)


# ---------------------------------------------------------------------------------------------
# Collectives


def check_all_reduce(c: Checker, group=None, world=WORLD, rank=RANK) -> None:
    n = 7
    for dtype in [torch.bool] + INT_TYPES + FLOAT_TYPES + FP8_TYPES:
        for op in ops_for(dtype):
            t = contribution(rank, n, dtype)
            try:
                dist.all_reduce(t, op=reduce_op(op), group=group)
            except Exception as e:  # noqa: BLE001
                if dtype in FP8_TYPES and "datatype" in str(e):
                    c.notes.append(f"library lacks {dtype}: {str(e).splitlines()[0][:160]}")
                    break
                c.ok(False, f"all_reduce {dtype} {op} raised {type(e).__name__}: {e}")
                continue
            c.eq(t, expected(op, dtype, n, world), f"all_reduce {dtype} {op}")
    # Non-contiguous (a transposed view), written back in place.
    base = torch.stack([contribution(rank, 4, torch.float32) for _ in range(3)])  # 3x4
    v = base.t()
    dist.all_reduce(v, group=group)
    want = torch.stack([expected(RedOpType.SUM, torch.float32, 4, world) for _ in range(3)]).t()
    c.eq(v, want, "all_reduce non-contiguous")
    c.eq(base, want.t(), "all_reduce non-contiguous writes the base tensor")
    # Empty tensor, scalar, large (several slices of the library's pipeline).
    e = torch.empty(0)
    dist.all_reduce(e, group=group)
    c.ok(e.numel() == 0, "all_reduce of an empty tensor")
    s = torch.tensor(float(rank + 1))
    dist.all_reduce(s, group=group)
    c.eq(s, torch.tensor(float(sum(range(1, world + 1)))), "all_reduce of a 0-d tensor")
    big = torch.full((3 << 20,), float(rank + 1))  # 12 MiB
    dist.all_reduce(big, group=group)
    c.ok(bool((big == float(sum(range(1, world + 1)))).all()), "all_reduce 12 MiB")
    # Complex (torch views it as real).
    z = torch.full((3,), complex(rank, 1), dtype=torch.complex64)
    dist.all_reduce(z, group=group)
    c.eq(torch.view_as_real(z), torch.view_as_real(torch.full((3,), complex(sum(range(world)), world), dtype=torch.complex64)), "all_reduce complex64")


def check_errors(c: Checker) -> None:
    # Bitwise reductions (Gloo has them; NCCL does not): the backend gathers and folds.
    vals = [0b1011 ^ (1 << r) for r in range(WORLD)]
    for op, fold in (
        (dist.ReduceOp.BAND, lambda a, b: a & b),
        (dist.ReduceOp.BOR, lambda a, b: a | b),
        (dist.ReduceOp.BXOR, lambda a, b: a ^ b),
    ):
        want = vals[0]
        for v in vals[1:]:
            want = fold(want, v)
        for dtype in (torch.int32, torch.uint8, torch.int64):
            t = torch.full((3,), vals[RANK], dtype=dtype)
            dist.all_reduce(t, op=op)
            c.eq(t, torch.full((3,), want, dtype=dtype), f"all_reduce {op} {dtype}")
        t = torch.full((2,), vals[RANK], dtype=torch.int32)
        dist.reduce(t, dst=WORLD - 1, op=op)
        if RANK == WORLD - 1:
            c.eq(t, torch.full((2,), want, dtype=torch.int32), f"reduce {op}")
    c.raises(
        lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BAND), RuntimeError, "BAND on floats", "bitwise"
    )
    c.raises(lambda: dist.all_reduce(torch.ones(3, dtype=torch.int16)), RuntimeError, "int16 reduction", "Short")
    c.raises(lambda: dist.send(torch.ones(3), dst=(RANK + 1) % WORLD, tag=-1), RuntimeError, "negative tag", "tag -1")
    # A call's own timeout, shorter than the group's: rank 0 alone enters a barrier of a
    # fresh group; it fails at that timeout, in torch's words, and its communicator is aborted.
    sg = dist.new_group(list(range(WORLD)))
    if RANK == 0:
        t0 = time.monotonic()
        c.raises(
            lambda: dist.barrier(group=sg, timeout=datetime.timedelta(seconds=0.3)),
            RuntimeError,
            "a barrier past its own timeout",
            "Timed out waiting 300ms",
        )
        dt = time.monotonic() - t0
        c.ok(0.3 <= dt < 5, f"the barrier failed at its 0.3 s timeout, not before (took {dt:.2f} s)")
        c.ok(topoccl.backend_of(sg).comm is None, "the timed-out call aborted its communicator")
    dist.barrier()
    dist.destroy_process_group(sg)
    # The group still works afterwards.
    t = torch.ones(2)
    dist.all_reduce(t)
    c.eq(t, torch.full((2,), float(WORLD)), "all_reduce after rejected calls")


def check_broadcast_reduce(c: Checker) -> None:
    for root in range(WORLD):
        for dtype in (torch.float32, torch.int16, torch.bool, torch.bfloat16):
            t = contribution(root, 5, dtype) if RANK == root else torch.zeros(5, dtype=dtype)
            dist.broadcast(t, src=root)
            c.eq(t, contribution(root, 5, dtype), f"broadcast {dtype} from {root}")
        z = torch.full((2,), complex(root, 2), dtype=torch.complex128) if RANK == root else torch.zeros(2, dtype=torch.complex128)
        dist.broadcast(z, src=root)
        c.eq(torch.view_as_real(z), torch.view_as_real(torch.full((2,), complex(root, 2), dtype=torch.complex128)), f"broadcast complex from {root}")
        nc = torch.zeros(4, 3)
        if RANK == root:
            nc.copy_(torch.arange(12.0).reshape(4, 3))
        v = nc.t()
        dist.broadcast(v, src=root)
        c.eq(nc, torch.arange(12.0).reshape(4, 3), f"broadcast non-contiguous from {root}")
        for op in (RedOpType.SUM, RedOpType.MAX, RedOpType.PRODUCT):
            t = contribution(RANK, 6, torch.int64)
            dist.reduce(t, dst=root, op=reduce_op(op))
            if RANK == root:
                c.eq(t, expected(op, torch.int64, 6, WORLD), f"reduce {op} to {root}")
        t = contribution(RANK, 6, torch.float32)
        dist.reduce(t, dst=root, op=reduce_op(RedOpType.PREMUL_SUM, 0.5))
        if RANK == root:
            c.eq(t, expected(RedOpType.PREMUL_SUM, torch.float32, 6, WORLD, 0.5), f"reduce PREMUL_SUM to {root}")


def check_all_gather(c: Checker) -> None:
    for dtype in (torch.float32, torch.int16, torch.float64, torch.bool):
        mine = contribution(RANK, 5, dtype)
        want = [contribution(r, 5, dtype) for r in range(WORLD)]
        outs = [torch.zeros(5, dtype=dtype) for _ in range(WORLD)]
        dist.all_gather(outs, mine)
        for r in range(WORLD):
            c.eq(outs[r], want[r], f"all_gather {dtype} slot {r}")
        flat = torch.zeros(5 * WORLD, dtype=dtype)
        dist.all_gather(list(flat.chunk(WORLD)), mine)
        c.eq(flat, torch.cat(want), f"all_gather into chunks {dtype}")
        out = torch.zeros(WORLD * 5, dtype=dtype)
        dist.all_gather_into_tensor(out, mine)
        c.eq(out, torch.cat(want), f"all_gather_into_tensor {dtype}")
        out2 = torch.zeros(WORLD, 5, dtype=dtype)
        dist.all_gather_into_tensor(out2, mine)
        c.eq(out2.reshape(-1), torch.cat(want), f"all_gather_into_tensor stacked {dtype}")
        inplace = torch.zeros(WORLD * 5, dtype=dtype)
        inplace[RANK * 5 : (RANK + 1) * 5] = mine
        dist.all_gather_into_tensor(inplace, inplace[RANK * 5 : (RANK + 1) * 5])
        c.eq(inplace, torch.cat(want), f"all_gather_into_tensor in place {dtype}")
    # Uneven sizes: rank r has r+1 elements.
    mine = torch.full((RANK + 1,), float(RANK))
    outs = [torch.zeros(r + 1) for r in range(WORLD)]
    dist.all_gather(outs, mine)
    for r in range(WORLD):
        c.eq(outs[r], torch.full((r + 1,), float(r)), f"uneven all_gather slot {r}")
    # Non-contiguous outputs.
    outs = [torch.zeros(3, 2).t() for _ in range(WORLD)]
    dist.all_gather(outs, torch.full((2, 3), float(RANK)))
    for r in range(WORLD):
        c.eq(outs[r], torch.full((2, 3), float(r)), f"all_gather non-contiguous slot {r}")
    # Objects (pickles through all_gather / broadcast of byte tensors).
    objs = [None] * WORLD
    dist.all_gather_object(objs, {"rank": RANK, "s": "x" * RANK})
    c.ok(objs == [{"rank": r, "s": "x" * r} for r in range(WORLD)], f"all_gather_object {objs}")
    lst = [RANK, "hello"] if RANK == 0 else [None, None]
    dist.broadcast_object_list(lst, src=0)
    c.ok(lst == [0, "hello"], f"broadcast_object_list {lst}")


def check_reduce_scatter(c: Checker) -> None:
    k = 3
    for dtype in (torch.float32, torch.int32, torch.bfloat16):
        for op in (RedOpType.SUM, RedOpType.MAX, RedOpType.MIN, RedOpType.PRODUCT):
            full = contribution(RANK, k * WORLD, dtype)
            want_full = expected(op, dtype, k * WORLD, WORLD)
            out = torch.zeros(k, dtype=dtype)
            dist.reduce_scatter_tensor(out, full, op=reduce_op(op))
            c.eq(out, want_full[RANK * k : (RANK + 1) * k], f"reduce_scatter_tensor {dtype} {op}")
            out = torch.zeros(k, dtype=dtype)
            ins = [x.clone() for x in full.chunk(WORLD)]
            dist.reduce_scatter(out, ins, op=reduce_op(op))
            c.eq(out, want_full[RANK * k : (RANK + 1) * k], f"reduce_scatter list {dtype} {op}")
    full = contribution(RANK, k * WORLD, torch.float32)
    want_full = expected(RedOpType.AVG, torch.float32, k * WORLD, WORLD)
    out = torch.zeros(k)
    dist.reduce_scatter_tensor(out, full, op=dist.ReduceOp.AVG)
    c.eq(out, want_full[RANK * k : (RANK + 1) * k], "reduce_scatter_tensor AVG")
    out = torch.zeros(k)
    dist.reduce_scatter_tensor(out, full, op=dist._make_nccl_premul_sum(3.0))
    c.eq(out, expected(RedOpType.PREMUL_SUM, torch.float32, k * WORLD, WORLD, 3.0)[RANK * k : (RANK + 1) * k], "reduce_scatter_tensor PREMUL_SUM")
    # 2-d input as FSDP lays it out.
    full2 = contribution(RANK, k * WORLD, torch.float32).reshape(WORLD, k)
    out = torch.zeros(k)
    dist.reduce_scatter_tensor(out, full2)
    c.eq(out, expected(RedOpType.SUM, torch.float32, k * WORLD, WORLD)[RANK * k : (RANK + 1) * k], "reduce_scatter_tensor 2-d")


def check_gather_scatter(c: Checker) -> None:
    for root in range(WORLD):
        mine = contribution(RANK, 4, torch.float32) + 10 * RANK
        want = [contribution(r, 4, torch.float32) + 10 * r for r in range(WORLD)]
        gl = [torch.zeros(4) for _ in range(WORLD)] if RANK == root else None
        dist.gather(mine, gather_list=gl, dst=root)
        if RANK == root:
            for r in range(WORLD):
                c.eq(gl[r], want[r], f"gather to {root} slot {r}")
        if hasattr(dist, "gather_into_tensor"):
            gt = torch.zeros(WORLD, 4) if RANK == root else None
            dist.gather_into_tensor(mine, gt, dst=root)
            if RANK == root:
                c.eq(gt.reshape(-1), torch.cat(want), f"gather_into_tensor to {root}")
        out = torch.zeros(3, dtype=torch.int64)
        sl = [torch.full((3,), 100 * root + r, dtype=torch.int64) for r in range(WORLD)] if RANK == root else None
        dist.scatter(out, scatter_list=sl, src=root)
        c.eq(out, torch.full((3,), 100 * root + RANK, dtype=torch.int64), f"scatter from {root}")


def a2a_count(i: int, j: int) -> int:
    """Rows rank i sends rank j in the uneven all_to_all (zeros included)."""
    return (i + 2 * j) % 3


def check_all_to_all(c: Checker) -> None:
    # Even.
    k = 2
    inp = torch.tensor([1000 * RANK + 10 * j + e for j in range(WORLD) for e in range(k)], dtype=torch.float64)
    out = torch.zeros(WORLD * k, dtype=torch.float64)
    dist.all_to_all_single(out, inp)
    want = torch.tensor([1000 * j + 10 * RANK + e for j in range(WORLD) for e in range(k)], dtype=torch.float64)
    c.eq(out, want, "all_to_all_single even")
    # Uneven splits of 2-d rows (width 3).
    in_splits = [a2a_count(RANK, j) for j in range(WORLD)]
    out_splits = [a2a_count(j, RANK) for j in range(WORLD)]
    rows = [[1000 * RANK + 100 * j + r] * 3 for j in range(WORLD) for r in range(in_splits[j])]
    inp = torch.tensor(rows, dtype=torch.int32).reshape(-1, 3)
    out = torch.full((sum(out_splits), 3), -1, dtype=torch.int32)
    dist.all_to_all_single(out, inp, output_split_sizes=out_splits, input_split_sizes=in_splits)
    want_rows = [[1000 * j + 100 * RANK + r] * 3 for j in range(WORLD) for r in range(out_splits[j])]
    c.eq(out, torch.tensor(want_rows, dtype=torch.int32).reshape(-1, 3), "all_to_all_single uneven")
    # Lists of different sizes per peer.
    ins = [torch.full((a2a_count(RANK, j) + 1,), float(100 * RANK + j)) for j in range(WORLD)]
    outs = [torch.zeros(a2a_count(j, RANK) + 1) for j in range(WORLD)]
    dist.all_to_all(outs, ins)
    for j in range(WORLD):
        c.eq(outs[j], torch.full((a2a_count(j, RANK) + 1,), float(100 * j + RANK)), f"all_to_all list from {j}")
    # Async, then future.
    out = torch.zeros(WORLD * k, dtype=torch.float64)
    inp = torch.tensor([1000 * RANK + 10 * j + e for j in range(WORLD) for e in range(k)], dtype=torch.float64)
    w = dist.all_to_all_single(out, inp, async_op=True)
    w.wait()
    c.eq(out, want, "all_to_all_single async")


def check_p2p(c: Checker) -> None:
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    # Blocking send/recv, even ranks first.
    t = torch.full((4,), float(RANK))
    r = torch.zeros(4)
    if WORLD % 2 == 0:
        if RANK % 2 == 0:
            dist.send(t, dst=nxt)
            dist.recv(r, src=prv)
        else:
            dist.recv(r, src=prv)
            dist.send(t, dst=nxt)
        c.eq(r, torch.full((4,), float(prv)), "send/recv ring")
    # isend/irecv (small).
    r = torch.zeros(4)
    reqs = [dist.isend(t, dst=nxt), dist.irecv(r, src=prv)]
    for q in reqs:
        q.wait()
    c.eq(r, torch.full((4,), float(prv)), "isend/irecv ring")
    # batch_isend_irecv both directions, large enough (8 MiB each way) that sends cannot all
    # be buffered: only grouped transfers avoid deadlock.
    n = 2 << 20
    s1, s2 = torch.full((n,), float(RANK)), torch.full((n,), float(RANK) + 0.5)
    r1, r2 = torch.zeros(n), torch.zeros(n)
    ops = [
        dist.P2POp(dist.isend, s1, nxt),
        dist.P2POp(dist.isend, s2, prv),
        dist.P2POp(dist.irecv, r1, prv),
        dist.P2POp(dist.irecv, r2, nxt),
    ]
    for q in dist.batch_isend_irecv(ops):
        q.wait()
    c.ok(bool((r1 == float(prv)).all()) and bool((r2 == float(nxt) + 0.5).all()), "batch_isend_irecv both ways, 8 MiB")
    # Non-contiguous receive.
    src = torch.arange(6.0).reshape(2, 3) + RANK
    dstv = torch.zeros(3, 2)
    ops = [dist.P2POp(dist.isend, src, nxt), dist.P2POp(dist.irecv, dstv.t(), prv)]
    for q in dist.batch_isend_irecv(ops):
        q.wait()
    c.eq(dstv.t(), torch.arange(6.0).reshape(2, 3) + prv, "batch_isend_irecv into a non-contiguous tensor")
    # Tags: rank 0 takes rank 1's messages in the other order than they were sent.
    if RANK == 1:
        for tag in (3, 4):
            dist.send(torch.full((2,), float(tag)), dst=0, tag=tag)
    elif RANK == 0:
        four, three = torch.zeros(2), torch.zeros(2)
        dist.recv(four, src=1, tag=4)
        dist.recv(three, src=1, tag=3)
        c.ok(bool((four == 4).all()) and bool((three == 3).all()), "tagged messages taken out of order")
    # Receives from any source: rank 0 takes one message from every other rank.
    if RANK == 0:
        got = []
        for _ in range(WORLD - 1):
            r = torch.zeros(3)
            src = dist.recv(r, tag=7)
            got.append((src, bool((r == src).all())))
        c.ok(sorted(s for s, _ in got) == list(range(1, WORLD)) and all(ok for _, ok in got), f"recv(src=None): {got}")
        w = dist.irecv(torch.zeros(1), tag=8) if WORLD > 1 else None
        if w is not None:
            w.wait()
            c.ok(w._source_rank() == WORLD - 1, "irecv(src=None)'s work names its source")
    else:
        dist.send(torch.full((3,), float(RANK)), dst=0, tag=7)
        if RANK == WORLD - 1:
            dist.send(torch.ones(1), dst=0, tag=8)


def check_async(c: Checker) -> None:
    ts = [torch.full((1000 * (i + 1),), float(RANK + i)) for i in range(8)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    seen = []
    futs = [w.get_future() for w in works]
    futs[0].then(lambda f: seen.append(f.value()[0].sum().item()))
    for w in works:
        c.ok(w.wait() is True, "work.wait() returns True")
    for i, t in enumerate(ts):
        c.ok(bool((t == float(sum(r + i for r in range(WORLD)))).all()), f"async all_reduce {i}")
    v = futs[3].wait()
    c.ok(isinstance(v, list) and v[0] is ts[3], "future value is the output tensor list")
    c.ok(works[-1].is_completed(), "is_completed after wait")
    c.ok(len(seen) == 1 and seen[0] == float(sum(range(WORLD))) * 1000, f"future.then ran: {seen}")
    # A future callback (run by the group's worker thread) issuing collectives of its own.
    got = []

    def callback(f):
        x = torch.full((2,), float(RANK))
        dist.all_reduce(x)
        y = torch.ones(2)
        dist.all_reduce(y, async_op=True).wait()
        got.append((x.tolist(), y.tolist()))
        return f.value()

    big = torch.ones(1 << 18)
    dist.all_reduce(big, async_op=True).get_future().then(callback).wait()
    want = ([float(sum(range(WORLD)))] * 2, [float(WORLD)] * 2)
    c.ok(got == [want], f"collectives inside a future callback: {got}")
    # Mixed async collectives, then a sync one: all in order.
    a = torch.full((5,), float(RANK))
    w1 = dist.broadcast(a, src=0, async_op=True)
    b = torch.zeros(WORLD * 5)
    w2 = dist.all_gather_into_tensor(b, a, async_op=True)
    dist.barrier()
    w1.wait(), w2.wait()
    c.eq(b, torch.zeros(WORLD * 5), "async broadcast then all_gather ran in order")
    w = dist.barrier(async_op=True)
    w.wait()
    # Coalescing manager (all_reduce / all_gather_into_tensor / reduce_scatter_tensor fast paths).
    xs = [torch.full((3,), float(RANK + i)) for i in range(3)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for x in xs:
            dist.all_reduce(x)
    cm.wait()
    for i, x in enumerate(xs):
        c.eq(x, torch.full((3,), float(sum(r + i for r in range(WORLD)))), f"coalesced all_reduce {i}")
    ins = [torch.full((2,), float(RANK * 10 + i)) for i in range(2)]
    outs = [torch.zeros(2 * WORLD) for _ in range(2)]
    with dist._coalescing_manager():
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    for i, o in enumerate(outs):
        c.eq(o, torch.cat([torch.full((2,), float(r * 10 + i)) for r in range(WORLD)]), f"coalesced all_gather_into_tensor {i}")
    # all_gather_coalesced: output_tensor_lists[r][i] is rank r's input i (torch's documented
    # layout); inputs of two sizes, so a transposed reading fails or mixes them up.
    ins = [torch.full((2,), float(RANK * 10 + 1)), torch.full((3,), float(RANK * 10 + 2))]
    outs = [[torch.zeros(2), torch.zeros(3)] for _ in range(WORLD)]
    dist.all_gather_coalesced(outs, ins)
    for r in range(WORLD):
        for i, n in enumerate((2, 3)):
            c.eq(outs[r][i], torch.full((n,), float(r * 10 + i + 1)), f"all_gather_coalesced rank {r} input {i}")
    # Functional collectives (C++ callers, as torch.compile'd code and FSDP2/TP use them).
    import torch.distributed._functional_collectives as funcol

    y = funcol.all_reduce(torch.full((4,), float(RANK)), "sum", dist.group.WORLD)
    y = funcol.wait_tensor(y) if hasattr(funcol, "wait_tensor") else y
    c.eq(y, torch.full((4,), float(sum(range(WORLD)))), "functional all_reduce")
    ag = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
    g = ag(torch.full((2,), float(RANK)), 0, dist.group.WORLD)
    g = funcol.wait_tensor(g) if hasattr(funcol, "wait_tensor") else g
    c.eq(g, torch.cat([torch.full((2,), float(r)) for r in range(WORLD)]), "functional all_gather_tensor")
    rsf = getattr(funcol, "reduce_scatter_single", None) or funcol.reduce_scatter_tensor
    rs = rsf(torch.ones(2 * WORLD), "sum", 0, dist.group.WORLD)
    rs = funcol.wait_tensor(rs) if hasattr(funcol, "wait_tensor") else rs
    c.eq(rs, torch.full((2,), float(WORLD)), "functional reduce_scatter_tensor")


def check_subgroups(c: Checker) -> None:
    # A group of topoccl alone names it (DDP logs the name); one shared with another backend
    # gives each device its own.
    c.ok(dist.group.WORLD.name() == "topoccl", f"the default group is named {dist.group.WORLD.name()!r}")
    mixed = dist.new_group(list(range(WORLD)), backend="cpu:topoccl,cuda:gloo")
    on_cpu, on_cuda = mixed._get_backend(torch.device("cpu")), mixed._get_backend(torch.device("cuda"))
    c.ok(
        isinstance(on_cpu, topoccl.ProcessGroupTopoccl) and on_cuda.name() == "gloo",
        f"cpu:topoccl,cuda:gloo: {type(on_cpu).__name__} on cpu, {on_cuda.name()} on cuda",
    )
    t = torch.ones(3)
    dist.all_reduce(t, group=mixed)
    c.eq(t, torch.full((3,), float(WORLD)), "all_reduce on a cpu:topoccl,cuda:gloo group")
    first = dist.new_group([0, 1])
    evens = dist.new_group(list(range(0, WORLD, 2)))
    last = dist.new_group([WORLD - 1])
    if RANK in (0, 1):
        t = torch.full((3,), float(RANK + 1))
        dist.all_reduce(t, group=first)
        c.eq(t, torch.full((3,), 3.0), "all_reduce on new_group([0, 1])")
        c.ok(dist.get_backend(first) == "topoccl", f"subgroup backend {dist.get_backend(first)}")
    else:
        c.ok(dist.all_reduce(torch.ones(1), group=first) is None, "non-member call returns None")
    if RANK % 2 == 0:
        ne = len(range(0, WORLD, 2))
        check_all_reduce_small(c, evens, ne, RANK // 2)
        t = torch.zeros(2) if RANK != 0 else torch.full((2,), 7.0)
        dist.broadcast(t, src=0, group=evens)
        c.eq(t, torch.full((2,), 7.0), "broadcast on the evens subgroup (global src 0)")
    if RANK == WORLD - 1:
        t = torch.full((2,), 5.0)
        dist.all_reduce(t, group=last)
        c.eq(t, torch.full((2,), 5.0), "all_reduce on a 1-rank group")
    # A subgroup of another backend alongside.
    gl = dist.new_group(list(range(WORLD)), backend="gloo")
    t = torch.ones(2)
    dist.all_reduce(t, group=gl)
    c.eq(t, torch.full((2,), float(WORLD)), "gloo subgroup beside topoccl")
    dist.destroy_process_group(first) if RANK in (0, 1) else None
    t = torch.ones(2)
    dist.all_reduce(t)
    c.eq(t, torch.full((2,), float(WORLD)), "world still works after destroying a subgroup")


def check_all_reduce_small(c: Checker, group, world: int, rank: int) -> None:
    for op in (RedOpType.SUM, RedOpType.MAX):
        t = contribution(rank, 5, torch.float32)
        dist.all_reduce(t, op=reduce_op(op), group=group)
        c.eq(t, expected(op, torch.float32, 5, world), f"subgroup all_reduce {op}")


def _mapping_of(addr: int) -> str | None:
    """The file mapped at ``addr`` in this process."""
    for line in open("/proc/self/maps"):
        parts = line.split()
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        if lo <= addr < hi:
            return os.path.realpath(parts[-1]) if len(parts) >= 6 else None
    return None


def check_library_isolation(c: Checker) -> None:
    """torch's CUDA build loads NVIDIA's libnccl.so.2 (same soname, maybe the same version
    number); the backend's functions must be the ones of our file, looked up on our handle."""
    import ctypes

    ours = os.path.realpath(topoccl.library_path)
    maps = open("/proc/self/maps").read()
    c.ok(ours in maps, f"our library {ours} is mapped")
    # The backend's own handle: dlopen of the same path, RTLD_LOCAL, gives the same one.
    library = ctypes.CDLL(ours, mode=os.RTLD_LOCAL)
    c.ok(topoccl.backend_of().library_path == ours, "the backend opened the package's library")
    for name in ("ncclAllReduce", "ncclCommInitRank", "ncclSend", "ncclGroupEnd", "topocclGroupEndAsync"):
        addr = ctypes.cast(getattr(library, name), ctypes.c_void_p).value
        c.ok(_mapping_of(addr) == ours, f"{name} resolves to {_mapping_of(addr)}, not {ours}")
    theirs = sorted(
        {l.split()[-1] for l in maps.splitlines() if "libnccl.so" in l and os.path.realpath(l.split()[-1]) != ours}
    )
    if theirs:
        nv = ctypes.CDLL(theirs[0], mode=os.RTLD_LOCAL)
        a_nv = ctypes.cast(nv.ncclAllReduce, ctypes.c_void_p).value
        a_us = ctypes.cast(library.ncclAllReduce, ctypes.c_void_p).value
        c.ok(a_nv != a_us, "NVIDIA's ncclAllReduce and ours are different functions")
        v = ctypes.c_int(0)
        nv.ncclGetVersion(ctypes.byref(v))
        c.notes.append(f"NVIDIA NCCL {v.value} ({theirs[0]}) loaded beside topoccl's")
    else:
        c.notes.append("no other libnccl.so in this process (torch without CUDA?)")


def case_collectives() -> int:
    c = Checker(f"collectives[{WORLD}]")
    init()
    c.ok(dist.get_backend() == "topoccl", f"backend is {dist.get_backend()}")
    for fn in (
        check_library_isolation,
        check_all_reduce,
        check_broadcast_reduce,
        check_all_gather,
        check_reduce_scatter,
        check_gather_scatter,
        check_all_to_all,
        check_p2p,
        check_async,
        check_errors,
        check_subgroups,
    ):
        c.guard(fn.__name__, fn, c)
    dist.barrier()
    backend = topoccl.backend_of()
    c.ok(backend.comm is not None, "the backend has a communicator")
    dist.destroy_process_group()
    c.ok(backend.comm is None, "destroy_process_group destroyed the communicator")
    return c.finish()


# ---------------------------------------------------------------------------------------------
# Training: DDP (and FSDP2) with gloo, then topoccl, on the same data.


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)
    )


def _batches(steps: int):
    g = torch.Generator().manual_seed(1234 + RANK)
    return [(torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)) for _ in range(steps)]


def train_ddp(backend: str, steps: int = 20) -> list[torch.Tensor]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    init(backend, init_method=f"file://{TMP}/ddp-{backend}")
    model = _model()
    if RANK == 1:  # DDP must broadcast rank 0's parameters
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    ddp = DDP(model, bucket_cap_mb=0.01)  # several buckets, reduced while backward runs
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for x, y in _batches(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    params = [p.detach().clone() for p in model.parameters()]
    # Identical on every rank (checked with the backend under test).
    flat = torch.cat([p.reshape(-1) for p in params])
    gathered = [torch.zeros_like(flat) for _ in range(WORLD)]
    dist.all_gather(gathered, flat)
    same = all(torch.equal(g, gathered[0]) for g in gathered)
    dist.destroy_process_group()
    return params, same


def train_fsdp(backend: str, steps: int = 10):
    from torch.distributed.device_mesh import init_device_mesh

    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard  # type: ignore

    init(backend, init_method=f"file://{TMP}/fsdp-{backend}")
    mesh = init_device_mesh("cpu", (WORLD,))
    model = _model()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for x, y in _batches(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    full = [p.full_tensor().detach().clone() for p in model.parameters()]
    dist.destroy_process_group()
    return full


def train_fsdp1(backend: str, steps: int = 10):
    import warnings

    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    init(backend, init_method=f"file://{TMP}/fsdp1-{backend}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FSDP1's deprecation notice
        model = FSDP(_model(), device_id=torch.device("cpu"), use_orig_params=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for x, y in _batches(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    with FSDP.summon_full_params(model):
        full = [p.detach().clone() for p in model.parameters()]
    dist.destroy_process_group()
    return full


def case_training() -> int:
    c = Checker(f"training[{WORLD}]")
    ref, ref_same = train_ddp("gloo")
    got, same = train_ddp("topoccl")
    c.ok(ref_same, "gloo: parameters identical across ranks")
    c.ok(same, "topoccl: parameters identical across ranks")
    for i, (a, b) in enumerate(zip(ref, got)):
        c.ok(torch.allclose(a, b, rtol=1e-5, atol=1e-6), f"DDP param {i}: max |gloo - topoccl| = {(a - b).abs().max().item():.3g}")
    moved = max((a - b).abs().max().item() for a, b in zip(ref, [p.detach() for p in _model().parameters()]))
    c.ok(moved > 1e-3, "training changed the parameters")
    if os.environ.get("TOPOCCL_TEST_FSDP", "1") == "1":
        try:
            fref = train_fsdp("gloo")
        except Exception as e:  # noqa: BLE001
            c.notes.append(f"FSDP2 with gloo unavailable here ({type(e).__name__}: {e}); FSDP2 skipped")
            fref = None
            if dist.is_initialized():
                dist.destroy_process_group()
        if fref is not None:
            fgot = train_fsdp("topoccl")
            for i, (a, b) in enumerate(zip(fref, fgot)):
                c.ok(torch.allclose(a, b, rtol=1e-5, atol=1e-6), f"FSDP2 param {i}: max |gloo - topoccl| = {(a - b).abs().max().item():.3g}")
        try:
            fref = train_fsdp1("gloo")
        except Exception as e:  # noqa: BLE001
            c.notes.append(f"FSDP (1) with gloo unavailable here ({type(e).__name__}: {e}); skipped")
            fref = None
            if dist.is_initialized():
                dist.destroy_process_group()
        if fref is not None:
            fgot = train_fsdp1("topoccl")
            for i, (a, b) in enumerate(zip(fref, fgot)):
                c.ok(torch.allclose(a, b, rtol=1e-5, atol=1e-6), f"FSDP param {i}: max |gloo - topoccl| = {(a - b).abs().max().item():.3g}")
    return c.finish()


# ---------------------------------------------------------------------------------------------
# A peer dies during a collective: the others raise, within a bounded time.


def case_dead_peer() -> int:
    """Two failures. (1) A stalled peer: the last rank skips a collective on a group created
    with timeout=3 s; the others must raise the library's timeout (TOPOCCL_TIMEOUT, which the
    backend sets from the group's timeout) after about 3 s. (2) A dead peer: the last rank
    exits while a 32 MiB all_reduce runs; the others must raise at once (or by the deadline)."""
    c = Checker(f"dead_peer[{WORLD}]")
    base = getattr(dist, "DistBackendError", RuntimeError)
    init(timeout=datetime.timedelta(seconds=12))
    t = torch.ones(4)
    dist.all_reduce(t)
    c.ok(bool((t == WORLD).all()), "all_reduce before the failures")
    victim = WORLD - 1
    stall = 3.0
    sg = dist.new_group(list(range(WORLD)), timeout=datetime.timedelta(seconds=stall))
    dist.all_reduce(torch.ones(1), group=sg)
    if RANK != victim:
        t0 = time.monotonic()
        err = None
        try:
            dist.all_reduce(torch.ones(4), group=sg)
        except Exception as e:  # noqa: BLE001
            err = e
        dt = time.monotonic() - t0
        c.ok(err is not None, "a collective missing a (live) peer raised")
        if err is not None:
            print(f"rank {RANK}: stalled peer: raised after {dt:.2f} s: {type(err).__name__}: {err}", flush=True)
            c.ok(isinstance(err, base), f"stall raised {type(err).__name__}, not {base.__name__}")
            text = str(err)
            c.ok(f"rank {victim} has not started" in text, f"the stall names rank {victim}: {text}")
            # Every rank reads a timeout, in torch's words: the one whose deadline ran out, and
            # those that learn from it that a peer stalled.
            c.ok(" Timed out " in text, f"the stall says ' Timed out ' (torch's tests match it): {text}")
        # torch's meaning of a timeout: the call fails when it runs out, never before. A rank
        # that learns of the stall from a peer whose call (and deadline) began a little earlier
        # may raise that much sooner: the ranks leave the all_reduce before it within a skew
        # (2.99 s seen on a loaded CI machine), allowed up to 0.25 s.
        c.ok(stall - 0.25 <= dt <= stall * 2 + 5, f"stall raised after the group's 3 s timeout, not before (took {dt:.2f} s)")
    dist.barrier()  # the victim waits here until the others have seen the timeout
    t2 = time.monotonic()
    sg.abort()
    c.ok(time.monotonic() - t2 < 5, f"aborting the timed-out group took {time.monotonic() - t2:.1f} s")
    # (2) The dead peer.
    big = torch.ones(8 << 20)
    if RANK == victim:
        threading.Timer(0.05, lambda: os._exit(17)).start()
        dist.all_reduce(big)
        time.sleep(10)
        os._exit(18)
    t0 = time.monotonic()
    err = None
    try:
        dist.all_reduce(big)
        dist.all_reduce(torch.ones(4))  # in case the big one got through before the exit
    except Exception as e:  # noqa: BLE001
        err = e
    dt = time.monotonic() - t0
    c.ok(err is not None, "a collective with a dead peer raised")
    if err is not None:
        c.ok(isinstance(err, base), f"raised {type(err).__name__}, not {base.__name__}")
        c.ok("topoccl" in str(err), f"message names topoccl: {err}")
        print(f"rank {RANK}: dead peer: raised after {dt:.2f} s: {type(err).__name__}: {err}", flush=True)
    c.ok(dt < 23, f"raised within 1.5 x the group timeout + 5 s (took {dt:.1f} s)")
    if dt > 3:
        c.notes.append(f"the dead peer was only noticed by the deadline ({dt:.1f} s), not by its closed connections")
    # Later calls fail too, fast, rather than hang.
    t1 = time.monotonic()
    w = None
    try:
        w = dist.all_reduce(torch.ones(4), async_op=True)
        w.wait()
        later = None
    except Exception as e:  # noqa: BLE001
        later = e
    c.ok(later is not None, "a later call on the broken group raised")
    if w is not None:
        try:
            w.get_future().wait()
            c.ok(False, "the failed work's future completed without an error")
        except Exception as e:  # noqa: BLE001
            c.ok("topoccl" in str(e), f"the failed work's future raised {type(e).__name__}: {e}")
        c.ok(w.is_completed() and not w.is_success() and w.exception() is not None, "failed work state")
    c.ok(time.monotonic() - t1 < 23, "the later call raised in bounded time")
    pg = dist.group.WORLD
    t2 = time.monotonic()
    try:
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001
        c.notes.append(f"destroy after the failure raised {type(e).__name__}: {e}")
        pg.abort()
    c.ok(time.monotonic() - t2 < 10, f"destroying the broken group took {time.monotonic() - t2:.1f} s")
    rc = c.finish()
    sys.stdout.flush()
    os._exit(rc)


# ---------------------------------------------------------------------------------------------
# Init methods, one after another in the same processes (each destroyed before the next).


def _one_all_reduce(c: Checker, what: str) -> None:
    t = torch.full((3,), float(RANK + 1))
    dist.all_reduce(t)
    c.eq(t, torch.full((3,), float(sum(range(1, WORLD + 1)))), f"all_reduce after init via {what}")
    g = dist.new_group(list(range(WORLD)))
    t = torch.ones(2)
    dist.all_reduce(t, group=g)
    c.eq(t, torch.full((2,), float(WORLD)), f"new_group after init via {what}")


def case_init_methods() -> int:
    c = Checker(f"init_methods[{WORLD}]")
    addr = os.environ["MASTER_ADDR"]
    ports = [int(p) for p in os.environ["TOPOCCL_TEST_PORTS"].split(",")]
    ways = [
        ("env://", lambda: init(init_method="env://")),
        ("tcp://", lambda: init(init_method=f"tcp://{addr}:{ports[0]}")),
        ("file://", lambda: init(init_method=f"file://{TMP}/init-file")),
        (
            "TCPStore",
            lambda: init(store=dist.TCPStore(addr, ports[1], WORLD, RANK == 0, timeout=datetime.timedelta(seconds=30))),
        ),
        ("FileStore", lambda: init(store=dist.FileStore(f"{TMP}/init-filestore", WORLD))),
        ("env:// again", lambda: (os.environ.update(MASTER_PORT=str(ports[2])), init())),
    ]
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    for what, fn in ways:
        try:
            fn()
            _one_all_reduce(c, what)
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            c.ok(False, f"init via {what} raised:\n{traceback.format_exc()}")
            if dist.is_initialized():
                dist.destroy_process_group()
    if abort is not None:
        # Aborting (what torch does on a fatal error): ncclCommAbort on every group. (Each
        # TCP store gets a port of its own: a rank that runs ahead could otherwise reach the
        # previous store before its owner has closed it.)
        os.environ["MASTER_PORT"] = str(ports[3])
        init()
        sub = dist.new_group(list(range(WORLD)))
        _one_all_reduce(c, "init before abort")
        world, sub = topoccl.backend_of(), topoccl.backend_of(sub)
        abort()
        c.ok(world.comm is None and sub.comm is None, "abort released the communicators")
        c.ok(not dist.is_initialized(), "abort ended the default group")
        init(init_method=f"file://{TMP}/after-abort")
        _one_all_reduce(c, "init after abort")
        dist.destroy_process_group()
    # TOPOCCL_TIMEOUT comes from the group's timeout (the library reads it at init).
    c.ok("TOPOCCL_TIMEOUT" not in os.environ, "TOPOCCL_TIMEOUT is not left set")
    return c.finish()


def case_hashstore() -> int:
    """An explicit HashStore: init_process_group with one rank, and two ranks in two threads
    of one process constructing the process group directly."""
    c = Checker("hashstore")
    store = dist.HashStore()
    dist.init_process_group("topoccl", store=store, rank=0, world_size=1)
    t = torch.full((3,), 2.0)
    dist.all_reduce(t)
    c.eq(t, torch.full((3,), 2.0), "1-rank all_reduce with a HashStore")
    dist.destroy_process_group()

    shared = dist.HashStore()
    results = {}

    def rank_thread(r: int) -> None:
        try:
            pg = topoccl.ProcessGroupTopoccl(dist.PrefixStore("t/", shared), r, 2, datetime.timedelta(seconds=30), "threads")
            x = torch.full((4,), float(r + 1))
            opts = dist.AllreduceOptions()
            pg.allreduce([x], opts).wait()
            out = torch.zeros(8)
            pg.all_gather_single(out, torch.full((4,), float(r))).wait()
            pg.shutdown()
            results[r] = (x, out)
        except Exception:  # noqa: BLE001
            results[r] = traceback.format_exc()

    ths = [threading.Thread(target=rank_thread, args=(r,)) for r in range(2)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(60)
    for r in range(2):
        res = results.get(r)
        if not isinstance(res, tuple):
            c.ok(False, f"thread rank {r}: {res}")
            continue
        c.eq(res[0], torch.full((4,), 3.0), f"thread rank {r} allreduce")
        c.eq(res[1], torch.cat([torch.zeros(4), torch.ones(4)]), f"thread rank {r} all_gather")
    return c.finish()


CASES = {
    "collectives": case_collectives,
    "training": case_training,
    "dead_peer": case_dead_peer,
    "init_methods": case_init_methods,
    "hashstore": case_hashstore,
}

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        rc = CASES[sys.argv[1]]()
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        rc = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
