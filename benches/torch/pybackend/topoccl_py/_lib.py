"""ctypes binding of topoccl's NCCL C ABI (``libnccl.so.2``, see ``ffi/include/nccl.h``).

The library is loaded by full path with ``RTLD_LOCAL`` and every symbol is looked up on its
handle, so NVIDIA's ``libnccl.so.2`` (which a CUDA build of torch may load) and ours never
mix. ctypes releases the GIL for the duration of each call.
"""

from __future__ import annotations

import ctypes
import os
from ctypes import POINTER, c_char, c_char_p, c_int, c_size_t, c_void_p

import torch.distributed as dist

__all__ = [
    "Library",
    "NcclError",
    "default_library_path",
    "load",
]

#: Result codes (ncclResult_t).
SUCCESS = 0
UNHANDLED_CUDA = 1
SYSTEM = 2
INTERNAL = 3
INVALID_ARGUMENT = 4
INVALID_USAGE = 5
REMOTE_ERROR = 6
IN_PROGRESS = 7
TIMEOUT = 8

RESULT_NAMES = {
    0: "ncclSuccess",
    1: "ncclUnhandledCudaError",
    2: "ncclSystemError",
    3: "ncclInternalError",
    4: "ncclInvalidArgument",
    5: "ncclInvalidUsage",
    6: "ncclRemoteError",
    7: "ncclInProgress",
    8: "ncclTimeout",
}

#: ncclDataType_t
INT8, UINT8, INT32, UINT32, INT64, UINT64, FLOAT16, FLOAT32, FLOAT64, BFLOAT16 = range(10)
FLOAT8E4M3, FLOAT8E5M2 = 10, 11

#: ncclRedOp_t
SUM, PROD, MAX, MIN, AVG = range(5)

#: ncclScalarResidence_t
SCALAR_DEVICE, SCALAR_HOST_IMMEDIATE = 0, 1

UNIQUE_ID_BYTES = 128

_BaseError = getattr(dist, "DistBackendError", RuntimeError)


class NcclError(_BaseError):
    """A call into the library failed; ``code`` is its ncclResult_t."""

    def __init__(self, message: str, code: int = INTERNAL):
        super().__init__(message)
        self.code = code


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", c_char * UNIQUE_ID_BYTES)]

    def to_bytes(self) -> bytes:
        return ctypes.string_at(ctypes.addressof(self), UNIQUE_ID_BYTES)

    @classmethod
    def from_bytes(cls, data: bytes) -> "UniqueId":
        if len(data) != UNIQUE_ID_BYTES:
            raise ValueError(f"a unique id has {UNIQUE_ID_BYTES} bytes, got {len(data)}")
        uid = cls()
        ctypes.memmove(ctypes.addressof(uid), data, UNIQUE_ID_BYTES)
        return uid


def default_library_path() -> str:
    """``$TOPOCCL_NCCL_LIB``, else the library installed in the package (``topoccl/lib``)."""
    env = os.environ.get("TOPOCCL_NCCL_LIB", "").strip()
    if env:
        return os.path.abspath(env)
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib")
    for name in ("libnccl.so.2", "libnccl.so"):
        p = os.path.join(here, name)
        if os.path.exists(p):
            return p
    return os.path.join(here, "libnccl.so.2")


_comm_t = c_void_p
_stream_t = c_void_p

# name: (restype, argtypes)
_SIGNATURES = {
    "ncclGetVersion": (c_int, [POINTER(c_int)]),
    "ncclGetUniqueId": (c_int, [POINTER(UniqueId)]),
    "ncclCommInitRank": (c_int, [POINTER(_comm_t), c_int, UniqueId, c_int]),
    "ncclCommDestroy": (c_int, [_comm_t]),
    "ncclCommAbort": (c_int, [_comm_t]),
    "ncclCommFinalize": (c_int, [_comm_t]),
    "ncclCommCount": (c_int, [_comm_t, POINTER(c_int)]),
    "ncclCommUserRank": (c_int, [_comm_t, POINTER(c_int)]),
    "ncclCommGetAsyncError": (c_int, [_comm_t, POINTER(c_int)]),
    "ncclGetErrorString": (c_char_p, [c_int]),
    "ncclGetLastError": (c_char_p, [_comm_t]),
    "ncclAllReduce": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, _comm_t, _stream_t]),
    "ncclBroadcast": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, _comm_t, _stream_t]),
    "ncclReduce": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, c_int, _comm_t, _stream_t]),
    "ncclAllGather": (c_int, [c_void_p, c_void_p, c_size_t, c_int, _comm_t, _stream_t]),
    "ncclReduceScatter": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, _comm_t, _stream_t]),
    "ncclSend": (c_int, [c_void_p, c_size_t, c_int, c_int, _comm_t, _stream_t]),
    "ncclRecv": (c_int, [c_void_p, c_size_t, c_int, c_int, _comm_t, _stream_t]),
    "ncclGroupStart": (c_int, []),
    "ncclGroupEnd": (c_int, []),
    "ncclRedOpCreatePreMulSum": (c_int, [POINTER(c_int), c_void_p, c_int, c_int, _comm_t]),
    "ncclRedOpDestroy": (c_int, [c_int, _comm_t]),
    "ncclAlltoAll": (c_int, [c_void_p, c_void_p, c_size_t, c_int, _comm_t, _stream_t]),
    "ncclGather": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, _comm_t, _stream_t]),
    "ncclScatter": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, _comm_t, _stream_t]),
}


class Library:
    """The C functions of one loaded ``libnccl.so.2``, with errors raised as :class:`NcclError`.

    The raw functions are attributes (``lib.ncclAllReduce``). :meth:`check` turns a result code
    into an exception; it must run on the thread that made the call (the library's last-error
    text is per thread).
    """

    def __init__(self, path: str):
        self.path = path
        if not os.path.exists(path):
            raise OSError(
                f"topoccl: the NCCL library {path!r} does not exist "
                "(reinstall the package with `pip install ./python`, or set TOPOCCL_NCCL_LIB)"
            )
        self._dll = ctypes.CDLL(path, mode=os.RTLD_LOCAL)
        for name, (res, args) in _SIGNATURES.items():
            fn = getattr(self._dll, name, None)
            if fn is None:
                raise OSError(f"topoccl: {path} has no {name}: not topoccl's libnccl.so.2?")
            fn.restype = res
            fn.argtypes = args
            setattr(self, name, fn)
        v = c_int(0)
        self.check("ncclGetVersion", self.ncclGetVersion(ctypes.byref(v)))
        self.version = v.value

    def error_string(self, code: int) -> str:
        s = self.ncclGetErrorString(code)
        return s.decode(errors="replace") if s else RESULT_NAMES.get(code, f"result {code}")

    def last_error(self) -> str:
        s = self.ncclGetLastError(None)
        return s.decode(errors="replace") if s else ""

    def check(self, what: str, code: int) -> None:
        if code == SUCCESS:
            return
        detail = self.last_error()
        name = RESULT_NAMES.get(code, f"result {code}")
        msg = f"topoccl: {what} failed: {name} ({self.error_string(code)})"
        if detail:
            msg += f": {detail}"
        raise NcclError(msg, code)

    # Communicators ---------------------------------------------------------------------

    def get_unique_id(self) -> bytes:
        uid = UniqueId()
        self.check("ncclGetUniqueId", self.ncclGetUniqueId(ctypes.byref(uid)))
        return uid.to_bytes()

    def comm_init_rank(self, nranks: int, uid: bytes, rank: int) -> int:
        comm = c_void_p()
        self.check(
            "ncclCommInitRank", self.ncclCommInitRank(ctypes.byref(comm), nranks, UniqueId.from_bytes(uid), rank)
        )
        if not comm.value:
            raise NcclError("topoccl: ncclCommInitRank returned a NULL communicator", INTERNAL)
        return comm.value

    def comm_destroy(self, comm: int) -> None:
        self.check("ncclCommDestroy", self.ncclCommDestroy(comm))

    def comm_abort(self, comm: int) -> None:
        self.check("ncclCommAbort", self.ncclCommAbort(comm))

    def comm_count(self, comm: int) -> int:
        n = c_int(0)
        self.check("ncclCommCount", self.ncclCommCount(comm, ctypes.byref(n)))
        return n.value

    def comm_user_rank(self, comm: int) -> int:
        r = c_int(0)
        self.check("ncclCommUserRank", self.ncclCommUserRank(comm, ctypes.byref(r)))
        return r.value

    def comm_async_error(self, comm: int) -> int:
        e = c_int(0)
        self.check("ncclCommGetAsyncError", self.ncclCommGetAsyncError(comm, ctypes.byref(e)))
        return e.value

    def premul_sum_create(self, scalar_ptr: int, dtype: int, comm: int) -> int:
        op = c_int(0)
        self.check(
            "ncclRedOpCreatePreMulSum",
            self.ncclRedOpCreatePreMulSum(ctypes.byref(op), scalar_ptr, dtype, SCALAR_HOST_IMMEDIATE, comm),
        )
        return op.value

    def red_op_destroy(self, op: int, comm: int) -> None:
        self.check("ncclRedOpDestroy", self.ncclRedOpDestroy(op, comm))


_loaded: dict[str, Library] = {}


def load(path: str | None = None) -> Library:
    """The library at ``path`` (default: :func:`default_library_path`), loaded once."""
    path = os.path.realpath(path or default_library_path())
    lib = _loaded.get(path)
    if lib is None:
        lib = _loaded[path] = Library(path)
    return lib
