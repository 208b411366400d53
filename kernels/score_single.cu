// The single-query kernels: the staged scoring of one query (optionally
// finding its threshold too) and the one-launch search (scoring and every
// selection pass in one cooperative launch).
#include "select.cuh"
#include "stage.cuh"

// The separate scoring kernel of one query: 8 warps, 4 rows each, 3 tiles.
#define SINGLE_WARPS 8
#define SINGLE_RT 4
#define SINGLE_DEPTH 3

// One query against every row. Dynamic shared memory: the query (D floats,
// padded to 16 bytes), then the tiles (topk_tiles_after). With `area` (not
// null) each block then counts its rows in the query's level-1 histogram
// and the last block finds the threshold for k into `th`, so that
// topk_gather can follow directly (the work of topk_hist, without its pass
// over the scores).
template <int METRIC, bool VEC16>
__device__ void score_single(const topk_row_t* __restrict__ corpus, const float* __restrict__ rnorm,
                             unsigned n, unsigned d, const float* __restrict__ query,
                             float* __restrict__ scores, unsigned* __restrict__ area, unsigned k,
                             TopkThreshold* __restrict__ th) {
    using ST = Stage<SINGLE_WARPS, SINGLE_RT, SINGLE_DEPTH>;
    static_assert(ST::THREADS == SCORE_THREADS, "single scoring block");
    static_assert(ST::TILE_FLOATS * SINGLE_DEPTH >= TOPK_L1_BINS, "the histogram reuses the tiles");
    extern __shared__ float4 topk_dyn_smem[];
    __shared__ float qn_sh;
    float* qsh = reinterpret_cast<float*>(topk_dyn_smem);
    float* tiles = topk_tiles_after(qsh, d);
    const float qn = load_query<METRIC>(query, d, qsh, &qn_sh);
    stage_score<METRIC, VEC16, SINGLE_WARPS, SINGLE_RT, SINGLE_DEPTH>(corpus, rnorm, n, d, qsh,
                                                                     qn, scores, tiles);
    if (area != nullptr) {
        topk_threshold_own_rows<ST::THREADS, ST::ROWS>(
            scores, n, reinterpret_cast<unsigned*>(tiles), area, k, th);
    }
}

// The one-launch search of one query (a cooperative launch: every block is
// resident, so blocks can wait for each other): 32 warps, 2 rows each, 4
// tiles. Scores every row, then between grid barriers counts the level-1
// histogram, finds the threshold (each block for itself), gathers the
// candidates, and the last block to finish selects into `out`. Dynamic shared
// memory as score_single; the tiles are reused by the selection. (Counting
// each block's own rows before one barrier, as score_single does, or each
// score in a shared histogram as it is written, measured slower here:
// bench/gpu/NOTES.md.)
#define SEARCH_WARPS 32
#define SEARCH_RT 2
#define SEARCH_DEPTH 4

template <int METRIC, bool VEC16>
__device__ void search_single(const topk_row_t* __restrict__ corpus, const float* __restrict__ rnorm,
                              unsigned n, unsigned d, const float* __restrict__ query,
                              float* __restrict__ scores, unsigned* __restrict__ area, unsigned k,
                              unsigned long long* __restrict__ cand,
                              unsigned long long* __restrict__ maybe,
                              TopkNeighbor* __restrict__ out) {
    using ST = Stage<SEARCH_WARPS, SEARCH_RT, SEARCH_DEPTH>;
    static_assert(ST::TILE_FLOATS * SEARCH_DEPTH * 4 >= 2 * TOPK_CAND_CAP * 8,
                  "the selection's keys and scratch reuse the tiles");
    extern __shared__ float4 topk_dyn_smem[];
    __shared__ float qn_sh;
    float* qsh = reinterpret_cast<float*>(topk_dyn_smem);
    float* tiles = topk_tiles_after(qsh, d);
    topk_mark(0);
    const float qn = load_query<METRIC>(query, d, qsh, &qn_sh);
    stage_score<METRIC, VEC16, SEARCH_WARPS, SEARCH_RT, SEARCH_DEPTH>(corpus, rnorm, n, d, qsh,
                                                                     qn, scores, tiles);
    topk_grid_sync(area);
    topk_mark(1);
    unsigned* h = reinterpret_cast<unsigned*>(tiles);
    topk_zero_shared(h, TOPK_L1_BINS);
    topk_hist_rows(scores, n, blockIdx.x * TOPK_SEL_THREADS, gridDim.x * TOPK_SEL_THREADS, h,
                   nullptr);
    __syncthreads();
    topk_mark(8);
    topk_flush_hist(h, area);
    topk_grid_sync(area);
    topk_mark(9);
    const TopkThreshold t = topk_threshold_block<true, false>(area, k);
    topk_mark(2);
    topk_gather_rows(scores, nullptr, n, t, blockIdx.x * TOPK_SEL_THREADS,
                     gridDim.x * TOPK_SEL_THREADS, &area[TOPK_AREA_CTR + TOPK_CTR_CAND], cand,
                     maybe);
    if (!topk_last_block(&area[TOPK_AREA_CTR + TOPK_CTR_GATHER], gridDim.x)) {
        return;
    }
    topk_mark(3);
    // Every block has read the histogram: clear it for the next search.
    for (unsigned i = threadIdx.x; i < TOPK_L1_BINS; i += TOPK_SEL_THREADS) {
        area[i] = 0u;
    }
    unsigned long long* keys = reinterpret_cast<unsigned long long*>(tiles);
    topk_select_block(scores, t, k, area, cand, maybe, keys, keys + TOPK_CAND_CAP, out);
}

// The staged single-query scoring kernel of one metric, for 16-byte copies
// (D % 4 == 0, SUFFIX empty) or 4-byte copies (SUFFIX u).
#define TOPK_SCORE1_KERNEL(NAME, METRIC, SUFFIX, VEC16)                                      \
    extern "C" __global__ void __launch_bounds__(SCORE_THREADS) topk_score1##SUFFIX##_##NAME( \
        const topk_row_t* __restrict__ corpus, const float* __restrict__ rnorm, unsigned n,       \
        unsigned d, const float* __restrict__ query, float* __restrict__ scores,            \
        unsigned* __restrict__ area, unsigned k, TopkThreshold* __restrict__ th) {           \
        score_single<METRIC, VEC16>(corpus, rnorm, n, d, query, scores, area, k, th);        \
    }

// The one-launch search kernel of one metric, copies as TOPK_SCORE1_KERNEL.
#define TOPK_SEARCH1_KERNEL(NAME, METRIC, SUFFIX, VEC16)                                     \
    extern "C" __global__ void __launch_bounds__(TOPK_SEL_THREADS)                           \
        topk_search1##SUFFIX##_##NAME(                                                       \
            const topk_row_t* __restrict__ corpus, const float* __restrict__ rnorm, unsigned n,   \
            unsigned d, const float* __restrict__ query, float* __restrict__ scores,         \
            unsigned* __restrict__ area, unsigned k, unsigned long long* __restrict__ cand,  \
            unsigned long long* __restrict__ maybe, TopkNeighbor* __restrict__ out) {        \
        search_single<METRIC, VEC16>(corpus, rnorm, n, d, query, scores, area, k, cand,     \
                                     maybe, out);                                            \
    }

#define TOPK_SINGLE_KERNELS(NAME, METRIC)                                                    \
    TOPK_SCORE1_KERNEL(NAME, METRIC, , true)                                                 \
    TOPK_SCORE1_KERNEL(NAME, METRIC, u, false)                                               \
    TOPK_SEARCH1_KERNEL(NAME, METRIC, , true)                                                \
    TOPK_SEARCH1_KERNEL(NAME, METRIC, u, false)

TOPK_SINGLE_KERNELS(dot, TOPK_DOT)
TOPK_SINGLE_KERNELS(cosine, TOPK_COSINE)
TOPK_SINGLE_KERNELS(l2, TOPK_L2)
