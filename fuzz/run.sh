#!/usr/bin/env bash
# Fuzzes what a peer or a user's file can feed topoccl (see fuzz/README.md).
#
#   fuzz/run.sh short          CI: every target a fixed number of runs from the seed corpus
#                              (about 2 minutes in all, after the build); fails on any crash.
#   fuzz/run.sh long [SECONDS] every target for SECONDS (default 60), keeping what it finds
#                              in fuzz/target/corpus/; a table of executions at the end.
#
# Installs what it needs when absent: a nightly toolchain (the sanitizer flags are unstable)
# and cargo-fuzz. Builds land in fuzz/target. A crash leaves its input in fuzz/artifacts/ and
# is printed in hex with the panic message.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
mode=${1:-short}
seconds=${2:-60}
case "$mode" in
short | long) ;;
*)
    echo "usage: fuzz/run.sh short | long [SECONDS]" >&2
    exit 2
    ;;
esac

# Target, runs in the short mode (about 20 s each on one core of a CI machine), and the largest
# single allocation that counts as absurd (MiB): inputs are a few KiB, so a peer's bytes never
# justify more; a topology or a schedule may legitimately describe something larger.
targets=(frame_header call_header bootstrap topology schedule_json shm_ring)
declare -A runs=([frame_header]=2500 [call_header]=300000 [bootstrap]=100000 [topology]=8000 [schedule_json]=80000 [shm_ring]=100000)
declare -A malloc_mb=([frame_header]=64 [call_header]=64 [bootstrap]=64 [topology]=512 [schedule_json]=512 [shm_ring]=64)

toolchain=nightly
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    if ! rustup toolchain install nightly --profile minimal; then
        # No nightly to be had: the stable compiler accepts the same flags when told to.
        echo "fuzz/run.sh: no nightly toolchain; using stable with RUSTC_BOOTSTRAP=1" >&2
        toolchain=stable
        export RUSTC_BOOTSTRAP=1
    fi
fi
if ! command -v cargo-fuzz >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

export CARGO_TARGET_DIR="$root/fuzz/target"
# 16 codegen units, not cargo-fuzz's 1: on CI's two cores the build takes half the time (about
# 4 minutes instead of 8.5), and the short run's fixed counts take about as long.
cargo "+$toolchain" fuzz build --fuzz-dir "$root/fuzz" --codegen-units 16
bin="$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release"

logs="$CARGO_TARGET_DIR/logs"
artifacts="$root/fuzz/artifacts"
mkdir -p "$logs" "$artifacts"
if [ "$mode" = short ]; then
    # A fresh corpus and a fixed seed: the short run is the same run every time (but for
    # timing: the bootstrap target goes through loopback sockets).
    scratch=$(mktemp -d "$CARGO_TARGET_DIR/short-corpus.XXXXXX")
    trap 'rm -rf "$scratch"' EXIT
else
    scratch="$CARGO_TARGET_DIR/corpus"
fi

failed=()
rows=()
for t in "${targets[@]}"; do
    mkdir -p "$scratch/$t" "$artifacts/$t"
    if [ "$mode" = short ]; then
        budget=("-runs=${runs[$t]}" -seed=1)
    else
        budget=("-max_total_time=$seconds")
    fi
    dict=()
    if [ -f "$root/fuzz/dict/$t.dict" ]; then
        dict=("-dict=$root/fuzz/dict/$t.dict")
    fi
    log="$logs/$t.log"
    started=$(date +%s)
    status=0
    # New inputs go to the first folder; the committed seeds are only read.
    "$bin/$t" "${budget[@]}" "${dict[@]}" -timeout=10 -rss_limit_mb=2048 "-malloc_limit_mb=${malloc_mb[$t]}" \
        -print_final_stats=1 "-artifact_prefix=$artifacts/$t/" "$scratch/$t" "$root/fuzz/corpus/$t" \
        >"$log" 2>&1 || status=$?
    took=$(($(date +%s) - started))
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    corpus=$(sed -n 's/^#[0-9]*[[:space:]]*DONE .* corp: \([0-9]*\)\/.*/\1/p' "$log" | tail -1)
    if [ -z "$execs" ]; then
        # A crash ends the run before the final statistics: the last status line counts.
        execs=$(sed -n 's/^#\([0-9]*\)[[:space:]].*/\1/p' "$log" | tail -1)
    fi
    result=ok
    if [ "$status" -ne 0 ]; then
        result="FAILED (exit $status)"
        failed+=("$t")
        echo "=== $t: $result after ${took}s; end of $log:"
        grep -v '^#[0-9]' "$log" | tail -40
        artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
        if [ -n "$artifact" ] && [ -f "$artifact" ]; then
            echo "=== the input ($artifact), in hex:"
            od -An -tx1 -v "$artifact" | head -64
        fi
    else
        echo "=== $t: ok, ${execs:-?} executions in ${took}s"
    fi
    rows+=("$(printf '%-14s %12s %9s %7s %6ss  %s' "$t" "${execs:-?}" "${rate:-?}" "${corpus:-?}" "$took" "$result")")
done

echo
printf '%-14s %12s %9s %7s %7s  %s\n' target executions exec/s corpus time result
printf '%s\n' "${rows[@]}"
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz/run.sh: crashes in ${failed[*]} (inputs under fuzz/artifacts/, logs under fuzz/target/logs/)" >&2
    exit 1
fi
