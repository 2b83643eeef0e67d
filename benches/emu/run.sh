#!/usr/bin/env bash
# The emulated-topology table: every algorithm's all-reduce at 64 MiB, measured on a real
# shaped network (collbench --emulate, needs root) beside the simulator's prediction, on
#   - a fragmented DGX-1 allocation (5 of 8 GPUs: no NVLink ring),
#   - two nodes x four GPUs with one slow NIC per node,
#   - a 4x4 torus with one link at a quarter of the bandwidth,
#   - a uniform ring (the control: synthesis must not lose there).
# Writes one table per machine under $OUT (default target/emu) and prints them.
# About 23 minutes on the 2-core VM (each all-reduce of 64 MiB takes 1-20 s at these rates).
# usage: benches/emu/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-target/emu}
mkdir -p "$out"
cargo build --release --bin collbench >/dev/null
# machine | size | iterations | algorithms | scale (Mbit/s per GB/s; "-": fastest link at 400)
while read -r machine size iters algos scale; do
  file="$out/$(echo "$machine" | tr -c 'a-zA-Z0-9\n' '_').txt"
  echo "== $machine" >&2
  [ "$scale" = "-" ] && scale=
  target/release/collbench --emulate "$machine" ${scale:+--emulate-scale $scale} \
    -b "$size" -e "$size" -N "$iters" --algo "$algos" --compare-sim | tee "$file"
done <<'MACHINES'
dgx1[0,1,2,3,7]       64M 2 ring,tree,rhd,hier,blink,tacos,auto -
cluster-2x4-slow      64M 1 ring,hier,blink,tacos,auto          -
torus2d-4x4-slowlink  64M 1 ring,blink,tacos,auto               2
ring:4                64M 3 ring,blink,tacos,auto               -
MACHINES
