#!/usr/bin/env bash
# Runs the campaign of two builds alternately in one call, on one GPU, and
# compares their GPU rows (compare_builds.py): a change meant to keep
# behaviour (a refactor) must show no configuration slower by more than the
# tolerance beyond the spread of two runs of the same build.
#
# Usage: compare_builds.sh BEFORE_TOPK_BENCH AFTER_TOPK_BENCH OUT_DIR [ROUNDS]
#   Each round runs `topk_bench campaign --no-data` of the before build, then
#   of the after build; OUT_DIR/{before,after}-<round>/ hold their records and
#   OUT_DIR/compare.md the table (needs ROUNDS >= 2; default 2).
set -u
BEFORE="$1"; AFTER="$2"; O="$3"; ROUNDS="${4:-2}"
HERE="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$O"
rc=0
for i in $(seq 1 "$ROUNDS"); do
  for side in before after; do
    bin="$BEFORE"; [ "$side" = after ] && bin="$AFTER"
    t0=$(date +%s)
    "$bin" campaign --out "$O/$side-$i" --no-data --no-progress > "$O/$side-$i.log" 2>&1 || rc=1
    echo "$side round $i: $(( $(date +%s) - t0 )) s (rc $rc)"
  done
done
python3 "$HERE/compare_builds.py" \
  --before "$O/before-1/results.jsonl" "$O/before-2/results.jsonl" \
  --after "$O/after-1/results.jsonl" "$O/after-2/results.jsonl" > "$O/compare.md" || rc=1
tail -3 "$O/compare.md"
exit $rc
