// Canonical scoring of resident corpus rows against one or many queries
// (DESIGN.md §2), fused with the first stage of selection: every score also
// lands in a per-query histogram of its top 16 ordered bits, from which
// select.cu finds a threshold without reading the scores twice.
//
// Mapping: a warp owns a group of RT rows; lane j walks d = j, j+32, ... in
// increasing order with one fmaf per step into its own partial, and the warp
// butterfly reduces the 32 partials. Several rows per warp give several
// independent loads in flight per lane, which is what keeps HBM busy.
#include "common.cuh"

#define SCORE_WARPS 8
#define SCORE_THREADS (SCORE_WARPS * TOPK_WARP)

// Writes the finished score of (query slot, row) and counts it in the histogram.
__device__ __forceinline__ void emit_score(float s, size_t slot, unsigned row, unsigned n,
                                           float* __restrict__ scores,
                                           unsigned* __restrict__ hist) {
    scores[slot * (size_t)n + row] = s;
    atomicAdd(&hist[slot * (size_t)TOPK_HIST_BINS + (topk_ordered_bits(s) >> (32 - TOPK_HIST_BITS))],
              1u);
}

// One query, staged whole in shared memory; warps stride over row groups.
template <int METRIC, int RT>
__device__ void score_single(const float* __restrict__ corpus, const float* __restrict__ rnorm,
                             unsigned n, unsigned d, const float* __restrict__ query,
                             const float* __restrict__ qnorm, float* __restrict__ scores,
                             unsigned* __restrict__ hist) {
    extern __shared__ float qsh[];
    for (unsigned i = threadIdx.x; i < d; i += blockDim.x) {
        qsh[i] = query[i];
    }
    __syncthreads();
    const float qn = (METRIC == TOPK_COSINE) ? *qnorm : 0.0f;
    const unsigned lane = threadIdx.x & (TOPK_WARP - 1);
    const unsigned warp = threadIdx.x / TOPK_WARP;
    const size_t stride = (size_t)gridDim.x * SCORE_WARPS * RT;
    for (size_t row0 = ((size_t)blockIdx.x * SCORE_WARPS + warp) * RT; row0 < n; row0 += stride) {
        const float* rows[RT];
        float acc[RT];
#pragma unroll
        for (int r = 0; r < RT; ++r) {
            // Rows past the end re-read row0 (always valid) and are discarded.
            size_t row = (row0 + r < n) ? row0 + r : row0;
            rows[r] = corpus + row * d;
            acc[r] = 0.0f;
        }
#pragma unroll 4
        for (unsigned dd = lane; dd < d; dd += TOPK_WARP) {
            float rv[RT];
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                rv[r] = __ldg(rows[r] + dd);
            }
            const float qv = qsh[dd];
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                acc[r] = topk_step<METRIC>(qv, rv[r], acc[r]);
            }
        }
#pragma unroll
        for (int r = 0; r < RT; ++r) {
            float s = topk_butterfly(acc[r]);
            size_t row = row0 + r;
            if (lane == (unsigned)r && row < n) {
                float rn = (METRIC == TOPK_COSINE) ? rnorm[row] : 0.0f;
                emit_score(topk_finish<METRIC>(s, qn, rn), 0, (unsigned)row, n, scores, hist);
            }
        }
    }
}

// A tile of QT queries against RT rows per warp. The queries pass through
// shared memory in chunks of CH values, so any D works; the block index is
// row_block * query_tiles + query_tile, so that the query tiles sharing a
// row block run together and read its rows from L2 rather than HBM.
#define BATCH_UNROLL 8
#define BATCH_CH (TOPK_WARP * BATCH_UNROLL)

template <int METRIC, int QT, int RT>
__device__ void score_batch(const float* __restrict__ corpus, const float* __restrict__ rnorm,
                            unsigned n, unsigned d, const float* __restrict__ queries,
                            unsigned nq, const float* __restrict__ qnorm,
                            float* __restrict__ scores, unsigned* __restrict__ hist) {
    __shared__ float qs[QT][BATCH_CH];
    const unsigned lane = threadIdx.x & (TOPK_WARP - 1);
    const unsigned warp = threadIdx.x / TOPK_WARP;
    const unsigned tiles = (nq + QT - 1) / QT;
    const unsigned q0 = (blockIdx.x % tiles) * QT;
    const size_t row0 = ((size_t)(blockIdx.x / tiles) * SCORE_WARPS + warp) * RT;

    const float* rows[RT];
    float acc[RT][QT];
#pragma unroll
    for (int r = 0; r < RT; ++r) {
        size_t row = (row0 + r < n) ? row0 + r : 0;
        rows[r] = corpus + row * d;
#pragma unroll
        for (int qi = 0; qi < QT; ++qi) {
            acc[r][qi] = 0.0f;
        }
    }
    const bool any_row = row0 < n;
    for (unsigned c0 = 0; c0 < d; c0 += BATCH_CH) {
        __syncthreads();
        for (unsigned i = threadIdx.x; i < QT * BATCH_CH; i += blockDim.x) {
            unsigned qi = i / BATCH_CH;
            unsigned j = i % BATCH_CH;
            unsigned q = q0 + qi;
            unsigned dd = c0 + j;
            qs[qi][j] = (q < nq && dd < d) ? queries[(size_t)q * d + dd] : 0.0f;
        }
        __syncthreads();
        if (!any_row) {
            continue;
        }
#pragma unroll
        for (int t = 0; t < BATCH_UNROLL; ++t) {
            const unsigned dd = c0 + lane + TOPK_WARP * t;
            // Only real columns take a step: an extra fma with zeros could
            // turn a -0.0 partial into +0.0.
            if (dd < d) {
                float rv[RT];
#pragma unroll
                for (int r = 0; r < RT; ++r) {
                    rv[r] = __ldg(rows[r] + dd);
                }
#pragma unroll
                for (int qi = 0; qi < QT; ++qi) {
                    const float qv = qs[qi][lane + TOPK_WARP * t];
#pragma unroll
                    for (int r = 0; r < RT; ++r) {
                        acc[r][qi] = topk_step<METRIC>(qv, rv[r], acc[r][qi]);
                    }
                }
            }
        }
    }
    if (!any_row) {
        return;
    }
#pragma unroll
    for (int r = 0; r < RT; ++r) {
        const size_t row = row0 + r;
        const float rn = (METRIC == TOPK_COSINE && row < n) ? rnorm[row] : 0.0f;
#pragma unroll
        for (int qi = 0; qi < QT; ++qi) {
            float s = topk_butterfly(acc[r][qi]);
            const unsigned q = q0 + qi;
            if (lane == (unsigned)((r * QT + qi) & (TOPK_WARP - 1)) && row < n && q < nq) {
                float qn = (METRIC == TOPK_COSINE) ? qnorm[q] : 0.0f;
                emit_score(topk_finish<METRIC>(s, qn, rn), q, (unsigned)row, n, scores, hist);
            }
        }
    }
}

// Canonical norms sqrt(canon_dot(x, x)) of n vectors of length d, a warp per
// vector: the corpus rows once at upload, the queries of a cosine search.
extern "C" __global__ void __launch_bounds__(SCORE_THREADS)
    topk_norms(const float* __restrict__ x, unsigned n, unsigned d, float* __restrict__ out) {
    const unsigned lane = threadIdx.x & (TOPK_WARP - 1);
    const size_t warps = (size_t)gridDim.x * SCORE_WARPS;
    for (size_t row = (size_t)blockIdx.x * SCORE_WARPS + threadIdx.x / TOPK_WARP; row < n;
         row += warps) {
        const float* v = x + row * d;
        float p = 0.0f;
        for (unsigned dd = lane; dd < d; dd += TOPK_WARP) {
            float a = v[dd];
            p = __fmaf_rn(a, a, p);
        }
        p = topk_butterfly(p);
        if (lane == 0) {
            out[row] = __fsqrt_rn(p);
        }
    }
}

// Scores listed (query, row) pairs, a warp per pair: the graph index's
// "distances to these neighbours" step, against the resident corpus.
template <int METRIC>
__device__ void score_ids(const float* __restrict__ corpus, const float* __restrict__ rnorm,
                          unsigned d, const float* __restrict__ queries,
                          const float* __restrict__ qnorm, const unsigned* __restrict__ ids,
                          const unsigned* __restrict__ owner, unsigned count,
                          float* __restrict__ out) {
    const unsigned lane = threadIdx.x & (TOPK_WARP - 1);
    const size_t warps = (size_t)gridDim.x * SCORE_WARPS;
    for (size_t i = (size_t)blockIdx.x * SCORE_WARPS + threadIdx.x / TOPK_WARP; i < count;
         i += warps) {
        const unsigned row = ids[i];
        const unsigned q = owner[i];
        const float* r = corpus + (size_t)row * d;
        const float* qv = queries + (size_t)q * d;
        float p = 0.0f;
        for (unsigned dd = lane; dd < d; dd += TOPK_WARP) {
            p = topk_step<METRIC>(qv[dd], __ldg(r + dd), p);
        }
        p = topk_butterfly(p);
        if (lane == 0) {
            float qn = (METRIC == TOPK_COSINE) ? qnorm[q] : 0.0f;
            float rn = (METRIC == TOPK_COSINE) ? rnorm[row] : 0.0f;
            out[i] = topk_finish<METRIC>(p, qn, rn);
        }
    }
}

#define SINGLE_RT 4
#define BATCH_QT 8
#define BATCH_RT 4

#define TOPK_SCORE_KERNELS(NAME, METRIC)                                                    \
    extern "C" __global__ void __launch_bounds__(SCORE_THREADS) topk_score1_##NAME(         \
        const float* __restrict__ corpus, const float* __restrict__ rnorm, unsigned n,      \
        unsigned d, const float* __restrict__ query, const float* __restrict__ qnorm,       \
        float* __restrict__ scores, unsigned* __restrict__ hist) {                          \
        score_single<METRIC, SINGLE_RT>(corpus, rnorm, n, d, query, qnorm, scores, hist);   \
    }                                                                                       \
    extern "C" __global__ void __launch_bounds__(SCORE_THREADS) topk_scoreb_##NAME(         \
        const float* __restrict__ corpus, const float* __restrict__ rnorm, unsigned n,      \
        unsigned d, const float* __restrict__ queries, unsigned nq,                        \
        const float* __restrict__ qnorm, float* __restrict__ scores,                        \
        unsigned* __restrict__ hist) {                                                      \
        score_batch<METRIC, BATCH_QT, BATCH_RT>(corpus, rnorm, n, d, queries, nq, qnorm,    \
                                                scores, hist);                              \
    }                                                                                       \
    extern "C" __global__ void __launch_bounds__(SCORE_THREADS) topk_score_ids_##NAME(      \
        const float* __restrict__ corpus, const float* __restrict__ rnorm, unsigned d,      \
        const float* __restrict__ queries, const float* __restrict__ qnorm,                 \
        const unsigned* __restrict__ ids, const unsigned* __restrict__ owner,               \
        unsigned count, float* __restrict__ out) {                                          \
        score_ids<METRIC>(corpus, rnorm, d, queries, qnorm, ids, owner, count, out);        \
    }

TOPK_SCORE_KERNELS(dot, TOPK_DOT)
TOPK_SCORE_KERNELS(cosine, TOPK_COSINE)
TOPK_SCORE_KERNELS(l2, TOPK_L2)
