#!/usr/bin/env bash
# The second call, on the same warm machine after callV.sh (same binaries):
# the §6 campaign again (campaign-2), Q = 256, K = 100 over the grid, topk
# (host and device batches) and torch (fp32 / TF32 / bf16) at the same shapes,
# then the campaign a third time (campaign-3) with the time left.
set -u
S=$(date +%s)
L=${L:-590}
T="$OUT/w"; mkdir -p "$T"
B=/tmp/gb
if [ ! -x $B/bin/topk_bench ]; then mkdir -p $B; tar xJf target/carry/v.tar.xz -C $B; cp -r bench $B/; fi
export TOPK_REQUIRE_GPU=1 TOPK_COMMIT=${TOPK_COMMIT:-unknown}
el() { echo $(( $(date +%s) - S )); }
note() { echo "$1 rc=$2 $(el)s" >> "$T/summary.txt"; }
camp() { mkdir -p "$T/c$1"; timeout $(( L - 20 - $(el) )) bash $B/bench/gpu/campaign.sh "$B" "$T/c$1" > "$T/bench-$1.log" 2>&1; note "campaign $1" $?; }
camp 2
G="--ns 10000,50000,100000,500000,1000000 --ds 384,768,1024"
timeout $(( L - 20 - $(el) )) $B/bin/cuda_probe $G --ks 100 --batches 256 --no-single --batch-trials 20 --device-batches > "$T/grid.jsonl" 2>> "$T/probe.log"; note grid $?
timeout $(( L - 20 - $(el) )) python3 $B/bench/gpu/scale_anchors.py $G --k 100 --batch 256 --trials 20 --no-upload --out "$T/torch-grid.jsonl" > "$T/torch-grid.log" 2>&1; note torch-grid $?
[ "$(el)" -lt $(( L - 110 )) ] && camp 3
tar czf "$OUT/w.tgz" -C "$OUT" w
cat "$T/summary.txt"; wc -l "$T"/c*/campaign/results.jsonl "$T/grid.jsonl" "$T/torch-grid.jsonl" 2>&1
