#!/usr/bin/env bash
# The tuner's first calls (issue 45): on each library machine, the all-reduce's first call of
# every size with the quick choice (cold, and made ahead by the background thread a
# communicator starts) against waiting for the full decision, as before; the goal is a first
# call within 2x its steady time plus 1 ms. Simulated: deciding times are measured on this
# machine, call times are the simulator's. Cold tuner (no disk cache).
# Then the same on local ranks over real connections (examples/first_call.rs, RANKS threads,
# host model): the first call of each size and the median of the next 20, deciding in full at
# the first call (as before), in the background (now), and with the algorithm forced (no
# decision at all: what a first call costs without the tuner).
#   benches/tuner/first-call.sh [machines...]   (default: dgx1 dgx-a100 dgx-h100 cluster-64x8)
set -euo pipefail
cd "$(dirname "$0")/../.."
machines=("$@")
[ ${#machines[@]} -gt 0 ] || machines=(dgx1 dgx-a100 dgx-h100 cluster-64x8)
cargo build --release --quiet --bin collbench --example first_call
for m in "${machines[@]}"; do
    TOPOCCL_CACHE_DIR=off target/release/collbench --simulate --first-call --topology "$m" -b 1K -e 1G -f 4
    echo
done
# The other collectives made ahead, on one machine.
for c in all_gather reduce_scatter; do
    TOPOCCL_CACHE_DIR=off target/release/collbench --simulate --first-call --topology dgx-a100 --collective $c -b 1K -e 1G -f 16
    echo
done
ranks=${RANKS:-4}
for mode in first-call background forced-ring; do
    echo "# local ranks: $ranks threads, all-reduce float32, $mode"
    case $mode in
        forced-ring) env=(TOPOCCL_ALGO=ring) ;;
        *) env=(TOPOCCL_TUNE=$mode) ;;
    esac
    env TOPOCCL_CACHE_DIR=off "${env[@]}" target/release/examples/first_call "$ranks" 20
    echo
done
