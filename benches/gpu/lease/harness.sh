# The lease script's harness (sourced by benches/gpu/lease.sh): one deadline for the whole run,
# a limit on every command, stacks of a command about to time out, a table rewritten after every
# result, each step's logs packed into the returned folder as the step ends, and a snapshot of
# the running command's log every few seconds — so that a run killed at any moment has already
# handed back everything up to that moment.
#
# What comes back (the device tool returns at most 8 files, 16 MiB each, from $OUT):
#   $OUT/lease-table.txt    the table of every result so far (and what is running), rewritten
#   $OUT/lease-logs.tar     one sN-NAME.tgz per finished step, appended as it ends
#   $OUT/lease-running.log  the tail of the running command's log, every 5 s
#   $OUT/lease-summary.txt  at the end: each step's highlights, then the table (also printed)
#
# The caller sets: OUT, RUN (a scratch folder), LEASE_S, LEASE_MAX_TIMEOUTS, LEASE_STEPS, MODE.

RESERVE=8            # seconds kept for the summary
TIMEOUTS=0           # commands that ran out of time so far
FAILS=0              # rows that say FAIL or TIMEOUT
declare -a ROWS=()   # the table's rows
CURRENT=""           # what runs now, for the table
STEP_ID="" STEP_NAME="" STEP_DIR="" STEP_T0=0
LAST_RC=0 LAST_SECS=0 LAST_LOG=""
HEADER=""

# Seconds left before the summary must begin.
time_left() { echo $((DEADLINE - SECONDS - RESERVE)); }

harness_init() {
    SECONDS=0 # the lease's own time, from here (the build before it does not count)
    DEADLINE=$LEASE_S
    rm -rf "$RUN/logs" "$RUN/packed"
    mkdir -p "$OUT" "$RUN/logs" "$RUN/packed"
    rm -f "$OUT/lease-table.txt" "$OUT/lease-logs.tar" "$OUT/lease-running.log" "$OUT/lease-summary.txt"
    : >"$RUN/highlights.txt"
    : >"$RUN/current"
    # A tar must exist from the start, even empty, so that what comes back is always readable.
    tar -C "$RUN/packed" -cf "$OUT/lease-logs.tar" --files-from /dev/null
    flusher &
    FLUSHER=$!
    trap 'kill "$FLUSHER" 2>/dev/null' EXIT
}

# Every 5 s, the tail of the running command's log into $OUT/lease-running.log.
flusher() {
    local f
    while sleep 5; do
        f=$(cat "$RUN/current" 2>/dev/null) || continue
        [ -n "$f" ] && [ -f "$f" ] || continue
        { echo "== $(date -u +%H:%M:%S) (lease ${SECONDS}s) $(cat "$RUN/current.what" 2>/dev/null): tail of ${f#"$RUN"/}"; tail -c 48000 "$f"; } \
            >"$OUT/lease-running.log.tmp" 2>/dev/null && mv -f "$OUT/lease-running.log.tmp" "$OUT/lease-running.log"
    done
}

write_table() {
    local tmp=$OUT/lease-table.txt.tmp r
    {
        echo "$HEADER"
        printf '%-5s %-42s %-12s %5s  %s\n' step what result secs note
        for r in "${ROWS[@]}"; do echo "$r"; done
        if [ -n "$CURRENT" ]; then echo "RUNNING: $CURRENT"; fi
        echo "lease: ${SECONDS}s of ${LEASE_S}s; $TIMEOUTS timeout(s) (skip to the summary at $LEASE_MAX_TIMEOUTS)"
    } >"$tmp" && mv -f "$tmp" "$OUT/lease-table.txt"
}

# row ID WHAT RESULT SECS [NOTE]: one line of the table, written at once.
row() {
    local note=${5:-}
    note=${note//$'\n'/ }
    case "$3" in FAIL* | TIMEOUT*) FAILS=$((FAILS + 1)) ;; esac
    ROWS+=("$(printf '%-5s %-42s %-12s %5s  %s' "$1" "${2:0:42}" "$3" "$4" "${note:0:150}")")
    write_table
}

# result_of RC: the table's word for a command's exit status.
result_of() {
    case "$1" in
        0) echo PASS ;;
        124 | 137) echo TIMEOUT ;;
        125) echo SKIP ;;
        *) echo "FAIL ($1)" ;;
    esac
}

selected() { # selected ID: whether --steps / LEASE_STEPS asks for this step
    [ -z "${LEASE_STEPS:-}" ] && return 0
    case ",$LEASE_STEPS," in *",$1,"*) return 0 ;; esac
    return 1
}

# step_begin ID NAME: starts a step, or records why it does not run (returns 1).
step_begin() {
    STEP_ID=$1 STEP_NAME=$2
    if ! selected "$1"; then
        row "$1" "$2" SKIP 0 "not in --steps $LEASE_STEPS"
        return 1
    fi
    if [ "$TIMEOUTS" -ge "$LEASE_MAX_TIMEOUTS" ]; then
        row "$1" "$2" SKIP 0 "after $TIMEOUTS timeouts: straight to the summary"
        return 1
    fi
    if [ "$(time_left)" -lt 3 ]; then
        row "$1" "$2" SKIP 0 "the lease's deadline (${LEASE_S}s)"
        return 1
    fi
    STEP_DIR=$RUN/logs/s$1-$2
    mkdir -p "$STEP_DIR"
    STEP_T0=$SECONDS
    CURRENT="step $1 ($2) since ${SECONDS}s"
    echo "$CURRENT" >"$RUN/current.what"
    echo
    echo "== step $1: $2 (lease at ${SECONDS}s, $(time_left)s left) =="
    write_table
    return 0
}

# step_end: packs the step's logs into $OUT/lease-logs.tar (each log cut to its first 256 KiB
# and last 1.5 MiB, the archive to 4 MiB, the tar kept under 15 MiB).
step_end() {
    local name=s$STEP_ID-$STEP_NAME f size
    CURRENT=""
    : >"$RUN/current"
    for f in "$STEP_DIR"/*; do
        [ -f "$f" ] || continue
        size=$(stat -c %s "$f")
        if [ "$size" -gt $((1792 << 10)) ]; then
            { head -c $((256 << 10)) "$f"; printf '\n[... %d bytes cut by the lease script ...]\n' "$((size - (1792 << 10)))"; tail -c $((1536 << 10)) "$f"; } >"$f.cut" && mv -f "$f.cut" "$f"
        fi
    done
    tar -C "$RUN/logs" -czf "$RUN/packed/$name.tgz" "$name" 2>/dev/null
    if [ "$(stat -c %s "$RUN/packed/$name.tgz")" -gt $((4 << 20)) ]; then
        find "$STEP_DIR" -type f -size +64k -exec sh -c 'tail -c 65536 "$1" >"$1.t" && mv -f "$1.t" "$1"' _ {} \;
        tar -C "$RUN/logs" -czf "$RUN/packed/$name.tgz" "$name" 2>/dev/null
    fi
    if [ $(($(stat -c %s "$OUT/lease-logs.tar") + $(stat -c %s "$RUN/packed/$name.tgz"))) -lt $((15 << 20)) ]; then
        tar -C "$RUN/packed" -rf "$OUT/lease-logs.tar" "$name.tgz"
    else
        echo "   (logs of step $STEP_ID not packed: lease-logs.tar would pass 15 MiB)"
    fi
    write_table
}

# highlight TEXT...: lines for the summary (printed at the end, before the table).
highlight() { printf '%s\n' "$@" >>"$RUN/highlights.txt"; }

# descendants PID: PID and every process below it.
descendants() {
    local all
    all=$(ps -e -o pid=,ppid= 2>/dev/null) || { echo "$1"; return; }
    awk -v root="$1" '{ parent[$1] = $2; pids[NR] = $1 }
        END {
            print root
            do {
                added = 0
                for (i in pids) { p = pids[i]; if (!(p in keep) && (parent[p] in keep || parent[p] == root) && p != root) { keep[p] = 1; added = 1 } }
            } while (added)
            for (p in keep) print p
        }' <<<"$all"
}

# stacks PID FILE: every thread's stack of PID's processes (cuda-gdb on a GPU machine, else gdb;
# at most 6 processes, those running a program of ours or python first).
stacks() {
    local root=$1 file=$2 dbg pid n=0
    dbg=$(command -v cuda-gdb || command -v gdb) || { echo "(no cuda-gdb or gdb here: no stacks)" >"$file"; return 0; }
    {
        echo "== stacks, ${SECONDS}s into the lease, of the processes under pid $root (with $(basename "$dbg"))"
        ps -o pid,ppid,stat,etime,args -p "$(descendants "$root" | tr '\n' ',' | sed 's/,$//')" 2>/dev/null
        for pid in $(descendants "$root"); do
            case "$(cat "/proc/$pid/comm" 2>/dev/null)" in timeout | bash | sh | "") continue ;; esac
            n=$((n + 1))
            [ "$n" -le 6 ] || break
            echo
            echo "=== pid $pid: $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)"
            timeout -k 2 20 "$dbg" -p "$pid" -batch -nx -ex 'set pagination off' -ex 'info threads' \
                -ex 'thread apply all bt 40' 2>&1 | grep -vE '^\[New LWP|^warning: |^Reading symbols|^Downloading'
        done
    } >"$file" 2>&1
}

# bounded LIMIT NAME CMD...: CMD with its output in $STEP_DIR/NAME.log, under LIMIT seconds
# (less if the lease's deadline is nearer); shortly before the limit, the stacks of its
# processes into $STEP_DIR/NAME.stacks.txt. Sets LAST_RC (125: not run, the deadline),
# LAST_SECS and LAST_LOG; a timeout counts towards LEASE_MAX_TIMEOUTS.
bounded() {
    local limit=$1 name=$2 left pid watcher="" t0=$SECONDS at
    shift 2
    LAST_LOG=$STEP_DIR/$name.log
    left=$(time_left)
    [ "$limit" -gt "$left" ] && limit=$left
    if [ "$limit" -lt 2 ]; then
        echo "(not run: the lease's deadline)" >"$LAST_LOG"
        LAST_RC=125 LAST_SECS=0
        return 125
    fi
    # A self-test of the harness (lease/killtest.sh) makes chosen commands hang.
    if [ "$MODE" = standin ] && [ -n "${LEASE_TEST_HANG:-}" ] && [[ " $LEASE_TEST_HANG " == *" $name "* ]]; then
        set -- sleep 3600
    fi
    echo "$LAST_LOG" >"$RUN/current"
    echo "+ (limit ${limit}s) $*" >"$LAST_LOG"
    timeout -k 5 "$limit" "$@" >>"$LAST_LOG" 2>&1 &
    pid=$!
    at=$((limit > 24 ? limit - 12 : limit * 2 / 3))
    (sleep "$at" && kill -0 "$pid" 2>/dev/null && stacks "$pid" "$STEP_DIR/$name.stacks.txt") 2>/dev/null &
    watcher=$!
    wait "$pid"
    LAST_RC=$?
    # The stacks (if taken) were taken before the limit; a capture still going is stopped.
    pkill -P "$watcher" 2>/dev/null
    kill "$watcher" 2>/dev/null
    wait "$watcher" 2>/dev/null
    LAST_SECS=$((SECONDS - t0))
    if [ "$LAST_RC" = 124 ] || [ "$LAST_RC" = 137 ]; then
        TIMEOUTS=$((TIMEOUTS + 1))
        echo "TIMEOUT: killed after ${limit}s (the lease's timeout $TIMEOUTS of $LEASE_MAX_TIMEOUTS)" >>"$LAST_LOG"
    fi
    return "$LAST_RC"
}

# sub_row ID WHAT [NOTE]: the table's row for the last bounded command.
sub_row() {
    local res
    res=$(result_of "$LAST_RC")
    row "$1" "$2" "$res" "$LAST_SECS" "${3:-}"
    printf '   %-44s %-10s %4ss  %s\n' "$2" "$res" "$LAST_SECS" "${3:0:100}"
}

# The end: highlights, then the table (the last lines printed), both also in $OUT.
summary() {
    CURRENT=""
    write_table
    kill "$FLUSHER" 2>/dev/null
    rm -f "$OUT/lease-running.log.tmp"
    {
        echo
        echo "==================== lease summary ===================="
        cat "$RUN/highlights.txt"
        echo
        cat "$OUT/lease-table.txt"
    } >"$OUT/lease-summary.txt"
    cat "$OUT/lease-summary.txt"
    [ "$FAILS" = 0 ]
}
