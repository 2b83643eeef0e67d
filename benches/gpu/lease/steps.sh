# The lease script's steps (sourced by benches/gpu/lease.sh after the harness). Each step runs
# its commands through `bounded`, writes one table row per command (`sub_row`), adds what the
# summary should show (`highlight`), and ends with `step_end`, which packs its logs.

# first_error LOG: the line of LOG that best says why a command failed (a panic's message with
# its place, a CUDA or NCCL error, a wrong result, a timeout).
first_error() {
    local l
    l=$(awk '/panicked at/ { p = $0; sub(/.*panicked at /, "", p); getline m; print m " (at " p ")"; exit }' "$1" 2>/dev/null)
    [ -n "$l" ] || l=$(grep -m 1 -E 'TIMEOUT: |WATCHDOG|Test failure|NCCL error|Cuda failure|CUDA_ERROR|[Ee]rror|wrong|FAILED|failed|not found' "$1" 2>/dev/null)
    [ -n "$l" ] || l=$(grep -vE '^\+ \(limit|^-+$' "$1" 2>/dev/null | tail -n 1)
    echo "${l:0:140}"
}

# ranks NAME: the command prefix that runs what follows as 2 rank processes (lease.sh --ranks),
# rank 1's output beside the step's logs.
ranks2() { echo env "RANKS_LOG=$STEP_DIR/$1" "$SELF" --ranks 2; }

step_machine() {
    step_begin 0 machine || return 0
    bounded "$T_MACHINE" machine "$HERE/lease/machine.sh" "$B"
    local note
    note=$(sed -n 's/^SUMMARY: //p' "$LAST_LOG" | tail -n 1)
    GPU_CAP=$(timeout 10 nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1)
    sub_row 0 machine "${note:-$(first_error "$LAST_LOG")}"
    highlight "machine: ${note:-?}"
    step_end
}

# The kernels' image for this device: the cubin of its SM, else PTX (the driver compiles it).
kernel_image() {
    # Asked here too: step 0 may not have run (--steps).
    local cap=${GPU_CAP:-$(timeout 10 nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1)}
    [ "$MODE" = standin ] && cap=${TOPOCCL_STANDIN_SM:-90}
    cap=${cap//./}
    if [ -f "$REPO/kernels/images/sm_$cap.cubin" ]; then echo "$REPO/kernels/images/sm_$cap.cubin"; else echo "$REPO/kernels/images/compute_90.ptx"; fi
}

step_probes() {
    step_begin 1 probes || return 0
    bounded "$T_PROBES" probes "$B/driver_probes" --image "$(kernel_image)"
    local log=$LAST_LOG note blocks hangs
    blocks=$(awk -F'|' '$2 ~ /BLOCKS/ { gsub(/^ +| +$/, "", $1); printf "%s%s", sep, $1; sep = ", " }' "$log")
    hangs=$(awk -F'|' '$2 ~ /HANGS/ { gsub(/^ +| +$/, "", $1); printf "%s%s", sep, $1; sep = ", " }' "$log")
    note=$(sed -n 's/^RESULT (i) CUDA_DEVICE_MAX_CONNECTIONS=\([0-9]*\): \([^;]*\).*/conns \1: \2/p' "$log" | paste -sd ";" - | sed "s/;/; /g")
    local side
    side=$(awk '/^   CUDA_DEVICE_MAX_CONNECTIONS=/ { c = $1 } /launched one after the other \|/ { sub(/.*\| /, ""); printf "%s%s adjacent %s", sep, c, $0; sep = "; " } /copy queued between the two launches \|/ { sub(/.*\| /, ""); printf ", between %s", $0 }' "$log")
    note="(i) ${note:-?}; (ii) blocks: ${blocks:-none}${hangs:+; HANGS: $hangs}; (v) ${side:-?}"
    grep -q 'WATCHDOG' "$log" && note="$note; watchdog fired"
    [ "$LAST_RC" = 0 ] || note="$(first_error "$log"); $note"
    sub_row 1 "driver probes" "$note"
    highlight "" "-- step 1: driver probes ($(kernel_image | xargs basename)) --" \
        "$(grep -vE '^ +k=|^ +released |^\+ \(limit' "$log")"
    step_end
}

step_smoke() {
    step_begin 2 smoke || return 0
    local sizes=(8 2M 512) what
    highlight "" "-- step 2: one all-reduce, read back with a pageable copy straight after the call --"
    for what in 1rank 2threads 2procs; do
        case $what in
            1rank) bounded "$T_SMOKE" smoke-1rank "$B/device_sweep" "${sizes[@]}" --threads 1 --once ;;
            2threads) bounded "$T_SMOKE" smoke-2threads "$B/device_sweep" "${sizes[@]}" --threads 2 --once ;;
            2procs) bounded "$T_SMOKE" smoke-2procs $(ranks2 smoke-2procs) "$B/device_sweep" "${sizes[@]}" --once ;;
        esac
        local note
        if [ "$LAST_RC" = 0 ]; then
            note="$(grep -c ' checked$' "$LAST_LOG") sizes (8 B, 4 KiB, 2 MiB) right"
        else
            note=$(first_error "$LAST_LOG")
        fi
        sub_row 2 "smoke: $what" "$note"
        highlight "smoke $what: $(result_of "$LAST_RC") ($LAST_SECS s) $note"
    done
    step_end
}

step_tests() {
    step_begin 3 tests || return 0
    local t n names pass fail skipped failed_names t0=$SECONDS
    highlight "" "-- step 3: device tests, one per process (limit ${T_TEST}s each) --"
    for t in $LEASE_TESTS; do
        names=$("$B/deps/$t" --list --format terse 2>/dev/null | sed -n 's/: test$//p')
        pass=0 fail=0 skipped=0 left=0 failed_names=""
        for n in $names; do
            if [ -n "${LEASE_TEST_MATCH:-}" ] && ! [[ $n =~ $LEASE_TEST_MATCH ]]; then
                left=$((left + 1))
                continue
            fi
            if [ "$TIMEOUTS" -ge "$LEASE_MAX_TIMEOUTS" ] || [ $((SECONDS - t0)) -ge "$T_TESTS" ] || [ "$(time_left)" -lt 3 ]; then
                skipped=$((skipped + 1))
                continue
            fi
            bounded "$T_TEST" "$t.$n" env ${TEST_ENV[@]+"${TEST_ENV[@]}"} "$B/deps/$t" --exact "$n" --test-threads=1 --nocapture
            if [ "$LAST_RC" = 0 ] && grep -q '1 passed' "$LAST_LOG"; then
                pass=$((pass + 1))
            else
                fail=$((fail + 1))
                failed_names="$failed_names $n"
                sub_row 3 "  $t::${n:0:30}" "$(first_error "$LAST_LOG")"
            fi
            echo "   $t::$n: $(result_of "$LAST_RC") (${LAST_SECS}s)"
        done
        local res=PASS
        [ $((pass + fail)) = 0 ] && res=SKIP
        [ "$fail" != 0 ] && res="FAIL ($fail)"
        [ -z "$names" ] && res="FAIL (no list)"
        row 3 "tests/$t.rs" "$res" "" "$pass passed, $fail failed$([ "$skipped" != 0 ] && echo ", $skipped not run (time or timeouts)")$([ "$left" != 0 ] && echo ", $left left out (LEASE_TEST_MATCH)")"
        highlight "$t: $pass passed, $fail failed, $skipped not run${failed_names:+; failed:$failed_names}"
    done
    step_end
}

step_kernels() {
    step_begin 4 kernels || return 0
    bounded "$T_KERNELS" kernels "$B/device_kernels" "${KERNEL_SIZES[@]}"
    local note
    if [ "$LAST_RC" = 0 ]; then
        note=$(awk '$3 == "reduce" && $4 == "float" { s = $1 " " $2; r = $NF } END { if (s) print "f32 sum at " s ": " r " of the copy'"'"'s bandwidth" }' "$LAST_LOG")
    else
        note=$(first_error "$LAST_LOG")
    fi
    sub_row 4 "kernels vs device-to-device copy" "$note"
    highlight "" "-- step 4: reduction kernels against cuMemcpyAsync device to device --" "$(grep -v '^+ (limit' "$LAST_LOG")"
    step_end
}

step_sweep() {
    step_begin 5 sweep || return 0
    local what
    # Small calls both ways on the same ranks sharing the GPU: one kernel per call
    # (TOPOCCL_DEVICE_LL=2) against the stream path (the default there, 1).
    local small=(8 64K 8)
    # And replayed from CUDA graphs (each size's timed calls captured into one graph).
    for what in 2threads 2threads-1kernel 2threads-1kernel-graph 2procs 2procs-graph 2procs-1kernel 2procs-1kernel-graph 2procs-cumem; do
        case $what in
            2threads-1kernel) bounded "$T_SWEEP" sweep-2threads-1kernel env TOPOCCL_DEVICE_LL=2 "$B/device_sweep" "${small[@]}" --threads 2 ;;
            2threads-1kernel-graph) bounded "$T_SWEEP" sweep-2threads-1kernel-graph env TOPOCCL_DEVICE_LL=2 "$B/device_sweep" "${small[@]}" --threads 2 --graph ;;
            2procs-1kernel) bounded "$T_SWEEP" sweep-2procs-1kernel env TOPOCCL_DEVICE_LL=2 $(ranks2 sweep-2procs-1kernel) "$B/device_sweep" "${small[@]}" ;;
            2procs-1kernel-graph) bounded "$T_SWEEP" sweep-2procs-1kernel-graph env TOPOCCL_DEVICE_LL=2 $(ranks2 sweep-2procs-1kernel-graph) "$B/device_sweep" "${small[@]}" --graph ;;
            2procs-graph) bounded "$T_SWEEP" sweep-2procs-graph $(ranks2 sweep-2procs-graph) "$B/device_sweep" "${SWEEP_SIZES[@]}" --graph ;;
            2threads) bounded "$T_SWEEP" sweep-2threads "$B/device_sweep" "${SWEEP_SIZES[@]}" --threads 2 ;;
            2procs) bounded "$T_SWEEP" sweep-2procs $(ranks2 sweep-2procs) "$B/device_sweep" "${SWEEP_SIZES[@]}" ;;
            2procs-cumem) bounded "$T_SWEEP" sweep-2procs-cumem env SWEEP_ALLOC=cumem $(ranks2 sweep-2procs-cumem) "$B/device_sweep" "${SWEEP_SIZES[@]}" ;;
        esac
        grep -E '^[0-9]+ [0-9.]+ ' "$LAST_LOG" >"$STEP_DIR/$what.table"
        local note
        note=$(awk 'NR == 1 { a = $1 " B: " $2 " us" } { z = $1 " B: " $4 " GB/s busbw" } END { if (NR) print NR " sizes right; " a "; " z }' "$STEP_DIR/$what.table")
        [ "$LAST_RC" = 0 ] || note="$(first_error "$LAST_LOG")${note:+ (after $note)}"
        sub_row 5 "sweep: $what" "$note"
    done
    highlight "" "-- step 5: all-reduce float32 sum on device buffers, 2 ranks on GPU 0 (us per call | busbw GB/s) --"
    highlight "$(awk -v d="$STEP_DIR" 'BEGIN {
        n = split("2threads 2threads-1kernel 2threads-1kernel-graph 2procs 2procs-graph 2procs-1kernel 2procs-1kernel-graph 2procs-cumem", w, " ")
        for (i = 1; i <= n; i++) while ((getline l < (d "/" w[i] ".table")) > 0) {
            split(l, v, " ")
            if (!(v[1] in seen)) { seen[v[1]] = 1; sizes[++m] = v[1] + 0 }
            us[i, v[1]] = v[2]; bw[i, v[1]] = v[4]
        }
        for (a = 1; a <= m; a++) for (b = a + 1; b <= m; b++) if (sizes[b] < sizes[a]) { t = sizes[a]; sizes[a] = sizes[b]; sizes[b] = t }
        printf "%12s", "bytes"
        for (i = 1; i <= n; i++) printf " | %-24s", w[i]
        printf "\n"
        for (k = 1; k <= m; k++) {
            printf "%12d", sizes[k]
            for (i = 1; i <= n; i++) if ((i, sizes[k]) in us) printf " | %11s %12s", us[i, sizes[k]], bw[i, sizes[k]]; else printf " | %11s %12s", "-", "-"
            printf "\n"
        }
    }')"
    step_end
}

# nccl_rows LOG: size, out-of-place time (us), busbw, #wrong of each row of an nccl-tests table.
nccl_rows() { awk '$1 ~ /^[0-9]+$/ && NF >= 13 { print $1, $6, $8, $9 }' "$1"; }

# The NCCL that NVIDIA ships with PyTorch on such a machine (the nvidia-nccl-cu13 package).
nvidia_nccl_dir() {
    local d
    d=$(timeout 20 "$PYTHON" -c 'import nvidia.nccl as m, os; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null)
    [ -n "$d" ] && [ -f "$d/libnccl.so.2" ] && { echo "$d"; return; }
    d=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 / { print $NF; exit }')
    [ -n "$d" ] && dirname "$d"
}

# nccl_table DIR: DIR's ours-1, nvidia-1 and ours-2 .rows side by side, with ours/NCCL at 1 rank.
nccl_table() {
    awk -v d="$1" 'BEGIN {
    n = split("ours-1 nvidia-1 ours-2", w, " ")
    for (i = 1; i <= n; i++) while ((getline l < (d "/" w[i] ".rows")) > 0) { split(l, v, " "); t[i, v[1]] = v[2]; b[i, v[1]] = v[3]; if (!(v[1] in seen)) { seen[v[1]] = 1; s[++m] = v[1] + 0 } }
    printf "%12s | %12s | %12s | %9s | %12s %10s\n", "bytes", "ours 1 rank", "NCCL 1 rank", "ours/NCCL", "ours 2 ranks", "busbw"
    for (k = 1; k <= m; k++) {
        x = s[k]; r = ((1, x) in t && (2, x) in t && t[2, x] > 0) ? sprintf("%.2f", t[1, x] / t[2, x]) : "-"
        printf "%12d | %12s | %12s | %9s | %12s %10s\n", x, ((1, x) in t) ? t[1, x] : "-", ((2, x) in t) ? t[2, x] : "-", r, ((3, x) in t) ? t[3, x] : "-", ((3, x) in b) ? b[3, x] : "-"
    }
}'
}

step_nccl_tests() {
    step_begin 6 nccl-tests || return 0
    if [ "$MODE" = standin ]; then
        row 6 "nccl-tests all_reduce_perf" SKIP 0 "stand-in: nccl-tests' CUDA runtime needs the real driver (cuGetProcAddress, export tables)"
        step_end
        return 0
    fi
    local nt=$CLIENTS/nccl-tests/all_reduce_perf mpi=$CLIENTS/mpi args=(-b 8 -e 256M -f 4 -g 1 -n 20 -w 5)
    if [ ! -x "$nt" ] || [ ! -x "$mpi/bin/mpirun" ]; then
        row 6 "nccl-tests all_reduce_perf" SKIP 0 "not in the bundle (built without nccl-tests' source or an MPI: see benches/gpu/README.md)"
        step_end
        return 0
    fi
    local mpirun=("$mpi/bin/mpirun" --oversubscribe --bind-to none -x LD_LIBRARY_PATH -x NCCL_TESTS_DEVICE -x NCCL_DEBUG -x OPAL_PREFIX)
    [ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
    export OPAL_PREFIX=$mpi NCCL_TESTS_DEVICE=0
    local ours=$CLIENTS/lib:$mpi/lib nv note
    local np
    for np in 2 1; do
        bounded "$T_NCCL" ours-np$np env LD_LIBRARY_PATH=$ours NCCL_DEBUG=VERSION "${mpirun[@]}" -np "$np" "$nt" "${args[@]}" -c 1
        note=$(NT_MIN=8 NT_MAX=256M NT_FACTOR=4 benches/gpu/clients.sh --check-table "$LAST_LOG" "$np" 2>&1 | tail -n 1)
        [ "$LAST_RC" = 0 ] && [[ "$note" == PROBLEMS* ]] && LAST_RC=1
        [ "$LAST_RC" = 0 ] || note="$(first_error "$LAST_LOG"); $note"
        sub_row 6 "nccl-tests: ours, $np rank$([ "$np" = 1 ] || echo s), -c 1" "$note"
        nccl_rows "$LAST_LOG" >"$STEP_DIR/ours-$np.rows"
    done
    nv=$(nvidia_nccl_dir)
    if [ -z "$nv" ]; then
        row 6 "nccl-tests: NVIDIA's NCCL, 1 rank" SKIP 0 "no NVIDIA libnccl.so.2 found (nvidia-nccl-cu13, ldconfig)"
    else
        bounded "$T_NCCL" nvidia-1rank env LD_LIBRARY_PATH=$nv:$mpi/lib NCCL_DEBUG=VERSION "${mpirun[@]}" -np 1 "$nt" "${args[@]}" -c 1
        nccl_rows "$LAST_LOG" >"$STEP_DIR/nvidia-1.rows"
        note="$(grep -m 1 -o 'NCCL version [^ ]*' "$LAST_LOG") from $nv; $(wc -l <"$STEP_DIR/nvidia-1.rows") rows, wrong: $(awk '$4 != "0"' "$STEP_DIR/nvidia-1.rows" | wc -l)"
        [ "$LAST_RC" = 0 ] || note="$(first_error "$LAST_LOG"); $note"
        sub_row 6 "nccl-tests: NVIDIA's NCCL, 1 rank" "$note"
    fi
    highlight "" "-- step 6: nccl-tests all_reduce_perf float sum, out of place: us per call (ours 2 ranks: busbw GB/s) --"
    highlight "$(nccl_table "$STEP_DIR")"
    unset OPAL_PREFIX NCCL_TESTS_DEVICE
    step_end
}

step_ddp() {
    step_begin 7 ddp || return 0
    if [ "$MODE" = standin ]; then
        row 7 "PyTorch DDP, nccl backend, ours" SKIP 0 "stand-in: PyTorch's NCCL process group needs a CUDA device (clients.sh --standin checks DDP on gloo)"
        step_end
        return 0
    fi
    local lib=$CLIENTS/lib/libnccl.so.2 note
    if [ ! -f "$lib" ]; then
        row 7 "PyTorch DDP, nccl backend, ours" SKIP 0 "no libnccl.so.2 in the bundle"
        step_end
        return 0
    fi
    bounded "$T_DDP" ddp env LD_PRELOAD="$lib" NCCL_DEBUG=VERSION PYTHONUNBUFFERED=1 "$PYTHON" benches/gpu/ddp_check.py \
        --backend nccl --world 2 --steps 10 --expect-lib "$lib" --timeout $((T_DDP > 30 ? T_DDP - 15 : T_DDP))
    if [ "$LAST_RC" = 0 ] && ! grep -q 'NCCL version .*+topoccl' "$LAST_LOG"; then LAST_RC=1; fi
    note=$(grep -v '^+ (limit' "$LAST_LOG" | tail -n 1)
    [ "$LAST_RC" = 0 ] || note=$(first_error "$LAST_LOG")
    sub_row 7 "PyTorch DDP, nccl backend, 2 ranks, 10 steps" "$note"
    highlight "" "-- step 7: PyTorch DDP (nccl backend, ours preloaded, float(loss) every step) --" "$(tail -n 8 "$LAST_LOG")"
    step_end
}
