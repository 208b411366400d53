#!/usr/bin/env bash
# Peak resident memory of one `topk_demo --backend cpu` run over a ~1 GB
# .npy corpus (700,416 x 384 float32), against the rule of
# docs/CONTRACTS.md: peak RSS <= 1.15 x the corpus file's size.
#
#   bench/memory/peak_rss.sh [WORKDIR]
#
# TOPK_DEMO=path/to/topk_demo uses that binary instead of building
# `cargo build --release -p topk-demo`. Needs python3 (no numpy) and GNU
# time (/usr/bin/time). Prints the numbers; exits 1 when the rule is broken.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${TOPK_DEMO:-}
if [ -z "$bin" ]; then
    (cd "$root" && cargo build --release -p topk-demo)
    bin="${CARGO_TARGET_DIR:-$root/target}/release/topk_demo"
fi
work=${1:-$(mktemp -d)}
mkdir -p "$work"

# 171 blocks of 4,096 pseudo-random rows (the blocks repeat; the values do
# not matter for memory, only the size does).
python3 - "$work" <<'PY'
import array, random, struct, sys, os
work = sys.argv[1]
def npy(path, rows, dim, blocks):
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }" % (rows * blocks, dim)
    pad = 64 - (10 + len(header) + 1) % 64
    header = header + " " * pad + "\n"
    rnd = random.Random(7)
    block = array.array("f", (rnd.gauss(0.0, 1.0) for _ in range(rows * dim))).tobytes()
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        for _ in range(blocks):
            f.write(block)
npy(os.path.join(work, "corpus.npy"), 4096, 384, 171)
npy(os.path.join(work, "queries.npy"), 10, 384, 1)
PY

size=$(stat -c %s "$work/corpus.npy")
/usr/bin/time -v "$bin" --backend cpu --corpus "$work/corpus.npy" --queries "$work/queries.npy" \
    --k 10 --out "$work/r.npy" > "$work/report.txt" 2> "$work/time.txt"
rss_kib=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$work/time.txt")
wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$work/time.txt")
python3 - "$size" "$rss_kib" "$wall" <<'PY'
import sys
size, rss_kib, wall = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rss = rss_kib * 1024
ratio = rss / size
print(f"corpus file      {size} bytes ({size / 2**20:.1f} MiB)")
print(f"peak RSS         {rss} bytes ({rss / 2**20:.1f} MiB)")
print(f"peak / file      {ratio:.3f} (limit 1.150)")
print(f"wall             {wall}")
sys.exit(0 if ratio <= 1.15 else 1)
PY
