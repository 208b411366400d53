// Does finding the threshold inside the single-query scoring kernel pay?
//
// Not part of the engine: a standalone CUDA C++ program that compiles the
// engine's own kernels (kernels/score.cu and kernels/select.cu) into one
// binary and times, with CUDA events, on Gaussian rows:
// - `plain`: topk_score1_dot alone (the scores only);
// - `plain+hist`: that, then topk_hist over the N scores (the separate path);
// - `fused`: topk_score1_dot with a query area, each block counting the rows
//   it scored and the last one finding the threshold (no topk_hist);
// - `read`: a float4 streaming read of the same bytes (the ceiling).
// The fused threshold is checked against topk_hist's, field by field. A
// second section times the staged loop with several epilogues (fuse_epi).
// Build: nvcc -O3 -arch=sm_90 -fmad=false -I kernels -o fuse_lab bench/gpu/lab/fuse_lab.cu
// With -DFUSE_LAB_PLAIN_ONLY it builds against a score.cu whose kernel has no
// area parameter (an older checkout's kernels) and times `plain` and
// `plain+hist` only. Output: one JSON object per line.
#include <cstdio>
#include <cstring>
#include <vector>

#include "lab.cuh"
#include "score_single.cu"
#include "select.cu"

__global__ void fuse_read(const float4* __restrict__ x, size_t n4, float* out) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
         i += (size_t)gridDim.x * blockDim.x) {
        const float4 v = __ldcs(x + i);
        acc.x += v.x;
        acc.y += v.y;
        acc.z += v.z;
        acc.w += v.w;
    }
    if (acc.x == 12345.0f) {
        out[0] = acc.y + acc.z + acc.w;
    }
}

#ifndef FUSE_LAB_PLAIN_ONLY
// The engine's staged loop (8 warps, 4 rows, 3 tiles) followed by one of
// several epilogues, to find what in a kernel's code after the loop slows
// the loop itself: 0 none; 1 a static shared variable; 2 shared atomics in
// the tiles' memory; 3 global atomics; 4 topk_threshold_own_rows (the engine's).
// With FUSE_EPI_ALIGN (default 1) the tiles start on a 128-byte boundary,
// as the engine's do (topk_tiles_after); 0 puts them right after the query.
#ifndef FUSE_EPI_ALIGN
#define FUSE_EPI_ALIGN 1
#endif
template <int EPI>
__global__ void __launch_bounds__(256)
    fuse_epi(const float* __restrict__ corpus, unsigned n, unsigned d,
             const float* __restrict__ query, float* __restrict__ scores,
             unsigned* __restrict__ area, unsigned k, TopkThreshold* __restrict__ th) {
    extern __shared__ float4 topk_dyn_smem[];
    float* qsh = reinterpret_cast<float*>(topk_dyn_smem);
    float* tiles = FUSE_EPI_ALIGN ? topk_tiles_after(qsh, d) : qsh + ((d + 3u) & ~3u);
    for (unsigned i = threadIdx.x; i < d; i += blockDim.x) {
        qsh[i] = query[i];
    }
    __syncthreads();
    stage_score<TOPK_DOT, true, 8, 4, 3>(corpus, nullptr, n, d, qsh, 0.0f, scores, tiles);
    if (area == nullptr) {
        return;
    }
    if (EPI == 1) {
        __shared__ unsigned s;
        if (threadIdx.x == 0) {
            s = area[0];
        }
        __syncthreads();
        if (threadIdx.x == 1) {
            area[1] = s + 1u;
        }
    } else if (EPI == 2) {
        unsigned* h = reinterpret_cast<unsigned*>(tiles);
        __syncthreads();
        h[threadIdx.x] = 0u;
        __syncthreads();
        atomicAdd(&h[topk_ordered_bits(scores[blockIdx.x * 32 + (threadIdx.x & 31)]) & 255u], 1u);
        __syncthreads();
        if (h[threadIdx.x] == 12345u) {
            area[threadIdx.x] = 1u;
        }
    } else if (EPI == 3) {
        atomicAdd(&area[4000u + (threadIdx.x & 63u)], 1u);
    } else if (EPI == 4) {
        topk_threshold_own_rows<256, 32>(scores, n, reinterpret_cast<unsigned*>(tiles), area, k,
                                         th);
    }
}

template <int EPI>
static void fuse_epi_run(unsigned n, unsigned d, float* corpus, float* query,
                         float* scores, unsigned* area, TopkThreshold* th) {
    const size_t smem = (size_t)d * 4 + TOPK_TILE_ALIGN + 3 * 32 * 128 * 4;
    int per = 0;
    const unsigned blocks = lab_staged_grid(fuse_epi<EPI>, 256, smem, n, 32, &per);
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, fuse_epi<EPI>));
    const float t = lab_event_ms(5, 30, [&] {
        fuse_epi<EPI><<<blocks, 256, smem>>>(corpus, n, d, query, scores, area, 100, th + 1);
    });
    CK(cudaDeviceSynchronize());
    printf("{\"kind\":\"epilogue\",\"epi\":%d,\"n\":%u,\"d\":%u,\"regs\":%d,\"static_smem\":%zu,"
           "\"per_sm\":%d,\"us\":%.1f}\n",
           EPI, n, d, fa.numRegs, fa.sharedSizeBytes, per, t * 1e3f);
    fflush(stdout);
}
#endif

int main() {
    const size_t maxn = 1000000, maxd = 1024;
    float *corpus, *query, *scores, *sink;
    unsigned* area;
    TopkThreshold* th;
    CK(cudaMalloc(&corpus, maxn * maxd * 4));
    CK(cudaMalloc(&query, maxd * 4));
    CK(cudaMalloc(&scores, maxn * 4));
    CK(cudaMalloc(&sink, 16));
    CK(cudaMalloc(&area, TOPK_AREA_STRIDE * 4));
    CK(cudaMalloc(&th, 2 * sizeof(TopkThreshold)));
    CK(cudaMemset(area, 0, TOPK_AREA_STRIDE * 4));
    lab_fill_rows(corpus, query, maxn, maxd, 7);
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    for (int i = 0; i < 100; ++i) {
        fuse_read<<<sms * 8, 512>>>((const float4*)corpus, maxn * maxd / 4, sink);
    }
    CK(cudaDeviceSynchronize());
    const unsigned k = 100;
    struct Cfg {
        unsigned n, d;
    } cfgs[] = {{50000, 384},   {100000, 384},  {100000, 1024},
                {500000, 384},  {500000, 1024}, {1000000, 384}, {1000000, 1024}};
    for (auto c : cfgs) {
        const unsigned n = c.n, d = c.d;
#ifdef FUSE_LAB_PLAIN_ONLY
        const size_t smem = (size_t)d * 4 + 3 * 32 * 128 * 4;
#else
        const size_t smem = (size_t)d * 4 + TOPK_TILE_ALIGN + 3 * 32 * 128 * 4;
#endif
        int per = 0;
        const unsigned blocks = lab_staged_grid(topk_score1_dot, 256, smem, n, 32, &per);
        const unsigned hist_blocks = std::min<unsigned>((n + 16383) / 16384, sms);
        const float t_read = lab_event_ms(5, 30, [&] {
            fuse_read<<<sms * 8, 512>>>((const float4*)corpus, (size_t)n * d / 4, sink);
        });
#ifdef FUSE_LAB_PLAIN_ONLY
        auto plain = [&] { topk_score1_dot<<<blocks, 256, smem>>>(corpus, nullptr, n, d, query, scores); };
#else
        auto plain = [&] {
            topk_score1_dot<<<blocks, 256, smem>>>(corpus, nullptr, n, d, query, scores, nullptr,
                                                  0, nullptr);
        };
#endif
        const float t_plain = lab_event_ms(5, 30, plain);
        auto hist = [&] { topk_hist<<<dim3(hist_blocks, 1), 1024>>>(scores, n, area, k, th); };
        const float t_plain_hist = lab_event_ms(5, 30, [&] {
            plain();
            hist();
        });
        CK(cudaDeviceSynchronize());
        float t_fused = -1.0f;
        bool same = true;
#ifndef FUSE_LAB_PLAIN_ONLY
        t_fused = lab_event_ms(5, 30, [&] {
            topk_score1_dot<<<blocks, 256, smem>>>(corpus, nullptr, n, d, query, scores, area, k,
                                                  th + 1);
        });
        CK(cudaDeviceSynchronize());
        plain();
        hist();
        TopkThreshold t[2];
        CK(cudaMemcpy(t, th, sizeof(t), cudaMemcpyDeviceToHost));
        same = t[0].bucket == t[1].bucket && t[0].above == t[1].above &&
               t[0].in_bucket == t[1].in_bucket;
#endif
        printf("{\"n\":%u,\"d\":%u,\"k\":%u,\"blocks\":%u,\"per_sm\":%d,\"read_us\":%.1f,"
               "\"plain_us\":%.1f,\"plain_hist_us\":%.1f,\"fused_us\":%.1f,\"same\":%s}\n",
               n, d, k, blocks, per, t_read * 1e3f, t_plain * 1e3f, t_plain_hist * 1e3f,
               t_fused * 1e3f, same ? "true" : "false");
        fflush(stdout);
    }
#ifndef FUSE_LAB_PLAIN_ONLY
    for (auto c : cfgs) {
        if (c.d != 1024) {
            continue;
        }
        printf("{\"kind\":\"epilogue-align\",\"align\":%d}\n", FUSE_EPI_ALIGN);
        fuse_epi_run<0>(c.n, c.d, corpus, query, scores, area, th);
        fuse_epi_run<1>(c.n, c.d, corpus, query, scores, area, th);
        fuse_epi_run<2>(c.n, c.d, corpus, query, scores, area, th);
        fuse_epi_run<3>(c.n, c.d, corpus, query, scores, area, th);
        fuse_epi_run<4>(c.n, c.d, corpus, query, scores, area, th);
    }
#endif
    return 0;
}
