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
