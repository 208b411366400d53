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

// Copies columns c0 .. c0 + STAGE_CW of rows row0 .. row0 + ROWS (those < n,
// columns < d) into `tile` (ROWS x STAGE_CW floats), the copies spread over
// THREADS threads of which this is `tid`.
template <bool VEC16, unsigned ROWS, unsigned THREADS>
__device__ __forceinline__ void stage_copy(const float* __restrict__ corpus, unsigned n,
                                           unsigned d, size_t row0, unsigned c0, float* tile,
                                           unsigned tid) {
    constexpr unsigned W = VEC16 ? 4 : 1;
#pragma unroll
    for (unsigned idx = tid; idx < ROWS * STAGE_CW / W; idx += THREADS) {
        const unsigned r = idx / (STAGE_CW / W);
        const unsigned col = (idx % (STAGE_CW / W)) * W;
        const size_t row = row0 + r;
        if (row < n && c0 + col < d) {
            if (VEC16) {
                topk_cp_async16(tile + r * STAGE_CW + col, corpus + row * d + c0 + col);
            } else {
                topk_cp_async4(tile + r * STAGE_CW + col, corpus + row * d + c0 + col);
            }
        }
    }
}

// Scores every row against the query `qsh` (shared, already loaded); qn is
// the query norm (cosine). Rows go in groups through DEPTH-deep rings of
// STAGE_CW-column tiles in shared memory at `tiles`:
// - PRIVATE: each warp streams its own groups of RT rows (a grid stride over
//   every warp of the grid) through its own ring, with no block barrier;
// - otherwise the block streams groups of WARPS * RT rows (a grid stride over
//   the blocks) through one ring, warp w scoring rows w * RT ...
// With `hist` (shared level-1 histogram, zeroed) every score is also counted
// there. Ends with every copy done.
template <int METRIC, bool VEC16, int WARPS, int RT, int DEPTH, bool PRIVATE>
__device__ __forceinline__ void stage_score(const float* __restrict__ corpus,
                                            const float* __restrict__ rnorm, unsigned n,
                                            unsigned d, const float* qsh, float qn,
                                            float* __restrict__ scores, float* tiles,
                                            unsigned* hist) {
    constexpr unsigned GROUP = PRIVATE ? RT : WARPS * RT;
    constexpr unsigned COPIERS = PRIVATE ? TOPK_WARP : WARPS * TOPK_WARP;
    constexpr unsigned TILE = GROUP * STAGE_CW;
    const unsigned lane = threadIdx.x & (TOPK_WARP - 1);
    const unsigned warp = threadIdx.x / TOPK_WARP;
    const unsigned unit = PRIVATE ? blockIdx.x * WARPS + warp : blockIdx.x;
    const unsigned units = PRIVATE ? gridDim.x * WARPS : gridDim.x;
    const unsigned tid = PRIVATE ? lane : threadIdx.x;
    float* ring = PRIVATE ? tiles + warp * DEPTH * TILE : tiles;
    const unsigned nchunks = (d + STAGE_CW - 1) / STAGE_CW;
    const unsigned ngroups = (n + GROUP - 1) / GROUP;
    const unsigned my_groups = unit < ngroups ? (ngroups - unit + units - 1) / units : 0;
    const unsigned items = my_groups * nchunks;
    // Starts the copy of item i (group i / nchunks of this unit's stride,
    // chunk i % nchunks); commits a group even when there is no item, so
    // group counting stays uniform.
    auto issue = [&](unsigned i) {
        if (i < items) {
            const size_t g = unit + (size_t)(i / nchunks) * units;
            stage_copy<VEC16, GROUP, COPIERS>(corpus, n, d, g * GROUP, (i % nchunks) * STAGE_CW,
                                              ring + (i % DEPTH) * TILE, tid);
        }
        topk_cp_async_commit();
    };
#pragma unroll
    for (unsigned i = 0; i < DEPTH - 1; ++i) {
        issue(i);
    }
    float acc[RT];
    for (unsigned i = 0; i < items; ++i) {
        topk_cp_async_wait<DEPTH - 2>();
        if (PRIVATE) {
            __syncwarp();
        } else {
            __syncthreads();
        }
        // The tile refilled here was consumed in the previous iteration,
        // which every thread sharing it has finished (the barrier above).
        issue(i + DEPTH - 1);
        const unsigned c = i % nchunks;
        if (c == 0) {
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                acc[r] = 0.0f;
            }
        }
        const unsigned sub = PRIVATE ? 0u : warp * RT;
        const float* tile = ring + (i % DEPTH) * TILE + sub * STAGE_CW;
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
            const size_t row0 = (unit + (size_t)(i / nchunks) * units) * GROUP + sub;
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                const float s = topk_butterfly(acc[r]);
                const size_t row = row0 + r;
                if (lane == (unsigned)r && row < n) {
                    const float rn = (METRIC == TOPK_COSINE) ? rnorm[row] : 0.0f;
                    const float v = topk_finish<METRIC>(s, qn, rn);
                    scores[row] = v;
                    if (hist != nullptr) {
                        atomicAdd(&hist[topk_ordered_bits(v) >> (32 - TOPK_L1_BITS)], 1u);
                    }
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
    stage_score<METRIC, VEC16, SINGLE_WARPS, SINGLE_RT, SINGLE_DEPTH, false>(
        corpus, rnorm, n, d, qsh, qn, scores, tiles, nullptr);
}

// The one-launch search of one query (a cooperative launch: every block is
// resident, so blocks can wait for each other), one 1,024-thread block per
// SM. Each warp streams its own rows (4 at a time, 3 tiles deep) and every
// score is counted in the block's level-1 histogram as it is written; a
// grid barrier hands every block the threshold of the summed histogram
// (found by the last block to arrive), every block gathers its share of
// candidates, and the last block to finish selects into `out`. Dynamic shared memory: the query (D floats,
// padded to 16 bytes), the histogram (TOPK_L1_BINS words), then the tiles,
// which the selection reuses (keys, then scratch).
#define SEARCH_WARPS 32
#define SEARCH_RT 4
#define SEARCH_DEPTH 3

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
    unsigned* h = reinterpret_cast<unsigned*>(qsh + ((d + 3u) & ~3u));
    float* tiles = reinterpret_cast<float*>(h + TOPK_L1_BINS);
    topk_zero_shared(h, TOPK_L1_BINS);
    const float qn = load_query<METRIC>(query, d, qsh, &qn_sh);
    stage_score<METRIC, VEC16, SEARCH_WARPS, SEARCH_RT, SEARCH_DEPTH, true>(
        corpus, rnorm, n, d, qsh, qn, scores, tiles, h);
    __syncthreads();
    topk_flush_hist(h, area);
    const TopkThreshold t = topk_grid_threshold(area, k);
    topk_gather_rows(scores, nullptr, n, t, blockIdx.x * TOPK_SEL_THREADS,
                     gridDim.x * TOPK_SEL_THREADS, area, cand, maybe);
    if (!topk_last_block(&area[TOPK_AREA_CTR + TOPK_CTR_GATHER], gridDim.x)) {
        return;
    }
    // Every block has read the threshold: clear it for the next search.
    if (threadIdx.x < 3) {
        area[TOPK_AREA_CTR + TOPK_CTR_TH + threadIdx.x] = 0u;
    }
    unsigned long long* keys = reinterpret_cast<unsigned long long*>(tiles);
    topk_select_block(scores, t, k, area, cand, maybe, keys,
                      reinterpret_cast<unsigned*>(keys + TOPK_CAND_CAP), out);
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
    extern "C" __global__ void __launch_bounds__(TOPK_SEL_THREADS, 1)                        \
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
