// Filtered batches: exact top-K of many queries with the bulk of the
// arithmetic on TF32 tensor cores.
//
// The canonical score (docs/CONTRACTS.md §2) fixes the order of every fp32 operation,
// which tensor cores cannot follow. They can still bound it: with inputs
// rounded to TF32 (11 significant bits) and fp32 accumulation, the
// tensor-core dot product `a` of a query and a row differs from the exact dot
// product by at most about 2^-10 Σ|q_i x_i| <= 2^-10 |q| |x|, and the canonical
// score from the exact one by far less (37 roundings of 2^-24 at D = 1024).
// topk_approx_width gives a half-width w with a margin of more than three
// over that bound, so every row's canonical score lies in [lower, lower + 2w]
// with lower = s(a) - w (s the metric's score of `a`).
//
// A filtered batch then runs, per chunk of queries:
// 1. topk_approx_*: the lower bounds, into the score buffer, and those of
//    every 2^s-th row (s >= 0, the host's choice) into a sampled buffer;
// 2. the usual selection (select.cu) over the sampled lower bounds: its
//    K-th result is T, at most the K-th best canonical score (K rows have
//    lower bounds of at least T, and each canonical score is at least its
//    lower bound);
// 3. topk_filter_*: rows whose upper bound reaches T are listed (at most
//    TOPK_CAND_CAP per query). Every row whose canonical score is at least
//    the K-th best, ties included, is listed;
// 4. topk_rescore_*: each listed row's canonical score, 8 lanes per row;
// 5. topk_select_listed: the listed rows ranked by the §3 key of their
//    canonical scores: the exact answer, bit for bit.
// A chunk where a query lists more rows, or whose first selection did not
// finish on the device (too many tied lower bounds), is flagged, and the
// host runs it again on the canonical path.
#include "bounds.cuh"
#include "select.cuh"

// Block tile of the approximate scores: AX_BQ queries x AX_BR rows, staged
// AX_BK columns at a time, AX_STAGES deep, by 8 warps of 32 x 32. Staged
// vectors are padded to AX_LD floats (16-byte aligned, and the 8 x 4 lanes
// of a fragment load fall on 32 different banks). topk-cuda mirrors these
// numbers.
#define AX_BQ 64
#define AX_BR 128
#define AX_BK 32
#define AX_LD (AX_BK + 4)
#define AX_STAGES 3
#define AX_THREADS 256

// Threads of the filter and rescoring kernels, and the runs of 32 rows a
// warp of the filter reads a step (topk-cuda mirrors both).
#define FILTER_THREADS 256
#define FILTER_UNROLL 4
// 4-value loads a lane of the rescoring issues before it adds any of them.
#define RESCORE_AHEAD 8

// Stages columns k0..k0+AX_BK of the block's queries and rows into `st`
// (queries first, AX_LD floats each, then rows, AX_LD stored values each:
// a half-width row fills half of its room), zeros past nq, n and d.
// D % 4 == 0, so a piece of 4 values is either wholly inside a vector or
// past it.
__device__ __forceinline__ void approx_stage(float* st, const topk_row_t* __restrict__ corpus,
                                             unsigned n, unsigned d,
                                             const float* __restrict__ queries, unsigned nq,
                                             size_t q0, size_t r0, unsigned k0) {
    constexpr unsigned PIECES = AX_BK / 4;
    topk_row_t* rows = reinterpret_cast<topk_row_t*>(st + AX_BQ * AX_LD);
    for (unsigned i = threadIdx.x; i < (AX_BQ + AX_BR) * PIECES; i += AX_THREADS) {
        const unsigned v = i / PIECES;
        const unsigned col = k0 + (i % PIECES) * 4;
        const bool is_q = v < AX_BQ;
        const size_t idx = is_q ? q0 + v : r0 + (v - AX_BQ);
        const bool inside = col < d && (is_q ? idx < nq : idx < n);
        if (is_q) {
            float* dst = st + v * AX_LD + (i % PIECES) * 4;
            if (inside) {
                topk_cp_async16(dst, queries + idx * d + col);
            } else {
                *reinterpret_cast<float4*>(dst) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
        } else {
            topk_row_t* dst = rows + (v - AX_BQ) * AX_LD + (i % PIECES) * 4;
            if (inside) {
                topk_cp_async_row4_s((unsigned)__cvta_generic_to_shared(dst),
                                     corpus + idx * d + col);
            } else if (sizeof(topk_row_t) == 4) {
                *reinterpret_cast<float4*>(dst) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            } else {
                *reinterpret_cast<uint2*>(dst) = make_uint2(0u, 0u);
            }
        }
    }
    topk_cp_async_commit();
}

// One m16n8k8 TF32 tensor-core product, d += a b: a 16 x 8 (row-major), b
// 8 x 8 (column-major), d 16 x 8 fp32. With g = lane / 4 and t = lane % 4,
// a holds (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4); b holds (k = t,
// n = g), (t + 4, g); d holds (g, 2t), (g, 2t + 1), (g + 8, 2t),
// (g + 8, 2t + 1) (PTX ISA, "Matrix fragments for mma.m16n8k8").
__device__ __forceinline__ void topk_mma_tf32(float (&d)[4], const unsigned (&a)[4],
                                              const unsigned (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// fp32 to TF32, rounded to nearest (ties away from zero): relative error at
// most 2^-11.
__device__ __forceinline__ unsigned topk_tf32(float x) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}

// Lower bounds of the canonical scores of nq queries against n rows into
// scores[q * n + row]. Blocks take (query tile, row tile) pairs with the
// query tile varying fastest, so the blocks that share a row tile run
// together and read it from L2. Warp w owns queries 32 (w / 4) .. + 32 and
// rows 32 (w % 4) .. + 32 of the block tile: 2 x 4 products of 16 x 8.
// Dynamic shared memory: AX_STAGES x (AX_BQ + AX_BR) x AX_LD floats.
template <int METRIC>
__device__ void approx_scores(const topk_row_t* __restrict__ corpus, const float* __restrict__ rnorm,
                              unsigned n, unsigned d, const float* __restrict__ queries,
                              unsigned nq, const float* __restrict__ qnorm,
                              float* __restrict__ scores, float* __restrict__ sub,
                              unsigned sub_shift) {
    extern __shared__ float4 topk_dyn_smem[];
    float* sm = reinterpret_cast<float*>(topk_dyn_smem);
    constexpr unsigned STAGE = (AX_BQ + AX_BR) * AX_LD;
    const unsigned qtiles = (nq + AX_BQ - 1) / AX_BQ;
    const size_t q0 = (size_t)(blockIdx.x % qtiles) * AX_BQ;
    const size_t r0 = (size_t)(blockIdx.x / qtiles) * AX_BR;
    const unsigned warp = threadIdx.x / TOPK_WARP;
    const unsigned lane = threadIdx.x & (TOPK_WARP - 1);
    const unsigned g = lane / 4;
    const unsigned t = lane % 4;
    const unsigned wq = warp / 4;
    const unsigned wr = warp % 4;
    const unsigned nk = (d + AX_BK - 1) / AX_BK;

    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                acc[i][j][r] = 0.0f;
            }
        }
    }
#pragma unroll
    for (unsigned s = 0; s + 1 < AX_STAGES; ++s) {
        if (s < nk) {
            approx_stage(sm + s * STAGE, corpus, n, d, queries, nq, q0, r0, s * AX_BK);
        } else {
            topk_cp_async_commit();
        }
    }
    for (unsigned kt = 0; kt < nk; ++kt) {
        topk_cp_async_wait<AX_STAGES - 2>();
        __syncthreads();
        // The stage refilled here was read in the previous iteration, which
        // every thread has finished (the barrier above).
        const unsigned next = kt + AX_STAGES - 1;
        if (next < nk) {
            approx_stage(sm + (next % AX_STAGES) * STAGE, corpus, n, d, queries, nq, q0, r0,
                         next * AX_BK);
        } else {
            topk_cp_async_commit();
        }
        const float* qs = sm + (kt % AX_STAGES) * STAGE + (wq * 32 + g) * AX_LD + t;
        // A stored row value is exact in TF32 when it is a half type (11 or
        // 8 significant bits), so its conversion below changes nothing.
        const topk_row_t* rs =
            reinterpret_cast<const topk_row_t*>(sm + (kt % AX_STAGES) * STAGE + AX_BQ * AX_LD) +
            (wr * 32 + g) * AX_LD + t;
#pragma unroll
        for (unsigned kk = 0; kk < AX_BK; kk += 8) {
            unsigned a[2][4];
            unsigned b[4][2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const float* p = qs + i * 16 * AX_LD + kk;
                a[i][0] = topk_tf32(p[0]);
                a[i][1] = topk_tf32(p[8 * AX_LD]);
                a[i][2] = topk_tf32(p[4]);
                a[i][3] = topk_tf32(p[8 * AX_LD + 4]);
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const topk_row_t* p = rs + j * 8 * AX_LD + kk;
                b[j][0] = topk_tf32(topk_widen(p[0]));
                b[j][1] = topk_tf32(topk_widen(p[4]));
            }
#pragma unroll
            for (int i = 0; i < 2; ++i) {
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    topk_mma_tf32(acc[i][j], a[i], b[j]);
                }
            }
        }
    }
    topk_cp_async_wait<0>();
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const size_t q = q0 + wq * 32 + i * 16 + g + 8 * h;
            if (q >= nq) {
                continue;
            }
            const float qn = qnorm[q];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const size_t row = r0 + wr * 32 + j * 8 + 2 * t + c;
                    if (row < n) {
                        topk_write_lower(
                            scores, sub, sub_shift, n, q, row,
                            topk_approx_lower<METRIC>(acc[i][j][2 * h + c], qn, rnorm[row], d));
                    }
                }
            }
        }
    }
}

// Lists the rows of query blockIdx.y whose upper bound reaches T, the K-th
// lower bound its first selection found (`out`: rows of k + 1 entries,
// header then results best first), into list[q * TOPK_CAND_CAP ..], counted
// in count[q]. `flag` becomes nonzero when a query lists more than
// TOPK_CAND_CAP rows or its selection did not finish on the device: the
// host then runs the chunk on the canonical path. The bounds are
// scores[q * n + row] for every row (EMITTED false), or (EMITTED true) the
// first min(ecount[q], n) entries of the rows the Hopper bound kernel listed
// (scores[q * n + i] the lower bound of row erow[q * n + i]; n their room).
template <int METRIC, bool EMITTED>
__device__ void filter_rows(const float* __restrict__ scores, const float* __restrict__ rnorm,
                            unsigned n, unsigned d, const float* __restrict__ qnorm,
                            const TopkNeighbor* __restrict__ out, unsigned k,
                            const unsigned* __restrict__ erow,
                            const unsigned* __restrict__ ecount, unsigned* __restrict__ list,
                            unsigned* __restrict__ count, unsigned* __restrict__ flag) {
    const unsigned q = blockIdx.y;
    const TopkNeighbor* res = out + (size_t)q * (k + 1);
    if (res[0].index != TOPK_STATUS_OK) {
        if (blockIdx.x == 0 && threadIdx.x == 0) {
            atomicOr(flag, 1u);
        }
        return;
    }
    const float t = res[k].score;
    const float qn = qnorm[q];
    const unsigned lane = threadIdx.x & (TOPK_WARP - 1);
    const float* row_scores = scores + (size_t)q * n;
    const unsigned* ids = EMITTED ? erow + (size_t)q * n : nullptr;
    const size_t limit = EMITTED ? min(ecount[q], n) : n;
    unsigned* qlist = list + (size_t)q * TOPK_CAND_CAP;
    // A warp takes FILTER_UNROLL runs of 32 rows a step and issues all of
    // their loads before it looks at any: one load a lane in flight leaves
    // the stream latency-bound (measured on an H200, bench/gpu/NOTES.md).
    // The steps are warp-uniform, so the ballots below have every lane.
    const size_t stride = (size_t)gridDim.x * FILTER_THREADS * FILTER_UNROLL;
    for (size_t base = ((size_t)blockIdx.x * FILTER_THREADS + (threadIdx.x - lane)) * FILTER_UNROLL;
         base < limit; base += stride) {
        float lo[FILTER_UNROLL], rn[FILTER_UNROLL];
        unsigned id[FILTER_UNROLL];
#pragma unroll
        for (unsigned j = 0; j < FILTER_UNROLL; ++j) {
            const size_t i = base + j * TOPK_WARP + lane;
            id[j] = i < limit ? (EMITTED ? __ldcs(ids + i) : (unsigned)i) : 0u;
            lo[j] = i < limit ? __ldcs(row_scores + i) : 0.0f;
        }
#pragma unroll
        for (unsigned j = 0; j < FILTER_UNROLL; ++j) {
            rn[j] = base + j * TOPK_WARP + lane < limit ? rnorm[id[j]] : 0.0f;
        }
#pragma unroll
        for (unsigned j = 0; j < FILTER_UNROLL; ++j) {
            const bool inside = base + j * TOPK_WARP + lane < limit;
            const bool listed =
                inside && topk_listed(lo[j], topk_approx_width<METRIC>(qn, rn[j], d), t);
            const unsigned mask = __ballot_sync(TOPK_FULL_MASK, listed);
            if (mask == 0u) {
                continue;
            }
            unsigned first = 0;
            if (lane == 0) {
                first = atomicAdd(&count[q], (unsigned)__popc(mask));
            }
            first = __shfl_sync(TOPK_FULL_MASK, first, 0);
            if (listed) {
                const unsigned at = first + __popc(mask & ((1u << lane) - 1u));
                if (at < TOPK_CAND_CAP) {
                    qlist[at] = id[j];
                } else {
                    atomicOr(flag, 1u);
                }
            }
        }
    }
}

// The canonical score of every row query blockIdx.y listed, into
// scores[q * n + row], a team of 8 lanes per row (common.cuh's
// topk_team8_score: 4-value loads, RESCORE_AHEAD of them in flight a lane);
// nothing when the chunk is flagged. The loop is uniform over each warp, so
// its four teams shuffle together: a team past the list scores the last
// listed row again and writes nothing.
template <int METRIC>
__device__ void rescore_rows(const topk_row_t* __restrict__ corpus, const float* __restrict__ rnorm,
                             unsigned n, unsigned d, const float* __restrict__ queries,
                             const float* __restrict__ qnorm, const unsigned* __restrict__ list,
                             const unsigned* __restrict__ count,
                             const unsigned* __restrict__ flag, float* __restrict__ scores) {
    constexpr unsigned TEAMS = TOPK_WARP / TOPK_TEAM8;
    constexpr unsigned WARPS = FILTER_THREADS / TOPK_WARP;
    const unsigned q = blockIdx.y;
    if (*flag != 0u) {
        return;
    }
    const unsigned total = min(count[q], (unsigned)TOPK_CAND_CAP);
    const unsigned lane = threadIdx.x & (TOPK_WARP - 1);
    const unsigned t = lane % TOPK_TEAM8;
    const float* qv = queries + (size_t)q * d;
    const float qn = (METRIC == TOPK_COSINE) ? qnorm[q] : 0.0f;
    const unsigned* qlist = list + (size_t)q * TOPK_CAND_CAP;
    const unsigned step = gridDim.x * WARPS * TEAMS;
    for (unsigned base = (blockIdx.x * WARPS + threadIdx.x / TOPK_WARP) * TEAMS; base < total;
         base += step) {
        const unsigned i = base + lane / TOPK_TEAM8;
        const unsigned row = qlist[min(i, total - 1u)];
        const float rn = (METRIC == TOPK_COSINE) ? rnorm[row] : 0.0f;
        const float sc = topk_team8_score<METRIC, RESCORE_AHEAD>(
            qv, corpus + (size_t)row * d, d, qn, rn, t);
        if (i < total && t == 0) {
            scores[(size_t)q * n + row] = sc;
        }
    }
}

// grid: (1, queries), TOPK_SEL_THREADS threads. The exact best k of query
// blockIdx.y's listed rows, ranked by the §3 key of their canonical scores
// (select.cuh's ranker), into its result row; nothing when the chunk is
// flagged. Dynamic shared memory: the ranker's TOPK_CAND_CAP keys.
extern "C" __global__ void __launch_bounds__(TOPK_SEL_THREADS)
    topk_select_listed(const float* __restrict__ scores, unsigned n,
                       const unsigned* __restrict__ list, const unsigned* __restrict__ count,
                       const unsigned* __restrict__ flag, unsigned k,
                       TopkNeighbor* __restrict__ out) {
    __shared__ __align__(16) unsigned long long keys[TOPK_CAND_CAP];
    __shared__ unsigned floor;
    extern __shared__ unsigned long long topk_rank_tmp[];
    const unsigned q = blockIdx.y;
    if (*flag != 0u) {
        return;
    }
    const unsigned total = min(count[q], (unsigned)TOPK_CAND_CAP);
    const float* sc = scores + (size_t)q * n;
    topk_rank_prepare();
    if (threadIdx.x == 0) {
        floor = 0xffffffffu;
    }
    __syncthreads();
    unsigned lowest = 0xffffffffu;
    for (unsigned i = threadIdx.x; i < total; i += TOPK_SEL_THREADS) {
        const unsigned row = list[(size_t)q * TOPK_CAND_CAP + i];
        const float s = __ldcg(sc + row);
        keys[i] = topk_rank_key(s, row);
        lowest = min(lowest, topk_ordered_bits(s));
    }
    atomicMin(&floor, lowest);
    __syncthreads();
    topk_rank_write(keys, topk_rank_tmp, total, k, floor, sc, out + (size_t)q * (k + 1));
}

#define TOPK_FILTER_KERNELS(NAME, METRIC)                                                    \
    extern "C" __global__ void __launch_bounds__(AX_THREADS) topk_approx_##NAME(             \
        const topk_row_t* __restrict__ corpus, const float* __restrict__ rnorm, unsigned n,  \
        unsigned d, const float* __restrict__ queries, unsigned nq,                         \
        const float* __restrict__ qnorm, float* __restrict__ scores, float* __restrict__ sub, \
        unsigned sub_shift) {                                                                \
        approx_scores<METRIC>(corpus, rnorm, n, d, queries, nq, qnorm, scores, sub, sub_shift); \
    }                                                                                        \
    extern "C" __global__ void __launch_bounds__(FILTER_THREADS) topk_filter_##NAME(         \
        const float* __restrict__ scores, const float* __restrict__ rnorm, unsigned n,       \
        unsigned d, const float* __restrict__ qnorm, const TopkNeighbor* __restrict__ out,   \
        unsigned k, unsigned* __restrict__ list, unsigned* __restrict__ count,               \
        unsigned* __restrict__ flag) {                                                       \
        filter_rows<METRIC, false>(scores, rnorm, n, d, qnorm, out, k, nullptr, nullptr, list, \
                                   count, flag);                                             \
    }                                                                                        \
    extern "C" __global__ void __launch_bounds__(FILTER_THREADS) topk_filter_emitted_##NAME( \
        const float* __restrict__ scores, const float* __restrict__ rnorm, unsigned cap,     \
        unsigned d, const float* __restrict__ qnorm, const TopkNeighbor* __restrict__ out,   \
        unsigned k, const unsigned* __restrict__ erow, const unsigned* __restrict__ ecount,  \
        unsigned* __restrict__ list, unsigned* __restrict__ count,                           \
        unsigned* __restrict__ flag) {                                                       \
        filter_rows<METRIC, true>(scores, rnorm, cap, d, qnorm, out, k, erow, ecount, list,  \
                                  count, flag);                                              \
    }                                                                                        \
    extern "C" __global__ void __launch_bounds__(FILTER_THREADS) topk_rescore_##NAME(        \
        const topk_row_t* __restrict__ corpus, const float* __restrict__ rnorm, unsigned n,  \
        unsigned d, const float* __restrict__ queries, const float* __restrict__ qnorm,      \
        const unsigned* __restrict__ list, const unsigned* __restrict__ count,               \
        const unsigned* __restrict__ flag, float* __restrict__ scores) {                     \
        rescore_rows<METRIC>(corpus, rnorm, n, d, queries, qnorm, list, count, flag,         \
                             scores);                                                        \
    }

TOPK_FILTER_KERNELS(dot, TOPK_DOT)
TOPK_FILTER_KERNELS(cosine, TOPK_COSINE)
TOPK_FILTER_KERNELS(l2, TOPK_L2)
