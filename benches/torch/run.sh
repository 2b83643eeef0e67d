#!/usr/bin/env bash
# torch.distributed all_reduce and a DDP step: gloo, topoccl's C++ backend and the Python
# backend it replaced (benches/torch/pybackend), 2 and 4 ranks on this machine, in one run.
# Prints markdown tables (rank 0's stdout); progress goes to stderr.
#
#   benches/torch/run.sh                 # 2 and 4 ranks
#   RANKS="2" BENCH_SECONDS=0.5 benches/torch/run.sh --skip-ddp
#
# The package is this checkout's python/topoccl; the library is $TOPOCCL_NCCL_LIB, else
# target/release/libnccl.so (built with `cargo build --release -p topoccl-ffi` if missing).
# Extra arguments go to bench.py (--max-bytes, --width, --depth, --batch, --steps,
# --skip-ddp, --skip-allreduce). The C++ backend is compiled in place first
# (python/build_ext.py --inplace; nothing to do when up to date).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
if [[ -z "${TOPOCCL_NCCL_LIB:-}" ]]; then
    TOPOCCL_NCCL_LIB="$repo/target/release/libnccl.so"
    if [[ ! -e "$TOPOCCL_NCCL_LIB" ]]; then
        (cd "$repo" && cargo build --release -p topoccl-ffi)
    fi
fi
export TOPOCCL_NCCL_LIB
export PYTHONPATH="$repo/python:$here/pybackend${PYTHONPATH:+:$PYTHONPATH}"
export MASTER_ADDR=127.0.0.1 OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export TOPOCCL_CACHE_DIR="${TOPOCCL_CACHE_DIR:-${TMPDIR:-/tmp}/topoccl-bench-cache}"
python3 -c "import torch" 2>/dev/null || { echo "torch is not installed (pip install torch)" >&2; exit 2; }
python3 "$repo/python/build_ext.py" --inplace >&2
echo "library: $TOPOCCL_NCCL_LIB" >&2
for n in ${RANKS:-2 4}; do
    export WORLD_SIZE=$n
    export MASTER_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    pids=()
    for ((r = 0; r < n; r++)); do
        if ((r == 0)); then
            RANK=$r python3 "$here/bench.py" "$@" &
        else
            RANK=$r python3 "$here/bench.py" "$@" >/dev/null &
        fi
        pids+=($!)
    done
    rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    ((rc == 0)) || { echo "benchmark with $n ranks failed ($rc)" >&2; exit "$rc"; }
done
