// Scores of listed (query, row) pairs against the resident corpus, a warp
// per pair: the graph index's batched "distances to these neighbours" step.
#include "pairs.cuh"
#include "stage.cuh"

#define TOPK_SCORE_IDS_KERNEL(NAME, METRIC)                                                  \
    extern "C" __global__ void __launch_bounds__(SCORE_THREADS) topk_score_ids_##NAME(       \
        const topk_row_t* __restrict__ corpus, const float* __restrict__ rnorm, unsigned d,       \
        const float* __restrict__ queries, const float* __restrict__ qnorm,                  \
        const unsigned* __restrict__ ids, const unsigned* __restrict__ owner,                \
        unsigned count, float* __restrict__ out) {                                           \
        topk_score_pairs<METRIC, SCORE_WARPS, size_t>(corpus, rnorm, d, queries, qnorm, ids,  \
                                                      owner, count, out);                     \
    }

TOPK_SCORE_IDS_KERNEL(dot, TOPK_DOT)
TOPK_SCORE_IDS_KERNEL(cosine, TOPK_COSINE)
TOPK_SCORE_IDS_KERNEL(l2, TOPK_L2)
