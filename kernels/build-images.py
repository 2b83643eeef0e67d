#!/usr/bin/env python3
"""Builds (or checks) the shipped kernel images from kernels/topoccl.cu with NVIDIA's NVRTC.

    python3 kernels/build-images.py            # writes kernels/images/{sm_80,sm_90}.cubin, compute_90.ptx
    python3 kernels/build-images.py --check    # fails if a shipped image differs from a fresh build

NVRTC and ptxas come from PyPI wheels pinned below, installed with pip into --wheels
(default: target/nvidia-wheels under the repository root) when absent. Only the standard
library and ctypes are used. Exit codes: 0 ok, 1 a check failed, 3 the tools could not be had
(no pip, no network: the caller decides whether that is fatal).
"""

import argparse
import concurrent.futures
import ctypes
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

# The newest 12.9.x of each; ptxas comes from the nvcc wheel of the same version. NVRTC 12.9
# writes PTX `.version 8.8`, which drivers of CUDA 12.9 and later can JIT.
NVRTC_WHEEL = ("nvidia-cuda-nvrtc-cu12", "12.9.86")
NVCC_WHEEL = ("nvidia-cuda-nvcc-cu12", "12.9.86")

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "kernels"
SOURCE = KERNELS / "topoccl.cu"
HEADERS = ["numerics.cuh", "ops.cuh", "packs.cuh", "ll.cuh"]

# Every option that can change the code is named, so a new NVRTC default cannot slip in.
COMMON_OPTIONS = ["-std=c++17", "--fmad=false", "--ftz=false", "--prec-div=true", "--prec-sqrt=true"]

# Image file -> NVRTC target. cubins for the architectures that matter, PTX for newer ones.
IMAGES = {
    "sm_80.cubin": "sm_80",
    "sm_90.cubin": "sm_90",
    "compute_90.ptx": "compute_90",
}

TYPES = ["i8", "u8", "i32", "u32", "i64", "u64", "f16", "f32", "f64", "bf16", "f8e4m3", "f8e5m2"]
OPS = ["reduce_sum", "reduce_prod", "reduce_min", "reduce_max", "scale", "divide"]
EXPECTED = ["topoccl_copy"] + [f"topoccl_{op}_{t}" for t in TYPES for op in OPS] + [f"topoccl_ll_{t}" for t in TYPES]

EXIT_FAILED = 1
EXIT_UNAVAILABLE = 3


class Unavailable(Exception):
    """The tools (python's pip, the wheels) could not be had."""


def dist_version(wheels: Path, name: str):
    prefix = name.replace("-", "_") + "-"
    for d in wheels.glob(prefix + "*.dist-info") if wheels.is_dir() else []:
        return d.name[len(prefix) : -len(".dist-info")]
    return None


def ensure_wheels(wheels: Path):
    """Installs the pinned wheels into `wheels` unless they are there; returns (libnvrtc, ptxas)."""
    missing = [f"{n}=={v}" for n, v in (NVRTC_WHEEL, NVCC_WHEEL) if dist_version(wheels, n) != v]
    if missing:
        print(f"installing {' '.join(missing)} into {wheels}", file=sys.stderr)
        env = dict(os.environ, PIP_BREAK_SYSTEM_PACKAGES="1")
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps"]
        cmd += ["--upgrade", "--target", str(wheels)] + missing
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        except OSError as e:
            raise Unavailable(f"cannot run pip: {e}")
        if done.returncode != 0:
            raise Unavailable(f"pip install failed:\n{done.stdout}{done.stderr}")
    nvrtc = wheels / "nvidia" / "cuda_nvrtc" / "lib" / "libnvrtc.so.12"
    ptxas = wheels / "nvidia" / "cuda_nvcc" / "bin" / "ptxas"
    for p in (nvrtc, ptxas):
        if not p.exists():
            raise Unavailable(f"{p} missing after installing the wheels")
    return nvrtc, ptxas


class Nvrtc:
    def __init__(self, path: Path):
        self.lib = ctypes.CDLL(str(path))
        self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p

    def call(self, fn, *args):
        r = getattr(self.lib, fn)(*args)
        if r != 0:
            raise RuntimeError(f"{fn}: {self.lib.nvrtcGetErrorString(r).decode()}")

    def version(self):
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.call("nvrtcVersion", ctypes.byref(major), ctypes.byref(minor))
        return f"{major.value}.{minor.value}"

    def compile(self, target: str) -> bytes:
        """Compiles the source for `target` (sm_XX: a cubin; compute_XX: PTX)."""
        src = SOURCE.read_bytes()
        names = (ctypes.c_char_p * len(HEADERS))(*[h.encode() for h in HEADERS])
        bodies = (ctypes.c_char_p * len(HEADERS))(*[(KERNELS / h).read_bytes() for h in HEADERS])
        prog = ctypes.c_void_p()
        self.call("nvrtcCreateProgram", ctypes.byref(prog), src, b"topoccl.cu", len(HEADERS), bodies, names)
        try:
            opts = COMMON_OPTIONS + [f"--gpu-architecture={target}"]
            copts = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
            result = self.lib.nvrtcCompileProgram(prog, len(opts), copts)
            size = ctypes.c_size_t()
            self.call("nvrtcGetProgramLogSize", prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            self.call("nvrtcGetProgramLog", prog, log)
            text = log.value.decode(errors="replace").strip()
            if result != 0:
                raise RuntimeError(f"NVRTC failed for {target}:\n{text}")
            if text:
                # A warning is a defect in the source: the images must come from a clean build.
                raise RuntimeError(f"NVRTC warned for {target}:\n{text}")
            kind = "CUBIN" if target.startswith("sm_") else "PTX"
            self.call(f"nvrtcGet{kind}Size", prog, ctypes.byref(size))
            out = ctypes.create_string_buffer(size.value)
            self.call(f"nvrtcGet{kind}", prog, out)
            data = out.raw
            # NVRTC's PTX size counts the terminating NUL; the shipped file is plain text.
            return data.rstrip(b"\0") if kind == "PTX" else data
        finally:
            self.call("nvrtcDestroyProgram", ctypes.byref(prog))


def cubin_entries(data: bytes):
    """The global function symbols of an ELF64 cubin (its kernels)."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise RuntimeError("not an ELF64 image")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = set()
    for _name, sh_type, _f, _a, off, size, link, _i, _al, entsize in sections:
        if sh_type != 2:  # SHT_SYMTAB
            continue
        stroff = sections[link][4]
        for k in range(size // entsize):
            st_name, st_info = struct.unpack_from("<IB", data, off + k * entsize)
            if st_info >> 4 == 1 and st_info & 0xF == 2:  # STB_GLOBAL, STT_FUNC
                end = data.index(b"\0", stroff + st_name)
                names.add(data[stroff + st_name : end].decode())
    return names


def ptx_entries(text: bytes):
    return set(re.findall(r"\.entry\s+(\w+)\s*\(", text.decode()))


def entries(file: str, data: bytes):
    return cubin_entries(data) if file.endswith(".cubin") else ptx_entries(data)


def check_names(file: str, data: bytes):
    found = entries(file, data)
    missing = sorted(set(EXPECTED) - found)
    extra = sorted(found - set(EXPECTED))
    if missing or extra:
        raise RuntimeError(f"{file}: kernels missing {missing}, unexpected {extra}")
    return len(found)


def build_all(nvrtc: Nvrtc, targets):
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(targets)) as pool:
        futures = {t: pool.submit(nvrtc.compile, t) for t in targets}
        return {t: f.result() for t, f in futures.items()}


def run_ptxas(ptxas: Path, ptx: bytes, arch: str, tmp: Path) -> bytes:
    src, out = tmp / f"{arch}.ptx", tmp / f"{arch}.ptxas.cubin"
    src.write_bytes(ptx)
    done = subprocess.run([str(ptxas), f"-arch={arch}", str(src), "-o", str(out)], capture_output=True, text=True)
    if done.returncode != 0 or done.stderr.strip():
        raise RuntimeError(f"ptxas -arch={arch} rejected NVRTC's PTX:\n{done.stdout}{done.stderr}")
    return out.read_bytes()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare the shipped images with a fresh build; run ptxas")
    ap.add_argument("--wheels", type=Path, default=Path(os.environ.get("TOPOCCL_NVIDIA_WHEELS", ROOT / "target" / "nvidia-wheels")))
    ap.add_argument("--out", type=Path, default=KERNELS / "images", help="where the images go (build mode)")
    args = ap.parse_args()
    try:
        lib, ptxas = ensure_wheels(args.wheels.resolve())
        nvrtc = Nvrtc(lib)
    except (Unavailable, OSError) as e:
        print(f"build-images: tools unavailable: {e}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    print(f"NVRTC {nvrtc.version()} ({NVRTC_WHEEL[0]} {NVRTC_WHEEL[1]}), ptxas from {NVCC_WHEEL[0]} {NVCC_WHEEL[1]}")
    try:
        if args.check:
            return check(nvrtc, ptxas, args.out)
        return build(nvrtc, args.out)
    except RuntimeError as e:
        print(f"build-images: FAILED: {e}", file=sys.stderr)
        return EXIT_FAILED


def build(nvrtc: Nvrtc, out: Path):
    first = build_all(nvrtc, list(IMAGES.values()))
    second = build_all(nvrtc, list(IMAGES.values()))
    out.mkdir(parents=True, exist_ok=True)
    for file, target in IMAGES.items():
        if first[target] != second[target]:
            raise RuntimeError(f"NVRTC is not deterministic for {target}: two builds differ")
        n = check_names(file, first[target])
        (out / file).write_bytes(first[target])
        print(f"{out / file}: {len(first[target])} bytes, {n} kernels")
    return 0


def check(nvrtc: Nvrtc, ptxas: Path, shipped: Path):
    fresh = build_all(nvrtc, list(IMAGES.values()) + ["compute_80"])
    failures = []
    for file, target in IMAGES.items():
        path = shipped / file
        have = path.read_bytes() if path.exists() else None
        n = check_names(file, fresh[target])
        if have is None:
            failures.append(f"{path} is missing")
        elif have != fresh[target]:
            failures.append(f"{path} differs from a fresh NVRTC build ({len(have)} vs {len(fresh[target])} bytes)")
        else:
            check_names(file, have)
            print(f"{file}: matches a fresh build ({len(have)} bytes, {n} kernels)")
    with tempfile.TemporaryDirectory() as tmp:
        cubins = {}
        for ptx_target, arch in (("compute_80", "sm_80"), ("compute_90", "sm_90")):
            cubins[arch] = run_ptxas(ptxas, fresh[ptx_target], arch, Path(tmp))
            n = check_names(f"{arch}.cubin", cubins[arch])
            print(f"ptxas -arch={arch} accepts NVRTC's {ptx_target} PTX ({n} kernels)")
        same = cubins["sm_90"] == fresh["sm_90"]
        print(f"ptxas's sm_90 cubin {'equals' if same else 'differs from'} NVRTC's"
              + ("" if same else f" ({len(cubins['sm_90'])} vs {len(fresh['sm_90'])} bytes)"))
    if failures:
        print("build-images: FAILED:\n  " + "\n  ".join(failures)
              + "\n(regenerate with: python3 kernels/build-images.py)", file=sys.stderr)
        return EXIT_FAILED
    print("build-images: the shipped images are current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
