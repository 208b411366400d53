// The canonical score of listed (query, row) pairs, a warp per pair: the
// body shared by the scores of listed ids (score_ids.cu, the graph index's
// "distances to these neighbours") and the rescoring of the rows a filtered
// query listed (filter.cu).
#ifndef TOPK_PAIRS_CUH
#define TOPK_PAIRS_CUH
#include "common.cuh"

// Scores pairs i < end, spread over the grid's warps (WARPS per block),
// indexed by I. With PER_PAIR, pair i is row rows[i] against query owner[i]
// (its vector at queries + owner[i] * d, its norm qnorm[owner[i]] for
// cosine) and the score goes to out[i]. Without it every pair belongs to
// query q: row rows[q * TOPK_CAND_CAP + i] (the query's list), the score
// to out[q * n + row] (the query's score row).
template <int METRIC, bool PER_PAIR, unsigned WARPS, class I>
__device__ __forceinline__ void topk_score_pairs(const topk_row_t* __restrict__ corpus,
                                                 const float* __restrict__ rnorm, unsigned n,
                                                 unsigned d, const float* __restrict__ queries,
                                                 const float* __restrict__ qnorm,
                                                 const unsigned* __restrict__ rows,
                                                 const unsigned* __restrict__ owner, unsigned q,
                                                 I end, float* __restrict__ out) {
    const unsigned lane = threadIdx.x & (TOPK_WARP - 1);
    const float qn_list = (!PER_PAIR && METRIC == TOPK_COSINE) ? qnorm[q] : 0.0f;
    const float* qv_list = queries + (size_t)q * d;
    for (I i = (I)blockIdx.x * WARPS + threadIdx.x / TOPK_WARP; i < end;
         i += (I)gridDim.x * WARPS) {
        const unsigned row = PER_PAIR ? rows[i] : rows[(size_t)q * TOPK_CAND_CAP + i];
        const float* qv = qv_list;
        float qn = qn_list;
        if (PER_PAIR) {
            const unsigned qi = owner[i];
            qn = (METRIC == TOPK_COSINE) ? qnorm[qi] : 0.0f;
            qv = queries + (size_t)qi * d;
        }
        const float rn = (METRIC == TOPK_COSINE) ? rnorm[row] : 0.0f;
        const float s = topk_warp_score<METRIC>(qv, corpus + (size_t)row * d, d, qn, rn, lane);
        if (lane == 0) {
            out[PER_PAIR ? (size_t)i : (size_t)q * n + row] = s;
        }
    }
}

#endif  // TOPK_PAIRS_CUH
