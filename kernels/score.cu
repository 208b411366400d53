// Canonical scoring of resident corpus rows against one or many queries
// (DESIGN.md §2) into a score buffer, which select.cu then reads.
//
// Mapping: a warp owns RT rows at a time; lane j walks d = j, j+32, ... in
// increasing order with one fmaf per step into its own partial, and the warp
// butterfly reduces the 32 partials. The single-query kernel stages the rows
// through shared memory with cp.async (whole 16-byte copies when D % 4 == 0),
// a few tiles deep, so that enough bytes are in flight to keep HBM busy
// without holding them in registers.
#include "common.cuh"
#include "select.cuh"

#define SCORE_WARPS 8
#define SCORE_THREADS (SCORE_WARPS * TOPK_WARP)

// Columns per staged tile.
#define STAGE_CW 128

__device__ __forceinline__ void topk_cp_async16(void* smem, const void* gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void topk_cp_async4(void* smem, const void* gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void topk_cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void topk_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Rows of a staged tile are WARPS * RT consecutive corpus rows (warp w owns
// RT of them) by STAGE_CW columns; DEPTH tiles are in flight.
template <int WARPS, int RT, int DEPTH>
struct Stage {
    static constexpr unsigned THREADS = WARPS * TOPK_WARP;
    static constexpr unsigned ROWS = WARPS * RT;
    static constexpr unsigned TILE = ROWS * STAGE_CW;
};

// Starts the copy of work item `i` of this block (row group i / nchunks of
// the block's grid stride, column chunk i % nchunks) into its tile; commits a
// group even when there is no item, so group counting stays uniform.
template <class ST, bool VEC16, int DEPTH>
__device__ __forceinline__ void stage_issue(const float* __restrict__ corpus, unsigned n,
                                            unsigned d, unsigned nchunks, unsigned items,
                                            unsigned i, float* tiles) {
    if (i < items) {
        const size_t g = blockIdx.x + (size_t)(i / nchunks) * gridDim.x;
        const unsigned c0 = (i % nchunks) * STAGE_CW;
        float* tile = tiles + (i % DEPTH) * ST::TILE;
        constexpr unsigned W = VEC16 ? 4 : 1;
        for (unsigned idx = threadIdx.x; idx < ST::TILE / W; idx += ST::THREADS) {
            const unsigned r = idx / (STAGE_CW / W);
            const unsigned col = (idx % (STAGE_CW / W)) * W;
            const size_t row = g * ST::ROWS + r;
            if (row < n && c0 + col < d) {
                if (VEC16) {
                    topk_cp_async16(tile + r * STAGE_CW + col, corpus + row * d + c0 + col);
                } else {
                    topk_cp_async4(tile + r * STAGE_CW + col, corpus + row * d + c0 + col);
                }
            }
        }
    }
    topk_cp_async_commit();
}

// Scores every row against the query `qsh` (shared, already loaded) with the
// block's grid-stride share of row groups staged through `tiles` (shared,
// DEPTH tiles). qn is the query norm (cosine). Ends with every copy done.
template <int METRIC, bool VEC16, int WARPS, int RT, int DEPTH>
__device__ __forceinline__ void stage_score(const float* __restrict__ corpus,
                                            const float* __restrict__ rnorm, unsigned n,
                                            unsigned d, const float* qsh, float qn,
                                            float* __restrict__ scores, float* tiles) {
    using ST = Stage<WARPS, RT, DEPTH>;
    const unsigned lane = threadIdx.x & (TOPK_WARP - 1);
    const unsigned warp = threadIdx.x / TOPK_WARP;
    const unsigned nchunks = (d + STAGE_CW - 1) / STAGE_CW;
    const unsigned ngroups = (n + ST::ROWS - 1) / ST::ROWS;
    const unsigned my_groups =
        blockIdx.x < ngroups ? (ngroups - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
    const unsigned items = my_groups * nchunks;
#pragma unroll
    for (unsigned i = 0; i < DEPTH - 1; ++i) {
        stage_issue<ST, VEC16, DEPTH>(corpus, n, d, nchunks, items, i, tiles);
    }
    float acc[RT];
    for (unsigned i = 0; i < items; ++i) {
        topk_cp_async_wait<DEPTH - 2>();
        __syncthreads();
        // The tile refilled here was consumed in the previous iteration,
        // which every thread has finished (the barrier above).
        stage_issue<ST, VEC16, DEPTH>(corpus, n, d, nchunks, items, i + DEPTH - 1, tiles);
        const unsigned c = i % nchunks;
        if (c == 0) {
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                acc[r] = 0.0f;
            }
        }
        const float* tile = tiles + (i % DEPTH) * ST::TILE + warp * RT * STAGE_CW;
#pragma unroll
        for (unsigned s = 0; s < STAGE_CW / TOPK_WARP; ++s) {
            const unsigned col = c * STAGE_CW + TOPK_WARP * s + lane;
            // Only real columns take a step.
            if (col < d) {
                const float qv = qsh[col];
#pragma unroll
                for (int r = 0; r < RT; ++r) {
                    acc[r] = topk_step<METRIC>(qv, tile[r * STAGE_CW + TOPK_WARP * s + lane],
                                               acc[r]);
                }
            }
        }
        if (c == nchunks - 1) {
            const size_t row0 =
                ((size_t)blockIdx.x + (size_t)(i / nchunks) * gridDim.x) * ST::ROWS + warp * RT;
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                const float s = topk_butterfly(acc[r]);
                const size_t row = row0 + r;
                if (lane == (unsigned)r && row < n) {
                    const float rn = (METRIC == TOPK_COSINE) ? rnorm[row] : 0.0f;
                    scores[row] = topk_finish<METRIC>(s, qn, rn);
                }
            }
        }
    }
    topk_cp_async_wait<0>();
}

// Loads the query into shared memory `qsh`; for cosine returns its canonical
// norm, computed by warp 0 and shared through `qn_sh`. Ends synchronised.
template <int METRIC>
__device__ __forceinline__ float load_query(const float* __restrict__ query, unsigned d,
                                            float* qsh, float* qn_sh) {
    for (unsigned i = threadIdx.x; i < d; i += blockDim.x) {
        qsh[i] = query[i];
    }
    __syncthreads();
    if (METRIC == TOPK_COSINE) {
        if (threadIdx.x < TOPK_WARP) {
            const float nq = topk_warp_norm(qsh, d, threadIdx.x);
            if (threadIdx.x == 0) {
                *qn_sh = nq;
            }
        }
        __syncthreads();
        return *qn_sh;
    }
    return 0.0f;
}

// The separate scoring kernel of one query: 8 warps, 4 rows each, 3 tiles.
#define SINGLE_WARPS 8
#define SINGLE_RT 4
#define SINGLE_DEPTH 3

// One query against every row. Dynamic shared memory: the query (D floats,
// padded to 16 bytes), then the tiles.
template <int METRIC, bool VEC16>
__device__ void score_single(const float* __restrict__ corpus, const float* __restrict__ rnorm,
                             unsigned n, unsigned d, const float* __restrict__ query,
                             float* __restrict__ scores) {
    extern __shared__ float4 topk_dyn_smem[];
    __shared__ float qn_sh;
    float* qsh = reinterpret_cast<float*>(topk_dyn_smem);
    float* tiles = qsh + ((d + 3u) & ~3u);
    const float qn = load_query<METRIC>(query, d, qsh, &qn_sh);
    stage_score<METRIC, VEC16, SINGLE_WARPS, SINGLE_RT, SINGLE_DEPTH>(corpus, rnorm, n, d, qsh,
                                                                     qn, scores, tiles);
}

// The one-launch search of one query (a cooperative launch: every block is
// resident, so blocks can wait for each other): 32 warps, 2 rows each, 4
// tiles. Scores every row, then between grid barriers counts the level-1
// histogram, finds the threshold (each block for itself), gathers the
// candidates, and the last block to finish selects into `out`. Dynamic shared
// memory as score_single; the tiles are reused by the selection.
#define SEARCH_WARPS 32
#define SEARCH_RT 2
#define SEARCH_DEPTH 4

template <int METRIC, bool VEC16>
__device__ void search_single(const float* __restrict__ corpus, const float* __restrict__ rnorm,
                              unsigned n, unsigned d, const float* __restrict__ query,
                              float* __restrict__ scores, unsigned* __restrict__ area, unsigned k,
                              unsigned long long* __restrict__ cand,
                              unsigned long long* __restrict__ maybe,
                              TopkNeighbor* __restrict__ out) {
    extern __shared__ float4 topk_dyn_smem[];
    __shared__ float qn_sh;
    float* qsh = reinterpret_cast<float*>(topk_dyn_smem);
    float* tiles = qsh + ((d + 3u) & ~3u);
    const float qn = load_query<METRIC>(query, d, qsh, &qn_sh);
    stage_score<METRIC, VEC16, SEARCH_WARPS, SEARCH_RT, SEARCH_DEPTH>(corpus, rnorm, n, d, qsh,
                                                                     qn, scores, tiles);
    topk_grid_sync(area);
    unsigned* h = reinterpret_cast<unsigned*>(tiles);
    topk_zero_shared(h, TOPK_L1_BINS);
    topk_hist_rows(scores, n, blockIdx.x * TOPK_SEL_THREADS, gridDim.x * TOPK_SEL_THREADS, h,
                   nullptr);
    __syncthreads();
    topk_flush_hist(h, area);
    topk_grid_sync(area);
    const TopkThreshold t = topk_threshold_block<true, false>(area, k);
    topk_gather_rows(scores, nullptr, n, t, blockIdx.x * TOPK_SEL_THREADS,
                     gridDim.x * TOPK_SEL_THREADS, area, cand, maybe);
    if (!topk_last_block(&area[TOPK_AREA_CTR + TOPK_CTR_GATHER], gridDim.x)) {
        return;
    }
    // Every block has read the histogram: clear it for the next search.
    for (unsigned i = threadIdx.x; i < TOPK_L1_BINS; i += TOPK_SEL_THREADS) {
        area[i] = 0u;
    }
    topk_select_block(scores, t, k, area, cand, maybe,
                      reinterpret_cast<unsigned long long*>(tiles), out);
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
                            float* __restrict__ scores) {
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
                scores[(size_t)q * n + row] = topk_finish<METRIC>(s, qn, rn);
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
        const float nv = topk_warp_norm(x + row * d, d, lane);
        if (lane == 0) {
            out[row] = nv;
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

#define BATCH_QT 8
#define BATCH_RT 4

// The staged single-query scoring kernel of one metric, for 16-byte copies
// (D % 4 == 0, SUFFIX empty) or 4-byte copies (SUFFIX u).
#define TOPK_SCORE1_KERNEL(NAME, METRIC, SUFFIX, VEC16)                                      \
    extern "C" __global__ void __launch_bounds__(SCORE_THREADS) topk_score1##SUFFIX##_##NAME( \
        const float* __restrict__ corpus, const float* __restrict__ rnorm, unsigned n,       \
        unsigned d, const float* __restrict__ query, float* __restrict__ scores) {           \
        score_single<METRIC, VEC16>(corpus, rnorm, n, d, query, scores);                     \
    }

// The one-launch search kernel of one metric, copies as TOPK_SCORE1_KERNEL.
#define TOPK_SEARCH1_KERNEL(NAME, METRIC, SUFFIX, VEC16)                                     \
    extern "C" __global__ void __launch_bounds__(TOPK_SEL_THREADS)                           \
        topk_search1##SUFFIX##_##NAME(                                                       \
            const float* __restrict__ corpus, const float* __restrict__ rnorm, unsigned n,   \
            unsigned d, const float* __restrict__ query, float* __restrict__ scores,         \
            unsigned* __restrict__ area, unsigned k, unsigned long long* __restrict__ cand,  \
            unsigned long long* __restrict__ maybe, TopkNeighbor* __restrict__ out) {        \
        search_single<METRIC, VEC16>(corpus, rnorm, n, d, query, scores, area, k, cand,     \
                                     maybe, out);                                            \
    }

#define TOPK_SCORE_KERNELS(NAME, METRIC)                                                     \
    TOPK_SCORE1_KERNEL(NAME, METRIC, , true)                                                 \
    TOPK_SCORE1_KERNEL(NAME, METRIC, u, false)                                               \
    TOPK_SEARCH1_KERNEL(NAME, METRIC, , true)                                                \
    TOPK_SEARCH1_KERNEL(NAME, METRIC, u, false)                                              \
    extern "C" __global__ void __launch_bounds__(SCORE_THREADS) topk_scoreb_##NAME(          \
        const float* __restrict__ corpus, const float* __restrict__ rnorm, unsigned n,       \
        unsigned d, const float* __restrict__ queries, unsigned nq,                         \
        const float* __restrict__ qnorm, float* __restrict__ scores) {                       \
        score_batch<METRIC, BATCH_QT, BATCH_RT>(corpus, rnorm, n, d, queries, nq, qnorm,     \
                                                scores);                                     \
    }                                                                                        \
    extern "C" __global__ void __launch_bounds__(SCORE_THREADS) topk_score_ids_##NAME(       \
        const float* __restrict__ corpus, const float* __restrict__ rnorm, unsigned d,       \
        const float* __restrict__ queries, const float* __restrict__ qnorm,                  \
        const unsigned* __restrict__ ids, const unsigned* __restrict__ owner,                \
        unsigned count, float* __restrict__ out) {                                           \
        score_ids<METRIC>(corpus, rnorm, d, queries, qnorm, ids, owner, count, out);         \
    }

TOPK_SCORE_KERNELS(dot, TOPK_DOT)
TOPK_SCORE_KERNELS(cosine, TOPK_COSINE)
TOPK_SCORE_KERNELS(l2, TOPK_L2)
