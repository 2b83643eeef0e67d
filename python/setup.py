"""Builds the ``topoccl`` Python package: ``pip install ./python`` from the repository root.

Two native parts:

* the library: ``cargo build --release -p topoccl-ffi`` in the repository (this directory's
  parent, or ``$TOPOCCL_REPO``); its ``libnccl.so`` (soname ``libnccl.so.2``) goes into the
  package as ``topoccl/lib/libnccl.so.2``, which the backend opens (``$TOPOCCL_NCCL_LIB``
  overrides it at run time);
* the backend, ``topoccl._C`` (C++ in ``topoccl/csrc``), compiled by ``build_ext.py`` with
  torch's extension tooling against the torch of the environment being installed into. pip
  builds in an isolated environment without torch, so ``build_ext.py`` runs in a child
  interpreter with that isolation removed (the same interpreter, its own site-packages).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.environ.get("TOPOCCL_REPO") or os.path.dirname(HERE))


def _cargo() -> str:
    found = shutil.which("cargo") or os.path.expanduser("~/.cargo/bin/cargo")
    if not os.path.exists(found):
        raise RuntimeError("topoccl: building the library needs cargo (https://rustup.rs) on PATH")
    return found


def build_library() -> str:
    """Runs cargo; the path of the libnccl.so it built."""
    if not os.path.exists(os.path.join(REPO, "ffi", "Cargo.toml")):
        raise RuntimeError(
            f"topoccl: {REPO} is not the topoccl repository (no ffi/Cargo.toml); "
            "install from the checkout (`pip install ./python`) or set TOPOCCL_REPO"
        )
    cmd = [_cargo(), "build", "--release", "-p", "topoccl-ffi", "--message-format=json-render-diagnostics"]
    print("topoccl: " + " ".join(cmd[:-1]) + f"  (in {REPO})", flush=True)
    proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"topoccl: cargo build failed (exit {proc.returncode})")
    built = None
    for line in proc.stdout.splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") == "compiler-artifact" and "cdylib" in msg.get("target", {}).get("crate_types", []):
            for f in msg.get("filenames", []):
                if f.endswith(".so"):
                    built = f
    if built is None:
        built = os.path.join(os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target"), "release", "libnccl.so")
    if not os.path.exists(built):
        raise RuntimeError(f"topoccl: cargo reported success but {built} does not exist")
    return built


def build_backend(build_lib: str) -> None:
    """Compiles ``topoccl._C`` into ``build_lib/topoccl`` (``build_ext.py``, in a child
    interpreter that sees the installing environment's torch)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}
    probe = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True)
    if probe.returncode != 0:
        raise RuntimeError(
            "topoccl: the backend is compiled against the installed torch, but `import torch` fails in "
            f"{sys.executable} ({probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else 'no torch'}): "
            "install torch first"
        )
    # What build_py copied from an in-place build of the checkout (build_ext.py --inplace) is
    # not necessarily compiled against this environment's torch: always compile.
    # (An editable install compiles in place: what is there is the build's own.)
    import glob

    if build_lib != HERE:
        copied = glob.glob(os.path.join(build_lib, "topoccl", "_C*.so"))
        copied += glob.glob(os.path.join(build_lib, "topoccl", "_build_info.py"))
        for stale in copied:
            os.remove(stale)
    temp = os.path.join(HERE, "build", "temp-backend")
    cmd = [sys.executable, os.path.join(HERE, "build_ext.py"), build_lib, temp, os.path.join(REPO, "ffi", "include")]
    print("topoccl: compiling the C++ backend (topoccl/csrc) against the installed torch", flush=True)
    if subprocess.run(cmd, env=env, cwd=HERE).returncode != 0:
        raise RuntimeError("topoccl: compiling the C++ backend failed (see above)")


class BuildPyWithLibrary(build_py):
    """build_py, plus the library in ``topoccl/lib/`` and the compiled backend (in the build
    tree, and for editable installs in the source tree)."""

    def run(self):
        super().run()
        lib = build_library()
        targets = [os.path.join(self.build_lib, "topoccl", "lib")]
        editable = getattr(self, "editable_mode", False)
        build_backend(HERE if editable else self.build_lib)
        if editable:
            targets = [os.path.join(HERE, "topoccl", "lib")]
        for d in targets:
            os.makedirs(d, exist_ok=True)
            dest = os.path.join(d, "libnccl.so.2")
            if os.path.exists(dest):
                os.remove(dest)  # never rewrite a file a running process may have mapped
            shutil.copy2(lib, dest)
            print(f"topoccl: {lib} -> {dest}", flush=True)


cmdclass = {"build_py": BuildPyWithLibrary}

try:  # a wheel with a native library: platform-specific, but for any Python 3
    try:
        from setuptools.command.bdist_wheel import bdist_wheel
    except ImportError:
        from wheel.bdist_wheel import bdist_wheel  # type: ignore

    class BdistWheel(bdist_wheel):
        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False

        def get_tag(self):
            _, _, plat = super().get_tag()
            return "py3", "none", plat

    cmdclass["bdist_wheel"] = BdistWheel
except ImportError:
    pass


setup(
    name="topoccl",
    version="0.1.0",
    description="torch.distributed backend 'topoccl' (CPU tensors): a C++ c10d::Backend on topoccl's library",
    long_description=open(os.path.join(HERE, "README.md")).read() if os.path.exists(os.path.join(HERE, "README.md")) else "",
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    packages=["topoccl"],
    package_data={"topoccl": ["lib/*", "_C*.so", "_build_info.py"]},
    python_requires=">=3.9",
    install_requires=["torch>=2.1"],
    entry_points={"torch.distributed.backends": ["topoccl = topoccl:register"]},
    cmdclass=cmdclass,
    zip_safe=False,
)
