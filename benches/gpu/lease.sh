#!/usr/bin/env bash
# A lent GPU machine's few minutes, in one command: what the driver does (probes), whether
# topoccl's device path runs the way users call it, how fast, against what reference.
#
#   here:  benches/gpu/lease.sh --build-only   # build and pack the carry: target/gpu-lease/
#   there: run(command="benches/gpu/lease.sh", carry=["target/gpu-lease"], timeout_s=480)
#   CI:    benches/gpu/lease.sh --standin      # build, then every step the stand-in driver can run
#
# Steps, in order of information per second (each command under its own limit, all under one
# deadline; after LEASE_MAX_TIMEOUTS timeouts the rest is skipped):
#   0 machine     nvidia-smi -q, driver and CUDA versions, CUDA_* variables, ulimit -l, /dev/shm
#   1 probes      the driver's semantics (lease/driver_probes.c): waits released by later work,
#                 which calls block behind a pageable copy, lazy loading, latencies, two
#                 one-launch kernels waiting for each other on streams of one context
#   2 smoke       one device all-reduce on 1 rank, 2 thread ranks and 2 processes, read back
#                 with a pageable copy straight after the call
#   3 tests       tests/device_{collectives,ipc,streams}.rs, one test per process
#   4 kernels     the reduction kernels against a device-to-device copy, 16 MiB .. 1 GiB
#   5 sweep       all-reduce 8 B .. 256 MiB on 2 ranks as threads, as processes, and as
#                 processes on cuMemAlloc buffers; 8 B .. 64 KiB as one kernel per call and by
#                 the stream path (TOPOCCL_DEVICE_LL=2 / 1) on both; every result checked
#   6 nccl-tests  all_reduce_perf -c 1 on 2 processes on ours; ours and NVIDIA's NCCL at 1 rank
#   7 ddp         PyTorch DDP on the nccl backend with ours preloaded, float(loss) every step
#
# Options: --standin (the stand-in driver; builds first unless --prebuilt), --build-only,
# --prebuilt, --steps LIST (e.g. 4,5,6: a rerun of some steps).
# Environment: LEASE_S (deadline, 420 s; 900 with --standin), LEASE_MAX_TIMEOUTS (2),
# LEASE_STEPS (as --steps), LEASE_TEST_MATCH (step 3 runs only the tests whose names match
# this extended regex; --standin: one a file), SWEEP_MAX_ITERS (timed calls a size), OUT (the folder that comes back; default target/gpu-lease-out),
# LEASE_WORK (where the bundle is unpacked; default target/gpu-lease-run), limits in seconds:
# T_MACHINE 20, T_PROBES 60, T_SMOKE 15, T_TEST 20, T_TESTS 180, T_KERNELS 60, T_SWEEP 60,
# T_NCCL 60, T_DDP 60. Building: NCCL_TESTS_SRC (default target/nccl-tests-v2.16.9),
# CUDA_HOME and MPI_HOME (default target/gpu-tools/..., from benches/gpu/fetch-build-tools.sh).
# What comes back and how to read it: benches/gpu/README.md.
set -uo pipefail
SELF=$(readlink -f "$0")
HERE=$(dirname "$SELF")
cd "$HERE/../.."
REPO=$PWD

usage() { awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$SELF"; }

# --ranks NP CMD...: NP processes of CMD with RANK/WORLD_SIZE/MASTER_* set; rank 0's output is
# this one's, rank r's goes to $RANKS_LOG.rank<r> (shown here on failure); the first failure
# is the exit status, and the other ranks get 5 s before they are killed.
if [ "${1:-}" = --ranks ]; then
    np=$2
    shift 2
    port=$((10000 + RANDOM % 20000))
    pids=()
    for r in $(seq 0 $((np - 1))); do
        if [ "$r" = 0 ]; then
            RANK=$r LOCAL_RANK=$r WORLD_SIZE=$np MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$@" &
        else
            RANK=$r LOCAL_RANK=$r WORLD_SIZE=$np MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$@" >"$RANKS_LOG.rank$r" 2>&1 &
        fi
        pids+=($!)
    done
    trap 'kill "${pids[@]}" 2>/dev/null' EXIT TERM
    rc=0
    while :; do
        left=0
        for i in "${!pids[@]}"; do
            p=${pids[$i]}
            [ -n "$p" ] || continue
            if kill -0 "$p" 2>/dev/null; then left=$((left + 1)); continue; fi
            wait "$p"
            s=$?
            pids[i]=""
            if [ "$s" != 0 ] && [ "$rc" = 0 ]; then
                rc=$s
                echo "rank $i exited with status $s" >&2
                (sleep 5 && kill "${pids[@]}" 2>/dev/null) &
            fi
        done
        [ "$left" = 0 ] && break
        sleep 0.05
    done
    for r in $(seq 1 $((np - 1))); do
        if [ "$rc" != 0 ]; then sed "s/^/[rank $r] /" "$RANKS_LOG.rank$r" >&2; fi
    done
    exit "$rc"
fi

MODE=gpu BUILD=0 PREBUILT=0
LEASE_STEPS=${LEASE_STEPS:-}
while [ $# -gt 0 ]; do
    case "$1" in
        --standin) MODE=standin ;;
        --build-only) BUILD=1 ;;
        --prebuilt) PREBUILT=1 ;;
        --steps) LEASE_STEPS=${2:?--steps needs a list such as 4,5,6}; shift ;;
        --steps=*) LEASE_STEPS=${1#--steps=} ;;
        -h | --help) usage; exit 0 ;;
        *) echo "lease.sh: unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
    shift
done

CARRY=target/gpu-lease             # what travels: bundle.tar.gz and MANIFEST.txt
STAGE=target/gpu-lease-stage       # what the bundle is packed from (stays here)
BUNDLE=$CARRY/bundle.tar.gz

# shellcheck source=benches/gpu/lease/build.sh
source "$HERE/lease/build.sh"
if [ "$BUILD" = 1 ] || { [ "$MODE" = standin ] && [ "$PREBUILT" = 0 ]; }; then
    build_bundle || exit 1
    [ "$BUILD" = 1 ] && exit 0
fi

# ---------------------------------------------------------------------------------------------
# The run: unpack the bundle, then the steps.
[ -f "$BUNDLE" ] || {
    echo "lease.sh: no $BUNDLE: build it where cargo is (benches/gpu/lease.sh --build-only) and carry [\"$CARRY\"]" >&2
    exit 1
}
if [ "$MODE" = standin ]; then : "${LEASE_S:=900}"; else : "${LEASE_S:=420}"; fi
: "${LEASE_MAX_TIMEOUTS:=2}"
OUT=${OUT:-$REPO/target/gpu-lease-out}
WORK=${LEASE_WORK:-$REPO/target/gpu-lease-run}
RUN=$WORK/run
case "$OUT" in /*) ;; *) OUT=$REPO/$OUT ;; esac
rm -rf "$WORK"
mkdir -p "$WORK" "$OUT"
tar -C "$WORK" -xzf "$BUNDLE" || { echo "lease.sh: $BUNDLE does not unpack" >&2; exit 1; }
B=$WORK/bundle

# shellcheck source=benches/gpu/lease/harness.sh
source "$HERE/lease/harness.sh"
harness_init

if [ "$MODE" = standin ]; then
    mkdir -p "$B/cuda-standin"
    ln -sfn ../libcuda_standin.so "$B/cuda-standin/libcuda.so.1"
    ln -sfn ../libcuda_standin.so "$B/cuda-standin/libcuda.so"
    export LD_LIBRARY_PATH=$B/cuda-standin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export TOPOCCL_STANDIN_DELAY_US=${TOPOCCL_STANDIN_DELAY_US:-20}
    DRIVER="stand-in driver (standins/cuda, TOPOCCL_STANDIN_DELAY_US=$TOPOCCL_STANDIN_DELAY_US): a CPU emulation, its times say NOTHING about a GPU"
    TEST_ENV=()
    : "${T_TEST:=90}" "${T_TESTS:=400}" "${T_SMOKE:=30}"
    KERNEL_SIZES=(--min 1M --max 4M --factor 4 --target-ms 10)
    SWEEP_SIZES=(8 1M 8)
    # CI runs every device test three times already (.ci/run): here one or two a file show
    # that the harness lists, runs and reads them; a stand-in call costs milliseconds, so the
    # sweep times a few calls a size.
    : "${LEASE_TEST_MATCH=^(driver_calls_per_call_on_two_threads|all_reduce_of_device_buffers_on_two_threads|eight_processes_over_cuda_ipc|the_stream_waits_for_the_call_before_its_later_work)$}"
    export SWEEP_MAX_ITERS=${SWEEP_MAX_ITERS:-20}
else
    DRIVER="system CUDA driver"
    TEST_ENV=(TOPOCCL_TEST_DRIVER=real)
    KERNEL_SIZES=(--min 16M --max 1G --factor 4 --target-ms 100)
    SWEEP_SIZES=(8 256M 4)
fi
: "${T_MACHINE:=20}" "${T_PROBES:=60}" "${T_SMOKE:=15}" "${T_TEST:=20}" "${T_TESTS:=180}"
: "${T_KERNELS:=60}" "${T_SWEEP:=60}" "${T_NCCL:=60}" "${T_DDP:=60}"
PYTHON=${PYTHON:-python3}
CLIENTS=$B/clients
HEADER="topoccl lease ($MODE: $DRIVER) of $(sed -n 's/^built from: //p' "$B/MANIFEST.txt" | head -n 1), started $(date -u '+%Y-%m-%d %H:%M:%S UTC'), deadline ${LEASE_S}s"
write_table
echo "$HEADER"

# shellcheck source=benches/gpu/lease/steps.sh
source "$HERE/lease/steps.sh"
step_machine
step_probes
step_smoke
step_tests
step_kernels
step_sweep
step_nccl_tests
step_ddp
summary
