"""Compiles the C++ backend (``topoccl/csrc``) into ``topoccl/_C*.so`` with torch's C++
extension tooling: ``python build_ext.py BUILD_LIB BUILD_TEMP NCCL_INCLUDE``, or
``python build_ext.py --inplace`` (into this checkout's ``topoccl/``, for the tests and
benchmarks that run from the source tree; up to date sources are not compiled again).

``setup.py`` runs this in a child interpreter whose environment is the installing one (not
pip's isolated build environment, which has no torch): the extension must be compiled against
the very torch it will be loaded into. It also writes ``topoccl/_build_info.py`` (the torch
version built against), which ``import topoccl`` checks.
"""

from __future__ import annotations

import os
import sys

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = ["library.cpp", "types.cpp", "work.cpp", "backend.cpp", "reductions.cpp", "movement.cpp", "module.cpp"]


def compile_in_parallel() -> None:
    """setuptools compiles one source at a time; the sources of one extension are independent,
    so compile them on every core (each includes torch's headers, ~20 s alone)."""
    import distutils.ccompiler
    from multiprocessing.pool import ThreadPool

    def compile(self, sources, output_dir=None, macros=None, include_dirs=None, debug=0,
                extra_preargs=None, extra_postargs=None, depends=None):
        macros, objects, extra_postargs, pp_opts, build = self._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs
        )
        cc_args = self._get_cc_args(pp_opts, debug, extra_preargs)

        print(f"topoccl: compiling {len(objects)} sources in parallel", flush=True)

        def one(obj):
            if obj in build:
                src, ext = build[obj]
                self._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

        with ThreadPool(max(1, min(len(objects), os.cpu_count() or 1))) as pool:
            pool.map(one, objects)
        return objects

    # The class that defines `compile` for this platform's compiler (setuptools' copy of
    # distutils moves it between versions).
    for cls in type(distutils.ccompiler.new_compiler()).__mro__:
        if "compile" in vars(cls):
            cls.compile = compile
            break


HEADERS = ["library.h", "types.h", "work.h", "backend.h", "internal.h"]


def main() -> None:
    if sys.argv[1:] == ["--inplace"]:
        build_lib = HERE
        build_temp = os.path.join(HERE, "build", "temp-inplace")
        nccl_include = os.path.join(os.path.dirname(HERE), "ffi", "include")
    elif len(sys.argv) == 4:
        build_lib, build_temp, nccl_include = sys.argv[1:4]
    else:
        sys.exit(__doc__)
    os.chdir(HERE)
    compile_in_parallel()
    ext = CppExtension(
        "topoccl._C",
        [os.path.join("topoccl", "csrc", s) for s in SOURCES],
        include_dirs=[os.path.abspath(nccl_include)],
        depends=[os.path.join("topoccl", "csrc", h) for h in HEADERS]
        + [os.path.join(os.path.abspath(nccl_include), h) for h in ("nccl.h", "topoccl.h")],
        extra_compile_args=["-O2", "-Wall", "-Wno-unused-parameter"],
    )
    setup(
        name="topoccl-backend",
        ext_modules=[ext],
        cmdclass={"build_ext": BuildExtension.with_options(use_ninja=False)},
        script_args=["--quiet", "build_ext", "--build-lib", build_lib, "--build-temp", build_temp],
    )
    info = os.path.join(build_lib, "topoccl", "_build_info.py")
    with open(info, "w") as f:
        f.write('"""Written by build_ext.py: what the C++ backend was compiled against."""\n\n')
        f.write(f"TORCH_VERSION = {torch.__version__!r}\n")


if __name__ == "__main__":
    main()
