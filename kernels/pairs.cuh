// The canonical score of listed (query, row) pairs, a warp per pair: the
// scores of listed ids (score_ids.cu, the graph index's "distances to these
// neighbours").
#ifndef TOPK_PAIRS_CUH
#define TOPK_PAIRS_CUH
#include "common.cuh"

// Scores pairs i < end, spread over the grid's warps (WARPS per block),
// indexed by I: pair i is row rows[i] against query owner[i] (its vector at
// queries + owner[i] * d, its norm qnorm[owner[i]] for cosine), the score to
// out[i].
template <int METRIC, unsigned WARPS, class I>
__device__ __forceinline__ void topk_score_pairs(const topk_row_t* __restrict__ corpus,
                                                 const float* __restrict__ rnorm, unsigned d,
                                                 const float* __restrict__ queries,
                                                 const float* __restrict__ qnorm,
                                                 const unsigned* __restrict__ rows,
                                                 const unsigned* __restrict__ owner, I end,
                                                 float* __restrict__ out) {
    const unsigned lane = threadIdx.x & (TOPK_WARP - 1);
    for (I i = (I)blockIdx.x * WARPS + threadIdx.x / TOPK_WARP; i < end;
         i += (I)gridDim.x * WARPS) {
        const unsigned row = rows[i];
        const unsigned qi = owner[i];
        const float qn = (METRIC == TOPK_COSINE) ? qnorm[qi] : 0.0f;
        const float rn = (METRIC == TOPK_COSINE) ? rnorm[row] : 0.0f;
        const float s = topk_warp_score<METRIC>(queries + (size_t)qi * d,
                                                corpus + (size_t)row * d, d, qn, rn, lane);
        if (lane == 0) {
            out[i] = s;
        }
    }
}

#endif  // TOPK_PAIRS_CUH
