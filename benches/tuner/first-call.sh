#!/usr/bin/env bash
# The tuner's first calls (issue 45): on each library machine, the all-reduce's first call of
# every size with the quick choice (cold, and made ahead by the background thread a
# communicator starts) against waiting for the full decision, as before; the goal is a first
# call within 2x its steady time plus 1 ms. Simulated: deciding times are measured on this
# machine, call times are the simulator's. Cold tuner (no disk cache).
#   benches/tuner/first-call.sh [machines...]   (default: dgx1 dgx-a100 dgx-h100 cluster-64x8)
set -euo pipefail
cd "$(dirname "$0")/../.."
machines=("$@")
[ ${#machines[@]} -gt 0 ] || machines=(dgx1 dgx-a100 dgx-h100 cluster-64x8)
cargo build --release --quiet --bin collbench
for m in "${machines[@]}"; do
    TOPOCCL_CACHE_DIR=off target/release/collbench --simulate --first-call --topology "$m" -b 1K -e 1G -f 4
    echo
done
