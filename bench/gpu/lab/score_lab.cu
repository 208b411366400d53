// Scoring and launch-overhead experiments for the single-query path.
//
// Not part of the engine: a standalone CUDA C++ program, built on the GPU
// machine with `nvcc -O3 -arch=sm_90 -fmad=false -I kernels bench/gpu/lab/score_lab.cu`,
// that times variants of the canonical scoring loop against a streaming-read
// ceiling (register loads with a grid stride, with and without the score
// write or a shared histogram; rows staged through shared memory by
// cp.async, whose scores it checks bit for bit against the register loop)
// and the per-query launch sequence. Output: one JSON object per line.
// The staged variant is the one kernels/score.cu adopted (bench/gpu/NOTES.md, v7).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cstring>

#include "common.cuh"
#include "lab.cuh"


// ---- scoring variants -------------------------------------------------------
// MODE 0: write score only. 1: no write (kept live by an impossible test).
// 2: write + shared 4096-bin histogram flushed at the end.
template <int RT, int MODE>
__global__ void __launch_bounds__(256) v_stride(const float* __restrict__ corpus, unsigned n,
                                                unsigned d, const float* __restrict__ query,
                                                float* __restrict__ scores,
                                                unsigned* __restrict__ hist) {
    extern __shared__ float qsh[];
    __shared__ unsigned h12[MODE == 2 ? 4096 : 1];
    for (unsigned i = threadIdx.x; i < d; i += blockDim.x) qsh[i] = query[i];
    if (MODE == 2)
        for (unsigned i = threadIdx.x; i < 4096; i += blockDim.x) h12[i] = 0;
    __syncthreads();
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    const size_t stride = (size_t)gridDim.x * 8 * RT;
    for (size_t row0 = ((size_t)blockIdx.x * 8 + warp) * RT; row0 < n; row0 += stride) {
        const float* rows[RT];
        float acc[RT];
#pragma unroll
        for (int r = 0; r < RT; ++r) {
            size_t row = (row0 + r < n) ? row0 + r : row0;
            rows[r] = corpus + row * d;
            acc[r] = 0.0f;
        }
#pragma unroll 4
        for (unsigned dd = lane; dd < d; dd += 32) {
            float rv[RT];
#pragma unroll
            for (int r = 0; r < RT; ++r) rv[r] = __ldg(rows[r] + dd);
            const float qv = qsh[dd];
#pragma unroll
            for (int r = 0; r < RT; ++r) acc[r] = __fmaf_rn(qv, rv[r], acc[r]);
        }
#pragma unroll
        for (int r = 0; r < RT; ++r) {
            float s = topk_butterfly(acc[r]);
            size_t row = row0 + r;
            if (lane == (unsigned)r && row < n) {
                if (MODE == 1) {
                    if (s == 12345.0f) scores[row] = s;
                } else {
                    scores[row] = s;
                }
                if (MODE == 2) atomicAdd(&h12[topk_ordered_bits(s) >> 20], 1u);
            }
        }
    }
    if (MODE == 2) {
        __syncthreads();
        for (unsigned i = threadIdx.x; i < 4096; i += blockDim.x)
            if (h12[i]) atomicAdd(&hist[i], h12[i]);
    }
}

// One warp per RT rows, no grid stride: grid = ceil(n / (8 RT)) blocks.
template <int RT>
__global__ void __launch_bounds__(256) v_flat(const float* __restrict__ corpus, unsigned n,
                                              unsigned d, const float* __restrict__ query,
                                              float* __restrict__ scores) {
    extern __shared__ float qsh[];
    for (unsigned i = threadIdx.x; i < d; i += blockDim.x) qsh[i] = query[i];
    __syncthreads();
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    const size_t row0 = ((size_t)blockIdx.x * 8 + warp) * RT;
    if (row0 >= n) return;
    const float* rows[RT];
    float acc[RT];
#pragma unroll
    for (int r = 0; r < RT; ++r) {
        size_t row = (row0 + r < n) ? row0 + r : row0;
        rows[r] = corpus + row * d;
        acc[r] = 0.0f;
    }
#pragma unroll 4
    for (unsigned dd = lane; dd < d; dd += 32) {
        float rv[RT];
#pragma unroll
        for (int r = 0; r < RT; ++r) rv[r] = __ldg(rows[r] + dd);
        const float qv = qsh[dd];
#pragma unroll
        for (int r = 0; r < RT; ++r) acc[r] = __fmaf_rn(qv, rv[r], acc[r]);
    }
#pragma unroll
    for (int r = 0; r < RT; ++r) {
        float s = topk_butterfly(acc[r]);
        if (lane == (unsigned)r && row0 + r < n) scores[row0 + r] = s;
    }
}

// Scalar loop with a deeper unroll U (RT rows per warp, grid stride).
template <int RT, int U>
__global__ void __launch_bounds__(256) v_unroll(const float* __restrict__ corpus, unsigned n,
                                                unsigned d, const float* __restrict__ query,
                                                float* __restrict__ scores) {
    extern __shared__ float qsh[];
    for (unsigned i = threadIdx.x; i < d; i += blockDim.x) qsh[i] = query[i];
    __syncthreads();
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    const size_t stride = (size_t)gridDim.x * 8 * RT;
    for (size_t row0 = ((size_t)blockIdx.x * 8 + warp) * RT; row0 < n; row0 += stride) {
        const float* rows[RT];
        float acc[RT];
#pragma unroll
        for (int r = 0; r < RT; ++r) {
            size_t row = (row0 + r < n) ? row0 + r : row0;
            rows[r] = corpus + row * d;
            acc[r] = 0.0f;
        }
#pragma unroll U
        for (unsigned dd = lane; dd < d; dd += 32) {
            float rv[RT];
#pragma unroll
            for (int r = 0; r < RT; ++r) rv[r] = __ldcs(rows[r] + dd);
            const float qv = qsh[dd];
#pragma unroll
            for (int r = 0; r < RT; ++r) acc[r] = __fmaf_rn(qv, rv[r], acc[r]);
        }
#pragma unroll
        for (int r = 0; r < RT; ++r) {
            float s = topk_butterfly(acc[r]);
            if (lane == (unsigned)r && row0 + r < n) scores[row0 + r] = s;
        }
    }
}

// Rows staged through shared memory with cp.async: a block owns row groups of
// 8*RT consecutive rows (grid stride), read in column chunks of CW floats
// through an S-deep pipeline; warp w computes rows w*RT.. of the tile with the
// canonical lane split, reading the tile from shared memory.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

template <int RT, int CW, int S>
__global__ void __launch_bounds__(256) v_stage(const float* __restrict__ corpus, unsigned n,
                                               unsigned d, const float* __restrict__ query,
                                               float* __restrict__ scores) {
    extern __shared__ float4 sm4[];
    float* sm = reinterpret_cast<float*>(sm4);
    constexpr int TR = 8 * RT;
    constexpr int TILE = TR * CW;
    float* qsh = sm;
    float* tiles = sm + ((d + 3) & ~3u);
    for (unsigned i = threadIdx.x; i < d; i += blockDim.x) qsh[i] = query[i];
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    const unsigned nchunks = (d + CW - 1) / CW;
    const unsigned ngroups = (n + TR - 1) / TR;
    const unsigned my_groups =
        blockIdx.x < ngroups ? (ngroups - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
    const unsigned items = my_groups * nchunks;
    auto issue = [&](unsigned i) {
        if (i < items) {
            const unsigned g = blockIdx.x + (i / nchunks) * gridDim.x;
            const unsigned c = i % nchunks;
            float* tile = tiles + (i % S) * TILE;
            for (unsigned idx = threadIdx.x; idx < TILE / 4; idx += 256) {
                const unsigned r = idx / (CW / 4);
                const unsigned col = c * CW + (idx % (CW / 4)) * 4;
                const size_t row = (size_t)g * TR + r;
                if (row < n && col < d) {
                    cp_async16(tile + r * CW + (idx % (CW / 4)) * 4, corpus + row * d + col);
                }
            }
        }
        cp_async_commit();
    };
#pragma unroll
    for (int i = 0; i < S - 1; ++i) issue(i);
    float acc[RT];
    for (unsigned i = 0; i < items; ++i) {
        cp_async_wait<S - 2>();
        __syncthreads();
        issue(i + S - 1);
        const unsigned c = i % nchunks;
        if (c == 0) {
#pragma unroll
            for (int r = 0; r < RT; ++r) acc[r] = 0.0f;
        }
        const float* tile = tiles + (i % S) * TILE + warp * RT * CW;
#pragma unroll
        for (int s = 0; s < CW / 32; ++s) {
            const unsigned col = c * CW + 32 * s + lane;
            if (col < d) {
                const float qv = qsh[col];
#pragma unroll
                for (int r = 0; r < RT; ++r)
                    acc[r] = __fmaf_rn(qv, tile[r * CW + 32 * s + lane], acc[r]);
            }
        }
        if (c == nchunks - 1) {
            const size_t row0 = (size_t)(blockIdx.x + (i / nchunks) * gridDim.x) * TR + warp * RT;
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                float s = topk_butterfly(acc[r]);
                if (lane == (unsigned)r && row0 + r < n) scores[row0 + r] = s;
            }
        }
    }
    cp_async_wait<0>();
}

// Pure streaming read (float4), the read-only bandwidth ceiling.
__global__ void v_read(const float4* __restrict__ x, size_t n4, float* out) {
    float a = 0.f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
         i += (size_t)gridDim.x * blockDim.x) {
        float4 v = __ldg(x + i);
        a += v.x + v.y + v.z + v.w;
    }
    if (a == 12345.0f) *out = a;
}

// ---- launch-overhead variants ------------------------------------------------
struct QParam {
    float q[1024];
};

__global__ void l_param(QParam qp, unsigned d, float* out) {
    if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = qp.q[d - 1];
}

__global__ void l_mapped(QParam qp, unsigned d, volatile unsigned* flag, float* res,
                         unsigned seq, unsigned k) {
    if (blockIdx.x == 0) {
        for (unsigned i = threadIdx.x; i < 2 * k; i += blockDim.x) res[i] = qp.q[i % d];
        __threadfence_system();
        __syncthreads();
        if (threadIdx.x == 0) *flag = seq;
    }
}

__global__ void l_empty() {}

template <typename F>
static float time_kernel(F launch, int reps) {
    const float ms = lab_event_ms(3, reps, launch);
    CK(cudaGetLastError());
    return ms * 1000.f;
}

template <typename F>
static float time_wall(F body, int reps) {
    std::vector<float> t;
    for (int i = 0; i < 20; ++i) body();
    for (int i = 0; i < reps; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        body();
        auto t1 = std::chrono::steady_clock::now();
        t.push_back(std::chrono::duration<float, std::micro>(t1 - t0).count());
    }
    return lab_median(t);
}

int main() {
    const size_t maxn = 1000000, maxd = 1024;
    float *corpus, *query, *scores, *sink;
    unsigned* hist;
    CK(cudaMalloc(&corpus, maxn * maxd * 4));
    CK(cudaMalloc(&query, maxd * 4));
    CK(cudaMalloc(&scores, maxn * 4 * 2));
    CK(cudaMalloc(&sink, 4096 * 4));
    CK(cudaMalloc(&hist, 4096 * 4));
    CK(cudaMemset(hist, 0, 4096 * 4));
    lab_fill_rows(corpus, query, maxn, maxd, 0);
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    // Warm the clocks.
    for (int i = 0; i < 200; ++i) v_read<<<sms * 8, 512>>>((const float4*)corpus, maxn * maxd / 4, sink);
    CK(cudaDeviceSynchronize());

    struct Cfg {
        unsigned n, d;
    } cfgs[] = {{10000, 384}, {100000, 384}, {100000, 1024}, {500000, 384},
                {500000, 1024}, {1000000, 384}, {1000000, 1024}};
    for (auto c : cfgs) {
        const unsigned n = c.n, d = c.d;
        const size_t bytes = (size_t)n * d * 4;
        float t_read = time_kernel([&] { v_read<<<sms * 8, 512>>>((const float4*)corpus, bytes / 16, sink); }, 20);
        auto occ_grid = [&](auto kern, int rt, size_t smem) {
            int per = 0;
            CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kern, 256, smem));
            unsigned groups = (n + 8 * rt - 1) / (8 * rt);
            return std::min<unsigned>(groups, per * sms);
        };
        auto stride_t = [&](auto kern, int rt) {
            unsigned blocks = occ_grid(kern, rt, d * 4);
            return time_kernel([&] { kern<<<blocks, 256, d * 4>>>(corpus, n, d, query, scores, hist); }, 20);
        };
        float t_s4 = stride_t(v_stride<4, 0>, 4);
        float t_s4nw = stride_t(v_stride<4, 1>, 4);
        float t_s4h = stride_t(v_stride<4, 2>, 4);
        CK(cudaMemset(hist, 0, 4096 * 4));
        auto flat_t = [&](auto kern, int rt) {
            unsigned blocks = (n + 8 * rt - 1) / (8 * rt);
            return time_kernel([&] { kern<<<blocks, 256, d * 4>>>(corpus, n, d, query, scores); }, 20);
        };
        float t_f2 = flat_t(v_flat<2>, 2);
        auto unroll_t = [&](auto kern, int rt) {
            unsigned blocks = occ_grid(kern, rt, d * 4);
            return time_kernel([&] { kern<<<blocks, 256, d * 4>>>(corpus, n, d, query, scores); }, 20);
        };
        float t_u48 = unroll_t(v_unroll<4, 8>, 4);
        std::vector<float> ref(n), got(n);
        CK(cudaMemcpy(ref.data(), scores, n * 4, cudaMemcpyDeviceToHost));
        unsigned bad = 0;
        auto stage_t = [&](auto kern, int rt, int cw, int st) {
            size_t smem = ((d + 3) & ~3u) * 4 + (size_t)st * 8 * rt * cw * 4;
            CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            unsigned blocks = occ_grid(kern, rt, smem);
            CK(cudaMemset(scores, 0, n * 4));
            float t = time_kernel([&] { kern<<<blocks, 256, smem>>>(corpus, n, d, query, scores); }, 20);
            CK(cudaMemcpy(got.data(), scores, n * 4, cudaMemcpyDeviceToHost));
            for (unsigned i = 0; i < n; ++i) bad += (memcmp(&ref[i], &got[i], 4) != 0);
            return t;
        };
        float t_st3 = stage_t(v_stage<4, 128, 3>, 4, 128, 3);
        float t_st4 = stage_t(v_stage<4, 128, 4>, 4, 128, 4);
        printf("{\"n\":%u,\"d\":%u,\"read_us\":%.1f,\"read_tbs\":%.2f,\"stride4_us\":%.1f,"
               "\"stride4_nowrite_us\":%.1f,\"stride4_hist12_us\":%.1f,\"flat2_us\":%.1f,"
               "\"unroll4x8_us\":%.1f,\"stage4_128_3_us\":%.1f,\"stage4_128_4_us\":%.1f,"
               "\"stage_mismatches\":%u}\n",
               n, d, t_read, bytes / (t_read * 1e-6) / 1e12, t_s4, t_s4nw, t_s4h, t_f2, t_u48,
               t_st3, t_st4, bad);
        fflush(stdout);
    }

    // Launch overheads, host wall clock, at 10k x 384 (the scoring itself is a few us).
    {
        const unsigned d = 384, k = 1000;
        cudaStream_t s;
        CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        float *qh, *rh;
        CK(cudaHostAlloc(&qh, maxd * 4, cudaHostAllocDefault));
        CK(cudaHostAlloc(&rh, 2 * (k + 1) * 8, cudaHostAllocMapped));
        unsigned* flag;
        CK(cudaHostAlloc(&flag, 64, cudaHostAllocMapped));
        *flag = 0;
        QParam qp;
        for (unsigned i = 0; i < 1024; ++i) qp.q[i] = 0.001f * i;
        float w_empty = time_wall([&] { l_empty<<<1, 32, 0, s>>>(); CK(cudaStreamSynchronize(s)); }, 500);
        float w_h2d_k_d2h = time_wall([&] {
            CK(cudaMemcpyAsync(query, qh, d * 4, cudaMemcpyHostToDevice, s));
            l_empty<<<1, 32, 0, s>>>();
            CK(cudaMemcpyAsync(rh, scores, (k + 1) * 8, cudaMemcpyDeviceToHost, s));
            CK(cudaStreamSynchronize(s));
        }, 500);
        float w_param_d2h = time_wall([&] {
            l_param<<<1, 32, 0, s>>>(qp, d, scores);
            CK(cudaMemcpyAsync(rh, scores, (k + 1) * 8, cudaMemcpyDeviceToHost, s));
            CK(cudaStreamSynchronize(s));
        }, 500);
        unsigned seq = 0;
        float w_mapped = time_wall([&] {
            ++seq;
            l_mapped<<<1, 256, 0, s>>>(qp, d, flag, rh, seq, k);
            while (*(volatile unsigned*)flag != seq) {
            }
        }, 500);
        CK(cudaStreamSynchronize(s));
        float w_mapped_sync = time_wall([&] {
            ++seq;
            l_mapped<<<1, 256, 0, s>>>(qp, d, flag, rh, seq, k);
            CK(cudaStreamSynchronize(s));
        }, 500);
        printf("{\"launch\":\"10k x 384\",\"empty_sync_us\":%.1f,\"h2d_kernel_d2h_sync_us\":%.1f,"
               "\"param_kernel_d2h_sync_us\":%.1f,\"param_kernel_mapped_spin_us\":%.1f,"
               "\"param_kernel_mapped_sync_us\":%.1f}\n",
               w_empty, w_h2d_k_d2h, w_param_d2h, w_mapped, w_mapped_sync);
    }
    CK(cudaDeviceSynchronize());
    return 0;
}
