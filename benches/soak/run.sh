#!/usr/bin/env bash
# Soak: 10 000 collectives of random kinds, sizes (up to 1 Mi elements), datatypes (all 12),
# reductions and roots on 4 ranks, every result checked, over shared memory and over TCP.
# Prints each rank's resident memory after the first call and at the end.
#   benches/soak/run.sh [calls]        (SOAK_CALLS, default 10000)
set -euo pipefail
cd "$(dirname "$0")/../.."
calls=${1:-10000}
cargo build --release --example soak >/dev/null 2>&1 || cargo build --release --example soak
exe=target/release/examples/soak
for transport in shm tcp; do
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null || echo $((20000 + RANDOM % 20000)))
    echo "== $transport: $calls calls on 4 ranks"
    pids=()
    for r in 0 1 2 3; do
        RANK=$r WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port SOAK_CALLS=$calls \
            TOPOCCL_TRANSPORT=$transport TOPOCCL_TIMEOUT=60 "$exe" &
        pids+=($!)
    done
    status=0
    for p in "${pids[@]}"; do wait "$p" || status=1; done
    [ $status -eq 0 ] || { echo "soak over $transport FAILED"; exit 1; }
done
