// Batch scoring experiments: register-tiled variants of the canonical
// many-query scoring loop, checked bit for bit against the engine's
// topk_scoreb_* kernel and timed beside it.
//
// Not part of the engine: a standalone CUDA C++ program, built with the
// pinned nvcc of `cargo xtask cuda-toolchain` (static cudart, so it runs on
// the GPU machine as is):
//   T=target/cuda-toolchain/py/nvidia/cu13
//   $T/bin/nvcc -O3 -arch=sm_90 -fmad=false -I kernels -L$T/lib \
//       -o batch_lab bench/gpu/lab/batch_lab.cu
// Usage: batch_lab [TRIALS] [CONFIG] (CONFIG: one index of the large
// configurations only, for a profiler). Output: one JSON object per line,
// the v10 table of bench/gpu/NOTES.md.
//
// The variants keep the canonical split of D (lane j owns d = j, j+32, ...)
// but stage a tile of rows and a tile of queries through shared memory with
// cp.async, give each lane an RT x QT register tile, and reduce the 32
// partials of 32 outputs at once (lab_reduce32: the butterfly's tree, 31
// shuffles instead of 160). The engine's kernels (topk_scoreq32_*,
// topk_scoreq16_*) are timed beside them.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "norms.cu"
#include "score_batch.cu"
#include "lab.cuh"


// The lab variants' reduction (the engine's before its outputs were placed
// per lane, common.cuh): the five butterfly steps on 32 outputs: on entry
// v[i] is this lane's partial of output i; on exit v[0] holds the full sum of
// output `lane`. Step H pairs lane j with j ^ H exactly as topk_butterfly
// does, so every output is added up by the same tree (and __fadd_rn is
// commutative, so the operand order within a pair does not matter); each
// lane then keeps the half of the outputs that its bit H selects and sends
// the other half, which takes 31 shuffles instead of 160.
template <int H>
__device__ __forceinline__ void lab_reduce32_step(float (&v)[32], unsigned lane) {
    const bool up = (lane & H) != 0;
#pragma unroll
    for (int i = 0; i < H; ++i) {
        const float send = up ? v[i] : v[i + H];
        const float keep = up ? v[i + H] : v[i];
        v[i] = __fadd_rn(keep, __shfl_xor_sync(TOPK_FULL_MASK, send, H));
    }
}

__device__ __forceinline__ float lab_reduce32(float (&v)[32], unsigned lane) {
    lab_reduce32_step<16>(v, lane);
    lab_reduce32_step<8>(v, lane);
    lab_reduce32_step<4>(v, lane);
    lab_reduce32_step<2>(v, lane);
    lab_reduce32_step<1>(v, lane);
    return v[0];
}

// One staged chunk of CH columns for a warp's RT x QT tile, one canonical
// step per column: rows at rt (row stride CH), queries at qp (row stride
// qstride), both already offset by the lane; only columns < d take a step.
template <int METRIC, int RT, int QT, unsigned CH>
__device__ __forceinline__ void lab_chunk(float (&acc)[RT * QT], const float* rt, const float* qp,
                                          unsigned qstride, bool full, unsigned col0,
                                          unsigned lane, unsigned d) {
#pragma unroll
    for (unsigned s = 0; s < CH / TOPK_WARP; ++s) {
        if (full || col0 + s * TOPK_WARP + lane < d) {
            float rv[RT];
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                rv[r] = rt[r * CH + s * TOPK_WARP];
            }
#pragma unroll
            for (int qi = 0; qi < QT; ++qi) {
                const float qv = qp[qi * qstride + s * TOPK_WARP];
#pragma unroll
                for (int r = 0; r < RT; ++r) {
                    acc[qi * RT + r] = topk_step<METRIC>(qv, rv[r], acc[qi * RT + r]);
                }
            }
        }
    }
}

// The end of a lab kernel's tile (the engine's epilogue before it zeroed the
// accumulators itself): the 32 lane partials of 32 outputs at a time added by
// the butterfly's tree (lab_reduce32), then the scores written.
template <int METRIC, int RT, int QT>
__device__ __forceinline__ void lab_write_tile(const float (&acc)[RT * QT], unsigned lane,
                                               size_t r0, size_t q0, unsigned n, unsigned nq,
                                               const float* qnorm, const float* rnorm,
                                               float* scores) {
#pragma unroll
    for (int g = 0; g < RT * QT / 32; ++g) {
        float v[32];
#pragma unroll
        for (int k = 0; k < 32; ++k) {
            v[k] = acc[g * 32 + k];
        }
        const float s = lab_reduce32(v, lane);
        const unsigned o = g * 32 + lane;
        const size_t row = r0 + o % RT;
        const size_t q = q0 + o / RT;
        if (row < n && q < nq) {
            const float qn = (METRIC == TOPK_COSINE) ? qnorm[q] : 0.0f;
            const float rn = (METRIC == TOPK_COSINE) ? rnorm[row] : 0.0f;
            scores[q * n + row] = topk_finish<METRIC>(s, qn, rn);
        }
    }
}

// A block of WR x WQ warps, each with an RT-row x QT-query tile, staging
// chunks of CH columns.
template <int WR, int WQ, int RT, int QT>
struct LabBlock {
    static constexpr unsigned THREADS = WR * WQ * TOPK_WARP;
    static constexpr unsigned BR = WR * RT;
    static constexpr unsigned BQ = WQ * QT;
    static constexpr unsigned CH = 128;
};

// Staged variant: rows and queries both pass through the stages.
template <int WR, int WQ, int RT, int QT, int DEPTH>
struct BT : LabBlock<WR, WQ, RT, QT> {
    using Base = LabBlock<WR, WQ, RT, QT>;
    static constexpr unsigned STAGE = (Base::BR + Base::BQ) * Base::CH;
    static constexpr size_t SMEM = (size_t)DEPTH * STAGE * sizeof(float);
};

template <class B, bool VEC16, int DEPTH>
__device__ __forceinline__ void bt_issue(const float* __restrict__ corpus, unsigned n, unsigned d,
                                         const float* __restrict__ queries, unsigned nq,
                                         unsigned nchunks, unsigned qtiles, unsigned items,
                                         unsigned i, float* stages) {
    if (i < items) {
        const size_t tile = blockIdx.x + (size_t)(i / nchunks) * gridDim.x;
        const size_t r0 = (tile / qtiles) * B::BR;
        const size_t q0 = (tile % qtiles) * B::BQ;
        const unsigned c0 = (i % nchunks) * B::CH;
        float* st = stages + (i % DEPTH) * B::STAGE;
        constexpr unsigned W = VEC16 ? 4 : 1;
        for (unsigned idx = threadIdx.x; idx < B::STAGE / W; idx += B::THREADS) {
            const unsigned r = idx / (B::CH / W);
            const unsigned col = (idx % (B::CH / W)) * W;
            const float* src;
            bool ok;
            if (r < B::BR) {
                ok = r0 + r < n;
                src = corpus + (r0 + r) * d + c0 + col;
            } else {
                ok = q0 + (r - B::BR) < nq;
                src = queries + (q0 + (r - B::BR)) * d + c0 + col;
            }
            if (ok && c0 + col < d) {
                if (VEC16) {
                    topk_cp_async16(st + r * B::CH + col, src);
                } else {
                    topk_cp_async4(st + r * B::CH + col, src);
                }
            }
        }
    }
    topk_cp_async_commit();
}

template <int METRIC, bool VEC16, int WR, int WQ, int RT, int QT, int DEPTH>
__global__ void __launch_bounds__(WR* WQ* TOPK_WARP, 1)
    lab_scoreb(const float* __restrict__ corpus, const float* __restrict__ rnorm, unsigned n,
               unsigned d, const float* __restrict__ queries, unsigned nq,
               const float* __restrict__ qnorm, float* __restrict__ scores) {
    using B = BT<WR, WQ, RT, QT, DEPTH>;
    static_assert((RT * QT) % 32 == 0, "groups of 32 outputs");
    extern __shared__ float stages[];
    const unsigned lane = threadIdx.x & (TOPK_WARP - 1);
    const unsigned warp = threadIdx.x / TOPK_WARP;
    const unsigned wr = warp % WR;
    const unsigned wq = warp / WR;
    const unsigned nchunks = (d + B::CH - 1) / B::CH;
    const unsigned qtiles = (nq + B::BQ - 1) / B::BQ;
    const size_t ntiles = (size_t)((n + B::BR - 1) / B::BR) * qtiles;
    const size_t my_tiles =
        blockIdx.x < ntiles ? (ntiles - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
    const unsigned items = (unsigned)(my_tiles * nchunks);
#pragma unroll
    for (unsigned i = 0; i < DEPTH - 1; ++i) {
        bt_issue<B, VEC16, DEPTH>(corpus, n, d, queries, nq, nchunks, qtiles, items, i, stages);
    }
    // acc[qi * RT + r]: lane's partial of (query qi, row r) of its warp tile.
    float acc[RT * QT];
    for (unsigned i = 0; i < items; ++i) {
        topk_cp_async_wait<DEPTH - 2>();
        __syncthreads();
        bt_issue<B, VEC16, DEPTH>(corpus, n, d, queries, nq, nchunks, qtiles, items,
                                  i + DEPTH - 1, stages);
        const unsigned c = i % nchunks;
        if (c == 0) {
#pragma unroll
            for (int k = 0; k < RT * QT; ++k) {
                acc[k] = 0.0f;
            }
        }
        const float* st = stages + (i % DEPTH) * B::STAGE;
        const float* rt = st + (wr * RT) * B::CH + lane;
        const float* qt = st + (B::BR + wq * QT) * B::CH + lane;
        const bool full = (c + 1) * B::CH <= d;
        lab_chunk<METRIC, RT, QT, B::CH>(acc, rt, qt, B::CH, full, c * B::CH, lane, d);
        if (c == nchunks - 1) {
            const size_t tile = blockIdx.x + (size_t)(i / nchunks) * gridDim.x;
            const size_t r0 = (tile / qtiles) * B::BR + wr * RT;
            const size_t q0 = (tile % qtiles) * B::BQ + wq * QT;
            lab_write_tile<METRIC, RT, QT>(acc, lane, r0, q0, n, nq, qnorm, rnorm, scores);
        }
    }
    topk_cp_async_wait<0>();
}

struct Cfg {
    unsigned n, d, q;
    int metric;
};


// The grid of a resident-query kernel, as topk-cuda computes it: the same
// number of blocks (at least one, at most one per row block of BR rows) for
// every tile of BQ queries, out of `resident` blocks.
static unsigned lab_resident_grid(const Cfg& c, unsigned bq, unsigned br, int resident) {
    const unsigned qtiles = (c.q + bq - 1) / bq;
    const unsigned nrb = (c.n + br - 1) / br;
    unsigned slots = (unsigned)resident / qtiles;
    if (slots == 0) slots = 1;
    if (slots > nrb) slots = nrb;
    return slots * qtiles;
}

template <class F>
static void time_variant(const char* name, const Cfg& c, float* out, const std::vector<float>& ref,
                         int trials, unsigned grid, int per_sm, F launch) {
    const size_t cnt = (size_t)c.n * c.q;
    CK(cudaMemset(out, 0xff, cnt * 4));
    launch();
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<float> got(cnt);
    CK(cudaMemcpy(got.data(), out, cnt * 4, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < cnt; ++i) {
        if (memcmp(&got[i], &ref[i], 4) != 0) ++bad;
    }
    const float ms = lab_event_ms(0, trials, launch);
    const double tflops = 2.0 * c.n * (double)c.d * c.q / (ms * 1e-3) / 1e12;
    printf("{\"kernel\":\"%s\",\"n\":%u,\"d\":%u,\"q\":%u,\"metric\":%d,\"grid\":%u,\"per_sm\":%d,"
           "\"ms\":%.4f,\"tflops\":%.2f,\"mismatches\":%zu}\n",
           name, c.n, c.d, c.q, c.metric, grid, per_sm, ms, tflops, bad);
    fflush(stdout);
}

// Resident-query variant: the block keeps its BQ queries (all of D) in
// shared memory and walks row blocks, so only rows stream through the
// cp.async stages: 4 / BQ bytes of L2 traffic per fma instead of
// 4 (BR + BQ) / (BR BQ).
template <int WR, int WQ, int RT, int QT, int DEPTH>
struct RT_ : LabBlock<WR, WQ, RT, QT> {
    using Base = LabBlock<WR, WQ, RT, QT>;
    static constexpr unsigned STAGE = Base::BR * Base::CH;
    static size_t smem(unsigned d) {
        const unsigned dp = (d + Base::CH - 1) / Base::CH * Base::CH;
        return ((size_t)DEPTH * STAGE + (size_t)Base::BQ * dp) * sizeof(float);
    }
};

// Position of chunk column `col` (= 32 s + j) in a permuted chunk: lane j's
// four columns s = 0..3 are adjacent, so one 128-bit load fetches them.
__device__ __forceinline__ unsigned lab_perm(unsigned col) {
    return (col % TOPK_WARP) * 4 + col / TOPK_WARP;
}

template <class B, bool VEC16, int DEPTH, bool PERM_ROWS>
__device__ __forceinline__ void rs_issue(const float* __restrict__ corpus, unsigned n, unsigned d,
                                         unsigned nchunks, unsigned rb0, unsigned rbstep,
                                         unsigned items, unsigned i, float* stages) {
    if (i < items) {
        const size_t r0 = (size_t)(rb0 + (i / nchunks) * rbstep) * B::BR;
        const unsigned c0 = (i % nchunks) * B::CH;
        float* st = stages + (i % DEPTH) * B::STAGE;
        constexpr unsigned W = (VEC16 && !PERM_ROWS) ? 4 : 1;
        constexpr unsigned PER_ROW = B::CH / W;
        constexpr unsigned COPIES = B::STAGE / W / B::THREADS;
        static_assert(B::STAGE / W % B::THREADS == 0, "whole copies per thread");
#pragma unroll
        for (unsigned k = 0; k < COPIES; ++k) {
            const unsigned idx = threadIdx.x + k * B::THREADS;
            const unsigned r = idx / PER_ROW;
            const unsigned col = (idx % PER_ROW) * W;
            if (r0 + r < n && c0 + col < d) {
                const float* src = corpus + (r0 + r) * d + c0 + col;
                if (PERM_ROWS) {
                    topk_cp_async4(st + r * B::CH + lab_perm(col), src);
                } else if (VEC16) {
                    topk_cp_async16(st + r * B::CH + col, src);
                } else {
                    topk_cp_async4(st + r * B::CH + col, src);
                }
            }
        }
    }
    topk_cp_async_commit();
}

template <int METRIC, bool VEC16, int WR, int WQ, int RT, int QT, int DEPTH, int PERM>
__global__ void __launch_bounds__(WR* WQ* TOPK_WARP, 1)
    lab_scoreb_res(const float* __restrict__ corpus, const float* __restrict__ rnorm, unsigned n,
                   unsigned d, const float* __restrict__ queries, unsigned nq,
                   const float* __restrict__ qnorm, float* __restrict__ scores) {
    using B = RT_<WR, WQ, RT, QT, DEPTH>;
    extern __shared__ float smem[];
    float* stages = smem;
    float* qs = smem + DEPTH * B::STAGE;
    const unsigned lane = threadIdx.x & (TOPK_WARP - 1);
    const unsigned warp = threadIdx.x / TOPK_WARP;
    const unsigned wr = warp % WR;
    const unsigned wq = warp / WR;
    const unsigned nchunks = (d + B::CH - 1) / B::CH;
    const unsigned dp = nchunks * B::CH;
    const unsigned qtiles = (nq + B::BQ - 1) / B::BQ;
    const unsigned qt = blockIdx.x % qtiles;
    const unsigned rb0 = blockIdx.x / qtiles;
    const unsigned rbstep = gridDim.x / qtiles;
    const unsigned nrb = (n + B::BR - 1) / B::BR;
    const unsigned my_rb = rb0 < nrb ? (nrb - rb0 + rbstep - 1) / rbstep : 0;
    const unsigned items = my_rb * nchunks;
    const size_t q0 = (size_t)qt * B::BQ;
    {
        constexpr unsigned W = (VEC16 && PERM == 0) ? 4 : 1;
        const unsigned per_q = d / W;
        for (unsigned idx = threadIdx.x; idx < B::BQ * per_q; idx += B::THREADS) {
            const unsigned qi = idx / per_q;
            const unsigned col = (idx % per_q) * W;
            if (q0 + qi < nq) {
                if (PERM > 0) {
                    topk_cp_async4(qs + qi * dp + col / B::CH * B::CH + lab_perm(col % B::CH),
                                   queries + (q0 + qi) * d + col);
                } else if (VEC16) {
                    topk_cp_async16(qs + qi * dp + col, queries + (q0 + qi) * d + col);
                } else {
                    topk_cp_async4(qs + qi * dp + col, queries + (q0 + qi) * d + col);
                }
            }
        }
    }
#pragma unroll
    for (unsigned i = 0; i < DEPTH - 1; ++i) {
        rs_issue<B, VEC16, DEPTH, PERM == 2>(corpus, n, d, nchunks, rb0, rbstep, items, i, stages);
    }
    float acc[RT * QT];
    for (unsigned i = 0; i < items; ++i) {
        topk_cp_async_wait<DEPTH - 2>();
        __syncthreads();
        rs_issue<B, VEC16, DEPTH, PERM == 2>(corpus, n, d, nchunks, rb0, rbstep, items, i + DEPTH - 1,
                                  stages);
        const unsigned c = i % nchunks;
        if (c == 0) {
#pragma unroll
            for (int k = 0; k < RT * QT; ++k) {
                acc[k] = 0.0f;
            }
        }
        const bool full = (c + 1) * B::CH <= d;
        if (PERM == 0) {
            const float* rt = stages + (i % DEPTH) * B::STAGE + (wr * RT) * B::CH + lane;
            const float* qp = qs + (wq * QT) * dp + c * B::CH + lane;
            lab_chunk<METRIC, RT, QT, B::CH>(acc, rt, qp, dp, full, c * B::CH, lane, d);
        } else {
            // Lane's four columns of the chunk: rows then queries.
            float rv[4][RT];
            const float* st = stages + (i % DEPTH) * B::STAGE + (wr * RT) * B::CH;
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                if (PERM == 2) {
                    const float4 x = *reinterpret_cast<const float4*>(st + r * B::CH + lane * 4);
                    rv[0][r] = x.x;
                    rv[1][r] = x.y;
                    rv[2][r] = x.z;
                    rv[3][r] = x.w;
                } else {
#pragma unroll
                    for (int s = 0; s < 4; ++s) {
                        rv[s][r] = st[r * B::CH + s * TOPK_WARP + lane];
                    }
                }
            }
            const float* qp = qs + (wq * QT) * dp + c * B::CH + lane * 4;
#pragma unroll
            for (int qi = 0; qi < QT; ++qi) {
                const float4 x = *reinterpret_cast<const float4*>(qp + qi * dp);
                const float qv[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
                for (int s = 0; s < 4; ++s) {
                    if (full || c * B::CH + s * TOPK_WARP + lane < d) {
#pragma unroll
                        for (int r = 0; r < RT; ++r) {
                            acc[qi * RT + r] =
                                topk_step<METRIC>(qv[s], rv[s][r], acc[qi * RT + r]);
                        }
                    }
                }
            }
        }
        if (c == nchunks - 1) {
            const size_t r0 = (size_t)(rb0 + (i / nchunks) * rbstep) * B::BR + wr * RT;
            lab_write_tile<METRIC, RT, QT>(acc, lane, r0, q0 + wq * QT, n, nq, qnorm, rnorm,
                                           scores);
        }
    }
    topk_cp_async_wait<0>();
}

template <int METRIC, bool VEC16, int WR, int WQ, int RT, int QT, int DEPTH, int PERM = 0>
static void run_res(const char* name, const Cfg& c, const float* corpus, const float* rnorm,
                    const float* queries, const float* qnorm, float* out,
                    const std::vector<float>& ref, int sms, int trials) {
    using B = RT_<WR, WQ, RT, QT, DEPTH>;
    auto k = lab_scoreb_res<METRIC, VEC16, WR, WQ, RT, QT, DEPTH, PERM>;
    const size_t smem = B::smem(c.d);
    if (smem > 227 * 1024) {
        return;
    }
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, B::THREADS, smem));
    const unsigned grid = lab_resident_grid(c, B::BQ, B::BR, sms * per_sm);
    time_variant(name, c, out, ref, trials, grid, per_sm, [&] {
        k<<<grid, B::THREADS, smem>>>(corpus, rnorm, c.n, c.d, queries, c.q, qnorm, out);
    });
}

// Deterministic pseudo-random fill in [-1, 1), with some exact ties.
__global__ void lab_fill(float* x, size_t count, unsigned seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (size_t)gridDim.x * blockDim.x) {
        unsigned long long z = (i + 1) * 0x9E3779B97F4A7C15ull ^ ((unsigned long long)seed << 32);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        const unsigned u = (unsigned)(z >> 40);  // 24 bits
        x[i] = (i % 97 == 0) ? 0.25f : ((float)u * (1.0f / 8388608.0f) - 1.0f);
    }
}

template <int METRIC, bool VEC16, int WR, int WQ, int RT, int QT, int DEPTH>
static void run_variant(const char* name, const Cfg& c, const float* corpus, const float* rnorm,
                        const float* queries, const float* qnorm, float* out,
                        const std::vector<float>& ref, int sms, int trials) {
    using B = BT<WR, WQ, RT, QT, DEPTH>;
    auto k = lab_scoreb<METRIC, VEC16, WR, WQ, RT, QT, DEPTH>;
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)B::SMEM));
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, B::THREADS, B::SMEM));
    const size_t ntiles = (size_t)((c.n + B::BR - 1) / B::BR) * ((c.q + B::BQ - 1) / B::BQ);
    const unsigned grid = (unsigned)std::min<size_t>(ntiles, (size_t)sms * per_sm);
    time_variant(name, c, out, ref, trials, grid, per_sm, [&] {
        k<<<grid, B::THREADS, B::SMEM>>>(corpus, rnorm, c.n, c.d, queries, c.q, qnorm, out);
    });
}

typedef void (*BatchKernel)(const float*, const float*, unsigned, unsigned, const float*,
                            unsigned, const float*, float*);

// The engine's resident-query kernels, launched as topk-cuda launches them.
template <unsigned BR, unsigned BQ, unsigned THREADS, unsigned DEPTH, unsigned SUB>
static void run_engine_q(const char* name, BatchKernel k, const Cfg& c, const float* corpus,
                         const float* rnorm, const float* queries, const float* qnorm, float* out,
                         const std::vector<float>& ref, int sms, int trials) {
    const unsigned dp = (c.d + BCH_CH - 1) / BCH_CH * BCH_CH;
    const size_t smem = ((size_t)DEPTH * BR * BCH_CH * SUB + (size_t)BQ * dp) * sizeof(float);
    if (smem > 227 * 1024) {
        return;
    }
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, THREADS, smem));
    const unsigned grid = lab_resident_grid(c, BQ, BR, sms * per_sm);
    time_variant(name, c, out, ref, trials, grid, per_sm, [&] {
        k<<<grid, THREADS, smem>>>(corpus, rnorm, c.n, c.d, queries, c.q, qnorm, out);
    });
}

template <int METRIC, bool VEC16>
static void run_cfg(const Cfg& c, int sms, int trials) {
    float *corpus, *queries, *rnorm, *qnorm, *out;
    CK(cudaMalloc(&corpus, (size_t)c.n * c.d * 4));
    CK(cudaMalloc(&queries, (size_t)c.q * c.d * 4));
    CK(cudaMalloc(&rnorm, (size_t)c.n * 4));
    CK(cudaMalloc(&qnorm, (size_t)c.q * 4));
    CK(cudaMalloc(&out, (size_t)c.n * c.q * 4));
    lab_fill<<<1024, 256>>>(corpus, (size_t)c.n * c.d, 1);
    lab_fill<<<64, 256>>>(queries, (size_t)c.q * c.d, 2);
    topk_norms<<<1024, SCORE_THREADS>>>(corpus, c.n, c.d, rnorm);
    topk_norms<<<64, SCORE_THREADS>>>(queries, c.q, c.d, qnorm);
    CK(cudaDeviceSynchronize());
    // Reference: the engine's batch kernel, launched as the engine does.
    auto ref_k = METRIC == TOPK_DOT ? topk_scoreb_dot
                 : METRIC == TOPK_COSINE ? topk_scoreb_cosine
                                         : topk_scoreb_l2;
    const unsigned tiles = (c.q + BATCH_QT - 1) / BATCH_QT;
    const unsigned row_blocks = (c.n + SCORE_WARPS * BATCH_RT - 1) / (SCORE_WARPS * BATCH_RT);
    const size_t cnt = (size_t)c.n * c.q;
    std::vector<float> ref(cnt);
    {
        const float ms = lab_event_ms(1, trials, [&] {
            ref_k<<<row_blocks * tiles, SCORE_THREADS>>>(corpus, rnorm, c.n, c.d, queries, c.q,
                                                         qnorm, out);
        });
        CK(cudaGetLastError());
        CK(cudaMemcpy(ref.data(), out, cnt * 4, cudaMemcpyDeviceToHost));
        printf("{\"kernel\":\"engine\",\"n\":%u,\"d\":%u,\"q\":%u,\"metric\":%d,\"ms\":%.4f,"
               "\"tflops\":%.2f}\n",
               c.n, c.d, c.q, c.metric, ms, 2.0 * c.n * (double)c.d * c.q / (ms * 1e-3) / 1e12);
        fflush(stdout);
    }
    // LAB_ENGINE_ONLY=1: the engine's kernels only (variants of score.cu's
    // BQ*_DEPTH and BQ*_SUB are separate builds, -D on the command line).
    const bool engine_only = getenv("LAB_ENGINE_ONLY") != nullptr;
    if (!engine_only) {
    run_variant<METRIC, VEC16, 4, 2, 8, 16, 2>("w4x2_r8q16_d2", c, corpus, rnorm, queries, qnorm,
                                               out, ref, sms, trials);
    run_res<METRIC, VEC16, 4, 2, 8, 16, 3>("res_w4x2_r8q16_d3", c, corpus, rnorm, queries, qnorm,
                                           out, ref, sms, trials);
    run_res<METRIC, VEC16, 4, 2, 8, 16, 3, 1>("res_w4x2_r8q16_d3_p1", c, corpus, rnorm, queries,
                                              qnorm, out, ref, sms, trials);
    run_res<METRIC, VEC16, 8, 1, 8, 16, 4, 1>("res_w8x1_r8q16_d4_p1", c, corpus, rnorm, queries,
                                              qnorm, out, ref, sms, trials);
    }
    run_engine_q<BQ32_WR * BQ32_RT, BQ32_WQ * BQ32_QT, BQ32_THREADS, BQ32_DEPTH, BQ32_SUB>(
        "engine_q32", METRIC == TOPK_DOT ? topk_scoreq32_dot
                      : METRIC == TOPK_COSINE ? topk_scoreq32_cosine
                                              : topk_scoreq32_l2,
        c, corpus, rnorm, queries, qnorm, out, ref, sms, trials);
    run_engine_q<BQ16_WR * BQ16_RT, BQ16_WQ * BQ16_QT, BQ16_THREADS, BQ16_DEPTH, BQ16_SUB>(
        "engine_q16", METRIC == TOPK_DOT ? topk_scoreq16_dot
                      : METRIC == TOPK_COSINE ? topk_scoreq16_cosine
                                              : topk_scoreq16_l2,
        c, corpus, rnorm, queries, qnorm, out, ref, sms, trials);
    CK(cudaFree(corpus));
    CK(cudaFree(queries));
    CK(cudaFree(rnorm));
    CK(cudaFree(qnorm));
    CK(cudaFree(out));
}

int main(int argc, char** argv) {
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int trials = argc > 1 ? atoi(argv[1]) : 5;
    // Odd shapes first (correctness of the 4-byte copies, partial tiles and
    // every metric), then the campaign's batch shapes.
    const Cfg big[] = {{1000000, 1024, 256, 0}, {1000000, 1024, 16, 0}, {1000000, 384, 256, 0},
                       {100000, 1024, 256, 0},  {100000, 384, 256, 0},  {10000, 384, 256, 0},
                       {500000, 768, 256, 0},   {100000, 768, 16, 0}};
    if (argc > 2) {
        // One configuration only (for a profiler run).
        run_cfg<TOPK_DOT, true>(big[atoi(argv[2])], sms, trials);
        return 0;
    }
    run_cfg<TOPK_DOT, false>({10007, 383, 37, 0}, sms, trials);
    run_cfg<TOPK_COSINE, false>({5001, 101, 19, 1}, sms, trials);
    run_cfg<TOPK_L2, false>({5001, 70, 40, 2}, sms, trials);
    run_cfg<TOPK_COSINE, true>({20000, 768, 33, 1}, sms, trials);
    run_cfg<TOPK_L2, true>({20000, 1024, 64, 2}, sms, trials);
    for (const Cfg& c : big) {
        run_cfg<TOPK_DOT, true>(c, sms, trials);
    }
    return 0;
}
