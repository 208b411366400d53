// Canonical scoring of resident corpus rows against one or many queries
// (DESIGN.md §2), fused with the first stage of selection: every score also
// lands in a per-query histogram of its top 16 ordered bits (and a coarse one
// of the top 8), from which the threshold is found without reading the scores
// twice; for a single query the scoring kernel's last block finds it.
//
// Mapping: a warp owns a group of RT rows; lane j walks d = j, j+32, ... in
// increasing order with one fmaf per step into its own partial, and the warp
// butterfly reduces the 32 partials. Several rows per warp give several
// independent loads in flight per lane, which is what keeps HBM busy.
#include "common.cuh"

#define SCORE_WARPS 8
#define SCORE_THREADS (SCORE_WARPS * TOPK_WARP)

// Writes the finished score of (query slot, row), counts it in the fine
// histogram (global atomics: its 65,536 bins spread the contention) and in the
// block's shared coarse histogram `coarse` (few bins, so kept on chip and
// flushed once per block by flush_coarse).
__device__ __forceinline__ void emit_score(float s, size_t slot, unsigned row, unsigned n,
                                           float* __restrict__ scores,
                                           unsigned* __restrict__ hist, unsigned* coarse) {
    scores[slot * (size_t)n + row] = s;
    const unsigned bin = topk_ordered_bits(s) >> (32 - TOPK_HIST_BITS);
    atomicAdd(&hist[slot * (size_t)TOPK_HIST_STRIDE + bin], 1u);
    atomicAdd(&coarse[bin >> (TOPK_HIST_BITS - TOPK_COARSE_BITS)], 1u);
}

// Adds a block's shared coarse counts of `nq` query slots (from `q0`) to the
// global ones; ends with the block synchronised.
__device__ __forceinline__ void flush_coarse(const unsigned* coarse, unsigned q0, unsigned nq,
                                             unsigned count, unsigned* __restrict__ hist) {
    __syncthreads();
    for (unsigned i = threadIdx.x; i < count * TOPK_COARSE_BINS; i += blockDim.x) {
        const unsigned q = q0 + i / TOPK_COARSE_BINS;
        const unsigned c = coarse[i];
        if (c != 0 && q < nq) {
            atomicAdd(&hist[(size_t)q * TOPK_HIST_STRIDE + TOPK_HIST_COARSE +
                            i % TOPK_COARSE_BINS],
                      c);
        }
    }
    __syncthreads();
}

// One query, staged whole in shared memory; warps stride over row groups.
template <int METRIC, int RT>
__device__ void score_single(const float* __restrict__ corpus, const float* __restrict__ rnorm,
                             unsigned n, unsigned d, const float* __restrict__ query,
                             const float* __restrict__ qnorm, float* __restrict__ scores,
                             unsigned* __restrict__ hist, unsigned k,
                             TopkThreshold* __restrict__ th) {
    extern __shared__ float qsh[];
    __shared__ unsigned coarse[TOPK_COARSE_BINS];
    __shared__ bool is_last;
    for (unsigned i = threadIdx.x; i < d; i += blockDim.x) {
        qsh[i] = query[i];
    }
    for (unsigned i = threadIdx.x; i < TOPK_COARSE_BINS; i += blockDim.x) {
        coarse[i] = 0u;
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
                emit_score(topk_finish<METRIC>(s, qn, rn), 0, (unsigned)row, n, scores, hist,
                           coarse);
            }
        }
    }
    flush_coarse(coarse, 0, 1, 1, hist);
    // The last block to finish finds the threshold, which saves a launch:
    // publish this block's counts, then take a ticket.
    __threadfence();
    unsigned* ticket = hist + TOPK_HIST_TICKET;
    if (threadIdx.x == 0) {
        is_last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!is_last || threadIdx.x >= TOPK_WARP) {
        return;
    }
    __threadfence();
    topk_find_threshold(hist, k, th);
    if (threadIdx.x == 0) {
        *ticket = 0u;
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
    __shared__ unsigned coarse[QT * TOPK_COARSE_BINS];
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
    for (unsigned i = threadIdx.x; i < QT * TOPK_COARSE_BINS; i += blockDim.x) {
        coarse[i] = 0u;
    }
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
                emit_score(topk_finish<METRIC>(s, qn, rn), q, (unsigned)row, n, scores, hist,
                           &coarse[qi * TOPK_COARSE_BINS]);
            }
        }
    }
    flush_coarse(coarse, q0, nq, QT, hist);
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
        float* __restrict__ scores, unsigned* __restrict__ hist, unsigned k,                \
        TopkThreshold* __restrict__ th) {                                                   \
        score_single<METRIC, SINGLE_RT>(corpus, rnorm, n, d, query, qnorm, scores, hist, k, \
                                        th);                                                \
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
