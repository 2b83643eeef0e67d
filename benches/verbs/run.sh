#!/usr/bin/env bash
# Host CPU per message of the RDMA verbs path against TCP, on this machine: two ranks given
# different host identities (TOPOCCL_HOSTID), once over TCP and once over verbs on the stand-in
# libibverbs (standins/ibverbs, its delays off), taking turns ROUNDS times (default 3), each
# pinging messages of each size back and forth (examples/transport_cpu.rs). The table has, per
# transport and size, the median over rounds of the wall time per message and of the CPU time
# per message of rank 0's calling thread (the transport's software path: what a rank's core
# pays) and of its whole process (for the stand-in, plus its emulated NIC's threads, which a
# real NIC does in hardware), and the ratios verbs / TCP of the thread's CPU.
#
# No speed of a NIC is measured here: the stand-in moves bytes over a Unix socket. A verbs
# connection busy-polls its completion queue while it waits (as a real one should, for the
# microseconds a NIC takes); the emulated NIC takes ~100 us a round trip, so the thread's CPU
# on the verbs path includes that spinning and bounds its software cost from above.
#
# A second table separates the work from the waiting (transports/examples/connection_cost.rs):
# one thread drives both ends of one connection, pinging each size back and forth, and times
# every call, counting `send` and the `progress`/`recv_with` calls that moved something as busy
# (for TCP that includes the kernel's socket work in those calls; for verbs, the stand-in's own
# post and poll, which a real NIC's doorbell and completion queue make cheaper) and the calls
# that found nothing as idle.
#
#   benches/verbs/run.sh
#   SIZES=8,65536 MESSAGES=5000 ROUNDS=5 benches/verbs/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3}
export SIZES=${SIZES:-8,4096,65536,1048576}
export MESSAGES=${MESSAGES:-20000}
OUT=${OUT:-target/verbs-bench}
mkdir -p "$OUT"

cargo build --release --example transport_cpu -p topoccl >&2
cargo build --release --example connection_cost -p topoccl-transports >&2
cargo build --release -p topoccl-standin-ibverbs >&2
EXE=target/release/examples/transport_cpu
LIB=$PWD/target/release/libibverbs_standin.so

run() { # transport round
    local port=$((29700 + RANDOM % 200))
    local log="$OUT/$1-$2"
    for r in 0 1; do
        RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port TOPOCCL_HOSTID="host$r" \
            TOPOCCL_TRANSPORT=$1 TOPOCCL_IBVERBS_LIB="$LIB" TOPOCCL_STANDIN_IB_DELAY_US=0 \
            "$EXE" > "$log.$r" 2>&1 &
    done
    wait
    grep -q "^transport \"$1\"" "$log.0" || { echo "round $2: rank 0 did not run over $1:" >&2; cat "$log.0" >&2; exit 1; }
}

for round in $(seq 1 "$ROUNDS"); do
    echo "round $round of $ROUNDS" >&2
    run tcp "$round"
    run ib "$round"
    for t in tcp ib; do
        TOPOCCL_IBVERBS_LIB="$LIB" TOPOCCL_STANDIN_IB_DELAY_US=0 \
            target/release/examples/connection_cost "$t" "$SIZES" "$MESSAGES" > "$OUT/cost-$t-$round"
    done
done

python3 - "$OUT" "$ROUNDS" <<'PY'
import statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = {}
for t in ("tcp", "ib"):
    for r in range(1, rounds + 1):
        for line in open(f"{out}/{t}-{r}.0"):
            f = line.split()
            if len(f) == 5 and f[0].isdigit():
                rows.setdefault((t, int(f[0])), []).append(tuple(map(float, f[2:])))
sizes = sorted({s for _, s in rows})
med = lambda v, i: statistics.median(x[i] for x in v)
print(f"# host CPU per message, 2 ranks on 2 host identities, median of {rounds} rounds")
print(f"# {'size (B)':>10} | {'TCP wall':>9} {'thread':>7} {'process':>8} | {'verbs wall':>10} {'thread':>7} {'process':>8} | {'thread verbs/TCP':>16}")
print(f"# {'':>10} | {'(us)':>9} {'(us)':>7} {'(us)':>8} | {'(us)':>10} {'(us)':>7} {'(us)':>8} |")
for s in sizes:
    t, v = rows[("tcp", s)], rows[("ib", s)]
    print(f"  {s:>10} | {med(t,0):>9.2f} {med(t,1):>7.2f} {med(t,2):>8.2f} | {med(v,0):>10.2f} {med(v,1):>7.2f} {med(v,2):>8.2f} | {med(v,1)/med(t,1):>16.2f}")
cost = {}
for t in ("tcp", "ib"):
    for r in range(1, rounds + 1):
        for line in open(f"{out}/cost-{t}-{r}"):
            f = line.split()
            cost.setdefault((t, int(f[0])), []).append(tuple(map(float, f[2:])))
print()
print(f"# time per message in the transport's own calls (busy) and in calls that found nothing (idle), one thread driving both ends, median of {rounds} rounds")
print(f"# {'size (B)':>10} | {'TCP busy':>9} {'idle':>7} | {'verbs busy':>10} {'idle':>7} | {'busy verbs/TCP':>14}")
for s in sorted({s for _, s in cost}):
    t, v = cost[("tcp", s)], cost[("ib", s)]
    print(f"  {s:>10} | {med(t,0):>9.2f} {med(t,1):>7.2f} | {med(v,0):>10.2f} {med(v,1):>7.2f} | {med(v,0)/med(t,0):>14.2f}")
PY
