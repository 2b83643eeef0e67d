#!/usr/bin/env bash
# Builds topoccl's NCCL-compatible library and lays it out as NCCL installs itself:
#   PREFIX/lib/libnccl.so.2   (soname libnccl.so.2)
#   PREFIX/lib/libnccl.so  -> libnccl.so.2   (for -lnccl)
#   PREFIX/include/nccl.h
# Usage: ffi/install.sh [PREFIX]   (default: target/nccl)
# Then: cc prog.c -IPREFIX/include -LPREFIX/lib -lnccl, and LD_LIBRARY_PATH=PREFIX/lib to
# run a program built against NVIDIA's NCCL on topoccl instead.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix="${1:-target/nccl}"
cargo build --release -p topoccl-ffi
mkdir -p "$prefix/lib" "$prefix/include"
cp target/release/libnccl.so "$prefix/lib/libnccl.so.2"
ln -sf libnccl.so.2 "$prefix/lib/libnccl.so"
cp ffi/include/nccl.h "$prefix/include/nccl.h"
echo "installed: $prefix/lib/libnccl.so.2 (soname $(readelf -d "$prefix/lib/libnccl.so.2" 2>/dev/null | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')), $prefix/include/nccl.h"
