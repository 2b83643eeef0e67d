#!/usr/bin/env bash
# The lease script's harness under the ways a lease ends badly, on the stand-in driver (CI runs
# this after `benches/gpu/lease.sh --standin`, whose bundle it reuses):
#   (a) killed mid-step (SIGKILL to its session, as the device tool does at its limit):
#       the table so far, the finished steps' logs and the running command's tail are there;
#   (b) a deadline shorter than the run: it ends by itself, about on time, the table last;
#   (c) two commands that hang: each is killed at its limit with its stacks taken first, and
#       the rest is skipped straight to the summary;
#   (d) a driver call that never returns in the probes: the table says HANGS for it and goes on
#       with the next calls in a new process.
# Exit status 0 when every check holds; each failed check is one line.
set -uo pipefail
cd "$(dirname "$(readlink -f "$0")")/../../.."
LEASE=benches/gpu/lease.sh
[ -f target/gpu-lease/bundle.tar.gz ] || { echo "killtest: no target/gpu-lease/bundle.tar.gz: run $LEASE --standin first" >&2; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
FAILED=0
check() { # check WHAT CONDITION...: one line, PASS or FAIL
    local what=$1
    shift
    if "$@"; then echo "   ok: $what"; else echo "   FAILED: $what"; FAILED=1; fi
}
has() { grep -qE "$2" "$1" 2>/dev/null; }
in_tar() { tar -tf "$1" 2>/dev/null | grep -qx "$2"; }
# member TAR NAME FILE PATTERN: NAME (a .tgz in TAR) unpacks and its FILE matches PATTERN.
member() {
    local d=$TMP/m.$RANDOM
    mkdir -p "$d" && tar -C "$d" -xf "$1" "$2" 2>/dev/null && tar -C "$d" -xzf "$d/$2" 2>/dev/null &&
        grep -qE "$4" "$d"/*/"$3" 2>/dev/null
}

echo "== (a) killed mid-step =="
out=$TMP/a
t0=$SECONDS
# Every test of step 3 (not the stand-in run's few), so that the kill finds it running.
setsid env OUT="$out" LEASE_WORK="$TMP/work-a" LEASE_TEST_MATCH= "$LEASE" --standin --prebuilt >"$TMP/a.stdout" 2>&1 &
pid=$!
until has "$out/lease-table.txt" '^RUNNING: step 3' || [ $((SECONDS - t0)) -gt 180 ]; do sleep 0.5; done
sleep 7 # the running command's tail is written every 5 s
# Its session, as the device tool ends what a command leaves running (timeout(1) puts each
# command in a process group of its own, so the script's group alone is not all of it).
pkill -KILL -s "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
check "the table holds steps 0-2 and says step 3 was running" \
    bash -c "grep -qE '^0 +machine +PASS' '$out/lease-table.txt' && grep -qE '^1 +driver probes +PASS' '$out/lease-table.txt' &&
        [ \$(grep -cE '^2 +smoke: .* PASS' '$out/lease-table.txt') = 3 ] && grep -q '^RUNNING: step 3' '$out/lease-table.txt'"
check "lease-logs.tar holds the finished steps, and only those" \
    bash -c "tar -tf '$out/lease-logs.tar' | grep -qx s0-machine.tgz && tar -tf '$out/lease-logs.tar' | grep -qx s1-probes.tgz &&
        tar -tf '$out/lease-logs.tar' | grep -qx s2-smoke.tgz && ! tar -tf '$out/lease-logs.tar' | grep -q '^s3-'"
check "each finished step's logs unpack (machine report, probe results, smoke checks)" \
    bash -c "$(declare -f member); TMP=$TMP; member '$out/lease-logs.tar' s0-machine.tgz machine.log '^SUMMARY: ' &&
        member '$out/lease-logs.tar' s1-probes.tgz probes.log '^RESULT \(i\) CUDA_DEVICE_MAX_CONNECTIONS=8' &&
        member '$out/lease-logs.tar' s2-smoke.tgz smoke-2procs.log '2097152 checked'"
check "lease-running.log is the running test's tail" has "$out/lease-running.log" 'step 3 \(tests\).*s3-tests/device_'
sleep 1
check "nothing of the killed run is left running" bash -c "! pgrep -f '$TMP/[w]ork-a' >/dev/null"

echo "== (b) a deadline shorter than the run (LEASE_S=30) =="
out=$TMP/b
t0=$SECONDS
# Every test again, so that the run outlasts the deadline.
OUT="$out" LEASE_WORK="$TMP/work-b" LEASE_S=30 LEASE_TEST_MATCH= timeout 120 "$LEASE" --standin --prebuilt >"$TMP/b.stdout" 2>&1
took=$((SECONDS - t0))
check "it ended by itself in ${took}s (deadline 30 s, +15 s at most)" test "$took" -le 45
check "its last line is the table's last" has <(tail -n 1 "$TMP/b.stdout") '^lease: [0-9]+s of 30s'
check "the steps past the deadline say so" has "$out/lease-table.txt" "SKIP +0 +the lease's deadline \(30s\)"
check "lease-summary.txt came back" has "$out/lease-summary.txt" 'lease summary'

echo "== (c) two commands that hang (T_SMOKE=4) =="
out=$TMP/c
t0=$SECONDS
OUT="$out" LEASE_WORK="$TMP/work-c" LEASE_STEPS=0,2,3,4 T_SMOKE=4 LEASE_TEST_HANG="smoke-2threads smoke-2procs" \
    timeout 120 "$LEASE" --standin --prebuilt >"$TMP/c.stdout" 2>&1
rc=$?
check "exit status 1 (it was $rc)" test "$rc" = 1
check "both hung commands are TIMEOUT rows" bash -c "[ \$(grep -cE '^2 +smoke: 2(threads|procs) +TIMEOUT' '$out/lease-table.txt') = 2 ]"
check "the one that did not hang passed" has "$out/lease-table.txt" '^2 +smoke: 1rank +PASS'
check "after two timeouts the rest is skipped" bash -c "grep -qE '^3 +tests +SKIP .*after 2 timeouts' '$out/lease-table.txt' &&
    grep -qE '^4 +kernels +SKIP .*after 2 timeouts' '$out/lease-table.txt'"
tar -C "$TMP" -xf "$out/lease-logs.tar" s2-smoke.tgz 2>/dev/null && tar -C "$TMP" -xzf "$TMP/s2-smoke.tgz" 2>/dev/null
check "the hung command's log says it was killed at its limit" has "$TMP/s2-smoke/smoke-2threads.log" 'TIMEOUT: killed after 4s'
if command -v cuda-gdb >/dev/null || command -v gdb >/dev/null; then
    check "its stacks were taken before the kill" has "$TMP/s2-smoke/smoke-2threads.stacks.txt" '=== pid [0-9]+: sleep 3600'
else
    echo "   (no gdb here: the stacks are not checked)"
    [ -n "${CI:-}" ] && { echo "   FAILED: CI must have gdb for the stacks check"; FAILED=1; }
fi
echo "== (d) a driver call that hangs in probe (ii) =="
rm -rf "$TMP/d" && mkdir -p "$TMP/d" && tar -C "$TMP/d" -xzf target/gpu-lease/bundle.tar.gz
ln -sfn ../libcuda_standin.so "$TMP/d/bundle/cuda-standin/libcuda.so.1" 2>/dev/null ||
    { mkdir -p "$TMP/d/bundle/cuda-standin" && ln -sfn ../libcuda_standin.so "$TMP/d/bundle/cuda-standin/libcuda.so.1"; }
LD_LIBRARY_PATH=$TMP/d/bundle/cuda-standin DRIVER_PROBES_SIMULATE_HANG=cuStreamCreate timeout 60 \
    "$TMP/d/bundle/driver_probes" --image kernels/images/sm_90.cubin --only ii >"$TMP/d.stdout" 2>&1
check "the hung call is a HANGS row" has "$TMP/d.stdout" '^ +cuStreamCreate +\| HANGS'
check "the calls after it were probed in a new process" has "$TMP/d.stdout" '^ +cuStreamWriteValue32 \(another stream\) +\| free'
check "and the ones before it in the first" has "$TMP/d.stdout" '^ +cuMemFree +\| BLOCKS'
echo "   (a, b, c, d took $((SECONDS)) s in all)"
if [ "$FAILED" != 0 ]; then
    echo "killtest: FAILED"
    for f in a b c d; do echo "--- $f: last lines of its output"; tail -n 25 "$TMP/$f.stdout"; done
    exit 1
fi
echo "killtest: all checks hold"
