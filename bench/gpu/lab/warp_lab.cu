// Warp-private staging for a one-block-per-SM search kernel.
//
// Not part of the engine: a standalone CUDA C++ program, built on the GPU
// machine with `nvcc -O3 -arch=sm_90 -fmad=false -I kernels bench/gpu/lab/warp_lab.cu`.
// Question: can a 1,024-thread block per SM (what the cooperative search
// kernel needs for its selection) score rows at the read ceiling, when each
// warp streams its own rows through its own cp.async pipeline (no block
// barrier per tile) a few tiles deep, and what does counting every score in a
// shared level-1 histogram cost there? Times (CUDA events) against the
// separate 256-thread block-staged kernel of v7 and a float4 read; checks
// every variant's scores bit for bit against it. Also times a grid barrier of
// the cooperative launch. Output: one JSON object per line.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common.cuh"

#define CK(x)                                                                                \
    do {                                                                                     \
        cudaError_t e = (x);                                                                 \
        if (e != cudaSuccess) {                                                              \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

__device__ __forceinline__ void cp16(void* smem, const void* gmem) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void wait_groups() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// v7's separate kernel: 8 warps x 4 rows, block-wide tiles of 128 columns, 3 deep.
__global__ void __launch_bounds__(256) v_block(const float* __restrict__ corpus, unsigned n,
                                               unsigned d, const float* __restrict__ query,
                                               float* __restrict__ scores) {
    constexpr int RT = 4, CW = 128, S = 3, TR = 32, TILE = TR * CW;
    extern __shared__ float4 sm4[];
    float* qsh = reinterpret_cast<float*>(sm4);
    float* tiles = qsh + ((d + 3) & ~3u);
    for (unsigned i = threadIdx.x; i < d; i += blockDim.x) qsh[i] = query[i];
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    const unsigned nchunks = (d + CW - 1) / CW;
    const unsigned ngroups = (n + TR - 1) / TR;
    const unsigned my = blockIdx.x < ngroups ? (ngroups - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
    const unsigned items = my * nchunks;
    auto issue = [&](unsigned i) {
        if (i < items) {
            const unsigned g = blockIdx.x + (i / nchunks) * gridDim.x;
            const unsigned c = i % nchunks;
            float* tile = tiles + (i % S) * TILE;
            for (unsigned idx = threadIdx.x; idx < TILE / 4; idx += 256) {
                const unsigned r = idx / (CW / 4);
                const unsigned col = c * CW + (idx % (CW / 4)) * 4;
                const size_t row = (size_t)g * TR + r;
                if (row < n && col < d) cp16(tile + r * CW + (idx % (CW / 4)) * 4, corpus + row * d + col);
            }
        }
        commit();
    };
    for (int i = 0; i < S - 1; ++i) issue(i);
    float acc[RT];
    for (unsigned i = 0; i < items; ++i) {
        wait_groups<S - 2>();
        __syncthreads();
        issue(i + S - 1);
        const unsigned c = i % nchunks;
        if (c == 0)
            for (int r = 0; r < RT; ++r) acc[r] = 0.0f;
        const float* tile = tiles + (i % S) * TILE + warp * RT * CW;
#pragma unroll
        for (int s = 0; s < CW / 32; ++s) {
            const unsigned col = c * CW + 32 * s + lane;
            if (col < d) {
                const float qv = qsh[col];
#pragma unroll
                for (int r = 0; r < RT; ++r) acc[r] = __fmaf_rn(qv, tile[r * CW + 32 * s + lane], acc[r]);
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
    wait_groups<0>();
}

// 32 warps, one block per SM; warp w streams RT-row groups (grid stride over
// every warp of the grid) in 128-column tiles through its own S-deep ring.
// HIST: every score also counted in a shared 4,096-bin histogram, flushed to
// `hist` at the end.
template <int RT, int S, bool HIST>
__global__ void __launch_bounds__(1024, 1) v_warp(const float* __restrict__ corpus, unsigned n,
                                                  unsigned d, const float* __restrict__ query,
                                                  float* __restrict__ scores,
                                                  unsigned* __restrict__ hist) {
    constexpr int CW = 128, TILE = RT * CW;
    extern __shared__ float4 sm4[];
    __shared__ unsigned h[HIST ? 4096 : 1];
    float* qsh = reinterpret_cast<float*>(sm4);
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    float* ring = qsh + ((d + 3) & ~3u) + warp * S * TILE;
    for (unsigned i = threadIdx.x; i < d; i += blockDim.x) qsh[i] = query[i];
    if (HIST)
        for (unsigned i = threadIdx.x; i < 4096; i += blockDim.x) h[i] = 0u;
    const unsigned gw = blockIdx.x * 32 + warp, nw = gridDim.x * 32;
    const unsigned nchunks = (d + CW - 1) / CW;
    const unsigned ngroups = (n + RT - 1) / RT;
    const unsigned my = gw < ngroups ? (ngroups - gw + nw - 1) / nw : 0;
    const unsigned items = my * nchunks;
    auto issue = [&](unsigned i) {
        if (i < items) {
            const unsigned g = gw + (i / nchunks) * nw;
            const unsigned c = i % nchunks;
            float* tile = ring + (i % S) * TILE;
#pragma unroll
            for (unsigned idx = lane; idx < TILE / 4; idx += 32) {
                const unsigned r = idx / (CW / 4);
                const unsigned col = c * CW + (idx % (CW / 4)) * 4;
                const size_t row = (size_t)g * RT + r;
                if (row < n && col < d) cp16(tile + r * CW + (idx % (CW / 4)) * 4, corpus + row * d + col);
            }
        }
        commit();
    };
    for (int i = 0; i < S - 1; ++i) issue(i);
    __syncthreads();  // query and histogram ready
    float acc[RT];
    for (unsigned i = 0; i < items; ++i) {
        wait_groups<S - 2>();
        __syncwarp();
        issue(i + S - 1);
        const unsigned c = i % nchunks;
        if (c == 0)
            for (int r = 0; r < RT; ++r) acc[r] = 0.0f;
        const float* tile = ring + (i % S) * TILE;
#pragma unroll
        for (int s = 0; s < CW / 32; ++s) {
            const unsigned col = c * CW + 32 * s + lane;
            if (col < d) {
                const float qv = qsh[col];
#pragma unroll
                for (int r = 0; r < RT; ++r) acc[r] = __fmaf_rn(qv, tile[r * CW + 32 * s + lane], acc[r]);
            }
        }
        if (c == nchunks - 1) {
            const size_t row0 = (size_t)(gw + (i / nchunks) * nw) * RT;
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                float s = topk_butterfly(acc[r]);
                if (lane == (unsigned)r && row0 + r < n) {
                    scores[row0 + r] = s;
                    if (HIST) atomicAdd(&h[topk_ordered_bits(s) >> 20], 1u);
                }
            }
        }
    }
    wait_groups<0>();
    if (HIST) {
        __syncthreads();
        for (unsigned i = threadIdx.x; i < 4096; i += blockDim.x)
            if (h[i]) atomicAdd(&hist[i], h[i]);
    }
}

__global__ void v_read(const float4* __restrict__ x, size_t n4, float* out) {
    float a = 0.f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
         i += (size_t)gridDim.x * blockDim.x) {
        float4 v = __ldg(x + i);
        a += v.x + v.y + v.z + v.w;
    }
    if (a == 12345.0f) *out = a;
}

// `rounds` grid barriers (the engine's counter + generation scheme).
__global__ void __launch_bounds__(1024, 1) g_barriers(unsigned* ctr, unsigned rounds) {
    unsigned* count = ctr;
    volatile unsigned* gen = ctr + 1;
    for (unsigned r = 0; r < rounds; ++r) {
        __syncthreads();
        if (threadIdx.x == 0) {
            const unsigned g = *gen;
            __threadfence();
            if (atomicAdd(count, 1u) == gridDim.x - 1) {
                *count = 0u;
                __threadfence();
                atomicAdd(const_cast<unsigned*>(gen), 1u);
            } else {
                while (*gen == g) __nanosleep(32);
            }
            __threadfence();
        }
        __syncthreads();
    }
}

static float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

template <typename F>
static float time_kernel(F launch, int reps) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> t;
    for (int i = 0; i < 3; ++i) launch();
    for (int i = 0; i < reps; ++i) {
        CK(cudaEventRecord(a));
        launch();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms * 1000.f);
    }
    CK(cudaGetLastError());
    return median(t);
}

int main() {
    const size_t maxn = 1000000, maxd = 1024;
    float *corpus, *query, *scores, *sink;
    unsigned *hist, *ctr;
    CK(cudaMalloc(&corpus, maxn * maxd * 4));
    CK(cudaMalloc(&query, maxd * 4));
    CK(cudaMalloc(&scores, maxn * 4));
    CK(cudaMalloc(&sink, 4096 * 4));
    CK(cudaMalloc(&hist, 4096 * 4));
    CK(cudaMalloc(&ctr, 64));
    CK(cudaMemset(ctr, 0, 64));
    {
        std::vector<float> h(maxn * maxd);
        unsigned s = 12345;
        for (auto& x : h) {
            s = s * 1664525u + 1013904223u;
            x = ((s >> 8) * (1.0f / 16777216.0f) - 0.5f) * 0.1f;
        }
        CK(cudaMemcpy(corpus, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(query, h.data() + 7 * maxd, maxd * 4, cudaMemcpyHostToDevice));
    }
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    for (int i = 0; i < 200; ++i) v_read<<<sms * 8, 512>>>((const float4*)corpus, maxn * maxd / 4, sink);
    CK(cudaDeviceSynchronize());

    // Grid barrier cost: 132 x 1024 cooperative, 0 vs 20 rounds.
    {
        auto coop = [&](unsigned rounds) {
            void* args[] = {&ctr, &rounds};
            return time_kernel([&] {
                CK(cudaLaunchCooperativeKernel((void*)g_barriers, sms, 1024, args, 0, 0));
            }, 50);
        };
        float t0 = coop(0), t20 = coop(20);
        printf("{\"coop_empty_us\":%.2f,\"coop_20_barriers_us\":%.2f,\"per_barrier_us\":%.2f}\n",
               t0, t20, (t20 - t0) / 20);
        fflush(stdout);
    }

    struct Cfg {
        unsigned n, d;
    } cfgs[] = {{10000, 384},  {10000, 1024},  {50000, 768},   {100000, 384},
                {100000, 1024}, {500000, 384}, {1000000, 384}, {1000000, 1024}};
    std::vector<float> ref(maxn), got(maxn);
    for (auto c : cfgs) {
        const unsigned n = c.n, d = c.d;
        const size_t bytes = (size_t)n * d * 4;
        float t_read = time_kernel([&] { v_read<<<sms * 8, 512>>>((const float4*)corpus, bytes / 16, sink); }, 20);
        size_t qbytes = ((d + 3) & ~3u) * 4;
        size_t smem_b = qbytes + 3 * 32 * 128 * 4;
        CK(cudaFuncSetAttribute(v_block, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_b));
        int per = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, v_block, 256, smem_b));
        unsigned grid_b = std::min<unsigned>((n + 31) / 32, per * sms);
        float t_block = time_kernel([&] { v_block<<<grid_b, 256, smem_b>>>(corpus, n, d, query, scores); }, 20);
        CK(cudaMemcpy(ref.data(), scores, n * 4, cudaMemcpyDeviceToHost));
        unsigned bad = 0;
        auto warp_t = [&](auto kern, int rt, int s) {
            size_t smem = qbytes + (size_t)32 * s * rt * 128 * 4;
            CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            int p = 0;
            CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&p, kern, 1024, smem));
            if (p < 1) return -1.0f;
            CK(cudaMemset(scores, 0, n * 4));
            float t = time_kernel([&] { kern<<<sms, 1024, smem>>>(corpus, n, d, query, scores, hist); }, 20);
            CK(cudaMemcpy(got.data(), scores, n * 4, cudaMemcpyDeviceToHost));
            for (unsigned i = 0; i < n; ++i) bad += (memcmp(&ref[i], &got[i], 4) != 0);
            return t;
        };
        float w2_6 = warp_t(v_warp<2, 6, false>, 2, 6);
        float w2_6h = warp_t(v_warp<2, 6, true>, 2, 6);
        float w4_3 = warp_t(v_warp<4, 3, false>, 4, 3);
        float w1_12 = warp_t(v_warp<1, 12, false>, 1, 12);
        float w2_4 = warp_t(v_warp<2, 4, false>, 2, 4);
        float w1_8h = warp_t(v_warp<1, 8, true>, 1, 8);
        printf("{\"n\":%u,\"d\":%u,\"read_us\":%.1f,\"block4x3_us\":%.1f,\"warp2x6_us\":%.1f,"
               "\"warp2x6_hist_us\":%.1f,\"warp4x3_us\":%.1f,\"warp1x12_us\":%.1f,\"warp2x4_us\":%.1f,"
               "\"warp1x8_hist_us\":%.1f,\"mismatches\":%u}\n",
               n, d, t_read, t_block, w2_6, w2_6h, w4_3, w1_12, w2_4, w1_8h, bad);
        fflush(stdout);
    }
    CK(cudaDeviceSynchronize());
    return 0;
}
