#!/usr/bin/env bash
# The machine a lease ran on, as a report (benches/gpu/lease.sh, step 0). Only reads: never
# changes a clock, a mode or a limit. Its last line is "SUMMARY: ...", the table's note.
#   lease/machine.sh BUNDLE_DIR
set -u
b=${1:-.}
q() { # q TITLE CMD...: a section, the command under a short limit
    local t=$1
    shift
    echo
    echo "## $t: $*"
    timeout -k 2 10 "$@" 2>&1 || echo "(exit $?)"
}
echo "# machine report, $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
q kernel uname -a
q cpus nproc
q memory free -m
q "locked memory (ulimit -l)" bash -c 'ulimit -l'
q "/dev/shm" df -h /dev/shm
echo
echo "## CUDA environment"
for v in CUDA_DEVICE_MAX_CONNECTIONS CUDA_MODULE_LOADING CUDA_VISIBLE_DEVICES CUDA_MPS_PIPE_DIRECTORY \
    CUDA_LAUNCH_BLOCKING NCCL_DEBUG LD_LIBRARY_PATH LD_PRELOAD; do
    echo "$v=${!v-(unset)}"
done
smi=""
if command -v nvidia-smi >/dev/null; then
    smi=$(timeout -k 2 10 nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,persistence_mode,compute_mode,ecc.mode.current,mig.mode.current --format=csv,noheader 2>&1 | head -n 1)
    q nvidia-smi nvidia-smi
    q "nvidia-smi -q" nvidia-smi -q
    q "topology" nvidia-smi topo -m
else
    echo
    echo "## nvidia-smi: not found"
fi
q "MPS daemon" bash -c 'pgrep -a nvidia-cuda-mps || echo "no MPS daemon running"'
q nvcc bash -c 'command -v nvcc && nvcc --version || ls -d /usr/local/cuda*/bin/nvcc 2>/dev/null || echo "no nvcc"'
q "cuda-gdb" bash -c 'command -v cuda-gdb || echo "no cuda-gdb"; command -v gdb || echo "no gdb"'
q "python, torch, NCCL" bash -c 'python3 -c "import sys, torch; print(sys.version.split()[0], \"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"nccl\", torch.cuda.nccl.version() if torch.cuda.is_available() else \"(no GPU)\")" 2>&1 | tail -n 1'
q "the driver library" bash -c 'ldconfig -p 2>/dev/null | grep -E "libcuda\.so|libnvidia-ml" | head -n 4'
echo
echo "## the bundle"
cat "$b/MANIFEST.txt" 2>/dev/null | head -n 3
cuda=$(timeout -k 2 10 nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n 1)
if [ -n "$smi" ]; then
    IFS=, read -r name cap drv mem sm smmax memclk pm cm ecc mig <<<"$smi"
    echo "SUMMARY: ${name# } (sm ${cap# }, ${mem# }), driver ${drv# }, CUDA ${cuda:-?}; clocks sm ${sm# }/${smmax# } mem ${memclk# }; persistence ${pm# }, compute ${cm# }, ECC ${ecc# }, MIG ${mig# }; MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS-unset}, MODULE_LOADING=${CUDA_MODULE_LOADING-unset}; ulimit -l $(ulimit -l); /dev/shm $(df -h /dev/shm 2>/dev/null | awk 'NR == 2 { print $2 }')"
else
    echo "SUMMARY: no nvidia-smi (no GPU driver here); $(nproc) cpus; MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS-unset}; ulimit -l $(ulimit -l); /dev/shm $(df -h /dev/shm 2>/dev/null | awk 'NR == 2 { print $2 }')"
fi
