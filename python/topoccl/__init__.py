"""topoccl for PyTorch: ``import topoccl`` registers the torch.distributed backend "topoccl"
(CPU tensors), which runs every call on topoccl's NCCL-compatible library (``libnccl.so.2``,
built from this repository's ``ffi/`` crate) through its C ABI.

    import torch.distributed as dist
    import topoccl  # noqa: F401
    dist.init_process_group("topoccl", ...)          # or "cpu:topoccl,cuda:nccl"

``TOPOCCL_NCCL_LIB`` names the library to load instead of the one installed in the package.
"""

from __future__ import annotations

import torch.distributed as dist

from . import _lib
from ._lib import NcclError, default_library_path
from ._work import Work
from .backend import ProcessGroupTopoccl, create_backend

__all__ = [
    "BACKEND_NAME",
    "NcclError",
    "ProcessGroupTopoccl",
    "Work",
    "library",
    "library_path",
    "register",
]

__version__ = "0.1.0"

BACKEND_NAME = "topoccl"

#: The loaded library (``ctypes.CDLL(path, mode=RTLD_LOCAL)``).
library: _lib.Library = _lib.load()
library_path: str = library.path


def register() -> None:
    """Registers the "topoccl" backend with torch.distributed (done at import; also the
    ``torch.distributed.backends`` entry point, so ``init_process_group("topoccl")`` finds it
    without the import)."""
    if BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend(BACKEND_NAME, create_backend, extended_api=True, devices=["cpu"])


register()
