// Canonical norms of vectors, and the copy of a host query through mapped
// memory into the device query buffer.
#include "stage.cuh"

// Canonical norms sqrt(canon_dot(x, x)) of n vectors of length d, a warp per
// vector.
template <class R>
__device__ __forceinline__ void norms(const R* __restrict__ x, unsigned n, unsigned d,
                                      float* __restrict__ out) {
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

// The norms of f32 vectors: the queries of a cosine search.
extern "C" __global__ void __launch_bounds__(SCORE_THREADS)
    topk_norms(const float* __restrict__ x, unsigned n, unsigned d, float* __restrict__ out) {
    norms(x, n, d, out);
}

// The norms of stored corpus rows (this module's storage type), once as
// they arrive.
extern "C" __global__ void __launch_bounds__(SCORE_THREADS)
    topk_row_norms(const topk_row_t* __restrict__ x, unsigned n, unsigned d,
                   float* __restrict__ out) {
    norms(x, n, d, out);
}

// Copies a host query of n floats from `src` (page-locked host memory
// mapped into the device's address space, read across the bus) into the
// device query buffer `dst`: one block, run as the first node of a host
// query's graph in place of a copy-engine transfer (bench/gpu/NOTES.md).
extern "C" __global__ void __launch_bounds__(SCORE_THREADS)
    topk_fetch_query(const float* __restrict__ src, float* __restrict__ dst, unsigned n) {
    if (((reinterpret_cast<size_t>(src) | reinterpret_cast<size_t>(dst)) & 15u) == 0u &&
        n % 4u == 0u) {
        const float4* s4 = reinterpret_cast<const float4*>(src);
        float4* d4 = reinterpret_cast<float4*>(dst);
#pragma unroll 4
        for (unsigned i = threadIdx.x; i < n / 4u; i += blockDim.x) {
            d4[i] = s4[i];
        }
    } else {
        for (unsigned i = threadIdx.x; i < n; i += blockDim.x) {
            dst[i] = src[i];
        }
    }
}
