"""topoccl for PyTorch: ``import topoccl`` registers the torch.distributed backend "topoccl"
for CPU tensors, a C++ ``c10d::Backend`` (``topoccl._C``, compiled against the installed
torch by ``pip install ./python``) whose calls run on topoccl's library (``libnccl.so.2``, built
from this repository's ``ffi/`` crate, opened privately beside any NVIDIA NCCL torch loads).

    import torch.distributed as dist
    import topoccl  # noqa: F401
    dist.init_process_group("topoccl", ...)          # or "cpu:topoccl,cuda:nccl"

``TOPOCCL_NCCL_LIB`` names the library to load instead of the one installed in the package.
"""

from __future__ import annotations

import datetime
import os
import sys

import torch
import torch.distributed as dist

try:
    from . import _C
    from ._build_info import TORCH_VERSION as _BUILT_FOR
except ImportError as e:  # pragma: no cover - what a broken install says
    raise ImportError(
        "topoccl: the C++ backend (topoccl._C) is not built: install with `pip install ./python` from the "
        "repository, or run `python3 python/build_ext.py --inplace` in a checkout"
    ) from e

if _BUILT_FOR != torch.__version__:
    raise ImportError(
        f"topoccl: the C++ backend was compiled against torch {_BUILT_FOR}, but torch {torch.__version__} is "
        "installed: reinstall topoccl (`pip install ./python`) so that it is compiled against this torch"
    )

__all__ = [
    "BACKEND_NAME",
    "ProcessGroupTopoccl",
    "backend_of",
    "default_library_path",
    "library_path",
    "register",
]

__version__ = "0.1.0"

BACKEND_NAME = "topoccl"


def default_library_path() -> str:
    """``$TOPOCCL_NCCL_LIB``, else the library installed in the package (``topoccl/lib``)."""
    env = os.environ.get("TOPOCCL_NCCL_LIB", "").strip()
    if env:
        return os.path.realpath(env)
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib")
    for name in ("libnccl.so.2", "libnccl.so"):
        p = os.path.join(here, name)
        if os.path.exists(p):
            return os.path.realpath(p)
    raise ImportError(
        f"topoccl: no library in {here} and TOPOCCL_NCCL_LIB is not set: install with `pip install ./python`, "
        "or set TOPOCCL_NCCL_LIB to target/release/libnccl.so of a `cargo build --release -p topoccl-ffi`"
    )


#: The library every communicator of this process runs on.
library_path: str = default_library_path()


class ProcessGroupTopoccl(_C.ProcessGroupTopoccl):
    """The backend (a ``c10d::Backend``): one topoccl communicator, made collectively by
    ``size`` ranks that share ``store``. torch makes it through :func:`create_backend`; it can
    also be made directly, as torch's own backends can."""

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        size: int,
        timeout: datetime.timedelta = datetime.timedelta(minutes=30),
        group_name: str = "",
        library_path: str | None = None,
    ):
        super().__init__(store, rank, size, timeout, group_name, library_path or globals()["library_path"])


def create_backend(dist_backend_opts, backend_options=None) -> ProcessGroupTopoccl | dist.ProcessGroup:
    """torch's creator function (``extended_api=True``): the backend, or, for a group of
    topoccl alone, a process group of its own around it (see :func:`_alone`)."""
    o = dist_backend_opts
    backend = ProcessGroupTopoccl(o.store, o.group_rank, o.group_size, o.timeout, str(o.group_id or ""))
    torch_pg = getattr(o, "process_group", None)
    if torch_pg is None or not _alone(sys._getframe(1)):
        return backend
    # torch takes a process group returned here as the group (registering nothing itself):
    # this one is torch's own with its backend's name, "topoccl" where torch says "custom"
    # for every plugin (DDP's logs).
    pg = _C.NamedProcessGroup(torch_pg.get_group_store(), o.group_rank, o.group_size, BACKEND_NAME)
    pg._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
    pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.CUSTOM, backend)
    if torch_pg.bound_device_id is not None:
        pg.bound_device_id = torch_pg.bound_device_id
    return pg


def _alone(caller) -> bool:
    """Whether torch is making a group whose every device runs topoccl ("topoccl", or
    "cpu:topoccl"), not one shared with another backend ("cpu:topoccl,cuda:nccl"), which torch
    would never give its other backend once a process group came back. Read from torch's
    ``_new_process_group_helper`` (the caller); anything else, or torch's debug wrapper
    (``TORCH_DISTRIBUTED_DEBUG=DETAIL``, which wraps backends only), keeps the plain backend."""
    if caller is None or caller.f_code.co_name != "_new_process_group_helper":
        return False
    config = caller.f_locals.get("backend_config")
    try:
        backends = set(config.get_device_backend_map().values())
    except AttributeError:
        return False
    return backends == {BACKEND_NAME} and dist.get_debug_level() != dist.DebugLevel.DETAIL


def backend_of(group=None) -> ProcessGroupTopoccl:
    """The topoccl backend of a process group (default: the default group)."""
    pg = group if group is not None else dist.group.WORLD
    return pg._get_backend(torch.device("cpu"))


def register() -> None:
    """Registers the "topoccl" backend with torch.distributed (done at import; also the
    ``torch.distributed.backends`` entry point, so ``init_process_group("topoccl")`` finds it
    without the import)."""
    if BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend(BACKEND_NAME, create_backend, extended_api=True, devices=["cpu"])


register()
