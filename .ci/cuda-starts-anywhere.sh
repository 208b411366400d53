#!/usr/bin/env bash
# The CUDA build starts anywhere: `topk_demo` built with `--features cuda`
# must not need the NVIDIA driver's libcuda.so.1 to start. The GPU engine is
# the plugin libtopk_cuda_plugin.so, loaded only for `--backend cuda`.
#
# On this machine (no NVIDIA driver) it checks, with nothing on the loader
# path: the demo binary has no DT_NEEDED on libcuda, the plugin has one,
# `--backend cpu` exits 0, and `--backend cuda` exits 1 with a message that
# names libcuda.so.1 and the missing NVIDIA driver; then the Rust tests of
# the same (crates/topk-demo/tests/cuda_build.rs, crates/topk-cuda-loader).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

fail() { echo "cuda-starts-anywhere: $*" >&2; exit 1; }

TARGET="${CARGO_TARGET_DIR:-$PWD/target}"
DEMO="$TARGET/debug/topk_demo"
PLUGIN="$TARGET/debug/libtopk_cuda_plugin.so"

# Linking the plugin needs a libcuda.so at link time only: the xtask prints
# CUDA_LIBRARY_PATH (a link-time copy under target/) where no driver is
# installed. Nothing below puts it on the loader path.
eval "$(cargo xtask cuda-toolchain)"
unset LD_LIBRARY_PATH TOPK_CUDA_PLUGIN

# Two invocations, so that the plugin's `topk-cuda/cuda` is not unified into
# the demo's build.
cargo build -p topk-demo --features cuda --bin topk_demo
cargo build -p topk-cuda-plugin --features cuda

needed=$(readelf -d "$DEMO" | grep -c libcuda || true)
[ "$needed" = 0 ] || fail "$DEMO has a DT_NEEDED on libcuda ($needed)"
readelf -d "$PLUGIN" | grep -q 'NEEDED.*libcuda\.so\.1' \
    || fail "$PLUGIN does not link libcuda.so.1 (not a CUDA build?)"
echo "ok: topk_demo needs no libcuda; the plugin needs libcuda.so.1"

"$DEMO" --backend cpu > /dev/null || fail "--backend cpu exited $?"
echo "ok: topk_demo --backend cpu exits 0"

if ldconfig -p | grep -q 'libcuda\.so\.1'; then
    echo "this machine has an NVIDIA driver: the missing-driver message cannot be checked here"
else
    set +e
    msg=$(RUST_LOG=warn "$DEMO" --backend cuda 2>&1 >/dev/null)
    rc=$?
    set -e
    [ "$rc" = 1 ] || fail "--backend cuda exited $rc, want 1: $msg"
    grep -q 'libcuda\.so\.1' <<< "$msg" || fail "the message does not name libcuda.so.1: $msg"
    grep -q 'NVIDIA driver' <<< "$msg" || fail "the message does not name the NVIDIA driver: $msg"
    echo "ok: topk_demo --backend cuda exits 1: $msg"
fi

# The Rust tests, with the CUDA plugin built above beside the binaries.
cargo test -p topk-demo --features cuda --test cuda_build
cargo test -p topk-cuda-loader
