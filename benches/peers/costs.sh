#!/usr/bin/env bash
# Where a small all-reduce's time goes on this machine, layer by layer, each measured on its own
# and best of ROUNDS (default 5) runs taken in turns (the VM drifts):
#
#   floor      a word handed between two processes through shared memory (no library)
#   message    one 8-byte message one way through topoccl's send/recv calls (shm)
#   call       one 8-byte all-reduce on 1 rank: the library's fixed cost (checks, plan, the
#              executor's turn, the engine, the ledger), no bytes travel
#   all-reduce 2 ranks (NP), 8 bytes, shm: what a user times
#   Open MPI   the same all-reduce (benches/peers/mpi_allreduce.c), shared memory
#
#   benches/peers/costs.sh            # NP=2; NP=4 for the all-reduce rows on 4 ranks
#
# Prints a table (µs) and, for the all-reduce, what the layers below account for.
set -euo pipefail
cd "$(dirname "$0")/../.."
NP=${NP:-2}
ROUNDS=${ROUNDS:-5}
BYTES=${BYTES:-8}
OUT=${OUT:-target/costs}
mkdir -p "$OUT"
command -v mpicc >/dev/null || { echo "installing Open MPI..." >&2; apt-get install -y openmpi-bin libopenmpi-dev >/dev/null; }
cargo build --release --example call_overhead --example transport_cpu --example allreduce_sweep >&2
cc -O2 -o "$OUT/pingpong" benches/peers/cacheline_pingpong.c
mpicc -O2 -o "$OUT/mpi_allreduce" benches/peers/mpi_allreduce.c

port=$((20000 + RANDOM % 20000))
launch() { # launch N PROGRAM... : one process per rank, torchrun-style variables; rank 0's stdout
    local n=$1; shift
    port=$((port + 1))
    local pids=()
    for r in $(seq 0 $((n - 1))); do
        RANK=$r WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port TOPOCCL_TRANSPORT=shm "$@" >"$OUT/launch.$r" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    cat "$OUT/launch.0"
}

: >"$OUT/samples"
for round in $(seq 1 "$ROUNDS"); do
    echo "round $round of $ROUNDS..." >&2
    "$OUT/pingpong" 2000000 | awk '{print "floor", $2}' >>"$OUT/samples"
    launch 2 env SIZES="$BYTES" MESSAGES=200000 target/release/examples/transport_cpu |
        awk -v b="$BYTES" '$1 == b {print "message", $3}' >>"$OUT/samples"
    COUNT=$(((BYTES + 3) / 4)) CALLS=1000000 target/release/examples/call_overhead | awk '{print "call", $3}' >>"$OUT/samples"
    launch "$NP" target/release/examples/allreduce_sweep "$BYTES" "$BYTES" 4 | awk -v b="$BYTES" '$1 == b {print "allreduce", $2}' >>"$OUT/samples"
    mpirun --allow-run-as-root --oversubscribe -np "$NP" "$OUT/mpi_allreduce" "$BYTES" "$BYTES" 4 |
        awk -v b="$BYTES" '$1 == b {print "ompi", $2}' >>"$OUT/samples"
done

python3 - "$OUT/samples" "$NP" "$ROUNDS" "$BYTES" <<'PY'
import sys
path, np_, rounds, size = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
best = {}
for line in open(path):
    k, v = line.split()
    best[k] = min(best.get(k, float("inf")), float(v))
rows = [
    ("floor", "a word between 2 processes, one way (no library)", best.get("floor", float("nan")) / 1000),
    ("message", f"{size} B one way through send/recv (shm, 2 processes)", best.get("message")),
    ("call", f"{size} B all-reduce on 1 rank (fixed cost, no bytes travel)", best.get("call")),
    ("all-reduce", f"{size} B all-reduce, {np_} ranks, shm", best.get("allreduce")),
    ("Open MPI", f"{size} B MPI_Allreduce, {np_} ranks, shm", best.get("ompi")),
]
print(f"\n# where a {size}-byte all-reduce's time goes (µs, best of {rounds} rounds)")
print(f"| layer | what | µs |\n|---|---|---|")
for k, what, v in rows:
    print(f"| {k} | {what} | {v:.3f} |" if v is not None else f"| {k} | {what} | - |")
f, m, c, a, o = (r[2] or float("nan") for r in rows)
print(f"\n# the message beyond the floor (framing, the ring, send/recv's calls): {m - f:.3f} µs")
print(f"# all-reduce minus the call's fixed cost: {a - c:.3f} µs (one message each way, crossing: ~ one message)")
print(f"# all-reduce / Open MPI: {a / o:.2f}x the time")
PY
