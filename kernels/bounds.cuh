// The tensor-core bounds of a filtered batch (docs/CONTRACTS.md §6): the
// half-width of the interval around a pair's tensor-core score that holds
// its canonical score, and the lower bound the listing starts from. Shared
// by the two bound kernels (filter.cu's mma.sync one for every device,
// filter90.cu's wgmma one for Hopper).
#ifndef TOPK_BOUNDS_CUH
#define TOPK_BOUNDS_CUH
#include "common.cuh"

// Half-width of the interval around the approximate score of a pair with
// canonical norms qn and rn, in METRIC's score (larger is better). The
// relative part 2^-8 + D 2^-22 covers both inputs reduced to TF32 (2^-10
// rounded, as filter.cu does; 2^-9 as the wgmma kernel takes them, rounded
// or truncated), fp32 accumulation in any order (D 2^-23) and the canonical
// score's own error, with a margin of more than three (two for wgmma); the
// absolute part covers inputs or products flushed to zero. A cosine pair with a zero norm has the
// canonical score -inf exactly (the caller's lower bound is -inf and the
// pair is always listed).
template <int METRIC>
__device__ __forceinline__ float topk_approx_width(float qn, float rn, unsigned d) {
    const float e = __fmaf_rn((float)d, 0x1p-22f, 0x1p-8f);
    const float tiny = __fmul_rn(0x1p-100f, __fadd_rn(__fadd_rn(qn, rn), 1.0f));
    const float p = __fmul_rn(qn, rn);
    if (METRIC == TOPK_DOT) {
        return __fmaf_rn(e, p, tiny);
    } else if (METRIC == TOPK_COSINE) {
        // The canonical finish divides by fl(qn rn) too; 2^-20 covers the
        // two divisions' roundings.
        return __fadd_rn(__fadd_rn(e, 0x1p-20f), __fdiv_rn(tiny, p));
    } else {
        // -(qn^2 + rn^2 - 2a): twice the dot product's width, plus the
        // squared norms' rounding and the canonical L2's own error.
        const float sq = __fmaf_rn(qn, qn, __fmul_rn(rn, rn));
        return __fmaf_rn(__fmul_rn(2.0f, e), p, __fmaf_rn(0x1p-15f, sq, __fmul_rn(2.0f, tiny)));
    }
}

// Lower bound of the canonical score of a pair whose tensor-core dot product
// is `a`; -inf whenever no finite bound is known, and wherever |q|^2 + |x|^2
// passes 2^100 (which bounds 2 |q| |x| and |x - q|^2), so that a canonical
// sum that could overflow (to inf or NaN) is never judged by a bound: such
// pairs are always listed.
template <int METRIC>
__device__ __forceinline__ float topk_approx_lower(float a, float qn, float rn, unsigned d) {
    if (!(__fmaf_rn(qn, qn, __fmul_rn(rn, rn)) <= 0x1p100f)) {
        return __int_as_float(0xff800000u);
    }
    float s;
    if (METRIC == TOPK_DOT) {
        s = a;
    } else if (METRIC == TOPK_COSINE) {
        const float den = __fmul_rn(qn, rn);
        if (den == 0.0f) {
            return __int_as_float(0xff800000u);
        }
        s = __fdiv_rn(a, den);
    } else {
        s = __fmaf_rn(2.0f, a, -__fmaf_rn(qn, qn, __fmul_rn(rn, rn)));
    }
    const float w = topk_approx_width<METRIC>(qn, rn, d);
    const float lo = __fsub_rn(s, w);
    return (isfinite(s) && isfinite(w) && isfinite(lo)) ? lo : __int_as_float(0xff800000u);
}

// Whether a pair whose lower bound is `lo`, with half-width `w`, is listed
// against the threshold t (at most the K-th best canonical score): its upper
// bound lo + 2w reaches t, or no finite bound is known. Both listings (the
// filter pass over every bound and the Hopper bound kernel that lists as it
// multiplies) take this test.
__device__ __forceinline__ bool topk_listed(float lo, float w, float t) {
    return lo == __int_as_float(0xff800000u) || __fmaf_rn(2.0f, w, lo) >= t;
}

// Writes the lower bound `lo` of (query q, row) into scores[q * n + row]
// and, where sub_shift > 0 and the row is a multiple of 2^sub_shift, into
// the sampled bounds sub[q * ceil(n / 2^sub_shift) + row / 2^sub_shift]:
// the rows whose K-th best lower bound the filtered batch selects first
// (docs/CONTRACTS.md §5; at most the K-th best of all rows, so still a
// valid threshold).
__device__ __forceinline__ void topk_write_lower(float* __restrict__ scores,
                                                 float* __restrict__ sub, unsigned sub_shift,
                                                 unsigned n, size_t q, size_t row, float lo) {
    scores[q * n + row] = lo;
    if (sub_shift != 0u && (row & ((1u << sub_shift) - 1u)) == 0u) {
        const size_t ns = ((size_t)n + (1u << sub_shift) - 1u) >> sub_shift;
        sub[q * ns + (row >> sub_shift)] = lo;
    }
}

#endif  // TOPK_BOUNDS_CUH
