// Exact top-K selection over the scores and histograms written by score.cu,
// in the order of DESIGN.md §3 (64-bit key: ordered score bits, then the
// complement of the row index).
//
// 1. topk_find_threshold (common.cuh; one warp per query, in the last block of
//    the single-query scoring kernel or in topk_threshold for a batch): walks
//    the 256 coarse bins, then the 256 fine bins of the chosen coarse bin, from
//    the best down to the bin b where the running count reaches k. Rows in
//    bins >= b are the candidates; there are `count` >= k of them.
// 2. topk_gather (a grid per query): clears the fine bins (those of the
//    scores below 65,536 rows, all of them from there on), appends the
//    candidates' keys to a small buffer; the last block to finish (a ticket counter) sorts them in shared
//    memory with a bitonic network and writes the best k, with the score bits
//    read back from the score buffer so -0.0 stays -0.0.
// When a query has more than TOPK_CAND_CAP candidates (heavy ties), its header
// says so and the host finishes that query from the scores (a slower path,
// never a wrong one).
#include "common.cuh"

#define THRESH_THREADS TOPK_WARP
#define GATHER_THREADS 1024

// Header of each query's result row: index = status, score unused.
#define TOPK_STATUS_OK 0u
#define TOPK_STATUS_OVERFLOW 1u

// One warp per query (grid: queries). The batch path's threshold step; a
// single query has it done by the last block of its scoring kernel.
extern "C" __global__ void __launch_bounds__(THRESH_THREADS)
    topk_threshold(unsigned* __restrict__ hist, unsigned k, TopkThreshold* __restrict__ out) {
    topk_find_threshold(hist + (size_t)blockIdx.x * TOPK_HIST_STRIDE, k, out + blockIdx.x);
}

// Sorts `len` (a power of two) keys in shared memory, largest first.
__device__ void bitonic_sort_desc(unsigned long long* s, unsigned len) {
    for (unsigned size = 2; size <= len; size <<= 1) {
        for (unsigned stride = size >> 1; stride > 0; stride >>= 1) {
            for (unsigned i = threadIdx.x; i < len / 2; i += blockDim.x) {
                unsigned a = 2 * i - (i & (stride - 1));
                unsigned b = a + stride;
                bool desc = (a & size) == 0;
                unsigned long long x = s[a];
                unsigned long long y = s[b];
                if ((x < y) == desc) {
                    s[a] = y;
                    s[b] = x;
                }
            }
            __syncthreads();
        }
    }
}

// grid: (blocks per query, queries). `out` holds one row of `stride` results
// per query: a header, then the k best.
extern "C" __global__ void __launch_bounds__(GATHER_THREADS)
    topk_gather(const float* __restrict__ scores, unsigned n, unsigned* __restrict__ hist,
                const TopkThreshold* __restrict__ th,
                unsigned long long* __restrict__ cand, unsigned* __restrict__ cand_count,
                unsigned* __restrict__ done, unsigned k, TopkNeighbor* __restrict__ out,
                unsigned stride) {
    __shared__ unsigned long long keys[TOPK_CAND_CAP];
    __shared__ bool is_last;
    const unsigned q = blockIdx.y;
    const float* sc = scores + (size_t)q * n;
    const TopkThreshold t = th[q];
    unsigned long long* qc = cand + (size_t)q * TOPK_CAND_CAP;
    unsigned* hq = hist + (size_t)q * TOPK_HIST_STRIDE;
    const unsigned lane = threadIdx.x & (TOPK_WARP - 1);
    const bool fits = t.count <= TOPK_CAND_CAP;
    if (n >= TOPK_HIST_BINS) {
        // From 65,536 rows on, the query's blocks clear all fine bins between
        // them, coalesced (the row pass below clears none).
        uint4* h4 = reinterpret_cast<uint4*>(hq);
        for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < TOPK_HIST_BINS / 4;
             i += gridDim.x * blockDim.x) {
            h4[i] = make_uint4(0u, 0u, 0u, 0u);
        }
    }

    {
        const unsigned step = gridDim.x * blockDim.x;
        // Whole warps iterate together so the ballot below sees every lane.
        for (unsigned base = blockIdx.x * blockDim.x; base < n; base += step) {
            const unsigned i = base + threadIdx.x;
            bool take = false;
            unsigned long long key = 0;
            if (i < n) {
                float s = sc[i];
                unsigned ob = topk_ordered_bits(s);
                const unsigned bin = ob >> (32 - TOPK_HIST_BITS);
                // Below 65,536 rows, clearing the bin of every score is less
                // work than clearing every bin (each counted bin holds some
                // score). The load (L1-cached) skips bins already cleared:
                // scores crowd into few bins, and stores to the same few
                // addresses would serialise in L2.
                if (n < TOPK_HIST_BINS && hq[bin] != 0u) {
                    hq[bin] = 0u;
                }
                take = fits && bin >= t.bucket;
                key = ((unsigned long long)ob << 32) | (unsigned long long)(0xffffffffu - i);
            }
            unsigned mask = __ballot_sync(TOPK_FULL_MASK, take);
            if (mask != 0) {
                unsigned leader = __ffs(mask) - 1;
                unsigned pos0 = 0;
                if (lane == leader) {
                    pos0 = atomicAdd(&cand_count[q], (unsigned)__popc(mask));
                }
                pos0 = __shfl_sync(TOPK_FULL_MASK, pos0, leader);
                if (take) {
                    unsigned pos = pos0 + __popc(mask & ((1u << lane) - 1));
                    if (pos < TOPK_CAND_CAP) {
                        qc[pos] = key;
                    }
                }
            }
        }
    }
    // Publish this block's appends before taking a ticket.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned ticket = atomicAdd(&done[q], 1u);
        is_last = (ticket == gridDim.x - 1);
    }
    __syncthreads();
    if (!is_last) {
        return;
    }
    __threadfence();
    TopkNeighbor* row = out + (size_t)q * stride;
    if (t.count > TOPK_CAND_CAP) {
        if (threadIdx.x == 0) {
            row[0].index = TOPK_STATUS_OVERFLOW;
            row[0].score = 0.0f;
            done[q] = 0;
            cand_count[q] = 0;
        }
        return;
    }
    const unsigned count = t.count;
    unsigned len = 1;
    while (len < count) {
        len <<= 1;
    }
    for (unsigned i = threadIdx.x; i < len; i += blockDim.x) {
        // Every real key is >= 1 (the index complement of a u32 row < N is
        // nonzero), so zero padding sorts last.
        keys[i] = (i < count) ? __ldcg(qc + i) : 0ull;
    }
    __syncthreads();
    bitonic_sort_desc(keys, len);
    for (unsigned r = threadIdx.x; r < k; r += blockDim.x) {
        unsigned idx = topk_key_index(keys[r]);
        row[1 + r].index = idx;
        row[1 + r].score = __ldcg(sc + idx);
    }
    if (threadIdx.x == 0) {
        row[0].index = TOPK_STATUS_OK;
        row[0].score = 0.0f;
        done[q] = 0;
        cand_count[q] = 0;
    }
}
