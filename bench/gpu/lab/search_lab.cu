// Where does the one-launch search kernel lose to the lab's warp-private
// scoring loop? Not part of the engine: a standalone CUDA C++ program, built
// on the GPU machine with
// `nvcc -O3 -arch=sm_90 -fmad=false -I kernels bench/gpu/lab/search_lab.cu`.
// It includes the engine's kernels (kernels/score.cu) and times, with CUDA
// events, the lab loop launched normally and cooperatively, the engine's
// topk_search1_dot (cooperative, K = 100) and topk_score1_dot.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "score.cu"

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

// The grid barrier of v7's one-launch search (every block waits for the
// last to arrive; no threshold).
__device__ __forceinline__ void lab_grid_sync(unsigned* __restrict__ area) {
    unsigned* count = area + TOPK_AREA_CTR + TOPK_CTR_BAR;
    volatile unsigned* gen = area + TOPK_AREA_CTR + TOPK_CTR_GEN;
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned g = *gen;
        __threadfence();
        if (atomicAdd(count, 1u) == gridDim.x - 1) {
            *count = 0u;
            __threadfence();
            atomicAdd(const_cast<unsigned*>(gen), 1u);
        } else {
            while (*gen == g) __nanosleep(64);
        }
        __threadfence();
    }
    __syncthreads();
}

// The engine's scoring loop alone (PRIVATE staging as topk_search1), with
// (HIST) or without the shared histogram; then returns.
template <bool HIST>
__global__ void __launch_bounds__(1024, 1) e_score_only(const float* __restrict__ corpus, unsigned n,
                                                        unsigned d, const float* __restrict__ query,
                                                        float* __restrict__ scores) {
    extern __shared__ float4 topk_dyn_smem[];
    __shared__ float qn_sh;
    float* qsh = reinterpret_cast<float*>(topk_dyn_smem);
    unsigned* h = reinterpret_cast<unsigned*>(qsh + ((d + 3u) & ~3u));
    float* tiles = reinterpret_cast<float*>(h + TOPK_L1_BINS);
    topk_zero_shared(h, TOPK_L1_BINS);
    const float qn = load_query<TOPK_DOT>(query, d, qsh, &qn_sh);
    stage_score<TOPK_DOT, true, SEARCH_WARPS, SEARCH_RT, SEARCH_DEPTH, true>(
        corpus, nullptr, n, d, qsh, qn, scores, tiles, HIST ? h : nullptr);
    if (HIST) {
        __syncthreads();
        if (h[threadIdx.x] == 0xffffffffu) scores[0] = 1.0f;
    }
}

// The engine's scoring with RT rows per warp, DEPTH tiles, then the full
// selection tail of topk_search1 (flush, grid barrier, threshold, gather,
// last block selects).
template <int RT, int DEPTH, int STOP = 9>
__global__ void __launch_bounds__(1024, 1) e_search(const float* __restrict__ corpus, unsigned n,
                                                    unsigned d, const float* __restrict__ query,
                                                    float* __restrict__ scores, unsigned* __restrict__ area,
                                                    unsigned k, unsigned long long* __restrict__ cand,
                                                    unsigned long long* __restrict__ maybe,
                                                    TopkNeighbor* __restrict__ out) {
    extern __shared__ float4 topk_dyn_smem[];
    __shared__ float qn_sh;
    float* qsh = reinterpret_cast<float*>(topk_dyn_smem);
    unsigned* h = reinterpret_cast<unsigned*>(qsh + ((d + 3u) & ~3u));
    float* tiles = reinterpret_cast<float*>(h + TOPK_L1_BINS);
    topk_zero_shared(h, TOPK_L1_BINS);
    const float qn = load_query<TOPK_DOT>(query, d, qsh, &qn_sh);
    stage_score<TOPK_DOT, true, SEARCH_WARPS, RT, DEPTH, true>(corpus, nullptr, n, d, qsh, qn, scores,
                                                               tiles, h);
    __syncthreads();
    if (STOP == 0) return;
    topk_flush_hist(h, area);
    if (STOP == 1) {
        // keep the area zero for the next launch
        lab_grid_sync(area);
        for (unsigned i = threadIdx.x + blockIdx.x * 1024; i < TOPK_L1_BINS; i += gridDim.x * 1024) area[i] = 0u;
        return;
    }
    if (STOP == 3) {  // two barriers, no threshold
        lab_grid_sync(area);
        lab_grid_sync(area);
        for (unsigned i = threadIdx.x + blockIdx.x * 1024; i < TOPK_L1_BINS; i += gridDim.x * 1024) area[i] = 0u;
        return;
    }
    if (STOP == 4) {  // barrier, threshold, no zeroing (the histogram accumulates)
        lab_grid_sync(area);
        const TopkThreshold t4 = topk_threshold_block<true, false>(area, k);
        if (t4.bucket == 12345u) scores[0] = 0.0f;
        return;
    }
    if (STOP == 5) {  // the last block to arrive finds the threshold, the others wait for it
        __shared__ bool last;
        __shared__ TopkThreshold ts;
        volatile unsigned* gen = area + TOPK_AREA_CTR + TOPK_CTR_GEN;
        unsigned g = 0;
        if (threadIdx.x == 0) {
            g = *gen;
            __threadfence();
            last = atomicAdd(area + TOPK_AREA_CTR + TOPK_CTR_BAR, 1u) == gridDim.x - 1;
        }
        __syncthreads();
        if (last) {
            __threadfence();
            const TopkThreshold t5 = topk_threshold_block<true, false>(area, k);
            if (threadIdx.x == 0) {
                reinterpret_cast<TopkThreshold*>(area + TOPK_AREA_CTR + 8)[0] = t5;
                area[TOPK_AREA_CTR + TOPK_CTR_BAR] = 0u;
                __threadfence();
                atomicAdd(const_cast<unsigned*>(gen), 1u);
            }
        } else if (threadIdx.x == 0) {
            while (*gen == g) __nanosleep(64);
            __threadfence();
        }
        if (threadIdx.x == 0) {
            const uint4 v = __ldcg(reinterpret_cast<const uint4*>(area + TOPK_AREA_CTR + 8));
            ts.bucket = v.x;
            ts.above = v.y;
            ts.in_bucket = v.z;
        }
        __syncthreads();
        if (ts.bucket == 12345u) scores[0] = 0.0f;
        lab_grid_sync(area);
        for (unsigned i = threadIdx.x + blockIdx.x * 1024; i < TOPK_L1_BINS; i += gridDim.x * 1024) area[i] = 0u;
        return;
    }
    lab_grid_sync(area);
    const TopkThreshold t = topk_threshold_block<true, false>(area, k);
    if (STOP == 2) {
        lab_grid_sync(area);
        for (unsigned i = threadIdx.x + blockIdx.x * 1024; i < TOPK_L1_BINS; i += gridDim.x * 1024) area[i] = 0u;
        if (t.bucket == 12345u) scores[0] = 0.0f;
        return;
    }
    topk_gather_rows(scores, nullptr, n, t, blockIdx.x * TOPK_SEL_THREADS,
                     gridDim.x * TOPK_SEL_THREADS, area, cand, maybe);
    if (!topk_last_block(&area[TOPK_AREA_CTR + TOPK_CTR_GATHER], gridDim.x)) return;
    for (unsigned i = threadIdx.x; i < TOPK_L1_BINS; i += TOPK_SEL_THREADS) area[i] = 0u;
    unsigned long long* keys = reinterpret_cast<unsigned long long*>(tiles);
    topk_select_block(scores, t, k, area, cand, maybe, keys,
                      reinterpret_cast<unsigned*>(keys + TOPK_CAND_CAP), out);
}

// After the engine's scoring and one grid barrier, every block reads 4,096
// words: MODE 0 nothing; 1 the area histogram (written by other blocks'
// atomics); 2 a buffer nothing in this kernel touched; 3 its own scores;
// 4 as 1, but each thread first touches the area and the scores (one word per
// 64 KiB) right after its own scoring, before the barrier.
template <int MODE>
__global__ void __launch_bounds__(1024, 1) e_after(const float* __restrict__ corpus, unsigned n,
                                                   unsigned d, const float* __restrict__ query,
                                                   float* __restrict__ scores, unsigned* __restrict__ area,
                                                   const unsigned* __restrict__ cold) {
    extern __shared__ float4 topk_dyn_smem[];
    __shared__ float qn_sh;
    float* qsh = reinterpret_cast<float*>(topk_dyn_smem);
    unsigned* h = reinterpret_cast<unsigned*>(qsh + ((d + 3u) & ~3u));
    float* tiles = reinterpret_cast<float*>(h + TOPK_L1_BINS);
    topk_zero_shared(h, TOPK_L1_BINS);
    const float qn = load_query<TOPK_DOT>(query, d, qsh, &qn_sh);
    stage_score<TOPK_DOT, true, SEARCH_WARPS, SEARCH_RT, SEARCH_DEPTH, true>(corpus, nullptr, n, d, qsh, qn,
                                                                            scores, tiles, h);
    __syncthreads();
    topk_flush_hist(h, area);
    unsigned acc = 0;
    if (MODE == 4) {
        acc += __ldcg(area + threadIdx.x * 4);
        for (size_t i = (size_t)threadIdx.x * 16384; i < n; i += 1024 * 16384) acc += __float_as_uint(__ldcg(scores + i));
    }
    topk_grid_threshold(area, 1);  // barrier (the last block also scans and zeroes the histogram)
    if (MODE == 1 || MODE == 4) {
        for (unsigned i = threadIdx.x; i < 4096; i += 1024) acc += __ldcg(area + ((i * 7 + blockIdx.x) & 4095));
    } else if (MODE == 2) {
        for (unsigned i = threadIdx.x; i < 4096; i += 1024) acc += __ldcg(cold + blockIdx.x * 4096 + i);
    } else if (MODE == 3) {
        for (unsigned i = threadIdx.x; i < 4096; i += 1024) acc += __float_as_uint(__ldcg(scores + ((size_t)blockIdx.x * 4096 + i) % n));
    }
    if (acc == 0x12345u) scores[0] = 1.0f;
    if (blockIdx.x == 0 && threadIdx.x < 3) area[TOPK_AREA_CTR + TOPK_CTR_TH + threadIdx.x] = 0u;
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
    unsigned *hist, *area;
    unsigned long long *cand, *maybe;
    TopkNeighbor* out;
    unsigned* cold;
    CK(cudaMalloc(&cold, 132 * 4096 * 4 * 2));
    CK(cudaMemset(cold, 0, 132 * 4096 * 4 * 2));
    CK(cudaMalloc(&corpus, maxn * maxd * 4));
    CK(cudaMalloc(&query, maxd * 4));
    CK(cudaMalloc(&scores, maxn * 4));
    CK(cudaMalloc(&sink, 4096 * 4));
    CK(cudaMalloc(&hist, 4096 * 4));
    CK(cudaMalloc(&area, 2 * TOPK_AREA_STRIDE * 4));  // room past the area for stop 5
    CK(cudaMemset(area, 0, 2 * TOPK_AREA_STRIDE * 4));
    CK(cudaMalloc(&cand, TOPK_CAND_CAP * 8));
    CK(cudaMalloc(&maybe, TOPK_MAYBE_CAP * 8));
    CK(cudaMalloc(&out, 4096 * 8));
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
    struct Cfg {
        unsigned n, d;
    } cfgs[] = {{100000, 1024}, {1000000, 384}, {1000000, 1024}};
    std::vector<float> ref(maxn), got(maxn);
    for (auto c : cfgs) {
        unsigned n = c.n, d = c.d, k = 100;
        const size_t qbytes = ((d + 3) & ~3u) * 4;
        // lab loop, normal and cooperative
        auto kw = v_warp<4, 3, true>;
        size_t smem_w = qbytes + (size_t)32 * 3 * 4 * 128 * 4;
        CK(cudaFuncSetAttribute(kw, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_w));
        float t_w = time_kernel([&] { kw<<<sms, 1024, smem_w>>>(corpus, n, d, query, scores, hist); }, 20);
        CK(cudaMemcpy(ref.data(), scores, n * 4, cudaMemcpyDeviceToHost));
        float t_wc = time_kernel([&] {
            void* args[] = {&corpus, &n, &d, &query, &scores, &hist};
            CK(cudaLaunchCooperativeKernel((void*)kw, sms, 1024, args, smem_w, 0));
        }, 20);
        // engine search kernel
        size_t smem_s = qbytes + 4096 * 4 + (size_t)32 * 3 * 4 * 128 * 4;
        CK(cudaFuncSetAttribute(topk_search1_dot, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_s));
        unsigned blocks = std::min<unsigned>((n + 127) / 128, sms);
        CK(cudaMemset(scores, 0, n * 4));
        float t_s = time_kernel([&] {
            void* args[] = {&corpus, &sink, &n, &d, &query, &scores, &area, &k, &cand, &maybe, &out};
            CK(cudaLaunchCooperativeKernel((void*)topk_search1_dot, blocks, 1024, args, smem_s, 0));
        }, 20);
        CK(cudaMemcpy(got.data(), scores, n * 4, cudaMemcpyDeviceToHost));
        unsigned bad = 0;
        for (unsigned i = 0; i < n; ++i) bad += memcmp(&ref[i], &got[i], 4) != 0;
        // engine separate scoring kernel
        size_t smem_1 = qbytes + 3 * 32 * 128 * 4;
        CK(cudaFuncSetAttribute(topk_score1_dot, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_1));
        int per = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, topk_score1_dot, 256, smem_1));
        unsigned g1 = std::min<unsigned>((n + 31) / 32, per * sms);
        float t_1 = time_kernel([&] { topk_score1_dot<<<g1, 256, smem_1>>>(corpus, sink, n, d, query, scores); }, 20);
        CK(cudaMemcpy(got.data(), scores, n * 4, cudaMemcpyDeviceToHost));
        for (unsigned i = 0; i < n; ++i) bad += memcmp(&ref[i], &got[i], 4) != 0;
        auto only_t = [&](auto kern) {
            CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_s));
            CK(cudaMemset(scores, 0, n * 4));
            float t = time_kernel([&] { kern<<<blocks, 1024, smem_s>>>(corpus, n, d, query, scores); }, 20);
            CK(cudaMemcpy(got.data(), scores, n * 4, cudaMemcpyDeviceToHost));
            for (unsigned i = 0; i < n; ++i) bad += memcmp(&ref[i], &got[i], 4) != 0;
            return t;
        };
        float t_o0 = only_t(e_score_only<false>);
        float t_o1 = only_t(e_score_only<true>);
        auto es_t = [&](auto kern, int rt, int depth) {
            size_t sm = qbytes + 4096 * 4 + (size_t)32 * depth * rt * 128 * 4;
            CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
            CK(cudaMemset(scores, 0, n * 4));
            CK(cudaMemset(area, 0, 2 * TOPK_AREA_STRIDE * 4));
            unsigned b = std::min<unsigned>((n + 32 * rt - 1) / (32 * rt), sms);
            float t = time_kernel([&] {
                void* args[] = {&corpus, &n, &d, &query, &scores, &area, &k, &cand, &maybe, &out};
                CK(cudaLaunchCooperativeKernel((void*)kern, b, 1024, args, sm, 0));
            }, 20);
            CK(cudaMemcpy(got.data(), scores, n * 4, cudaMemcpyDeviceToHost));
            for (unsigned i = 0; i < n; ++i) bad += memcmp(&ref[i], &got[i], 4) != 0;
            return t;
        };
        auto af_t = [&](auto kern) {
            CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_s));
            CK(cudaMemset(area, 0, 2 * TOPK_AREA_STRIDE * 4));
            return time_kernel([&] {
                void* args[] = {&corpus, &n, &d, &query, &scores, &area, &cold};
                CK(cudaLaunchCooperativeKernel((void*)kern, blocks, 1024, args, smem_s, 0));
            }, 20);
        };
        float a0 = af_t(e_after<0>), a1 = af_t(e_after<1>), a2 = af_t(e_after<2>), a3 = af_t(e_after<3>),
              a4 = af_t(e_after<4>);
        printf("{\"n\":%u,\"d\":%u,\"after_nothing_us\":%.1f,\"after_area_us\":%.1f,\"after_cold_us\":%.1f,"
               "\"after_own_scores_us\":%.1f,\"after_area_touched_before_us\":%.1f}\n",
               n, d, a0, a1, a2, a3, a4);
        fflush(stdout);
        if (n < 100000) continue;
        float t_e43 = es_t(e_search<4, 3>, 4, 3);
        float t_e26 = es_t(e_search<4, 3, 0>, 4, 3);
        float t_e24 = es_t(e_search<4, 3, 1>, 4, 3);
        float t_e2 = es_t(e_search<4, 3, 2>, 4, 3);
        float t_e3 = es_t(e_search<4, 3, 3>, 4, 3);
        float t_e5 = es_t(e_search<4, 3, 5>, 4, 3);
        float t_e4 = es_t(e_search<4, 3, 4>, 4, 3);
        printf("{\"n\":%u,\"d\":%u,\"lab_warp4x3_hist_us\":%.1f,\"lab_coop_us\":%.1f,\"engine_search1_us\":%.1f,"
               "\"engine_score1_us\":%.1f,\"score1_per_sm\":%d,\"e_score_only_us\":%.1f,"
               "\"e_score_only_hist_us\":%.1f,\"e_search4x3_us\":%.1f,\"stop0_score_us\":%.1f,"
               "\"stop1_flush_barrier_us\":%.1f,\"stop2_threshold_us\":%.1f,\"stop3_two_barriers_us\":%.1f,"
               "\"stop4_threshold_no_barrier_us\":%.1f,\"stop5_last_block_threshold_us\":%.1f,\"mismatches\":%u}\n",
               n, d, t_w, t_wc, t_s, t_1, per, t_o0, t_o1, t_e43, t_e26, t_e24, t_e2, t_e3, t_e4, t_e5, bad);
        fflush(stdout);
    }
    CK(cudaDeviceSynchronize());
    return 0;
}
