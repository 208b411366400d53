// The filtered batch's Hopper lower bounds (kernels/filter90.cu) with the
// stages filled by the copy engine (w9_scores_tma: a producer warp, tensor
// maps, mbarriers) against every thread copying its share (w9_scores,
// cp.async): both must write the same bits (the same products in the same
// order), and their times side by side, for f32 rows (TF32 products) and
// f16 rows (f16 products of topk_queries16's operands), at 3 and 4 stages.
//
// Not part of the engine: a standalone CUDA C++ program, built with the
// pinned nvcc of `cargo xtask cuda-toolchain` (static cudart; the tensor
// maps are encoded through the runtime's driver entry point, no -lcuda):
//   $NVCC -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -fmad=false -I kernels \
//       -o tma_lab bench/gpu/lab/tma_lab.cu
// Usage: tma_lab. Output: one JSON object per line; the exit status is 1
// when any two kernels' bounds differ.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "norms.cu"
#include "filter90.cu"
#include "w9_copy.cuh"
#include "lab.cuh"
#include "w9_lab.cuh"

template <class T>
__global__ void __launch_bounds__(W9Engine::THREADS)
    lab_copy(const T* __restrict__ corpus, const float* __restrict__ rnorm, unsigned n, unsigned d,
             const T* __restrict__ queries, unsigned nq, const float* __restrict__ qnorm,
             const float* __restrict__ qinv, float* __restrict__ scores) {
    w9_scores<TOPK_DOT, W9_WGQ, W9_WGR, W9_STAGES, 0, T>(corpus, rnorm, n, d, queries, nq, qnorm,
                                                         qinv, scores, nullptr, 0);
}

template <class SH, class T>
__global__ void __launch_bounds__(SH::TMA_THREADS, 1)
    lab_tma(const __grid_constant__ W9Map qmap, const __grid_constant__ W9Map cmap,
            const float* __restrict__ rnorm, unsigned n, unsigned d, unsigned nq,
            const float* __restrict__ qnorm, const float* __restrict__ qinv,
            float* __restrict__ scores) {
    w9_scores_tma<TOPK_DOT, SH, T>(qmap, cmap, rnorm, n, d, nq, qnorm, qinv, nullptr, scores,
                                   nullptr, 0, 0);
}

static PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
    static PFN_cuTensorMapEncodeTiled_v12000 f = nullptr;
    if (f == nullptr) {
        cudaDriverEntryPointQueryResult r;
        CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void**)&f, 12000,
                                            cudaEnableDefault, &r));
        if (r != cudaDriverEntryPointSuccess || f == nullptr) {
            fprintf(stderr, "no cuTensorMapEncodeTiled\n");
            exit(1);
        }
    }
    return f;
}

// The engine's map of `rows` vectors of d values of `bytes` each, boxes of
// 128 bytes by `box` vectors.
static W9Map make_map(const void* base, size_t rows, unsigned d, unsigned bytes, unsigned box) {
    W9Map m;
    static_assert(sizeof(W9Map) == sizeof(CUtensorMap), "tensor map size");
    const cuuint64_t dims[2] = {d, rows};
    const cuuint64_t strides[1] = {(cuuint64_t)d * bytes};
    const cuuint32_t boxes[2] = {128u / bytes, box};
    const cuuint32_t elems[2] = {1, 1};
    const CUtensorMapDataType t =
        bytes == 4 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    CUresult r = encode_fn()(reinterpret_cast<CUtensorMap*>(&m), t, 2, const_cast<void*>(base),
                             dims, strides, boxes, elems, CU_TENSOR_MAP_INTERLEAVE_NONE,
                             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "cuTensorMapEncodeTiled: %d\n", (int)r);
        exit(1);
    }
    return m;
}

struct Set {
    unsigned n, d, nq;
    float *x, *q, *xn, *qn, *qinv, *s0, *s1;
    TopkF16 *x16, *q16;
};

static Set make_set(unsigned n, unsigned d, unsigned nq) {
    Set a{n, d, nq};
    CK(cudaMalloc(&a.x, (size_t)n * d * 4));
    CK(cudaMalloc(&a.q, (size_t)nq * d * 4));
    CK(cudaMalloc(&a.xn, n * 4));
    CK(cudaMalloc(&a.qn, nq * 4));
    CK(cudaMalloc(&a.qinv, nq * 4));
    CK(cudaMalloc(&a.s0, (size_t)n * nq * 4));
    CK(cudaMalloc(&a.s1, (size_t)n * nq * 4));
    CK(cudaMalloc(&a.x16, (size_t)n * d * 2));
    CK(cudaMalloc(&a.q16, (size_t)nq * d * 2));
    // Rows from the labs' LCG; queries are rows (0, 7, 14, ...) so that
    // some pairs score high.
    lab_fill_rows(a.x, a.q, n, d, 0);
    for (unsigned j = 0; j < nq; ++j) {
        CK(cudaMemcpy(a.q + (size_t)j * d, a.x + (size_t)((7ull * j) % n) * d, d * 4,
                      cudaMemcpyDeviceToDevice));
    }
    topk_norms<<<1024, SCORE_THREADS>>>(a.x, n, d, a.xn);
    topk_norms<<<64, SCORE_THREADS>>>(a.q, nq, d, a.qn);
    CK(cudaDeviceSynchronize());
    return a;
}

static void free_set(Set& a) {
    for (void* p : {(void*)a.x, (void*)a.q, (void*)a.xn, (void*)a.qn, (void*)a.qinv, (void*)a.s0,
                    (void*)a.s1, (void*)a.x16, (void*)a.q16}) {
        CK(cudaFree(p));
    }
}

static bool same(const Set& a) {
    std::vector<float> h0((size_t)a.n * a.nq), h1(h0.size());
    CK(cudaMemcpy(h0.data(), a.s0, h0.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(h1.data(), a.s1, h1.size() * 4, cudaMemcpyDeviceToHost));
    return std::memcmp(h0.data(), h1.data(), h0.size() * 4) == 0;
}

template <class SH, class T>
static void run_tma(const Set& a, float* out, const W9Map& qm, const W9Map& cm, const float* xn) {
    const unsigned blocks = ((a.nq + SH::BQ - 1) / SH::BQ) * ((a.n + SH::BR - 1) / SH::BR);
    lab_tma<SH, T><<<blocks, SH::TMA_THREADS, SH::TMA_SMEM>>>(
        qm, cm, xn, a.n, a.d, a.nq, a.qn, sizeof(T) == 2 ? a.qinv : nullptr, out);
    CK(cudaGetLastError());
}

// One storage type: the copy kernel into s0, each TMA shape into s1,
// compared bit for bit and timed.
template <class T, class SH3, class SH4>
static bool compare(Set& a, bool timed, const char* dtype) {
    const bool half = sizeof(T) == 2;
    const T* x = half ? (const T*)a.x16 : (const T*)a.x;
    const T* q = half ? (const T*)a.q16 : (const T*)a.q;
    float* xn = a.xn;
    if (half) {
        // Rows rounded to f16 (their widened values into x, norms of those).
        lab_narrow<TopkF16><<<1024, 256>>>(a.x, (size_t)a.n * a.d, a.x16, a.x);
        topk_norms<<<1024, SCORE_THREADS>>>(a.x, a.n, a.d, a.xn);
        if constexpr (sizeof(T) == 2) {
            lab_queries16<T><<<64, 256>>>(a.q, a.nq, a.d, (T*)a.q16, a.qinv);
        }
        CK(cudaDeviceSynchronize());
    }
    const unsigned cblocks =
        ((a.nq + W9Engine::BQ - 1) / W9Engine::BQ) * ((a.n + W9Engine::BR - 1) / W9Engine::BR);
    auto copy = [&] {
        lab_copy<T><<<cblocks, W9Engine::THREADS, W9Engine::SMEM>>>(
            x, xn, a.n, a.d, q, a.nq, a.qn, half ? a.qinv : nullptr, a.s0);
        CK(cudaGetLastError());
    };
    const W9Map qm = make_map(q, a.nq, a.d, sizeof(T), SH4::BQ);
    const W9Map cm = make_map(x, a.n, a.d, sizeof(T), SH4::BR);
    copy();
    bool ok = true;
    const char* names[2] = {"tma_s3", "tma_s4"};
    for (int v = 0; v < 2; ++v) {
        CK(cudaMemset(a.s1, 0xff, (size_t)a.n * a.nq * 4));
        if (v == 0) {
            run_tma<SH3, T>(a, a.s1, qm, cm, xn);
        } else {
            run_tma<SH4, T>(a, a.s1, qm, cm, xn);
        }
        CK(cudaDeviceSynchronize());
        const bool eq = same(a);
        ok = ok && eq;
        printf("{\"check\":\"%s\",\"dtype\":\"%s\",\"n\":%u,\"d\":%u,\"nq\":%u,\"same_bits\":%s}\n",
               names[v], dtype, a.n, a.d, a.nq, eq ? "true" : "false");
    }
    if (timed) {
        const double flop = 2.0 * a.n * (double)a.d * a.nq;
        const float tc = lab_event_ms(3, 10, copy);
        const float t3 = lab_event_ms(3, 10, [&] { run_tma<SH3, T>(a, a.s1, qm, cm, xn); });
        const float t4 = lab_event_ms(3, 10, [&] { run_tma<SH4, T>(a, a.s1, qm, cm, xn); });
        printf("{\"timing\":\"bounds\",\"dtype\":\"%s\",\"n\":%u,\"d\":%u,\"nq\":%u,"
               "\"copy_ms\":%.4f,\"tma_s3_ms\":%.4f,\"tma_s4_ms\":%.4f,\"tma_s4_over_copy\":%.3f,"
               "\"tma_s4_tflops\":%.1f}\n",
               dtype, a.n, a.d, a.nq, tc, t3, t4, t4 / tc, flop / t4 / 1e9);
    }
    fflush(stdout);
    return ok;
}

int main() {
    using S3 = W9Shape<W9_WGQ, W9_WGR, 3>;
    using S4 = W9Engine;
    CK(cudaFuncSetAttribute(lab_copy<float>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            W9Engine::SMEM));
    CK(cudaFuncSetAttribute(lab_copy<TopkF16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            W9Engine::SMEM));
    CK(cudaFuncSetAttribute(lab_tma<S3, float>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            S3::TMA_SMEM));
    CK(cudaFuncSetAttribute(lab_tma<S4, float>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            S4::TMA_SMEM));
    CK(cudaFuncSetAttribute(lab_tma<S3, TopkF16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            S3::TMA_SMEM));
    CK(cudaFuncSetAttribute(lab_tma<S4, TopkF16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            S4::TMA_SMEM));
    bool ok = true;
    // (n, d, nq, timed): edges first (partial tiles in every dimension,
    // D not a multiple of a stage), then the benchmark shapes.
    const unsigned shapes[][4] = {{3001, 104, 70, 0},    {1000, 40, 1, 0},
                                  {777, 1024, 129, 0},   {20000, 384, 256, 0},
                                  {1000000, 1024, 256, 1}, {1000000, 384, 256, 1},
                                  {1000000, 1024, 1024, 1}, {100000, 1024, 256, 1}};
    for (const auto& s : shapes) {
        Set a = make_set(s[0], s[1], s[2]);
        ok = compare<float, S3, S4>(a, s[3] != 0, "f32") && ok;
        if (s[1] % 8 == 0) {
            ok = compare<TopkF16, S3, S4>(a, s[3] != 0, "f16") && ok;
        }
        free_set(a);
    }
    printf("{\"all_same_bits\":%s}\n", ok ? "true" : "false");
    return ok ? 0 : 1;
}
