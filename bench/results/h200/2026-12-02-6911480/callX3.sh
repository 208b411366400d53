#!/usr/bin/env bash
# H200 call X3: the final walk (16-bit seen tags for teams of <= 64 threads,
# buffers sized by the graph's degree, 12-step loads for the 256-thread team,
# 6 barriers per step). gpu_walk tests, memcheck and racecheck, then the
# graph sweep at ef 128/192 over batch sizes, base (the previous kernel) and
# final alternated twice, then one profile of the walk at batch 10,000.
set -u
C="$PWD/target/calls"; T="$OUT/x3"; mkdir -p "$T"; B=/tmp/bins; mkdir -p $B
tar xJf $C/bins.tar.xz -C $B
export TOPK_REQUIRE_GPU=1
S=$(date +%s)
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem --format=csv; lscpu | head -20; } > "$T/environment.txt" 2>&1
timeout 150 $B/gpu_walk --test-threads=2 > "$T/tests.log" 2>&1
echo "gpu_walk rc=$? $(( $(date +%s) - S ))s" >> "$T/summary.txt"
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 $B/gpu_walk every_team_size_gives_the_cpu_bits small_walks_match_the_cpu --test-threads=1 > "$T/memcheck.log" 2>&1
echo "memcheck rc=$? $(( $(date +%s) - S ))s" >> "$T/summary.txt"
timeout 120 compute-sanitizer --tool racecheck --error-exitcode 3 $B/gpu_walk small_walks_match_the_cpu --test-threads=1 > "$T/racecheck.log" 2>&1
echo "racecheck rc=$? $(( $(date +%s) - S ))s" >> "$T/summary.txt"
run() { # name binary extra...
  local name=$1 bin=$2; shift 2
  timeout 110 $B/$bin --out "$T/sweep-$name" --ef 128,192 --batch 1,100,1000,10000 --budget-s 0.5 --no-gpu-build "$@" > "$T/sweep-$name.log" 2>&1
  echo "sweep $name rc=$? $(( $(date +%s) - S ))s" >> "$T/summary.txt"
}
run base-1 graph_sweep_base
run final-1 graph_sweep_final
run base-2 graph_sweep_base
run final-2 graph_sweep_final
timeout 70 ncu --kernel-name regex:topk_walk --launch-count 1 --metrics gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,sm__throughput.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__bytes_read.sum,launch__occupancy_limit_shared_mem,launch__occupancy_limit_registers,launch__shared_mem_per_block_dynamic --csv $B/graph_sweep_final --out /tmp/ncu --ef 192 --batch 10000 --budget-s 0 --min-reps 1 --warmup 0 --no-gpu-build > "$T/ncu-final-t64.csv" 2> "$T/ncu-final-t64.log"
echo "ncu rc=$? $(( $(date +%s) - S ))s" >> "$T/summary.txt"
tar czf "$OUT/x3.tgz" -C "$OUT" x3
cat "$T/summary.txt"; grep -h "test result\|FAILED\|panicked\|ERROR SUMMARY\|RACECHECK SUMMARY" "$T"/*.log | head -20
for t in base-1 final-1 base-2 final-2; do echo "== $t"; python3 -c "
import json,sys
for l in open(sys.argv[1]):
    r=json.loads(l)
    if r.get('what')=='search' and (r['method']=='gpu-graph' or (r['batch'] in (1,10000) and r['method']!='exact-gpu')):
        print(r['method'][:10], r['batch'], r['ef'], round(r['qps']), round(r['latency_median_ms'],3), round(r['recall'],4), r['differs_from_one_call_bits'])
    elif r.get('what','').startswith('check'): print(r['ef'], 'bits_differ', r['bits_differ'], 'host', r['host_answers'])
" "$T/sweep-$t/raw.jsonl" 2>&1 | head -30; done
grep -h "topk_walk" "$T"/ncu-final-t64.csv | cut -c1-300
