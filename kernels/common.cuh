// Shared device helpers of the topk kernels: the canonical butterfly
// (docs/CONTRACTS.md §2), the ranking key (§3) and the metric epilogue.
//
// Every floating-point operation is written with an explicit round-to-nearest
// intrinsic (__fmaf_rn, __fadd_rn, ...) so that no compiler contraction or
// reassociation can change a bit; the PTX is also built with -fmad=false.
#pragma once

#define TOPK_FULL_MASK 0xffffffffu
#define TOPK_WARP 32

// Selection state of one query, in 32-bit words ("query area"): a histogram
// of the top 12 ordered bits of every score (level 1), then counters. Every
// word is zero between searches. Level 2 (the next 12 bits of the rows in the
// level-1 threshold bin) is built in shared memory when needed.
#define TOPK_L1_BITS 12
#define TOPK_L1_BINS (1u << TOPK_L1_BITS)
#define TOPK_L2_BITS 12
#define TOPK_L2_BINS (1u << TOPK_L2_BITS)
#define TOPK_AREA_CTR TOPK_L1_BINS
// Counters: blocks of the histogram pass done, blocks of the gather done,
// candidates appended, threshold-bin rows appended, and the grid barrier of
// the one-launch search (topk_grid_sync: each barrier adds 2^31 to it, so
// its two barriers leave it at zero again).
#define TOPK_CTR_HIST 0
#define TOPK_CTR_GATHER 1
#define TOPK_CTR_CAND 2
#define TOPK_CTR_MAYBE 3
#define TOPK_CTR_BAR 4
// Literal, so that the host's mirror of it can be checked against this file.
#define TOPK_AREA_STRIDE 4104
static_assert(TOPK_AREA_STRIDE == TOPK_AREA_CTR + 8, "area layout");

// Largest candidate set the on-device exact selection sorts in shared memory.
#define TOPK_CAND_CAP 4096
// Rows of the level-1 threshold bin one query can hold for refinement.
#define TOPK_MAYBE_CAP 16384

// Largest query whose rows' ordered bits topk_select_small keeps in shared
// memory between its two passes (64 KiB).
#define TOPK_STASH_ROWS 16384

// Threads of every block that runs the selection helpers of select.cuh.
#define TOPK_SEL_THREADS 1024

// Header of each query's result row: index = status, score unused.
#define TOPK_STATUS_OK 0u
#define TOPK_STATUS_OVERFLOW 1u

enum TopkMetric { TOPK_DOT = 0, TOPK_COSINE = 1, TOPK_L2 = 2 };

// How the corpus rows of this module are stored (docs/CONTRACTS.md §14):
// TOPK_ROW_DTYPE 0 = f32, 1 = f16, 2 = bf16, set by the build of each
// row family (topk-cuda's ptx::ROW_DTYPES). A stored value is widened to
// f32 (exact for both half types) where it is read, and scored as f32.
// Queries are f32 in every module.
#ifndef TOPK_ROW_DTYPE
#define TOPK_ROW_DTYPE 0
#endif
struct TopkF16 {
    unsigned short bits;
};
struct TopkBf16 {
    unsigned short bits;
};
#if TOPK_ROW_DTYPE == 0
typedef float topk_row_t;
#elif TOPK_ROW_DTYPE == 1
typedef TopkF16 topk_row_t;
#elif TOPK_ROW_DTYPE == 2
typedef TopkBf16 topk_row_t;
#else
#error "TOPK_ROW_DTYPE must be 0 (f32), 1 (f16) or 2 (bf16)"
#endif

// A stored value as f32: the identity, cvt.f32.f16 (exact), or the bf16
// bits as the upper half of a binary32 (exact).
__device__ __forceinline__ float topk_widen(float x) { return x; }
__device__ __forceinline__ float topk_widen(TopkF16 x) {
    float f;
    asm("{ .reg .b16 h; mov.b16 h, %1; cvt.f32.f16 %0, h; }" : "=f"(f) : "h"(x.bits));
    return f;
}
__device__ __forceinline__ float topk_widen(TopkBf16 x) {
    return __uint_as_float((unsigned)x.bits << 16);
}
// A read-only stored value, widened (through the non-coherent cache).
__device__ __forceinline__ float topk_ldg_row(const float* p) { return __ldg(p); }
__device__ __forceinline__ float topk_ldg_row(const TopkF16* p) {
    return topk_widen(TopkF16{__ldg(&p->bits)});
}
__device__ __forceinline__ float topk_ldg_row(const TopkBf16* p) {
    return topk_widen(TopkBf16{__ldg(&p->bits)});
}

// One result as the host reads it: the layout of topk_core::Neighbor.
struct TopkNeighbor {
    unsigned index;
    float score;
};

// Where the exact selection of one query starts: rows whose level-1 bin is
// above `bucket` are in the top k (there are `above` < k of them); the
// `in_bucket` rows of bin `bucket` hold the rest.
struct TopkThreshold {
    unsigned bucket;
    unsigned above;
    unsigned in_bucket;
    unsigned pad;
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

// The same five butterfly steps applied to 32 outputs at once, with each
// lane's outputs placed so that no lane has to choose what to send. Lane j's
// v[i] is its partial of output i ^ topk_slot_perm(j), a permutation of the
// lane's bits: lane bits 4, 3, 2 become slot bits 2, 1, 0 and lane bits 1, 0
// become slot bits 4, 3 (topk_slot_perm(j ^ H) = topk_slot_perm(j) ^ S for
// step H's slot bit S). Step H pairs lane j with j ^ H exactly as
// topk_butterfly does, so every output is added up by the same tree
// (__fadd_rn is commutative, so the operand order within a pair does not
// matter): each lane keeps its slots with bit S clear and adds the partner's
// slot i | S, which holds the same output. That is 31 shuffles and 31 adds
// for 32 outputs (topk_butterfly per output takes 160 of each), and no
// selects. On exit v[0] holds the full sum of output topk_slot_perm(lane).
__device__ __forceinline__ unsigned topk_slot_perm(unsigned lane) {
    return ((lane >> 2) & 7u) | ((lane & 3u) << 3);
}

template <int H, int S, int DONE>
__device__ __forceinline__ void topk_reduce32_step(float (&v)[32]) {
#pragma unroll
    for (int i = 0; i < 32; ++i) {
        if ((i & (DONE | S)) == 0) {
            v[i] = __fadd_rn(v[i], __shfl_xor_sync(TOPK_FULL_MASK, v[i | S], H));
        }
    }
}

__device__ __forceinline__ float topk_reduce32(float (&v)[32]) {
    topk_reduce32_step<16, 4, 0>(v);
    topk_reduce32_step<8, 2, 4>(v);
    topk_reduce32_step<4, 1, 6>(v);
    topk_reduce32_step<2, 16, 7>(v);
    topk_reduce32_step<1, 8, 23>(v);
    return v[0];
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

// The inverse of topk_ordered_bits: the score whose ordered bits are `ob`,
// exact for every score but the zeros (one value for -0.0 and +0.0, read here
// as +0.0) and NaN (all of them 0).
__device__ __forceinline__ float topk_score_of_bits(unsigned ob) {
    return __uint_as_float((ob & 0x80000000u) ? (ob & 0x7fffffffu) : ~ob);
}

// The total ranking key of §3: larger is better, ties go to the smaller index.
__device__ __forceinline__ unsigned long long topk_rank_key(float s, unsigned index) {
    return ((unsigned long long)topk_ordered_bits(s) << 32) |
           (unsigned long long)(0xffffffffu - index);
}

__device__ __forceinline__ unsigned topk_key_index(unsigned long long key) {
    return 0xffffffffu - (unsigned)(key & 0xffffffffull);
}

// Turns a reduced accumulator into the metric's score (docs/CONTRACTS.md §2).
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

// The canonical score of one (query, row) pair, computed by one whole warp
// (lane j walks d = j, j+32, ...; then the butterfly and the metric's finish):
// listed pairs, a warp each (pairs.cuh: score_ids.cu and filter.cu's rescoring).
template <int METRIC, class R>
__device__ __forceinline__ float topk_warp_score(const float* __restrict__ qv,
                                                 const R* __restrict__ rv, unsigned d,
                                                 float qn, float rn, unsigned lane) {
    float p = 0.0f;
    for (unsigned dd = lane; dd < d; dd += TOPK_WARP) {
        p = topk_step<METRIC>(qv[dd], topk_ldg_row(rv + dd), p);
    }
    return topk_finish<METRIC>(topk_butterfly(p), qn, rn);
}

// Four consecutive stored values widened to f32, read through the
// non-coherent cache with one load: 16 bytes of f32, 8 of a half type
// (`p` aligned to that).
__device__ __forceinline__ float4 topk_ldg_row4(const float* p) {
    return __ldg(reinterpret_cast<const float4*>(p));
}
__device__ __forceinline__ float4 topk_ldg_row4(const TopkF16* p) {
    const uint2 u = __ldg(reinterpret_cast<const uint2*>(p));
    return make_float4(topk_widen(TopkF16{(unsigned short)(u.x & 0xffffu)}),
                       topk_widen(TopkF16{(unsigned short)(u.x >> 16)}),
                       topk_widen(TopkF16{(unsigned short)(u.y & 0xffffu)}),
                       topk_widen(TopkF16{(unsigned short)(u.y >> 16)}));
}
__device__ __forceinline__ float4 topk_ldg_row4(const TopkBf16* p) {
    const uint2 u = __ldg(reinterpret_cast<const uint2*>(p));
    return make_float4(topk_widen(TopkBf16{(unsigned short)(u.x & 0xffffu)}),
                       topk_widen(TopkBf16{(unsigned short)(u.x >> 16)}),
                       topk_widen(TopkBf16{(unsigned short)(u.y & 0xffffu)}),
                       topk_widen(TopkBf16{(unsigned short)(u.y >> 16)}));
}

// Lanes in a team of topk_team8_score.
#define TOPK_TEAM8 8

// The canonical score of one (query, row) pair by a team of 8 consecutive
// lanes (t = lane % 8; all 32 lanes of the warp call it together, each team
// with its own row). Lane t keeps the four canonical partials 4t..4t+3: the
// m-th value of each is column 32m + 4t + i, so one 4-value load of columns
// 32m + 4t .. 32m + 4t + 3 feeds the four partials their next values in
// canonical order (D % 4 == 0 and 16-byte aligned vectors: a load is wholly
// inside the vector or past it). AHEAD loads per lane are issued before the
// arithmetic that uses them. The butterfly's steps 16, 8 and 4 pair lane t
// with lane t ^ 4, t ^ 2 and t ^ 1 (the same slot), steps 2 and 1 pair slots
// within a lane: the tree of topk_butterfly. Every lane of the team returns
// the score.
template <int METRIC, int AHEAD, class R>
__device__ __forceinline__ float topk_team8_score(const float* __restrict__ qv,
                                                  const R* __restrict__ rv, unsigned d,
                                                  float qn, float rn, unsigned t) {
    float p0 = 0.0f, p1 = 0.0f, p2 = 0.0f, p3 = 0.0f;
    for (unsigned base = 4 * t; base < d; base += AHEAD * TOPK_WARP) {
        float4 x[AHEAD];
        float4 y[AHEAD];
#pragma unroll
        for (int u = 0; u < AHEAD; ++u) {
            const unsigned col = base + u * TOPK_WARP;
            if (col < d) {
                x[u] = topk_ldg_row4(rv + col);
                y[u] = __ldg(reinterpret_cast<const float4*>(qv + col));
            }
        }
#pragma unroll
        for (int u = 0; u < AHEAD; ++u) {
            // Only real columns take a step.
            if (base + u * TOPK_WARP < d) {
                p0 = topk_step<METRIC>(y[u].x, x[u].x, p0);
                p1 = topk_step<METRIC>(y[u].y, x[u].y, p1);
                p2 = topk_step<METRIC>(y[u].z, x[u].z, p2);
                p3 = topk_step<METRIC>(y[u].w, x[u].w, p3);
            }
        }
    }
#pragma unroll
    for (unsigned s = 4; s >= 1; s /= 2) {
        p0 = __fadd_rn(p0, __shfl_xor_sync(TOPK_FULL_MASK, p0, s));
        p1 = __fadd_rn(p1, __shfl_xor_sync(TOPK_FULL_MASK, p1, s));
        p2 = __fadd_rn(p2, __shfl_xor_sync(TOPK_FULL_MASK, p2, s));
        p3 = __fadd_rn(p3, __shfl_xor_sync(TOPK_FULL_MASK, p3, s));
    }
    return topk_finish<METRIC>(__fadd_rn(__fadd_rn(p0, p2), __fadd_rn(p1, p3)), qn, rn);
}

// Canonical norm sqrt(canon_dot(v, v)) of a vector of length d, computed by
// one whole warp (lane j walks d = j, j+32, ...; then the butterfly).
template <class R>
__device__ __forceinline__ float topk_warp_norm(const R* v, unsigned d, unsigned lane) {
    float p = 0.0f;
    for (unsigned dd = lane; dd < d; dd += TOPK_WARP) {
        const float a = topk_widen(v[dd]);
        p = __fmaf_rn(a, a, p);
    }
    return __fsqrt_rn(topk_butterfly(p));
}

// Asynchronous global-to-shared copies (cp.async), by shared-memory address
// or by generic pointer.
__device__ __forceinline__ void topk_cp_async16_s(unsigned smem, const void* gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem), "l"(gmem));
}
__device__ __forceinline__ void topk_cp_async4_s(unsigned smem, const void* gmem) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem), "l"(gmem));
}
__device__ __forceinline__ void topk_cp_async16(void* smem, const void* gmem) {
    topk_cp_async16_s((unsigned)__cvta_generic_to_shared(smem), gmem);
}
__device__ __forceinline__ void topk_cp_async4(void* smem, const void* gmem) {
    topk_cp_async4_s((unsigned)__cvta_generic_to_shared(smem), gmem);
}
__device__ __forceinline__ void topk_cp_async8_s(unsigned smem, const void* gmem) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(smem), "l"(gmem));
}
// Copies W consecutive stored values (W * sizeof(topk_row_t) bytes, `gmem`
// aligned to that) to shared memory as they are stored: cp.async for 4, 8
// or 16 bytes, a plain copy for a single 2-byte value.
template <unsigned W>
__device__ __forceinline__ void topk_cp_async_rows_s(unsigned smem, const topk_row_t* gmem) {
    constexpr unsigned BYTES = W * sizeof(topk_row_t);
    static_assert(BYTES == 16 || BYTES == 8 || BYTES == 4 || BYTES == 2, "copy width");
    if constexpr (BYTES == 16) {
        topk_cp_async16_s(smem, gmem);
    } else if constexpr (BYTES == 8) {
        topk_cp_async8_s(smem, gmem);
    } else if constexpr (BYTES == 4) {
        topk_cp_async4_s(smem, gmem);
    } else {
        const unsigned short v = __ldg(reinterpret_cast<const unsigned short*>(gmem));
        asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(smem), "h"(v));
    }
}
// 4 consecutive stored values (16 bytes of f32, 8 of a half type), and 1.
__device__ __forceinline__ void topk_cp_async_row4_s(unsigned smem, const topk_row_t* gmem) {
    topk_cp_async_rows_s<4>(smem, gmem);
}
__device__ __forceinline__ void topk_cp_async_row1_s(unsigned smem, const topk_row_t* gmem) {
    topk_cp_async_rows_s<1>(smem, gmem);
}
__device__ __forceinline__ void topk_cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void topk_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Stage marks, for the trace lab (bench/gpu/lab/trace_lab.cu) only: built
// with TOPK_TRACE, thread 0 of each block passing mark i records the global
// timer (ns) into topk_trace_first[i] (the earliest block) and
// topk_trace_last[i] (the latest). Without it (the engine's PTX) a mark is
// nothing at all. Marks sit at a kernel's entry or right after a block
// barrier, so that thread 0 stands for its block.
#define TOPK_TRACE_MARKS 16
#ifdef TOPK_TRACE
__device__ unsigned long long topk_trace_first[TOPK_TRACE_MARKS];
__device__ unsigned long long topk_trace_last[TOPK_TRACE_MARKS];
__device__ __forceinline__ void topk_mark(unsigned i) {
    if (threadIdx.x == 0) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        atomicMin(&topk_trace_first[i], t);
        atomicMax(&topk_trace_last[i], t);
    }
}
#else
__device__ __forceinline__ void topk_mark(unsigned) {}
#endif

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

// Exclusive prefix sum of one value per thread over a block of THREADS
// threads, in thread order; with TOTAL every thread also gets the block's
// total in `*total`. One block barrier: every warp scans the warps' sums
// (`warp_sums`, shared, THREADS / 32 words) for itself rather than waiting
// for one warp to scan them. `warp_sums` may be written again only after a
// later block barrier.
template <unsigned THREADS, bool TOTAL = false>
__device__ __forceinline__ unsigned topk_block_exclusive_scan(unsigned v, unsigned* warp_sums,
                                                              unsigned* total = nullptr) {
    constexpr unsigned WARPS = THREADS / TOPK_WARP;
    static_assert(WARPS * TOPK_WARP == THREADS && WARPS <= TOPK_WARP, "block scan shape");
    const unsigned lane = threadIdx.x & (TOPK_WARP - 1);
    const unsigned warp = threadIdx.x / TOPK_WARP;
    const unsigned incl = topk_warp_inclusive_scan(v, lane);
    if (lane == TOPK_WARP - 1) {
        warp_sums[warp] = incl;
    }
    __syncthreads();
    const unsigned w = lane < WARPS ? warp_sums[lane] : 0u;
    const unsigned w_incl = topk_warp_inclusive_scan(w, lane);
    if (TOTAL) {
        *total = __shfl_sync(TOPK_FULL_MASK, w_incl, WARPS - 1);
    }
    return __shfl_sync(TOPK_FULL_MASK, w_incl - w, warp) + incl - v;
}
