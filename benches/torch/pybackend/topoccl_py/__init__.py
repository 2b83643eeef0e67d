"""The Python backend the C++ one (``python/topoccl``) replaced, kept as the benchmark's
baseline (``benches/torch/run.sh``): ``import topoccl_py`` registers the backend
"topoccl_py", a Python ``ProcessGroup`` over ctypes with a call queue and worker thread of its
own. Not shipped; the library is ``$TOPOCCL_NCCL_LIB``.
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

BACKEND_NAME = "topoccl_py"

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
