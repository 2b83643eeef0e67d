#!/usr/bin/env bash
# Fetches NVIDIA's nccl.h 2.30.7 (from the nvidia-nccl-cu13 wheel on PyPI) into
# target/nvidia-nccl-2.30.7/include, for the C ABI test that compiles our test programs against
# NVIDIA's own header. Not committed: read at test time only. Usage: ffi/tests/fetch-nvidia-nccl.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=target/nvidia-nccl-2.30.7
[ -f "$dest/include/nccl.h" ] && exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps -d "$tmp" nvidia-nccl-cu13==2.30.7
mkdir -p "$dest/include"
python3 - "$tmp"/*.whl "$dest/include" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    data = z.read("nvidia/nccl/include/nccl.h")
open(out + "/nccl.h", "wb").write(data)
PY
echo "NVIDIA nccl.h 2.30.7 in $dest/include"
