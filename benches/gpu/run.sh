#!/usr/bin/env bash
# topoccl's GPU data path on one machine: (a) the device tests (tests/device_collectives.rs;
# (a2) tests/device_ipc.rs, device data GPU to GPU by CUDA IPC),
# (b) the device reduction kernel against a device-to-device copy (examples/device_kernels.rs),
# (c) the all-reduce sweep on device buffers, 2 and 4 ranks sharing GPU 0, and (c2) on 2 ranks
# with cuMemAlloc buffers (received slices may land in place over CUDA IPC)
# (examples/device_sweep.rs). Readable tables, a summary, exit status 1 if anything failed;
# every step runs under `timeout`, so nothing hangs.
#
#   benches/gpu/run.sh                 # build (release), then run on the system's CUDA driver
#   benches/gpu/run.sh --standin       # the same on the stand-in driver (standins/cuda), small
#                                      # sizes: checks that everything runs; its numbers are
#                                      # a CPU emulation's and say NOTHING about speed
#   benches/gpu/run.sh --prebuilt      # run what an earlier build staged, without cargo
#   benches/gpu/run.sh --max 64M       # largest size of (b) and (c) (K/M/G suffixes)
#
# On a lent GPU machine (the `run` device tool: no network, probably no Rust toolchain; only
# the working tree plus up to 8 carried ignored paths, 64 MiB in all, reach it):
#   1. here:  benches/gpu/run.sh --build-only
#             (builds, stages stripped binaries in target/gpu-bench/, prints the carry list)
#   2. there: run(command="benches/gpu/run.sh --prebuilt", carry=["target/gpu-bench"])
#      Logs go to target/gpu-bench-logs/, packed into $OUT/gpu-bench-logs.tgz at the end when
#      OUT is set (the device tool brings that folder back, at most 8 files). Time limits: T_TESTS, T_IPC, T_KERNELS, T_SWEEP (seconds; defaults
#      keep the whole run under the device tool's 10 minutes per command).
#
# Environment: T_TESTS / T_IPC / T_KERNELS / T_SWEEP (time limits), NP_LIST (default "2 4"),
# SWEEP_MIN (8), SWEEP_FACTOR (4), KERNELS_ARGS (extra arguments for device_kernels).
set -uo pipefail
cd "$(dirname "$0")/../.."

usage() { awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; }
STANDIN=0 PREBUILT=0 BUILD_ONLY=0 MAX=""
while [ $# -gt 0 ]; do
    case "$1" in
        --standin) STANDIN=1 ;;
        --prebuilt) PREBUILT=1 ;;
        --build-only) BUILD_ONLY=1 ;;
        --max) MAX=${2:?--max needs a size}; shift ;;
        --max=*) MAX=${1#--max=} ;;
        -h | --help) usage; exit 0 ;;
        *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
    shift
done
if [ "$PREBUILT" = 1 ] && [ "$BUILD_ONLY" = 1 ]; then
    echo "--prebuilt and --build-only exclude each other" >&2
    exit 2
fi

# Sizes in bytes from "64M", "1G", "512K", "4096".
bytes() {
    local v=${1%iB} s=1
    v=${v%B}
    case "$v" in
        *[Kk]) s=1024; v=${v%?} ;;
        *[Mm]) s=$((1 << 20)); v=${v%?} ;;
        *[Gg]) s=$((1 << 30)); v=${v%?} ;;
    esac
    case "$v" in '' | *[!0-9]*) echo "not a size: $1" >&2; exit 2 ;; esac
    echo $((v * s))
}

if [ "$STANDIN" = 1 ]; then
    KMAX=$(bytes "${MAX:-16M}")
    SMAX=$(bytes "${MAX:-4M}")
    KTARGET_MS=10
    : "${T_TESTS:=120}" "${T_IPC:=120}" "${T_KERNELS:=60}" "${T_SWEEP:=60}"
    export TOPOCCL_STANDIN_DELAY_US=${TOPOCCL_STANDIN_DELAY_US:-20}
else
    KMAX=$(bytes "${MAX:-1G}")
    SMAX=$(bytes "${MAX:-256M}")
    KTARGET_MS=100
    : "${T_TESTS:=150}" "${T_IPC:=60}" "${T_KERNELS:=100}" "${T_SWEEP:=90}"
fi
KMIN=$((1 << 20))
[ "$KMAX" -lt "$KMIN" ] && KMIN=$KMAX
SMIN=${SWEEP_MIN:-8}
SFACTOR=${SWEEP_FACTOR:-4}
NP_LIST=${NP_LIST:-2 4}

# What the GPU machine needs, in one carried folder laid out as a cargo profile directory
# (the test binary finds the stand-in from its own path: <dir>/deps/<test> → <dir>/cuda-standin).
BIN=target/gpu-bench
LOGS=${GPU_BENCH_LOGS:-target/gpu-bench-logs}
rm -rf "$LOGS"
mkdir -p "$LOGS"

if [ "$PREBUILT" = 0 ]; then
    echo "== building (release) ==" >&2
    cargo build --release --example device_kernels --example device_sweep >&2 || exit 1
    cargo test --release --no-run --test device_collectives --test device_ipc >&2 || exit 1
    if [ "$STANDIN" = 1 ]; then
        cargo build --release -p topoccl-standin-cuda >&2 || exit 1
    fi
    TARGET=${CARGO_TARGET_DIR:-target}/release
    newest_test() { # newest_test NAME: the newest NAME-<hash> executable (cargo keeps older ones)
        local f
        f=$(ls -t "$TARGET"/deps/"$1"-* 2>/dev/null | grep -v '\.d$' | while read -r f; do
            [ -x "$f" ] && echo "$f" && break
        done)
        [ -n "$f" ] || { echo "no $1 test binary under $TARGET/deps" >&2; return 1; }
        echo "$f"
    }
    TEST_EXE=$(newest_test device_collectives) || exit 1
    IPC_EXE=$(newest_test device_ipc) || exit 1
    rm -rf "$BIN"
    mkdir -p "$BIN/deps"
    stage() { # stage SRC DST: copy without debug information (the carry limit is 64 MiB)
        cp "$1" "$2" && { strip --strip-debug "$2" 2>/dev/null || true; }
    }
    stage "$TARGET/examples/device_kernels" "$BIN/device_kernels" || exit 1
    stage "$TARGET/examples/device_sweep" "$BIN/device_sweep" || exit 1
    stage "$TEST_EXE" "$BIN/deps/device_collectives" || exit 1
    stage "$IPC_EXE" "$BIN/deps/device_ipc" || exit 1
    if [ "$STANDIN" = 1 ]; then
        stage "$TARGET/libcuda_standin.so" "$BIN/libcuda_standin.so" || exit 1
    fi
    total=$(du -sbL "$BIN" | cut -f1)
    echo "== staged in $BIN ($((total / 1024)) KiB; from $TEST_EXE) ==" >&2
    ls -l "$BIN" "$BIN/deps" | sed 's/^/   /' >&2
    echo "carry for the GPU machine: [\"$BIN\"]   (then: benches/gpu/run.sh --prebuilt$([ "$STANDIN" = 1 ] && echo ' --standin'))"
    [ "$total" -gt $((64 << 20)) ] && echo "WARNING: $BIN is over the 64 MiB a carry may hold" >&2
fi
[ "$BUILD_ONLY" = 1 ] && exit 0

for f in "$BIN/device_kernels" "$BIN/device_sweep" "$BIN/deps/device_collectives" "$BIN/deps/device_ipc"; do
    [ -x "$f" ] || { echo "missing $f: build here first (benches/gpu/run.sh --build-only) and carry $BIN" >&2; exit 1; }
done
if [ "$STANDIN" = 1 ]; then
    [ -f "$BIN/libcuda_standin.so" ] || { echo "missing $BIN/libcuda_standin.so: build with --standin" >&2; exit 1; }
    # Links do not always survive a carry: lay them out again.
    mkdir -p "$BIN/cuda-standin"
    ln -sfn ../libcuda_standin.so "$BIN/cuda-standin/libcuda.so.1"
    ln -sfn ../libcuda_standin.so "$BIN/cuda-standin/libcuda.so"
    DRIVER_ENV=(env "LD_LIBRARY_PATH=$PWD/$BIN/cuda-standin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
    TEST_ENV=(env) # the test binary re-runs each test in a child under the stand-in itself
    TEST_THREADS=2 # each test runs in processes of its own
    banner="STAND-IN DRIVER (standins/cuda, TOPOCCL_STANDIN_DELAY_US=$TOPOCCL_STANDIN_DELAY_US): a CPU emulation; these numbers say NOTHING about GPU speed"
else
    DRIVER_ENV=(env)
    TEST_ENV=(env TOPOCCL_TEST_DRIVER=real)
    TEST_THREADS=1 # the bodies run in this process, on one context: one at a time
    banner="system CUDA driver"
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | sed 's/^/GPU /'
    else
        echo "(no nvidia-smi; the driver is whatever libcuda.so.1 the loader finds)"
    fi
fi
echo "driver: $banner"

# stacks_at SECONDS NAME PATTERN: SECONDS later, every thread's stack of the first two
# processes whose command line matches PATTERN, into $LOGS/stacks.NAME.txt: what a step that is
# about to time out was waiting for (a GPU machine has cuda-gdb, which attaches to host
# programs; without cuda-gdb or gdb nothing is written). Run in the background; killed when
# the step ends in time.
stacks_at() {
    local after=$1 name=$2 pattern=$3 dbg pid
    dbg=$(command -v cuda-gdb || command -v gdb) || return 0
    sleep "$after"
    for pid in $(pgrep -f "$pattern" | head -n 2); do
        echo "=== pid $pid: $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)"
        timeout -k 5 40 "$dbg" -p "$pid" -batch -ex 'info threads' -ex 'thread apply all bt 30' 2>&1 |
            grep -vE '^\[New LWP|^warning:'
    done >"$LOGS/stacks.$name.txt" 2>&1
    echo "   (stacks of the step's processes, ${after}s in: $LOGS/stacks.$name.txt)"
}
# watch LIMIT NAME PATTERN: starts stacks_at shortly before LIMIT; its pid in WATCHER.
watch() {
    local at=$(($1 > 90 ? $1 - 50 : $1 / 2))
    stacks_at "$at" "$2" "$3" &
    WATCHER=$!
}
unwatch() { kill "$WATCHER" 2>/dev/null; wait "$WATCHER" 2>/dev/null; }

declare -a SUMMARY
FAILED=0
record() { # record NAME STATUS SECONDS [NOTE]
    local mark=PASS
    if [ "$2" != 0 ]; then
        mark="FAIL (exit $2$([ "$2" = 124 ] && echo ', timed out'))"
        FAILED=1
    fi
    SUMMARY+=("$(printf '%-34s %-26s %5ss %s' "$1" "$mark" "$3" "${4:-}")")
}

# run_tests STEP NAME LIMIT SUMMARY_LINES: a staged test binary, its lines matching
# SUMMARY_LINES shown, its last lines on failure, and its result recorded.
run_tests() {
    local step=$1 name=$2 limit=$3 lines=$4 log="$LOGS/$2.log" t0=$SECONDS rc
    echo
    echo "== ($step) tests/$name.rs on the $([ "$STANDIN" = 1 ] && echo stand-in || echo real) driver, limit ${limit}s =="
    watch "$limit" "$name" "$BIN/deps/$name"
    "${TEST_ENV[@]}" timeout -k 10 "$limit" "$BIN/deps/$name" --test-threads=$TEST_THREADS >"$log" 2>&1
    rc=$?
    unwatch
    grep -E "$lines" "$log" | sed 's/^/   /'
    [ "$rc" = 0 ] || { echo "   --- last lines of $log ---"; tail -n 40 "$log" | sed 's/^/   /'; }
    record "($step) $name" "$rc" $((SECONDS - t0)) "$(grep -o 'test result: [a-zA-Z]*\. [0-9]* passed; [0-9]* failed' "$log" | tail -1)"
}

# (a) The device tests; (a2) the CUDA IPC tests (ranks that know their GPU at init move device
# data GPU to GPU).
run_tests a device_collectives "$T_TESTS" '^test |ranks over|test result'
run_tests a2 device_ipc "$T_IPC" '^test |processes over|failed after|test result'

# (b) Reduction kernel against the copy engine.
echo
echo "== (b) device_kernels: reduce vs device-to-device copy, 1 MiB .. $((KMAX >> 20)) MiB, limit ${T_KERNELS}s =="
echo "   [$banner]"
t0=$SECONDS
"${DRIVER_ENV[@]}" timeout -k 10 "$T_KERNELS" "$BIN/device_kernels" --min "$KMIN" --max "$KMAX" \
    --target-ms "$KTARGET_MS" ${KERNELS_ARGS:-} >"$LOGS/kernels.log" 2>&1
rc=$?
sed 's/^/   /' "$LOGS/kernels.log"
record "(b) device_kernels" "$rc" $((SECONDS - t0))

# (c) All-reduce sweep on device buffers, ranks sharing GPU 0.
port=$((20000 + RANDOM % 20000))
sweep() { # sweep NP [ALLOC]: one process per rank; rank 0's lines in $LOGS/sweep.NP[.ALLOC].txt
    local np=$1 alloc=${2:-} pids=() rc=0 r name=sweep.$1${2:+.$2}
    port=$((port + 1))
    for r in $(seq 0 $((np - 1))); do
        RANK=$r WORLD_SIZE=$np MASTER_ADDR=127.0.0.1 MASTER_PORT=$port SWEEP_ALLOC=$alloc \
            "${DRIVER_ENV[@]}" timeout -k 10 "$T_SWEEP" "$BIN/device_sweep" "$SMIN" "$SMAX" "$SFACTOR" \
            >"$LOGS/$name.$r" 2>&1 &
        pids+=($!)
    done
    watch "$T_SWEEP" "$name" "$BIN/device_sweep"
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    unwatch
    grep -E '^[0-9]+ ' "$LOGS/$name.0" >"$LOGS/$name.txt"
    if [ "$rc" != 0 ]; then
        for r in $(seq 0 $((np - 1))); do
            grep -vE '^[0-9]+ ' "$LOGS/$name.$r" | head -n 4 | sed "s/^/   rank $r: /"
        done
    fi
    return "$rc"
}
echo
echo "== (c) device_sweep: all-reduce float32 sum of device buffers, $SMIN B .. $SMAX B x$SFACTOR, ranks ($NP_LIST) sharing GPU 0, limit ${T_SWEEP}s each =="
echo "   [$banner]"
for np in $NP_LIST; do
    t0=$SECONDS
    sweep "$np"
    record "(c) device_sweep, $np ranks" "$?" $((SECONDS - t0)) "$(wc -l <"$LOGS/sweep.$np.txt") sizes"
done
# Side by side: time per call and bus bandwidth (NCCL's busbw: algbw x 2(n-1)/n) per rank count.
awk -v nps="$NP_LIST" -v logs="$LOGS" '
    BEGIN {
        n = split(nps, np, " ")
        for (i = 1; i <= n; i++) {
            f = logs "/sweep." np[i] ".txt"
            while ((getline line < f) > 0) {
                split(line, v, " ")
                if (!(v[1] in seen)) { seen[v[1]] = 1; sizes[++m] = v[1] + 0 }
                us[i, v[1]] = v[2]; bw[i, v[1]] = v[4]
            }
        }
        # sizes in increasing order
        for (a = 1; a <= m; a++) for (b = a + 1; b <= m; b++) if (sizes[b] < sizes[a]) { t = sizes[a]; sizes[a] = sizes[b]; sizes[b] = t }
        printf "   %12s", "bytes"
        for (i = 1; i <= n; i++) printf " | %2s ranks: %10s %9s", np[i], "us/call", "busbw GB/s"
        printf "\n"
        for (k = 1; k <= m; k++) {
            s = sizes[k]
            printf "   %12d", s
            for (i = 1; i <= n; i++) {
                if ((i, s) in us) printf " | %9s %10.2f %10.3f", "", us[i, s], bw[i, s]
                else printf " | %9s %10s %10s", "", "-", "-"
            }
            printf "\n"
        }
    }'

# (c2) The same on 2 ranks with cuMemAlloc buffers (cudaMalloc's kind, what nccl-tests and PyTorch
# use): CUDA IPC may write received slices in place. Rank 0's table, then how messages went.
echo
echo "== (c2) device_sweep, 2 ranks, cuMemAlloc buffers (SWEEP_ALLOC=cumem), limit ${T_SWEEP}s =="
echo "   [$banner]"
t0=$SECONDS
sweep 2 cumem
rc=$?
awk '{ printf "   %12d %10.2f us %10.3f busbw GB/s\n", $1, $2, $4 }' "$LOGS/sweep.2.cumem.txt"
grep -h 'in place' "$LOGS"/sweep.2.cumem.[0-9]* | sed 's/^/   /'
record "(c2) device_sweep, 2, cuMemAlloc" "$rc" $((SECONDS - t0)) "$(wc -l <"$LOGS/sweep.2.cumem.txt") sizes"

echo
echo "== summary ($banner) =="
for line in "${SUMMARY[@]}"; do echo "   $line"; done
echo "   logs: $LOGS/"
if [ -n "${OUT:-}" ]; then
    tar -C "$(dirname "$LOGS")" -czf "$OUT/gpu-bench-logs.tgz" "$(basename "$LOGS")" &&
        echo "   packed: \$OUT/gpu-bench-logs.tgz"
fi
if [ "$FAILED" != 0 ]; then
    echo "FAILED"
    exit 1
fi
echo "all passed"
