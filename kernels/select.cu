// Exact top-K selection over the scores and histograms written by score.cu,
// in the order of DESIGN.md §3 (64-bit key: ordered score bits, then the
// complement of the row index).
//
// 1. topk_threshold (one block per query): scans the 65,536-bin histogram from
//    the best bin down to the bin b where the running count reaches k. Rows in
//    bins >= b are the candidates; there are `count` >= k of them. It leaves
//    the histogram zeroed for the next search.
// 2. topk_gather (a grid per query): appends the candidates' keys to a small
//    buffer; the last block to finish (a ticket counter) sorts them in shared
//    memory with a bitonic network and writes the best k, with the score bits
//    read back from the score buffer so -0.0 stays -0.0.
// When a query has more than TOPK_CAND_CAP candidates (heavy ties), its header
// says so and the host finishes that query from the scores (a slower path,
// never a wrong one).
#include "common.cuh"

#define THRESH_THREADS 1024
#define GATHER_THREADS 1024

// Header of each query's result row: index = status, score unused.
#define TOPK_STATUS_OK 0u
#define TOPK_STATUS_OVERFLOW 1u

// Inclusive prefix sum over the lanes of a warp.
__device__ __forceinline__ unsigned warp_inclusive_scan(unsigned v, unsigned lane) {
#pragma unroll
    for (unsigned s = 1; s < TOPK_WARP; s <<= 1) {
        unsigned u = __shfl_up_sync(TOPK_FULL_MASK, v, s);
        if (lane >= s) {
            v += u;
        }
    }
    return v;
}

// Three levels, every read coalesced: each warp sums a segment of 2,048 bins
// (warp 0 the best); the segment holding the k-th best row is split into 32
// runs of 64 bins, one per lane; the run holding it is scanned two bins a lane.
extern "C" __global__ void __launch_bounds__(THRESH_THREADS)
    topk_threshold(unsigned* __restrict__ hist, unsigned k, TopkThreshold* __restrict__ out) {
    __shared__ unsigned warp_sums[THRESH_THREADS / TOPK_WARP];
    __shared__ unsigned seg_sel, seg_above;
    const unsigned warps = THRESH_THREADS / TOPK_WARP;
    const unsigned seg = TOPK_HIST_BINS / warps;  // 2048 bins per warp
    const unsigned lane = threadIdx.x & (TOPK_WARP - 1);
    const unsigned warp = threadIdx.x / TOPK_WARP;
    uint4* h4 = reinterpret_cast<uint4*>(hist + (size_t)blockIdx.x * TOPK_HIST_BINS);
    unsigned* h = hist + (size_t)blockIdx.x * TOPK_HIST_BINS;

    // Level 1: segment sums; warp w owns bins [65536 - (w+1)*2048, 65536 - w*2048).
    const unsigned seg_lo = TOPK_HIST_BINS - (warp + 1) * seg;
    unsigned sum = 0;
#pragma unroll
    for (unsigned j = 0; j < seg / 4 / TOPK_WARP; ++j) {
        uint4 v = h4[seg_lo / 4 + lane + TOPK_WARP * j];
        sum += v.x + v.y + v.z + v.w;
    }
#pragma unroll
    for (unsigned s = 16; s > 0; s >>= 1) {
        sum += __shfl_xor_sync(TOPK_FULL_MASK, sum, s);
    }
    if (lane == 0) {
        warp_sums[warp] = sum;
    }
    __syncthreads();
    if (warp == 0) {
        unsigned w = warp_sums[lane];
        unsigned incl = warp_inclusive_scan(w, lane);
        unsigned above = incl - w;
        if (above < k && incl >= k) {
            seg_sel = lane;
            seg_above = above;
        }
    }
    __syncthreads();

    // Levels 2 and 3, in warp 0: runs of 64 bins in the chosen segment.
    if (warp == 0) {
        const unsigned base = TOPK_HIST_BINS - (seg_sel + 1) * seg;
        const unsigned run = seg / TOPK_WARP;  // 64
        // Lane l's run is the l-th best: bins [base + 2048 - 64(l+1), base + 2048 - 64l).
        const unsigned run_lo = base + seg - run * (lane + 1);
        unsigned rsum = 0;
#pragma unroll
        for (unsigned j = 0; j < run / 4; ++j) {
            uint4 v = h4[run_lo / 4 + j];
            rsum += v.x + v.y + v.z + v.w;
        }
        unsigned rincl = warp_inclusive_scan(rsum, lane);
        unsigned rabove = seg_above + rincl - rsum;
        unsigned sel = __ballot_sync(TOPK_FULL_MASK, rabove < k && rabove + rsum >= k);
        unsigned owner = __ffs(sel) - 1;
        const unsigned o_lo = __shfl_sync(TOPK_FULL_MASK, run_lo, owner);
        const unsigned o_above = __shfl_sync(TOPK_FULL_MASK, rabove, owner);
        // Lane l holds bins o_lo+63-2l (better) and o_lo+62-2l.
        const unsigned hi_bin = o_lo + run - 1 - 2 * lane;
        const unsigned c_hi = h[hi_bin];
        const unsigned c_lo = h[hi_bin - 1];
        const unsigned pair = c_hi + c_lo;
        const unsigned before = o_above + warp_inclusive_scan(pair, lane) - pair;
        if (before < k && before + pair >= k) {
            const bool in_hi = before + c_hi >= k;
            out[blockIdx.x].bucket = in_hi ? hi_bin : hi_bin - 1;
            out[blockIdx.x].count = in_hi ? before + c_hi : before + pair;
        }
    }
    __syncthreads();
    // Leave the histogram zeroed for the next search (coalesced stores).
    for (unsigned i = threadIdx.x; i < TOPK_HIST_BINS / 4; i += blockDim.x) {
        h4[i] = make_uint4(0u, 0u, 0u, 0u);
    }
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
    topk_gather(const float* __restrict__ scores, unsigned n, const TopkThreshold* __restrict__ th,
                unsigned long long* __restrict__ cand, unsigned* __restrict__ cand_count,
                unsigned* __restrict__ done, unsigned k, TopkNeighbor* __restrict__ out,
                unsigned stride) {
    __shared__ unsigned long long keys[TOPK_CAND_CAP];
    __shared__ bool is_last;
    const unsigned q = blockIdx.y;
    const float* sc = scores + (size_t)q * n;
    const TopkThreshold t = th[q];
    unsigned long long* qc = cand + (size_t)q * TOPK_CAND_CAP;
    const unsigned lane = threadIdx.x & (TOPK_WARP - 1);

    if (t.count <= TOPK_CAND_CAP) {
        const unsigned step = gridDim.x * blockDim.x;
        // Whole warps iterate together so the ballot below sees every lane.
        for (unsigned base = blockIdx.x * blockDim.x; base < n; base += step) {
            const unsigned i = base + threadIdx.x;
            bool take = false;
            unsigned long long key = 0;
            if (i < n) {
                float s = sc[i];
                unsigned ob = topk_ordered_bits(s);
                take = (ob >> (32 - TOPK_HIST_BITS)) >= t.bucket;
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
