#!/usr/bin/env bash
# The two-GPU run (one CUDA shard per GPU) and its one-GPU rehearsal, from the
# GPU bundle: the sharded GPU tests with their shards spread over DEVICES
# (TOPK_REQUIRE_GPU=1: bit-identical to one index over the union), then
# topk_bench scale at 10M and 20M x 1024: one engine on GPU 0, one `cuda`
# Index on GPU 0, and a 2-shard set over DEVICES, single query K = 100 and
# Q = 256, in the same process; and how the GPUs are linked.
#
# Usage: bench/gpu/two_gpu.sh BUNDLE_DIR OUT_DIR
#   DEVICES=0,1               device ordinals of the shards (rehearsal: DEVICES=0)
#   NS=10000000,20000000      corpus sizes (20M x 1024 is 82 GB: one H200 holds it;
#                             the host needs about 2.2x that in memory)
# Leaves NCCL_* and every other variable the machine sets as it is; changes no
# clock, power or mode of any GPU.
set -u
B="$1"; O="$2"; mkdir -p "$O"
DEVICES="${DEVICES:-0,1}"; NS="${NS:-10000000,20000000}"
[ -x "$B/bin/topk_bench" ] || { mkdir -p /tmp/gb; tar xzf "$B/bin.tar.gz" -C /tmp/gb; B=/tmp/gb; }
export TOPK_CUDA_PLUGIN="$B/bin/libtopk_cuda_plugin.so" TOPK_REQUIRE_GPU=1 TOPK_SHARD_DEVICES="$DEVICES"
nvidia-smi topo -m > "$O/topo.txt" 2>&1
nvidia-smi --query-gpu=index,name,driver_version,memory.total,pci.bus_id --format=csv > "$O/gpu.csv" 2>&1
env | grep -E '^(NCCL|CUDA)_' | sort > "$O/env.txt"
S=$(date +%s)
(cd "$B/bin" && ./test-topk-shard-sharded) > "$O/shard-tests.log" 2>&1
echo "shard tests (devices $DEVICES) rc=$? $(( $(date +%s) - S ))s" >> "$O/summary.txt"
"$B/bin/topk_bench" scale --ns "$NS" --ds 1024 --shards 2 --devices "$DEVICES" \
  --trials 50 --check 2 --out "$O/scale" > "$O/scale.log" 2>&1
echo "scale (devices $DEVICES, N $NS) rc=$? $(( $(date +%s) - S ))s" >> "$O/summary.txt"
cat "$O/summary.txt"; cat "$O/scale/scale.md" 2>/dev/null
