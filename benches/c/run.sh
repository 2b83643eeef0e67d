#!/usr/bin/env bash
# The C boundary's cost: all-reduce through libnccl.so.2 (C) beside collbench (Rust API), same
# ranks, sizes, transport and algorithm choice, taking turns for ROUNDS rounds (this machine's
# speed drifts), best time per size kept.   usage: benches/c/run.sh [NRANKS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
n="${1:-2}"; rounds="${2:-3}"
sizes=(8 1024 65536 1048576 8388608)
prefix=target/nccl
ffi/install.sh "$prefix" >/dev/null
cargo build --release --bin collbench -q
cc -O2 -std=c11 -I"$prefix/include" benches/c/allreduce.c -o target/nccl/allreduce_c -L"$prefix/lib" -lnccl -Wl,-rpath,"$PWD/$prefix/lib"
declare -A c rust
for round in $(seq "$rounds"); do
  while read -r b us; do
    [[ -z "${c[$b]:-}" ]] || (( $(echo "$us < ${c[$b]}" | bc) )) && c[$b]=$us || true
  done < <(target/nccl/allreduce_c "$n" "${sizes[@]}")
  for b in "${sizes[@]}"; do
    us=$(target/release/collbench -n "$n" -b "$b" -e "$b" -c 0 -w 5 -N $(( b <= 65536 ? 2000 : b <= 1048576 ? 200 : 20 )) 2>/dev/null \
      | awk '!/^#/ && NF > 5 {print $6; exit}')
    [[ -z "${rust[$b]:-}" ]] || (( $(echo "$us < ${rust[$b]}" | bc) )) && rust[$b]=$us || true
  done
done
printf "%10s %12s %12s %8s\n" bytes "C ABI (us)" "Rust (us)" "C/Rust"
for b in "${sizes[@]}"; do
  printf "%10s %12s %12s %8.2f\n" "$b" "${c[$b]}" "${rust[$b]}" "$(echo "${c[$b]} / ${rust[$b]}" | bc -l)"
done
