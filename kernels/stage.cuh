// Canonical scoring of resident corpus rows (docs/CONTRACTS.md §2), shared by
// the scoring kernels: the block sizes, rows staged through shared memory
// with cp.async, and the query loaded beside them.
//
// Mapping: a warp owns RT rows at a time; lane j walks d = j, j+32, ... in
// increasing order with one fmaf per step into its own partial, and the warp
// butterfly reduces the 32 partials. The staged kernels bring the rows
// through shared memory with cp.async (whole 16-byte copies when D % 4 == 0),
// a few tiles deep, so that enough bytes are in flight to keep HBM busy
// without holding them in registers.
#ifndef TOPK_STAGE_CUH
#define TOPK_STAGE_CUH
#include "common.cuh"

#define SCORE_WARPS 8
#define SCORE_THREADS (SCORE_WARPS * TOPK_WARP)

// Stored values per staged tile row: 128 f32 or 256 halves, 512 bytes
// either way, so that a half-width corpus keeps as many bytes in flight (and
// the host sizes the tiles alike for every storage type).
#define STAGE_CW (512 / (unsigned)sizeof(topk_row_t))

// Rows of a staged tile are WARPS * RT consecutive corpus rows (warp w owns
// RT of them) by STAGE_CW columns; DEPTH tiles are in flight. TILE counts
// stored values, TILE_FLOATS the f32 room a tile takes (the same bytes).
template <int WARPS, int RT, int DEPTH>
struct Stage {
    static constexpr unsigned THREADS = WARPS * TOPK_WARP;
    static constexpr unsigned ROWS = WARPS * RT;
    static constexpr unsigned TILE = ROWS * STAGE_CW;
    static constexpr unsigned TILE_FLOATS = TILE * sizeof(topk_row_t) / 4;
};

// Starts the copy of work item `i` of this block (row group i / nchunks of
// the block's grid stride, column chunk i % nchunks) into its tile; commits a
// group even when there is no item, so group counting stays uniform.
template <class ST, unsigned W, int DEPTH>
__device__ __forceinline__ void stage_issue(const topk_row_t* __restrict__ corpus, unsigned n,
                                            unsigned d, unsigned nchunks, unsigned items,
                                            unsigned i, topk_row_t* tiles) {
    if (i < items) {
        const size_t g = blockIdx.x + (size_t)(i / nchunks) * gridDim.x;
        const unsigned c0 = (i % nchunks) * STAGE_CW;
        topk_row_t* tile = tiles + (i % DEPTH) * ST::TILE;
        for (unsigned idx = threadIdx.x; idx < ST::TILE / W; idx += ST::THREADS) {
            const unsigned r = idx / (STAGE_CW / W);
            const unsigned col = (idx % (STAGE_CW / W)) * W;
            const size_t row = g * ST::ROWS + r;
            if (row < n && c0 + col < d) {
                const unsigned dst =
                    (unsigned)__cvta_generic_to_shared(tile + r * STAGE_CW + col);
                topk_cp_async_rows_s<W>(dst, corpus + row * d + c0 + col);
            }
        }
    }
    topk_cp_async_commit();
}

// Scores every row against the query `qsh` (shared, already loaded) with the
// block's grid-stride share of row groups staged through `tiles` (shared,
// DEPTH tiles, the stored values as they are stored: a half-width tile
// fills half of its f32-sized room). qn is the query norm (cosine). Ends
// with every copy done.
template <int METRIC, unsigned W, int WARPS, int RT, int DEPTH>
__device__ __forceinline__ void stage_score_w(const topk_row_t* __restrict__ corpus,
                                              const float* __restrict__ rnorm, unsigned n,
                                              unsigned d, const float* qsh, float qn,
                                              float* __restrict__ scores, float* tiles_room) {
    topk_row_t* tiles = reinterpret_cast<topk_row_t*>(tiles_room);
    using ST = Stage<WARPS, RT, DEPTH>;
    const unsigned lane = threadIdx.x & (TOPK_WARP - 1);
    const unsigned warp = threadIdx.x / TOPK_WARP;
    const unsigned nchunks = (d + STAGE_CW - 1) / STAGE_CW;
    const unsigned ngroups = (n + ST::ROWS - 1) / ST::ROWS;
    const unsigned my_groups =
        blockIdx.x < ngroups ? (ngroups - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
    const unsigned items = my_groups * nchunks;
#pragma unroll
    for (unsigned i = 0; i < DEPTH - 1; ++i) {
        stage_issue<ST, W, DEPTH>(corpus, n, d, nchunks, items, i, tiles);
    }
    float acc[RT];
    for (unsigned i = 0; i < items; ++i) {
        topk_cp_async_wait<DEPTH - 2>();
        __syncthreads();
        // The tile refilled here was consumed in the previous iteration,
        // which every thread has finished (the barrier above).
        stage_issue<ST, W, DEPTH>(corpus, n, d, nchunks, items, i + DEPTH - 1, tiles);
        const unsigned c = i % nchunks;
        if (c == 0) {
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                acc[r] = 0.0f;
            }
        }
        const topk_row_t* tile = tiles + (i % DEPTH) * ST::TILE + warp * RT * STAGE_CW;
#pragma unroll
        for (unsigned s = 0; s < STAGE_CW / TOPK_WARP; ++s) {
            const unsigned col = c * STAGE_CW + TOPK_WARP * s + lane;
            // Only real columns take a step.
            if (col < d) {
                const float qv = qsh[col];
#pragma unroll
                for (int r = 0; r < RT; ++r) {
                    acc[r] = topk_step<METRIC>(
                        qv, topk_widen(tile[r * STAGE_CW + TOPK_WARP * s + lane]), acc[r]);
                }
            }
        }
        if (c == nchunks - 1) {
            const size_t row0 =
                ((size_t)blockIdx.x + (size_t)(i / nchunks) * gridDim.x) * ST::ROWS + warp * RT;
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                const float s = topk_butterfly(acc[r]);
                const size_t row = row0 + r;
                if (lane == (unsigned)r && row < n) {
                    const float rn = (METRIC == TOPK_COSINE) ? rnorm[row] : 0.0f;
                    scores[row] = topk_finish<METRIC>(s, qn, rn);
                }
            }
        }
    }
    topk_cp_async_wait<0>();
}

// stage_score_w with whole 16-byte copies where the rows allow them (VEC16:
// D % 4 == 0; a half-width row needs D % 8 == 0 for them, else it takes
// 8-byte copies of 4 values), else single values.
template <int METRIC, bool VEC16, int WARPS, int RT, int DEPTH>
__device__ __forceinline__ void stage_score(const topk_row_t* __restrict__ corpus,
                                            const float* __restrict__ rnorm, unsigned n,
                                            unsigned d, const float* qsh, float qn,
                                            float* __restrict__ scores, float* tiles_room) {
    if constexpr (VEC16 && sizeof(topk_row_t) == 2) {
        if (d % 8u == 0u) {
            stage_score_w<METRIC, 8, WARPS, RT, DEPTH>(corpus, rnorm, n, d, qsh, qn, scores,
                                                       tiles_room);
            return;
        }
    }
    stage_score_w<METRIC, VEC16 ? 4u : 1u, WARPS, RT, DEPTH>(corpus, rnorm, n, d, qsh, qn,
                                                             scores, tiles_room);
}

// Dynamic shared memory follows the kernel's static shared variables, so its
// start moves with them; staged tiles that do not start on a 128-byte
// boundary stream 20-30 % slower (bench/gpu/NOTES.md). The staged
// kernels place their tiles at the first such boundary after the query,
// and the host allows TOPK_TILE_ALIGN bytes of slack for it.
#define TOPK_TILE_ALIGN 128
__device__ __forceinline__ float* topk_tiles_after(float* qsh, unsigned d) {
    float* end = qsh + ((d + 3u) & ~3u);
    const unsigned at = (unsigned)__cvta_generic_to_shared(end);
    return end + ((0u - at) & (TOPK_TILE_ALIGN - 1u)) / 4u;
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

#endif  // TOPK_STAGE_CUH
