#!/usr/bin/env bash
# The cluster-scale table (issue 26): % of the bound for all-reduce, all-gather and
# reduce-scatter at 64 MiB and 1 GiB, every algorithm and the tuner's choice, predicted by
# `collbench --simulate` on single machines and clusters, with the time each took to build
# (synthesis) and the tuner's cold decision time (disk cache off).
#
# usage: benches/cluster/run.sh [COLLBENCH] [TOPOLOGY...]
#   COLLBENCH   the binary to measure (default: target/release/collbench, built here); pass an
#               older build to get the "before" column
#   TIMEOUT     seconds allowed per (topology, collective, algorithm) (default 600)
#   OUT         where the JSON and the table go (default target/cluster)
#   ALGOS       the algorithms to run (default: every one, then auto)
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-}
shift || true
if [ -z "$bin" ]; then
  cargo build --release --bin collbench >/dev/null
  bin=target/release/collbench
fi
topos=("$@")
[ ${#topos[@]} -eq 0 ] && topos=(dgx1 dgx-a100 dgx-h100 cluster:2x8 cluster:8x8 cluster-64x8 cluster:512x8)
out=${OUT:-target/cluster}
timeout_s=${TIMEOUT:-600}
mkdir -p "$out"
export TOPOCCL_CACHE_DIR=off
for topo in "${topos[@]}"; do
  for coll in all_reduce all_gather reduce_scatter; do
    for algo in ${ALGOS:-ring tree rhd rd hier hier-rhd blink forest tacos auto}; do
      file="$out/$(echo "$topo" | tr -c 'a-zA-Z0-9\n' '_')-$coll-$algo.json"
      [ -s "$file" ] && continue
      echo "== $topo $coll $algo" >&2
      start=$(date +%s.%N)
      if timeout "$timeout_s" "$bin" --simulate --topology "$topo" --collective "$coll" --algo "$algo" \
        -b 64M -e 1G -f 16 --json >"$file.part" 2>"$file.err"; then
        mv "$file.part" "$file"
      else
        rc=$?
        if grep -q "not implemented\|unsupported\|does not build\|builds all-reduce only" "$file.err"; then
          echo '{"unsupported": true}' >"$file"
        elif [ $rc -eq 124 ]; then
          echo "{\"timeout_s\": $timeout_s}" >"$file"
        else
          echo "{\"error\": $(python3 -c 'import json,sys; print(json.dumps(open(sys.argv[1]).read()[-300:]))' "$file.err")}" >"$file"
        fi
        rm -f "$file.part"
      fi
      echo "   $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s" >&2
    done
  done
done
python3 benches/cluster/table.py "$out" "${topos[@]}" | tee "$out/table.md"
