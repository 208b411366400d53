#!/usr/bin/env bash
# One call. Binaries: the GPU tests touching device queries, the plugin and
# cuda_probe (as cuda_probe_fused) at this commit (y.tar.xz); cuda_probe of
# 0d8a3ed (cuda_probe_mid) and of 7eb474a (cuda_probe_old) in probes.tar.xz.
# 1. the tests with TOPK_REQUIRE_GPU=1 in three lanes, memcheck of the bad
#    device batches (mapped and copied verdicts);
# 2. 10k-100k rows x 384/768/1024, Q = 16 and 256, K = 100, host and device
#    queries: 7eb474a (before the epilogue change), 0d8a3ed (epilogue, the
#    verdict read with the results) and this commit (one kernel checks and
#    stages), alternated twice.
set -u
S=$(date +%s)
L=${L:-560}
T="$OUT/y"; mkdir -p "$T"
B=/tmp/gy; mkdir -p $B
tar xJf target/carry/probes.tar.xz -C $B; tar xJf target/carry/y.tar.xz -C $B
export TOPK_CUDA_PLUGIN="$B/bin/libtopk_cuda_plugin.so" TOPK_REQUIRE_GPU=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv; } > "$T/environment.txt" 2>&1
el() { echo $(( $(date +%s) - S )); }
note() { echo "$1 rc=$2 $(el)s" >> "$T/summary.txt"; }
t() { timeout $(( L / 2 - $(el) )) $B/bin/test-$1 --test-threads=2 > "$T/test-$1.log" 2>&1; note "test $1" $?; }
( t topk-cuda-device_batches; t topk-cuda-topk_cuda; t topk-topk; t topk-conformance ) &
( t topk-cuda-gpu; t topk-cuda-conformance; t topk-index-lifecycle ) &
( t topk-cuda-resident; t topk-cuda-plugin-topk_cuda_plugin; t topk-shard-sharded ) &
wait
TOPK_GPU_CASES=2 timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $B/bin/test-topk-cuda-device_batches --test-threads=1 bad_device_batches > "$T/sanitizer.log" 2>&1; note "memcheck bad_device_batches" $?
note "tests done" 0
for r in 1 2; do for v in old mid fused; do
  [ "$(el)" -gt $(( L - 45 )) ] && { note "ab $v $r (not started, time)" -; continue; }
  timeout 60 $B/bin/cuda_probe_$v --ns 10000,50000,100000 --ds 384,768,1024 --ks 100 --batches 16,256 --no-single --batch-trials 30 --device-batches | sed "s/^{/{\"build\":\"$v\",\"round\":$r,/" >> "$T/ab-small.jsonl" 2>> "$T/probe.log"; note "ab $v $r" $?
done; done
tar czf "$OUT/y.tgz" -C "$OUT" y
cat "$T/summary.txt"; grep -h "test result\|FAILED\|panicked\|ERROR SUMMARY" "$T"/test-*.log "$T/sanitizer.log" | sort | uniq -c
python3 - "$T/ab-small.jsonl" <<'PY'
import json,sys,collections
d=collections.defaultdict(list)
for l in open(sys.argv[1]):
    r=json.loads(l)
    if r.get('kind')=='batch': d[(r['n'],r['d'],r['q'],r['queries'])].append((r['build'],round(r['median_ms']*1000,1),r['correct']))
for k in sorted(d): print(k, d[k])
PY
