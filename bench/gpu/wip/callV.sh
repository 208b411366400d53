#!/usr/bin/env bash
# One call. Binaries: `cargo xtask gpu-bundle` at this commit (v.tar.xz) and,
# for the A/B of the listing epilogue, cuda_probe from before it (7eb474a,
# ab.tar.xz's cuda_probe_old).
# 1. the GPU tests with TOPK_REQUIRE_GPU=1 in four lanes at once, memcheck of
#    the Hopper listing tests, of the gpu tests' batch cases and of the bad
#    device batches (searched before the verdict is read), racecheck of the
#    small-corpus listing test (reduced cases);
# 2. alone on the card: the docs/CONTRACTS.md §6 campaign with the torch
#    anchor (fp32; batches also TF32 and bf16) on the same .npy files;
# 3. A/B of the epilogue: Q = 256, K = 100, 1M x 1024, f32 and f16 rows,
#    old / new alternated twice;
# 4. with the time left: single queries and Q = 256 / 1,024 / 4,096 at
#    1M x 1024 over f32 / f16 / bf16 rows (cuda_probe).
set -u
S=$(date +%s)
L=${L:-590}
T="$OUT/v"; mkdir -p "$T"
B=/tmp/gb; mkdir -p $B; tar xJf target/carry/v.tar.xz -C $B; tar xJf target/carry/ab.tar.xz -C $B; cp -r bench $B/
export TOPK_CUDA_PLUGIN="$B/bin/libtopk_cuda_plugin.so" TOPK_REQUIRE_GPU=1 TOPK_COMMIT=${TOPK_COMMIT:-unknown}
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; lscpu | head -20; } > "$T/environment.txt" 2>&1
el() { echo $(( $(date +%s) - S )); }
note() { echo "$1 rc=$2 $(el)s" >> "$T/summary.txt"; }
t() {
  if [ "$(el)" -gt $(( L * 29 / 100 )) ]; then note "test $1 (not started, time)" -; return; fi
  timeout $(( L * 34 / 100 - $(el) + 5 )) $B/bin/test-$1 --test-threads=2 > "$T/test-$1.log" 2>&1; note "test $1" $?
}
san() { # san TOOL BIN CASES TESTS...
  if [ "$(el)" -gt $(( L * 25 / 100 )) ]; then note "$1 $2 (not started, time)" -; return; fi
  TOPK_GPU_CASES=$3 timeout $(( L * 34 / 100 - $(el) + 5 )) compute-sanitizer --tool $1 --error-exitcode 9 $B/bin/test-$2 --test-threads=1 "${@:4}" >> "$T/sanitizer.log" 2>&1; note "$1 $2 $4" $?
}
( t topk-cuda-device_batches; t topk-cuda-storage; t topk-topk; t topk-conformance ) &
( t topk-cuda-bounds; t topk-cuda-conformance; t topk-index-certified; t topk-index-storage ) &
( t topk-cuda-gpu; t topk-cuda-resident; t topk-index-lifecycle; t topk-shard-sharded; t topk-cuda-topk_cuda; t topk-cuda-plugin-topk_cuda_plugin; t topk-cuda-overflow_rule ) &
( san memcheck topk-cuda-bounds 2 the_hopper_listing
  san memcheck topk-cuda-gpu 2 batch_shapes batch_turns filtered
  san memcheck topk-cuda-device_batches 2 bad_device_batches
  san racecheck topk-cuda-bounds 1 the_hopper_listing_on_a_small ) &
wait
note "tests done" 0
timeout $(( L - 150 - $(el) )) bash $B/bench/gpu/campaign.sh "$B" "$T" > "$T/bench.log" 2>&1; note campaign $?
A="--ns 1000000 --ds 1024 --ks 100 --batches 256 --no-single --batch-trials 10"
for r in 1 2; do for dt in f32 f16; do for v in old new; do
  [ "$(el)" -gt $(( L - 40 )) ] && { note "ab $v $dt (not started, time)" -; continue; }
  P=$B/bin/cuda_probe; [ $v = old ] && P=$B/bin/cuda_probe_old
  timeout 30 $P $A --dtype $dt | sed "s/^{/{\"build\":\"$v\",/" >> "$T/ab.jsonl" 2>> "$T/probe.log"; note "ab $v $dt" $?
done; done; done
P="$B/bin/cuda_probe"
for dt in f16 bf16 f32; do
  [ "$(el)" -gt $(( L - 30 )) ] && { note "1M $dt (not started, time)" -; continue; }
  timeout $(( L - 8 - $(el) )) "$P" --ns 1000000 --ds 1024 --ks 100 --batches 256,1024,4096 --batch-trials 5 --dtype $dt > "$T/m1-$dt.jsonl" 2>> "$T/probe.log"; note "1M $dt" $?
done
tar czf "$OUT/v.tgz" -C "$OUT" v
cat "$T/summary.txt"; grep -h "test result\|FAILED\|panicked\|ERROR SUMMARY\|RACECHECK SUMMARY" "$T"/test-*.log "$T/sanitizer.log" | sort | uniq -c | head -30
tail -3 "$T/bench.log"; wc -l "$T"/campaign/results.jsonl "$T"/campaign/anchors/torch.jsonl 2>&1
python3 -c "
import json
for l in open('$T/ab.jsonl'):
    r=json.loads(l)
    if r.get('kind')=='batch': print(r['build'], r['dtype'], r['q'], round(r['median_ms'],3), round(r['min_ms'],3), r['correct'], r['filter_reruns'])
"
