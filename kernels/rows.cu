// Kernels of the mutable resident corpus (docs/CONTRACTS.md §10): moving
// rows on the device when rows are added out of id order or compacted,
// overwriting upserted rows, hiding removed or filtered-out rows from
// selection, and scoring a list of rows (a sparse filter's allowed rows).
#include "stage.cuh"

// Row j of dst (j < m) is row map[j] of src_a, or row map[j] & ~TOPK_FROM_B
// of src_b when the flag is set: the merge of the stored rows (a) with rows
// added below the largest id (b), and compaction (a only). One block-stride
// loop over all m * d values, so consecutive threads copy consecutive values.
#define TOPK_FROM_B 0x80000000u
template <class T>
__device__ __forceinline__ void gather_rows(const T* __restrict__ src_a,
                                            const T* __restrict__ src_b,
                                            const unsigned* __restrict__ map, unsigned m,
                                            unsigned d, T* __restrict__ dst) {
    const size_t total = (size_t)m * d;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t j = i / d;
        const size_t c = i - j * d;
        const unsigned s = map[j];
        const T* src = (s & TOPK_FROM_B) ? src_b : src_a;
        dst[i] = src[(size_t)(s & ~TOPK_FROM_B) * d + c];
    }
}

// Row rows[j] of dst becomes row j of src (j < m): upserted rows replace
// the stored values of their ids in place.
template <class T>
__device__ __forceinline__ void scatter_rows(const T* __restrict__ src,
                                             const unsigned* __restrict__ rows, unsigned m,
                                             unsigned d, T* __restrict__ dst) {
    const size_t total = (size_t)m * d;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t j = i / d;
        const size_t c = i - j * d;
        dst[(size_t)rows[j] * d + c] = src[i];
    }
}

// The two moves over f32 values (row norms) and over stored rows (this
// module's storage type; the same kernels as the f32 ones in the f32 build).
extern "C" __global__ void __launch_bounds__(SCORE_THREADS)
    topk_gather_rows(const float* __restrict__ src_a, const float* __restrict__ src_b,
                     const unsigned* __restrict__ map, unsigned m, unsigned d,
                     float* __restrict__ dst) {
    gather_rows(src_a, src_b, map, m, d, dst);
}
extern "C" __global__ void __launch_bounds__(SCORE_THREADS)
    topk_gather_stored(const topk_row_t* __restrict__ src_a,
                       const topk_row_t* __restrict__ src_b, const unsigned* __restrict__ map,
                       unsigned m, unsigned d, topk_row_t* __restrict__ dst) {
    gather_rows(src_a, src_b, map, m, d, dst);
}
extern "C" __global__ void __launch_bounds__(SCORE_THREADS)
    topk_scatter_rows(const float* __restrict__ src, const unsigned* __restrict__ rows,
                      unsigned m, unsigned d, float* __restrict__ dst) {
    scatter_rows(src, rows, m, d, dst);
}
extern "C" __global__ void __launch_bounds__(SCORE_THREADS)
    topk_scatter_stored(const topk_row_t* __restrict__ src, const unsigned* __restrict__ rows,
                        unsigned m, unsigned d, topk_row_t* __restrict__ dst) {
    scatter_rows(src, rows, m, d, dst);
}

// Score i of query q (row q of nq rows of n scores) becomes NaN where bit i
// of the query's allow set is clear: words + q * stride, 64 rows a word
// (stride 0: one set for every query). NaN's ordered bits are 0, below every
// score -inf included (docs/CONTRACTS.md §3), and the host asks for at most
// as many results as rows are allowed, so a hidden row never reaches a
// result. The same pass hides rows from the filtered batch's lower bounds:
// a NaN bound is never listed (filter.cu).
extern "C" __global__ void __launch_bounds__(SCORE_THREADS)
    topk_mask_scores(float* __restrict__ scores, unsigned n, unsigned nq,
                     const unsigned long long* __restrict__ words, unsigned stride) {
    const size_t total = (size_t)n * nq;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t q = i / n;
        const unsigned r = (unsigned)(i - q * n);
        const unsigned long long w = words[q * stride + r / 64u];
        if (((w >> (r % 64u)) & 1ull) == 0ull) {
            scores[i] = __int_as_float(0x7fc00000);
        }
    }
}

// A list entry naming no row: an allow-list id the corpus does not hold.
#define TOPK_NO_ROW 0xffffffffu

// The canonical score of query q (of nq) against row list[j] (of m), a warp
// per pair, into out[q * m + j] (NaN for TOPK_NO_ROW, ranking below every
// score): the nq queries of a sparse filter's batch share the list. Pairs run row-major over j, so the queries of one row are
// scored by neighbouring warps while the row is in cache.
#define TOPK_SCORE_LIST_KERNEL(NAME, METRIC)                                                  \
    extern "C" __global__ void __launch_bounds__(SCORE_THREADS) topk_score_list_##NAME(      \
        const topk_row_t* __restrict__ corpus, const float* __restrict__ rnorm, unsigned d,  \
        const float* __restrict__ queries, const float* __restrict__ qnorm, unsigned nq,     \
        const unsigned* __restrict__ list, unsigned m, float* __restrict__ out) {            \
        const unsigned lane = threadIdx.x & (TOPK_WARP - 1);                                 \
        const size_t pairs = (size_t)m * nq;                                                 \
        for (size_t i = (size_t)blockIdx.x * SCORE_WARPS + threadIdx.x / TOPK_WARP;          \
             i < pairs; i += (size_t)gridDim.x * SCORE_WARPS) {                              \
            const size_t j = i / nq;                                                         \
            const size_t q = i - j * nq;                                                     \
            const unsigned row = list[j];                                                    \
            float s = __int_as_float(0x7fc00000);                                            \
            if (row != TOPK_NO_ROW) {                                                        \
                const float qn = (METRIC == TOPK_COSINE) ? qnorm[q] : 0.0f;                  \
                const float rn = (METRIC == TOPK_COSINE) ? rnorm[row] : 0.0f;                \
                s = topk_warp_score<METRIC>(queries + q * d, corpus + (size_t)row * d, d, qn, \
                                            rn, lane);                                       \
            }                                                                                \
            if (lane == 0) {                                                                 \
                out[q * m + j] = s;                                                          \
            }                                                                                \
        }                                                                                    \
    }

TOPK_SCORE_LIST_KERNEL(dot, TOPK_DOT)
TOPK_SCORE_LIST_KERNEL(cosine, TOPK_COSINE)
TOPK_SCORE_LIST_KERNEL(l2, TOPK_L2)

// The input rules (docs/CONTRACTS.md §4) for nq queries of d values already on
// the device, a warp per query: a non-finite value, or a squared norm above
// 2^100 summed in double, makes the query at fault. Where staged is not null
// the values are copied there as they are read (the search's staging, so the
// queries cross memory once). *verdict gets the smallest query at fault
// (0xffffffff: none), written by the last block to finish, which also resets
// words (words[0] the running minimum, 0xffffffff between launches;
// words[1] the blocks finished, 0 between launches) for the next launch: no
// copy to set them up, and verdict may be host memory mapped for the device.
extern "C" __global__ void __launch_bounds__(SCORE_THREADS)
    topk_check_queries(const float* __restrict__ q, unsigned nq, unsigned d,
                       float* __restrict__ staged, unsigned* __restrict__ words,
                       unsigned* __restrict__ verdict) {
    const unsigned lane = threadIdx.x & (TOPK_WARP - 1);
    for (size_t qi = (size_t)blockIdx.x * SCORE_WARPS + threadIdx.x / TOPK_WARP; qi < nq;
         qi += (size_t)gridDim.x * SCORE_WARPS) {
        double sq = 0.0;
        bool finite = true;
        for (unsigned j = lane; j < d; j += TOPK_WARP) {
            const float v = q[qi * d + j];
            if (staged != nullptr) {
                staged[qi * d + j] = v;
            }
            finite = finite && isfinite(v);
            sq += (double)v * (double)v;
        }
        for (int s = 16; s > 0; s >>= 1) {
            sq += __shfl_xor_sync(TOPK_FULL_MASK, sq, s);
        }
        finite = __all_sync(TOPK_FULL_MASK, finite);
        if (lane == 0 && (!finite || sq > 0x1p100)) {
            atomicMin(words, (unsigned)qi);
        }
    }
    // Every block's minimum is visible before its count: the block that
    // counts last sees them all.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned finished = atomicAdd(words + 1, 1u);
        if (finished == gridDim.x - 1u) {
            __threadfence();
            *verdict = atomicExch(words, 0xffffffffu);
            words[1] = 0u;
            __threadfence_system();
        }
    }
}

// Resolves an allow-list on the device, a thread per listed id: want[i] (of
// m, ascending) is looked up by binary search among the n stored ids (ids,
// ascending, the row order). Where it is stored and live (bit r of live, or
// every row when live is null), rows[i] = its row, bit r of bits is set (bits
// zero before) and *count grows by one; elsewhere rows[i] = TOPK_NO_ROW. The
// rows come out ascending with gaps, as the ids are.
extern "C" __global__ void __launch_bounds__(SCORE_THREADS)
    topk_resolve_ids(const unsigned long long* __restrict__ ids, unsigned n,
                     const unsigned long long* __restrict__ live,
                     const unsigned long long* __restrict__ want, unsigned m,
                     unsigned* __restrict__ rows, unsigned long long* __restrict__ bits,
                     unsigned* __restrict__ count) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < m;
         i += (size_t)gridDim.x * blockDim.x) {
        const unsigned long long id = want[i];
        unsigned lo = 0, hi = n;
        while (lo < hi) {
            const unsigned mid = lo + (hi - lo) / 2u;
            if (ids[mid] < id) {
                lo = mid + 1u;
            } else {
                hi = mid;
            }
        }
        unsigned row = TOPK_NO_ROW;
        if (lo < n && ids[lo] == id &&
            (live == nullptr || ((live[lo / 64u] >> (lo % 64u)) & 1ull) != 0ull)) {
            row = lo;
            atomicOr(bits + lo / 64u, 1ull << (lo % 64u));
            atomicAdd(count, 1u);
        }
        rows[i] = row;
    }
}
