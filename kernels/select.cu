// Exact top-K selection over the scores written by the scoring kernels, in the order of
// docs/CONTRACTS.md §3 (64-bit key: ordered score bits, then the complement of the row
// index). The steps are the helpers of select.cuh:
// - topk_select_small: one block per query does all of them, for corpora
//   small enough that one block reading every score beats two more launches;
// - topk_hist then topk_gather: a grid per query, for larger corpora.
#include "select.cuh"

// grid: (1, queries). The whole selection of each query in one block. With
// n <= TOPK_STASH_ROWS the dynamic shared memory holds every row's ordered
// bits (n words) from the histogram pass, which the gather pass reads
// instead of the scores; then (at least TOPK_CAND_CAP keys of it) the
// ranking's scratch.
extern "C" __global__ void __launch_bounds__(TOPK_SEL_THREADS)
    topk_select_small(const float* __restrict__ scores, unsigned n, unsigned* __restrict__ area,
                      unsigned long long* __restrict__ cand,
                      unsigned long long* __restrict__ maybe, unsigned k,
                      TopkNeighbor* __restrict__ out, unsigned stride) {
    // The level-1 histogram lives in the sort buffer until the sort needs it.
    __shared__ __align__(16) unsigned long long keys[TOPK_CAND_CAP];
    extern __shared__ unsigned topk_stash[];
    unsigned* stash = n <= TOPK_STASH_ROWS ? topk_stash : nullptr;
    unsigned* h = reinterpret_cast<unsigned*>(keys);
    const unsigned q = blockIdx.y;
    const float* sc = scores + (size_t)q * n;
    unsigned* qa = area + (size_t)q * TOPK_AREA_STRIDE;
    unsigned long long* qc = cand + (size_t)q * TOPK_CAND_CAP;
    unsigned long long* qm = maybe + (size_t)q * TOPK_MAYBE_CAP;
    // The list counters: one block, so shared atomics suffice.
    __shared__ unsigned ctr[2];
    if (threadIdx.x < 2) {
        ctr[threadIdx.x] = 0u;
    }
    topk_mark(0);
    topk_rank_prepare();
    topk_zero_shared(h, TOPK_L1_BINS);
    topk_hist_rows(sc, n, 0, TOPK_SEL_THREADS, h, stash);
    __syncthreads();
    topk_mark(1);
    const TopkThreshold t = topk_threshold_block<false>(h, k);
    topk_mark(2);
    TopkNeighbor* row = out + (size_t)q * stride;
    unsigned long long* tmp = reinterpret_cast<unsigned long long*>(topk_stash);
    const unsigned count = t.above + t.in_bucket;
    if (count <= TOPK_CAND_CAP) {
        // Every candidate and every row of the threshold bin fit the sort
        // buffer (the histogram's memory, free now): gathered straight into
        // it, candidates first, they are ranked without a trip through
        // global memory.
        topk_gather_rows(sc, stash, n, t, 0, TOPK_SEL_THREADS, ctr, keys, keys + t.above);
        __syncthreads();
        topk_mark(3);
        topk_rank_write(keys, tmp, count, k, t.bucket << (32 - TOPK_L1_BITS), sc, row);
        return;
    }
    topk_gather_rows(sc, stash, n, t, 0, TOPK_SEL_THREADS, ctr, qc, qm);
    // The block's own global appends are visible to it after the barrier.
    __syncthreads();
    topk_mark(3);
    topk_select_block(sc, t, k, qa, qc, qm, keys, tmp, row);
}

// grid: (blocks per query, queries). Each block counts a grid-stride share of
// its query's scores in a shared level-1 histogram and adds it to the query
// area; the query's last block (a ticket counter) finds the threshold.
extern "C" __global__ void __launch_bounds__(TOPK_SEL_THREADS)
    topk_hist(const float* __restrict__ scores, unsigned n, unsigned* __restrict__ area,
              unsigned k, TopkThreshold* __restrict__ th) {
    __shared__ __align__(16) unsigned h[TOPK_L1_BINS];
    const unsigned q = blockIdx.y;
    unsigned* qa = area + (size_t)q * TOPK_AREA_STRIDE;
    topk_zero_shared(h, TOPK_L1_BINS);
    topk_hist_rows(scores + (size_t)q * n, n, blockIdx.x * TOPK_SEL_THREADS,
                   gridDim.x * TOPK_SEL_THREADS, h, nullptr);
    __syncthreads();
    topk_flush_hist(h, qa);
    topk_last_block_threshold<TOPK_SEL_THREADS>(qa, gridDim.x, k, th + q);
}

// grid: (blocks per query, queries). Each block classifies a grid-stride
// share of the query's scores; the last block of the query to finish (a
// ticket counter) selects and writes its row of `out` (`stride` = k + 1
// entries per query: a header, then the k best). Dynamic shared memory:
// TOPK_CAND_CAP keys of the ranking's scratch.
extern "C" __global__ void __launch_bounds__(TOPK_SEL_THREADS)
    topk_gather(const float* __restrict__ scores, unsigned n, unsigned* __restrict__ area,
                const TopkThreshold* __restrict__ th, unsigned long long* __restrict__ cand,
                unsigned long long* __restrict__ maybe, unsigned k,
                TopkNeighbor* __restrict__ out, unsigned stride) {
    __shared__ __align__(16) unsigned long long keys[TOPK_CAND_CAP];
    extern __shared__ unsigned long long topk_rank_tmp[];
    const unsigned q = blockIdx.y;
    const float* sc = scores + (size_t)q * n;
    const TopkThreshold t = th[q];
    unsigned* qa = area + (size_t)q * TOPK_AREA_STRIDE;
    unsigned long long* qc = cand + (size_t)q * TOPK_CAND_CAP;
    unsigned long long* qm = maybe + (size_t)q * TOPK_MAYBE_CAP;
    topk_mark(2);
    topk_gather_rows(sc, nullptr, n, t, blockIdx.x * TOPK_SEL_THREADS,
                     gridDim.x * TOPK_SEL_THREADS, &qa[TOPK_AREA_CTR + TOPK_CTR_CAND], qc, qm);
    if (!topk_last_block(&qa[TOPK_AREA_CTR + TOPK_CTR_GATHER], gridDim.x)) {
        return;
    }
    topk_mark(3);
    topk_select_block(sc, t, k, qa, qc, qm, keys, topk_rank_tmp, out + (size_t)q * stride);
}
