#!/usr/bin/env bash
# The benchmark campaign inside the GPU bundle (called by run.sh's "bench"
# section): topk_bench, built with CUDA, over the docs/CONTRACTS.md §6 grid (GPU-resident,
# device-query and CPU round-trip paths, each gated bit for bit against the
# oracle before timing), then the torch anchor on the very same .npy files, then
# the join into OUT/campaign/joined.csv. Plots and the README table are drawn
# afterwards on a machine with Rust: `cargo xtask plots DIR`, `cargo xtask bench-table DIR`.
#
# Usage: campaign.sh BUNDLE_DIR OUT_DIR
#   QUICK=1        the quick subset (seconds)
#   BENCH_DATA=DIR where the ~9 GB of .npy data go (default $TMPDIR or /tmp; deleted at the end)
set -eu
B="$1"
O="$2"
DATA="${BENCH_DATA:-${TMPDIR:-/tmp}/topk-bench-data}"
args=(campaign --out "$O/campaign" --data "$DATA" --no-progress
      --torch "$B/bench/anchors/torch_anchor.py" --clean-data)
if [ "${QUICK:-0}" = 1 ]; then args+=(--quick); fi
exec "$B/bin/topk_bench" "${args[@]}"
