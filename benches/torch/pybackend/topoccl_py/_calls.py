"""Tensors and calls as the process group hands them to the library: the dtype and reduce-op
codes, argument checks, contiguous stand-ins for strided tensors, and ``_Op`` (one call split
into copy-in, library call and copy-out, so calls can be queued, coalesced into one NCCL group,
and completed together)."""

from __future__ import annotations

import contextlib
import datetime
import os
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from . import _lib

RedOpType = dist.ReduceOp.RedOpType

# torch dtype -> ncclDataType_t (bool as uint8, as ProcessGroupNCCL does).
_DTYPES: dict[torch.dtype, int] = {
    torch.int8: _lib.INT8,
    torch.uint8: _lib.UINT8,
    torch.bool: _lib.UINT8,
    torch.int32: _lib.INT32,
    torch.int64: _lib.INT64,
    torch.float16: _lib.FLOAT16,
    torch.float32: _lib.FLOAT32,
    torch.float64: _lib.FLOAT64,
    torch.bfloat16: _lib.BFLOAT16,
}
for _name, _code in (
    ("uint32", _lib.UINT32),
    ("uint64", _lib.UINT64),
    ("float8_e4m3fn", _lib.FLOAT8E4M3),
    ("float8_e5m2", _lib.FLOAT8E5M2),
):
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = _code

# Keyed by RedOpType's value (hashing pybind11 enums costs microseconds per call).
_OPS = {
    RedOpType.SUM.value: _lib.SUM,
    RedOpType.PRODUCT.value: _lib.PROD,
    RedOpType.MAX.value: _lib.MAX,
    RedOpType.MIN.value: _lib.MIN,
    RedOpType.AVG.value: _lib.AVG,
}
# bool: SUM is a logical or (MAX), PRODUCT a logical and (MIN), as in ProcessGroupNCCL.
_BOOL_OPS = {
    RedOpType.SUM.value: _lib.MAX,
    RedOpType.MAX.value: _lib.MAX,
    RedOpType.PRODUCT.value: _lib.MIN,
    RedOpType.MIN.value: _lib.MIN,
}
_BITWISE = {RedOpType.BAND.value: "BAND", RedOpType.BOR.value: "BOR", RedOpType.BXOR.value: "BXOR"}
_PREMUL_SUM = RedOpType.PREMUL_SUM.value


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _check_tensor(t: Any, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"topoccl: {what} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_cpu:
        raise ValueError(f"topoccl: {what} is on {t.device}; the topoccl backend takes CPU tensors only")
    if t.layout != torch.strided:
        raise ValueError(f"topoccl: {what} has layout {t.layout}; only dense (strided) tensors are supported")
    return t


def _dtype_code(t: torch.Tensor, what: str) -> int:
    code = _DTYPES.get(t.dtype)
    if code is None:
        raise ValueError(f"topoccl: {what} has dtype {t.dtype}, which NCCL's reductions do not support")
    return code


class _Contig:
    """A contiguous stand-in for a tensor: the tensor itself, or a copy made when the task runs
    (``load``) and written back after the call (``store``)."""

    __slots__ = ("t", "buf", "copy")

    def __init__(self, t: torch.Tensor):
        self.t = t
        self.copy = not t.is_contiguous()
        self.buf = t if not self.copy else None

    def load(self) -> torch.Tensor:
        if self.copy:
            self.buf = self.t.contiguous()
        return self.buf

    def empty(self) -> torch.Tensor:
        if self.copy:
            self.buf = torch.empty(self.t.shape, dtype=self.t.dtype)
        return self.buf

    def store(self) -> None:
        if self.copy:
            self.t.copy_(self.buf)
            self.buf = None

    @property
    def ptr(self) -> int:
        return self.buf.data_ptr()


def _consecutive(ts: Sequence[torch.Tensor]) -> int | None:
    """The address of ``ts`` if they are contiguous and lie one after another in memory (as the
    chunks of one tensor do), else None."""
    if not ts:
        return None
    start = p = ts[0].data_ptr()
    for t in ts:
        if not t.is_contiguous() or t.data_ptr() != p:
            return None
        p += _nbytes(t)
    return start


class _Op:
    """One call as the call queue runs it: ``pre`` (copies in), ``issue`` (the library calls;
    inside a coalesced group, between ncclGroupStart and ncclGroupEnd), ``post`` (copies out)."""

    __slots__ = ("name", "pre", "issue", "post", "cleanup")

    def __init__(self, name: str, issue: Callable[[], None], pre=None, post=None, cleanup=None):
        self.name, self.issue, self.pre, self.post, self.cleanup = name, issue, pre, post, cleanup


def _op_value(rop: Any) -> int:
    """RedOpType's value of a ReduceOp, a RedOpType or an int (isinstance on torch's ReduceOp
    goes through a Python metaclass: slow on the hot path)."""
    try:
        return rop.op.value
    except AttributeError:
        pass
    try:
        return rop.value
    except AttributeError:
        return int(rop)


def _sync(opts: Any) -> bool:
    """Whether the caller waits for the call at once (``async_op=False``)."""
    return not getattr(opts, "asyncOp", True)


def _root(r: int, n: int, what: str = "root") -> int:
    r = int(r)
    if not 0 <= r < n:
        raise ValueError(f"topoccl: {what} rank {r} is out of range for a group of {n}")
    return r


def _offsets(counts: Sequence[int]) -> list[int]:
    offs, acc = [], 0
    for c in counts:
        offs.append(acc)
        acc += c
    return offs


def _chain(*fns: Callable[[], Any] | None) -> Callable[[], None]:
    fns2 = [f for f in fns if f is not None]

    def run() -> None:
        for f in fns2:
            f()

    return run


def _seq(name: str, ops: list[_Op]) -> _Op:
    """Several calls as one: every copy-in, the calls in order, every copy-out (inside a
    coalesced group the calls only complete at ncclGroupEnd, so copy-outs wait for it)."""

    def phase(attr: str) -> Callable[[], None] | None:
        fns = [getattr(op, attr) for op in ops if getattr(op, attr) is not None]
        if not fns:
            return None

        def run() -> None:
            for f in fns:
                f()

        return run

    return _Op(name, phase("issue") or (lambda: None), phase("pre"), phase("post"), phase("cleanup"))


@contextlib.contextmanager
def _timeout_env(timeout: datetime.timedelta | None):
    """``TOPOCCL_TIMEOUT`` from the process group's timeout while the communicator is made
    (the library reads it then), unless the user set it."""
    if os.environ.get("TOPOCCL_TIMEOUT", "").strip() or timeout is None:
        yield
        return
    secs = timeout.total_seconds()
    if secs <= 0:
        yield
        return
    os.environ["TOPOCCL_TIMEOUT"] = repr(min(max(secs, 0.001), 1e9))
    try:
        yield
    finally:
        os.environ.pop("TOPOCCL_TIMEOUT", None)
