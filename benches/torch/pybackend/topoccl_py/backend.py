"""``ProcessGroupTopoccl``: a torch.distributed process group for CPU tensors that runs every
call on a topoccl communicator through the NCCL C ABI (``_lib``).

Each method checks its arguments in the caller's thread (so a bad call raises at once, on
the rank that made it), then hands the call queue (``_work.CallQueue``) a task; the task makes
contiguous copies where needed, calls the library (GIL released), copies results back and
completes the :class:`~topoccl._work.Work` it returned. The task holds every tensor it uses
until it has run.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import threading
from typing import Any, Callable

import torch
import torch.distributed as dist

from . import _lib
from ._calls import (
    _BITWISE,
    _BOOL_OPS,
    _Contig,
    _DTYPES,
    _OPS,
    _Op,
    _PREMUL_SUM,
    _chain,
    _check_tensor,
    _consecutive,
    _dtype_code,
    _nbytes,
    _offsets,
    _op_value,
    _root,
    _seq,
    _sync,
    _timeout_env,
)
from ._lib import NcclError
from ._work import CallQueue, Work

ReduceOp = dist.ReduceOp
RedOpType = ReduceOp.RedOpType
_c10d = torch._C._distributed_c10d
# Options classes (not all are re-exported by torch.distributed).
_AllreduceOptions = _c10d.AllreduceOptions
_AllreduceCoalescedOptions = _c10d.AllreduceCoalescedOptions
_BroadcastOptions = _c10d.BroadcastOptions
_ReduceOptions = _c10d.ReduceOptions
_AllgatherOptions = _c10d.AllgatherOptions
_GatherOptions = _c10d.GatherOptions
_ScatterOptions = _c10d.ScatterOptions
_ReduceScatterOptions = _c10d.ReduceScatterOptions
_AllToAllOptions = _c10d.AllToAllOptions
_BarrierOptions = _c10d.BarrierOptions


# Per (group name, rank), how many communicators this process made for it: with the store's
# prefix (the group's name), a key every member agrees on, which no earlier group of the same
# name (torch reuses names after destroy_process_group) used.
_created: dict[tuple[str, int], int] = {}
_created_lock = threading.Lock()


class ProcessGroupTopoccl(dist.ProcessGroup):
    """A process group whose calls run on one topoccl communicator (CPU tensors)."""

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        size: int,
        timeout: datetime.timedelta | None = None,
        group_name: str = "",
        library: _lib.Library | None = None,
    ):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._lib = library or _lib.load()
        self._group_name = group_name
        self._timeout = timeout
        self._comm: int | None = None
        self._coalescing: list[_Op] | None = None
        self._coalesced_works: list[Work] = []
        self._barrier_buf = torch.zeros(1, dtype=torch.int32)
        with _created_lock:
            n = _created.get((group_name, rank), 0)
            _created[(group_name, rank)] = n + 1
        key = f"topoccl/unique_id/{n}"
        if rank == 0:
            uid = self._lib.get_unique_id()
            store.set(key, uid)
        else:
            uid = bytes(store.get(key))
        with _timeout_env(timeout):
            self._comm = self._lib.comm_init_rank(size, uid, rank)
        self._exec = CallQueue(f"{group_name or 'pg'}-{n}")

    # Identity -------------------------------------------------------------------------------

    def getBackendName(self) -> str:
        return "topoccl_py"

    # c10d keeps a group's name and description in its per-device backends, which a Python
    # process group has none of: keep them here (torch sets them after creating the group).
    def setGroupName(self, name: str) -> None:
        self._pg_name = name

    def getGroupName(self) -> str:
        return getattr(self, "_pg_name", self._group_name)

    def setGroupDesc(self, desc: str) -> None:
        self._pg_desc = desc

    def getGroupDesc(self) -> str:
        return getattr(self, "_pg_desc", "")

    def __repr__(self) -> str:
        return f"ProcessGroupTopoccl(rank={self._rank}, size={self._size}, group={self._group_name!r})"

    @property
    def comm(self) -> int | None:
        """The ``ncclComm_t`` (an address), None once shut down."""
        return self._comm

    @property
    def library(self) -> _lib.Library:
        return self._lib

    # torch asks a process group's per-device backend for these; this group is its own.
    def _get_backend(self, device=None):
        return self

    @property
    def supports_coalescing(self) -> bool:
        return True

    @property
    def supports_splitting(self) -> bool:
        return False

    def supports_tensor_alloc(self, device=None) -> bool:
        return False

    _supports_time_estimate = False

    # Running calls ---------------------------------------------------------------------------

    def _check(self, what: str, code: int) -> None:
        if code:
            self._lib.check(what, code)

    def _live_comm(self) -> int:
        if self._comm is None:
            raise NcclError(f"topoccl: the process group {self._group_name!r} was shut down or aborted")
        return self._comm

    def _submit(self, op: _Op, result: Any, sync: bool) -> Work | None:
        """Runs ``op`` after every call issued before it. A synchronous call (``async_op=False``)
        that finds the executor idle runs here, raises its error itself and returns None
        (torch's wrappers then wait for nothing); otherwise the call is queued and its work
        returned."""
        if self._comm is None:
            self._live_comm()
        if self._coalescing is not None:
            # Runs when the block ends; a synchronous call gets no work to wait for (as with
            # ProcessGroupNCCL), an asynchronous one a work that completes with the block.
            work = Work(result, op.name)
            work._deferred = True
            self._coalescing.append(op)
            self._coalesced_works.append(work)
            return None if sync else work
        ex = self._exec
        if ex.on_worker():
            # From a future callback, which the worker runs right after the call it completes,
            # at the same point of the call sequence on every rank: run it now, in that place
            # (queued, it would land wherever the other threads' calls happen to be).
            work = Work(result, op.name)
            self._run_ops([op], op.name, [work])
            if sync:
                work.wait()
                return None
            return work
        if sync and ex.try_inline():
            try:
                try:
                    if op.pre is not None:
                        op.pre()
                    op.issue()
                    if op.post is not None:
                        op.post()
                finally:
                    if op.cleanup is not None:
                        op.cleanup()
            finally:
                ex.end_inline()
            return None
        work = Work(result, op.name)
        work._queue = ex
        ex.enqueue(lambda: self._run_ops([op], op.name, [work]))
        return work

    def _run_ops(self, ops: list[_Op], name: str, works: list[Work]) -> None:
        exc: BaseException | None = None
        try:
            for op in ops:
                if op.pre is not None:
                    op.pre()
            if len(ops) == 1:
                ops[0].issue()
            else:
                with self._group(name):
                    for op in ops:
                        op.issue()
            for op in ops:
                if op.post is not None:
                    op.post()
        except BaseException as e:  # noqa: BLE001 - handed to the works
            exc = e if isinstance(e, Exception) else NcclError(f"topoccl: {name} interrupted: {e!r}")
        for op in ops:
            if op.cleanup is not None:
                try:
                    op.cleanup()
                except Exception as e:  # noqa: BLE001
                    exc = exc or e
        for w in works:
            w._complete(exc)

    @contextlib.contextmanager
    def _group(self, what: str):
        """ncclGroupStart ... ncclGroupEnd, ending the group even when a call in it raised
        (the library's group state is per thread and would otherwise stay open)."""
        self._check("ncclGroupStart", self._lib.ncclGroupStart())
        try:
            yield
        except BaseException:
            self._lib.ncclGroupEnd()
            raise
        self._check(f"ncclGroupEnd ({what})", self._lib.ncclGroupEnd())

    def _reduction(self, rop: Any, t: torch.Tensor) -> tuple[Callable[[], int], Callable[[], None] | None]:
        """The ncclRedOp_t for ``rop`` on ``t``'s dtype: a function giving it when the call runs
        (a PreMulSum operator is made on the communicator then) and a clean-up, or None."""
        kind = _op_value(rop)
        dtype = t.dtype
        code = (_BOOL_OPS if dtype == torch.bool else _OPS).get(kind)
        if code is not None:
            return (lambda: code), None
        if kind in _BITWISE:
            raise ValueError(
                f"topoccl: ReduceOp.{_BITWISE[kind]} is not supported (NCCL has no bitwise reductions)"
            )
        if dtype == torch.bool:
            raise ValueError(f"topoccl: {rop} is not supported on bool tensors")
        if kind == _PREMUL_SUM:
            factor = getattr(rop, "factor", None)
            if factor is None:
                raise ValueError("topoccl: PREMUL_SUM without a factor")
            if isinstance(factor, torch.Tensor):
                factor = factor.detach().to("cpu").reshape(-1)[0].item()
            scalar = torch.tensor([factor], dtype=dtype)
            dcode = _dtype_code(t, "tensor")
            made: list[int] = []

            def create() -> int:
                op = self._lib.premul_sum_create(scalar.data_ptr(), dcode, self._live_comm())
                made.append(op)
                return op

            def destroy() -> None:
                while made:
                    self._lib.red_op_destroy(made.pop(), self._live_comm())

            return create, destroy
        raise ValueError(f"topoccl: unsupported reduce op {rop!r}")

    def _reducing(
        self, name: str, rop: Any, t: torch.Tensor, call: Callable[[int], int]
    ) -> tuple[Callable[[], None], Callable[[], None] | None]:
        """An issue function running ``call(op)`` with the reduction's op code, and the clean-up
        to run once the call has completed (a PreMulSum operator is destroyed then: inside a
        group the call only runs at ncclGroupEnd)."""
        get_op, cleanup = self._reduction(rop, t)
        _dtype_code(t, "tensor")

        def issue() -> None:
            self._check(name, call(get_op()))

        return issue, cleanup

    # Collectives -----------------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        if opts is None:
            opts = _AllreduceOptions()
        elif type(opts) is not _AllreduceOptions and not hasattr(opts, "reduceOp"):
            op, opts = opts, _AllreduceOptions()  # allreduce(tensors, ReduceOp.X)
            opts.reduceOp = op
        tensors = list(tensors)
        if len(tensors) != 1:
            return self.allreduce_coalesced(tensors, opts)
        t = _check_tensor(tensors[0], "tensor")
        rop = opts.reduceOp
        sync = _sync(opts)
        # Fast path: a synchronous call on a contiguous tensor with a built-in op, the executor
        # idle (so not on its worker) - one library call, no closures, no work object.
        if sync and self._coalescing is None and self._comm is not None and t.is_contiguous():
            dtype = _DTYPES.get(t.dtype)
            op = (_BOOL_OPS if t.dtype == torch.bool else _OPS).get(_op_value(rop))
            n = t.numel()
            if dtype is not None and op is not None and n and self._exec.try_inline():
                try:
                    p = t.data_ptr()
                    rc = self._lib.ncclAllReduce(p, p, n, dtype, op, self._comm, None)
                    if rc:
                        self._lib.check("ncclAllReduce", rc)
                finally:
                    self._exec.end_inline()
                return None
        return self._submit(self._allreduce_op(t, rop), tensors, sync)

    def _allreduce_op(self, t: torch.Tensor, rop: Any, name: str = "allreduce") -> _Op:
        c = _Contig(t)
        dtype = _dtype_code(t, "tensor")
        lib, n = self._lib, t.numel()
        if n == 0:
            self._reduction(rop, t)
            return _Op(name, lambda: None)
        issue, cleanup = self._reducing(
            "ncclAllReduce", rop, t, lambda op: lib.ncclAllReduce(c.ptr, c.ptr, n, dtype, op, self._live_comm(), None)
        )
        return _Op(name, issue, c.load, c.store, cleanup)

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts or _AllreduceCoalescedOptions()
        tensors = [_check_tensor(t, "tensor") for t in tensors]
        ops = [self._allreduce_op(t, opts.reduceOp, "allreduce_coalesced") for t in tensors]
        return self._submit(_seq("allreduce_coalesced", ops), tensors, _sync(opts))

    def broadcast(self, tensors, opts=None):
        opts = opts or _BroadcastOptions()
        tensors = list(tensors)
        root = _root(opts.rootRank, self._size)
        ops = [self._broadcast_op(_check_tensor(t, "tensor"), root) for t in tensors]
        op = ops[0] if len(ops) == 1 else _seq("broadcast", ops)
        return self._submit(op, tensors, _sync(opts))

    def _broadcast_op(self, t: torch.Tensor, root: int) -> _Op:
        c = _Contig(t)
        lib, nb = self._lib, _nbytes(t)
        if nb == 0:
            return _Op("broadcast", lambda: None)

        def issue():
            self._check("ncclBroadcast", lib.ncclBroadcast(c.ptr, c.ptr, nb, _lib.UINT8, root, self._live_comm(), None))

        pre = c.load if self._rank == root else c.empty
        post = c.store if self._rank != root else None
        return _Op("broadcast", issue, pre, post)

    def reduce(self, tensors, opts=None):
        opts = opts or _ReduceOptions()
        tensors = list(tensors)
        if len(tensors) != 1:
            raise ValueError("topoccl: reduce takes one tensor")
        t = _check_tensor(tensors[0], "tensor")
        root = _root(opts.rootRank, self._size)
        c = _Contig(t)
        dtype = _dtype_code(t, "tensor")
        lib, n = self._lib, t.numel()
        if n == 0:
            self._reduction(opts.reduceOp, t)
            return self._submit(_Op("reduce", lambda: None), tensors, _sync(opts))
        issue, cleanup = self._reducing(
            "ncclReduce",
            opts.reduceOp,
            t,
            lambda op: lib.ncclReduce(c.ptr, c.ptr, n, dtype, op, root, self._live_comm(), None),
        )
        return self._submit(_Op("reduce", issue, c.load, c.store, cleanup), tensors, _sync(opts))

    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = opts or _AllgatherOptions()
        if len(input_tensors) != 1 or len(output_tensors) != 1:
            raise ValueError("topoccl: allgather takes one input tensor and one list of outputs")
        inp = _check_tensor(input_tensors[0], "input tensor")
        outs = [_check_tensor(o, "output tensor") for o in output_tensors[0]]
        if len(outs) != self._size:
            raise ValueError(f"topoccl: allgather needs {self._size} output tensors, got {len(outs)}")
        for o in outs:
            if o.dtype != inp.dtype:
                raise ValueError(f"topoccl: allgather output dtype {o.dtype} differs from input dtype {inp.dtype}")
        if all(o.numel() == inp.numel() for o in outs):
            op = self._allgather_list_op(inp, outs)
        else:
            # Uneven sizes (the same output list on every rank): each rank's piece is copied
            # into its own output slot, then broadcast from there.
            mine = outs[self._rank]
            if mine.numel() != inp.numel():
                raise ValueError(f"topoccl: allgather output {self._rank} must be shaped like this rank's input")
            ops = [self._broadcast_op(o, r) for r, o in enumerate(outs)]
            own = ops[self._rank]
            own.pre = _chain(lambda: mine.copy_(inp.reshape(mine.shape)), own.pre)
            op = _seq("allgather", ops)
        return self._submit(op, output_tensors, _sync(opts))

    def _allgather_list_op(self, inp: torch.Tensor, outs: list[torch.Tensor]) -> _Op:
        lib, nb, n = self._lib, _nbytes(inp), self._size
        if nb == 0:
            return _Op("allgather", lambda: None)
        src = _Contig(inp)
        direct = _consecutive(outs)
        state: dict[str, Any] = {}

        def pre():
            src.load()
            state["flat"] = None if direct is not None else torch.empty(n * nb, dtype=torch.uint8)

        def issue():
            dst = direct if direct is not None else state["flat"].data_ptr()
            self._check("ncclAllGather", lib.ncclAllGather(src.ptr, dst, nb, _lib.UINT8, self._live_comm(), None))

        def post():
            flat = state.pop("flat", None)
            if flat is not None:
                for r, o in enumerate(outs):
                    o.copy_(flat[r * nb : (r + 1) * nb].view(o.dtype).view(o.shape))

        return _Op("allgather", issue, pre, post)

    def all_gather_single(self, output, input, opts=None):
        opts = opts or _AllgatherOptions()
        out, inp = _check_tensor(output, "output tensor"), _check_tensor(input, "input tensor")
        if out.numel() != inp.numel() * self._size or out.dtype != inp.dtype:
            raise ValueError(
                f"topoccl: all_gather_into_tensor output must have {self._size} x {inp.numel()} elements of "
                f"{inp.dtype}, got {out.numel()} of {out.dtype}"
            )
        return self._submit(self._gather_single_op(out, inp), output, _sync(opts))

    def _gather_single_op(self, out: torch.Tensor, inp: torch.Tensor) -> _Op:
        lib, nb = self._lib, _nbytes(inp)
        if nb == 0:
            return _Op("all_gather_into_tensor", lambda: None)
        src, dst = _Contig(inp), _Contig(out)

        def issue():
            self._check(
                "ncclAllGather", lib.ncclAllGather(src.ptr, dst.ptr, nb, _lib.UINT8, self._live_comm(), None)
            )

        return _Op("all_gather_into_tensor", issue, _chain(src.load, dst.empty), dst.store)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts or _AllgatherOptions()
        ops = []
        for o, i in zip(outputs, inputs):
            o, i = _check_tensor(o, "output tensor"), _check_tensor(i, "input tensor")
            if o.numel() != i.numel() * self._size:
                raise ValueError("topoccl: all_gather_into_tensor_coalesced: output must be world_size x input")
            ops.append(self._gather_single_op(o, i))
        return self._submit(_seq("all_gather_into_tensor_coalesced", ops), list(outputs), _sync(opts))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        # torch's layout (and Gloo's): output_lists[r][i] receives rank r's input i.
        opts = opts or _AllgatherOptions()
        inputs = [_check_tensor(t, "input tensor") for t in input_tensors]
        if len(output_lists) != self._size or any(len(outs) != len(inputs) for outs in output_lists):
            raise ValueError(
                f"topoccl: allgather_coalesced needs {self._size} output lists (one per rank), each of "
                f"{len(inputs)} tensors (one per input)"
            )
        ops = []
        for i, inp in enumerate(inputs):
            outs = [_check_tensor(output_lists[r][i], "output tensor") for r in range(self._size)]
            if any(o.numel() != inp.numel() or o.dtype != inp.dtype for o in outs):
                raise ValueError(
                    f"topoccl: allgather_coalesced: every rank's output {i} must be {inp.numel()} elements of "
                    f"{inp.dtype}, as input {i} is"
                )
            ops.append(self._allgather_list_op(inp, outs))
        return self._submit(_seq("allgather_coalesced", ops), list(output_lists), _sync(opts))

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or _ReduceScatterOptions()
        if len(output_tensors) != 1 or len(input_tensors) != 1:
            raise ValueError("topoccl: reduce_scatter takes one output tensor and one list of inputs")
        out = _check_tensor(output_tensors[0], "output tensor")
        ins = [_check_tensor(i, "input tensor") for i in input_tensors[0]]
        if len(ins) != self._size or any(i.numel() != out.numel() or i.dtype != out.dtype for i in ins):
            raise ValueError(
                f"topoccl: reduce_scatter needs {self._size} input tensors shaped like the output "
                "(uneven reduce_scatter is not supported)"
            )
        dtype = _dtype_code(out, "output tensor")
        lib, n = self._lib, out.numel()
        dst = _Contig(out)
        direct = _consecutive(ins)
        state: dict[str, Any] = {}
        if n == 0:
            self._reduction(opts.reduceOp, out)
            return self._submit(_Op("reduce_scatter", lambda: None), output_tensors, _sync(opts))

        def pre():
            dst.empty()
            state["src"] = direct if direct is not None else torch.cat([i.reshape(-1) for i in ins])

        issue, cleanup = self._reducing(
            "ncclReduceScatter",
            opts.reduceOp,
            out,
            lambda op: lib.ncclReduceScatter(
                direct if direct is not None else state["src"].data_ptr(),
                dst.ptr,
                n,
                dtype,
                op,
                self._live_comm(),
                None,
            ),
        )

        def post():
            state.pop("src", None)
            dst.store()

        return self._submit(_Op("reduce_scatter", issue, pre, post, cleanup), output_tensors, _sync(opts))

    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts or _ReduceScatterOptions()
        out, inp = _check_tensor(output, "output tensor"), _check_tensor(input, "input tensor")
        if inp.numel() != out.numel() * self._size or out.dtype != inp.dtype:
            raise ValueError(
                f"topoccl: reduce_scatter_tensor input must have {self._size} x {out.numel()} elements of "
                f"{out.dtype}, got {inp.numel()} of {inp.dtype}"
            )
        return self._submit(self._reduce_scatter_single_op(out, inp, opts.reduceOp), output, _sync(opts))

    def _reduce_scatter_single_op(self, out: torch.Tensor, inp: torch.Tensor, rop: Any) -> _Op:
        dtype = _dtype_code(out, "output tensor")
        lib, n = self._lib, out.numel()
        if n == 0:
            self._reduction(rop, out)
            return _Op("reduce_scatter_tensor", lambda: None)
        src, dst = _Contig(inp), _Contig(out)
        issue, cleanup = self._reducing(
            "ncclReduceScatter",
            rop,
            out,
            lambda op: lib.ncclReduceScatter(src.ptr, dst.ptr, n, dtype, op, self._live_comm(), None),
        )
        return _Op("reduce_scatter_tensor", issue, _chain(src.load, dst.empty), dst.store, cleanup)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts or _ReduceScatterOptions()
        ops = []
        for o, i in zip(outputs, inputs):
            o, i = _check_tensor(o, "output tensor"), _check_tensor(i, "input tensor")
            if i.numel() != o.numel() * self._size:
                raise ValueError("topoccl: reduce_scatter_tensor_coalesced: input must be world_size x output")
            ops.append(self._reduce_scatter_single_op(o, i, opts.reduceOp))
        return self._submit(_seq("reduce_scatter_tensor_coalesced", ops), list(outputs), _sync(opts))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts or _GatherOptions()
        root = _root(opts.rootRank, self._size)
        if len(input_tensors) != 1:
            raise ValueError("topoccl: gather takes one input tensor")
        inp = _check_tensor(input_tensors[0], "input tensor")
        outs: list[torch.Tensor] = []
        if self._rank == root:
            if len(output_tensors) != 1 or len(output_tensors[0]) != self._size:
                raise ValueError(f"topoccl: gather needs {self._size} output tensors on the root")
            outs = [_check_tensor(o, "output tensor") for o in output_tensors[0]]
            if any(o.numel() != inp.numel() or o.dtype != inp.dtype for o in outs):
                raise ValueError("topoccl: gather outputs must be shaped like the input")
        op = self._gather_op(inp, outs, root, consecutive=_consecutive(outs) if outs else None)
        return self._submit(op, output_tensors, _sync(opts))

    def gather_single(self, output, input, opts=None):
        opts = opts or _GatherOptions()
        root = _root(opts.rootRank, self._size)
        inp = _check_tensor(input, "input tensor")
        outs: list[torch.Tensor] = []
        after = None
        if self._rank == root:
            out = _check_tensor(output, "output tensor")
            if out.numel() != inp.numel() * self._size or out.dtype != inp.dtype:
                raise ValueError(f"topoccl: gather_into_tensor output must be {self._size} x the input")
            if out.is_contiguous():
                outs = list(out.reshape(-1).chunk(self._size)) if inp.numel() else []
            else:
                tmp = torch.empty(out.numel(), dtype=out.dtype)
                outs = list(tmp.chunk(self._size)) if inp.numel() else []
                after = lambda: out.copy_(tmp.view(out.shape))  # noqa: E731
        op = self._gather_op(inp, outs, root, consecutive=_consecutive(outs) if outs else None)
        if after is not None:
            op.post = _chain(op.post, after)
        return self._submit(op, output, _sync(opts))

    def _gather_op(self, inp: torch.Tensor, outs: list[torch.Tensor], root: int, consecutive: int | None) -> _Op:
        lib, nb, n, me = self._lib, _nbytes(inp), self._size, self._rank
        if nb == 0:
            return _Op("gather", lambda: None)
        src = _Contig(inp)
        state: dict[str, Any] = {}

        def pre():
            src.load()
            if me == root and consecutive is None:
                state["flat"] = torch.empty(n * nb, dtype=torch.uint8)

        def dst_ptr() -> int:
            return consecutive if consecutive is not None else state["flat"].data_ptr()

        def issue():
            recv = dst_ptr() if me == root else None
            self._check("ncclGather", lib.ncclGather(src.ptr, recv, nb, _lib.UINT8, root, self._live_comm(), None))

        def post():
            flat = state.pop("flat", None)
            if flat is not None:
                for r, o in enumerate(outs):
                    o.copy_(flat[r * nb : (r + 1) * nb].view(o.dtype).view(o.shape))

        return _Op("gather", issue, pre, post)

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or _ScatterOptions()
        root = _root(opts.rootRank, self._size)
        if len(output_tensors) != 1:
            raise ValueError("topoccl: scatter takes one output tensor")
        out = _check_tensor(output_tensors[0], "output tensor")
        ins: list[torch.Tensor] = []
        if self._rank == root:
            if len(input_tensors) != 1 or len(input_tensors[0]) != self._size:
                raise ValueError(f"topoccl: scatter needs {self._size} input tensors on the root")
            ins = [_check_tensor(i, "input tensor") for i in input_tensors[0]]
            if any(i.numel() != out.numel() or i.dtype != out.dtype for i in ins):
                raise ValueError("topoccl: scatter inputs must be shaped like the output")
        lib, nb, me = self._lib, _nbytes(out), self._rank
        if nb == 0:
            return self._submit(_Op("scatter", lambda: None), output_tensors, _sync(opts))
        dst = _Contig(out)
        direct = _consecutive(ins) if ins else None
        state: dict[str, Any] = {}

        def pre():
            dst.empty()
            if me == root and direct is None:
                state["flat"] = torch.cat([i.reshape(-1) for i in ins]).view(torch.uint8)

        def src_ptr() -> int:
            return direct if direct is not None else state["flat"].data_ptr()

        def issue():
            send = src_ptr() if me == root else None
            self._check("ncclScatter", lib.ncclScatter(send, dst.ptr, nb, _lib.UINT8, root, self._live_comm(), None))

        def post():
            state.pop("flat", None)
            dst.store()

        return self._submit(_Op("scatter", issue, pre, post), output_tensors, _sync(opts))

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        opts = opts or _AllToAllOptions()
        out, inp = _check_tensor(output, "output tensor"), _check_tensor(input, "input tensor")
        if out.dtype != inp.dtype:
            raise ValueError("topoccl: all_to_all_single input and output dtypes differ")
        n, lib = self._size, self._lib
        osz, isz = list(output_split_sizes or []), list(input_split_sizes or [])
        src, dst = _Contig(inp), _Contig(out)
        even = not osz and not isz
        if even:
            if inp.numel() % n or out.numel() != inp.numel():
                raise ValueError(
                    f"topoccl: all_to_all_single without split sizes needs equal input and output sizes divisible "
                    f"by the world size {n}, got {inp.numel()} and {out.numel()}"
                )
            chunk = _nbytes(inp) // n
            send_counts, recv_counts = [chunk] * n, [chunk] * n
        else:
            row_in = _nbytes(inp) // inp.shape[0] if inp.dim() and inp.shape[0] else 0
            row_out = _nbytes(out) // out.shape[0] if out.dim() and out.shape[0] else 0
            if not isz:
                isz = [inp.shape[0] // n] * n if inp.dim() else [0] * n
            if not osz:
                osz = [out.shape[0] // n] * n if out.dim() else [0] * n
            if len(isz) != n or len(osz) != n:
                raise ValueError(f"topoccl: all_to_all_single split sizes must have {n} entries")
            if sum(isz) != (inp.shape[0] if inp.dim() else 0) or sum(osz) != (out.shape[0] if out.dim() else 0):
                raise ValueError("topoccl: all_to_all_single split sizes do not add up to the tensors' first dimension")
            send_counts = [s * row_in for s in isz]
            recv_counts = [s * row_out for s in osz]
        send_offs = _offsets(send_counts)
        recv_offs = _offsets(recv_counts)
        # ncclAlltoAll only without split sizes: the choice must be the same on every rank,
        # and equal splits on one rank do not mean equal splits on all.

        def issue():
            comm = self._live_comm()
            if even:
                if send_counts[0]:
                    rc = lib.ncclAlltoAll(src.ptr, dst.ptr, send_counts[0], _lib.UINT8, comm, None)
                    self._check("ncclAlltoAll", rc)
                return
            self._alltoall_p2p(
                comm,
                [src.ptr + o for o in send_offs],
                send_counts,
                [dst.ptr + o for o in recv_offs],
                recv_counts,
            )

        op = _Op("all_to_all_single", issue, _chain(src.load, dst.empty), dst.store)
        return self._submit(op, output, _sync(opts))

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        opts = opts or _AllToAllOptions()
        n = self._size
        outs = [_check_tensor(o, "output tensor") for o in output_tensors]
        ins = [_check_tensor(i, "input tensor") for i in input_tensors]
        if len(outs) != n or len(ins) != n:
            raise ValueError(f"topoccl: all_to_all needs {n} input and {n} output tensors")
        srcs, dsts = [_Contig(i) for i in ins], [_Contig(o) for o in outs]

        def pre():
            for s in srcs:
                s.load()
            for d in dsts:
                d.empty()

        def issue():
            self._alltoall_p2p(
                self._live_comm(),
                [s.ptr for s in srcs],
                [_nbytes(i) for i in ins],
                [d.ptr for d in dsts],
                [_nbytes(o) for o in outs],
            )

        def post():
            for d in dsts:
                d.store()

        return self._submit(_Op("all_to_all", issue, pre, post), list(output_tensors), _sync(opts))

    def _alltoall_p2p(self, comm: int, sptr, scount, rptr, rcount) -> None:
        lib, me, n = self._lib, self._rank, self._size
        if scount[me] != rcount[me]:
            raise ValueError(
                f"topoccl: all_to_all sends {scount[me]} bytes to itself but expects {rcount[me]}"
            )
        with self._group("all_to_all"):
            for k in range(1, n):
                to, frm = (me + k) % n, (me - k) % n
                if scount[to]:
                    self._check("ncclSend", lib.ncclSend(sptr[to], scount[to], _lib.UINT8, to, comm, None))
                if rcount[frm]:
                    self._check("ncclRecv", lib.ncclRecv(rptr[frm], rcount[frm], _lib.UINT8, frm, comm, None))
        if scount[me]:
            ctypes.memmove(rptr[me], sptr[me], scount[me])

    def barrier(self, opts=None):
        opts = opts or _BarrierOptions()
        buf, lib = self._barrier_buf, self._lib

        def issue():
            self._check(
                "ncclAllReduce (barrier)",
                lib.ncclAllReduce(buf.data_ptr(), buf.data_ptr(), 1, _lib.INT32, _lib.SUM, self._live_comm(), None),
            )

        return self._submit(_Op("barrier", issue), [], _sync(opts))

    # Point to point --------------------------------------------------------------------------

    def send(self, tensors, dstRank, tag=0):
        tensors = list(tensors)
        peer = _root(dstRank, self._size, "destination")
        ops = [self._p2p_op(_check_tensor(t, "tensor"), peer, True) for t in tensors]
        return self._submit(ops[0] if len(ops) == 1 else _seq("send", ops), tensors, False)

    def recv(self, tensors, srcRank, tag=0):
        tensors = list(tensors)
        peer = _root(srcRank, self._size, "source")
        ops = [self._p2p_op(_check_tensor(t, "tensor"), peer, False) for t in tensors]
        return self._submit(ops[0] if len(ops) == 1 else _seq("recv", ops), tensors, False)

    def recv_anysource(self, tensors, tag=0):
        raise ValueError("topoccl: receiving from any source is not supported (NCCL has no wildcard receive); pass src")

    def _p2p_op(self, t: torch.Tensor, peer: int, is_send: bool) -> _Op:
        lib, nb = self._lib, _nbytes(t)
        c = _Contig(t)
        if nb == 0:
            return _Op("send" if is_send else "recv", lambda: None)
        if peer == self._rank:
            raise ValueError("topoccl: send/recv to oneself is not supported")
        if is_send:

            def issue():
                self._check("ncclSend", lib.ncclSend(c.ptr, nb, _lib.UINT8, peer, self._live_comm(), None))

            return _Op("send", issue, c.load)

        def issue_recv():
            self._check("ncclRecv", lib.ncclRecv(c.ptr, nb, _lib.UINT8, peer, self._live_comm(), None))

        return _Op("recv", issue_recv, c.empty, c.store)

    # Coalescing (batch_isend_irecv, _coalescing_manager with a device) ------------------------

    def start_coalescing(self, device=None) -> None:
        if self._coalescing is not None:
            raise RuntimeError("topoccl: start_coalescing called twice without end_coalescing")
        self._coalescing = []
        self._coalesced_works = []

    def end_coalescing(self, device=None) -> Work:
        if self._coalescing is None:
            raise RuntimeError("topoccl: end_coalescing without start_coalescing")
        ops, works = self._coalescing, self._coalesced_works
        self._coalescing, self._coalesced_works = None, []
        for w in works:
            w._deferred = False
        work = Work([w._result for w in works], "coalesced")
        if not ops:
            work._complete(None)
            return work
        all_works = works + [work]
        for w in all_works:
            w._queue = self._exec
        self._live_comm()
        self._exec.enqueue(lambda: self._run_ops(ops, "coalesced", all_works))
        return work

    _start_coalescing = start_coalescing
    _end_coalescing = end_coalescing

    # Lifetime --------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Finishes the queued calls and destroys the communicator (destroy_process_group)."""
        comm = self._comm
        if comm is None:
            return
        self._exec.close(drain=True)
        self._comm = None
        self._lib.comm_destroy(comm)

    def abort(self) -> None:
        """Aborts the communicator at once: a running call fails, queued ones fail."""
        comm = self._comm
        if comm is None:
            return
        self._comm = None
        try:
            self._lib.comm_abort(comm)
        finally:
            self._exec.close(drain=False)

    def _wait_for_pending_works(self) -> None:
        done = threading.Event()
        try:
            self._exec.enqueue(done.set)
        except NcclError:
            return
        done.wait()


def create_backend(dist_backend_opts, backend_options=None) -> ProcessGroupTopoccl:
    """torch's creator function (``extended_api=True``)."""
    o = dist_backend_opts
    return ProcessGroupTopoccl(o.store, o.group_rank, o.group_size, o.timeout, group_name=str(o.group_id or ""))
