// Shared device helpers of the topk kernels: the canonical butterfly
// (DESIGN.md §2), the ranking key (§3) and the metric epilogue.
//
// Every floating-point operation is written with an explicit round-to-nearest
// intrinsic (__fmaf_rn, __fadd_rn, ...) so that no compiler contraction or
// reassociation can change a bit; the PTX is also built with -fmad=false.
#pragma once

#define TOPK_FULL_MASK 0xffffffffu
#define TOPK_WARP 32

// Histogram of the top 16 bits of ordered_bits(score), one per query.
#define TOPK_HIST_BITS 16
#define TOPK_HIST_BINS (1u << TOPK_HIST_BITS)
// A coarse histogram of the top 8 bits rides beside it, so that the threshold
// search reads 256 + 256 bins instead of all 65,536: coarse bin c is the sum
// of fine bins [256c, 256c + 256).
#define TOPK_COARSE_BITS 8
#define TOPK_COARSE_BINS (1u << TOPK_COARSE_BITS)
// Each query's histogram area, in 32-bit words: fine bins, coarse bins, then
// the ticket counter of the fused scoring kernel (padded to 16-byte rows).
#define TOPK_HIST_COARSE TOPK_HIST_BINS
#define TOPK_HIST_TICKET (TOPK_HIST_BINS + TOPK_COARSE_BINS)
#define TOPK_HIST_STRIDE (TOPK_HIST_BINS + TOPK_COARSE_BINS + 4)

// Largest candidate set the on-device exact selection sorts in shared memory.
#define TOPK_CAND_CAP 4096

enum TopkMetric { TOPK_DOT = 0, TOPK_COSINE = 1, TOPK_L2 = 2 };

// One result as the host reads it: the layout of topk_core::Neighbor.
struct TopkNeighbor {
    unsigned index;
    float score;
};

// Where the exact selection of one query starts: every row whose histogram
// bin is >= bucket is a candidate, and there are `count` of them (>= k).
struct TopkThreshold {
    unsigned bucket;
    unsigned count;
};

// The five-step butterfly of a warp: p[j] = p[j] + p[j ^ s], s = 16..1.
__device__ __forceinline__ float topk_butterfly(float p) {
    p = __fadd_rn(p, __shfl_xor_sync(TOPK_FULL_MASK, p, 16));
    p = __fadd_rn(p, __shfl_xor_sync(TOPK_FULL_MASK, p, 8));
    p = __fadd_rn(p, __shfl_xor_sync(TOPK_FULL_MASK, p, 4));
    p = __fadd_rn(p, __shfl_xor_sync(TOPK_FULL_MASK, p, 2));
    p = __fadd_rn(p, __shfl_xor_sync(TOPK_FULL_MASK, p, 1));
    return p;
}

// Monotone map of scores to u32 (topk_core::order::ordered_bits): -0.0 and
// +0.0 share a value, NaN maps to 0, below -inf.
__device__ __forceinline__ unsigned topk_ordered_bits(float s) {
    if (s != s) {
        return 0u;
    }
    unsigned b = (s == 0.0f) ? 0u : __float_as_uint(s);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The total ranking key of §3: larger is better, ties go to the smaller index.
__device__ __forceinline__ unsigned long long topk_rank_key(float s, unsigned index) {
    return ((unsigned long long)topk_ordered_bits(s) << 32) |
           (unsigned long long)(0xffffffffu - index);
}

__device__ __forceinline__ unsigned topk_key_index(unsigned long long key) {
    return 0xffffffffu - (unsigned)(key & 0xffffffffull);
}

// Turns a reduced accumulator into the metric's score (DESIGN.md §2).
template <int METRIC>
__device__ __forceinline__ float topk_finish(float acc, float qnorm, float rnorm) {
    if (METRIC == TOPK_DOT) {
        return acc;
    } else if (METRIC == TOPK_L2) {
        return -acc;
    } else {
        float den = __fmul_rn(qnorm, rnorm);
        return den == 0.0f ? __int_as_float(0xff800000u) : __fdiv_rn(acc, den);
    }
}

// One canonical step for lane-partial `p`: Dot and Cosine multiply the query
// value by the row value, L2 squares their difference t = r - q.
template <int METRIC>
__device__ __forceinline__ float topk_step(float q, float r, float p) {
    if (METRIC == TOPK_L2) {
        float t = __fsub_rn(r, q);
        return __fmaf_rn(t, t, p);
    } else {
        return __fmaf_rn(q, r, p);
    }
}

// Inclusive prefix sum over the lanes of a warp.
__device__ __forceinline__ unsigned topk_warp_inclusive_scan(unsigned v, unsigned lane) {
#pragma unroll
    for (unsigned s = 1; s < TOPK_WARP; s <<= 1) {
        unsigned u = __shfl_up_sync(TOPK_FULL_MASK, v, s);
        if (lane >= s) {
            v += u;
        }
    }
    return v;
}

// Among 256 bins starting at `bins` (best = highest bin), with `above` rows
// in better bins, finds the bin where the running count reaches k. Lane l
// holds the l-th best run of 8 bins. Returns the bin's offset in the run of
// 256 and, in *through, the count of rows in it and every better bin.
// Reads through L2 (__ldcg): the bins were filled by other blocks' atomics.
__device__ __forceinline__ unsigned topk_scan256(const unsigned* bins, unsigned above, unsigned k,
                                                 unsigned lane, unsigned* through) {
    const unsigned hi = TOPK_COARSE_BINS - 1 - 8 * lane;
    unsigned c[8];
    unsigned sum = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        c[j] = __ldcg(bins + hi - j);
        sum += c[j];
    }
    const unsigned incl = above + topk_warp_inclusive_scan(sum, lane);
    const unsigned before = incl - sum;
    const unsigned sel = __ballot_sync(TOPK_FULL_MASK, before < k && incl >= k);
    const unsigned owner = __ffs(sel) - 1;
    unsigned bin = 0;
    unsigned run = before;
    if (lane == owner) {
        bin = hi;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            if (run + c[j] >= k) {
                bin = hi - j;
                run += c[j];
                break;
            }
            run += c[j];
        }
    }
    *through = __shfl_sync(TOPK_FULL_MASK, run, owner);
    return __shfl_sync(TOPK_FULL_MASK, bin, owner);
}

// Run by one whole warp: finds the threshold bin of one query's histogram
// area `h` for k (1 <= k <= rows counted) and clears its coarse bins. The
// fine bins are cleared later, by the gather pass, which visits every score.
__device__ __forceinline__ void topk_find_threshold(unsigned* h, unsigned k,
                                                    TopkThreshold* __restrict__ out) {
    const unsigned lane = threadIdx.x & (TOPK_WARP - 1);
    unsigned* coarse = h + TOPK_HIST_COARSE;
    unsigned through = 0;
    const unsigned cb = topk_scan256(coarse, 0, k, lane, &through);
    // Rows in coarse bins better than cb: `through` less cb's own count.
    const unsigned above = through - __ldcg(coarse + cb);
    const unsigned fb = topk_scan256(h + cb * TOPK_COARSE_BINS, above, k, lane, &through);
    if (lane == 0) {
        out->bucket = cb * TOPK_COARSE_BINS + fb;
        out->count = through;
    }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        coarse[lane * 8 + j] = 0u;
    }
}
