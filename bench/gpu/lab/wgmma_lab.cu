// The filtered batch's lower bounds from wgmma (kernels/filter90.cu)
// against the mma.sync kernel (kernels/filter.cu): where each bound puts
// the exact score inside its interval, and their times side by side.
//
// Not part of the engine: a standalone CUDA C++ program, built with the
// pinned nvcc of `cargo xtask cuda-toolchain` (static cudart):
//   T=target/cuda-toolchain/py/nvidia/cu13
//   $T/bin/nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -fmad=false -I kernels \
//       -L$T/lib -o wgmma_lab bench/gpu/lab/wgmma_lab.cu
// Usage: wgmma_lab. Output: one JSON object per line.
//
// Check: for sampled pairs, p = (exact - lower) / w with the exact dot
// product in double; every bound must give 0 <= p <= 2 (the canonical score
// is within 2^-19 of the exact one, far inside the margin), and
// |a - exact| / (|q| |x|) (a = lower + w) shows the tensor cores' own error
// against the 2^-8 the width allows. Rows are scaled by powers of two from
// 2^-20 to 2^20 in the second data set, so that the bounds are relative.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "filter.cu"
#include "norms.cu"
#include "filter90.cu"
#include "w9_copy.cuh"
#include "lab.cuh"

// Lab variants of the wgmma kernel's shape: (WGQ, WGR, STAGES).
template <int WGQ, int WGR, int ST, int LAB>
__global__ void __launch_bounds__(W9Shape<WGQ, WGR, ST>::THREADS)
    lab_w9(const float* __restrict__ corpus, const float* __restrict__ rnorm, unsigned n,
           unsigned d, const float* __restrict__ queries, unsigned nq,
           const float* __restrict__ qnorm, float* __restrict__ scores, float* __restrict__ sub,
           unsigned sub_shift) {
    w9_scores<TOPK_DOT, WGQ, WGR, ST, LAB>(corpus, rnorm, n, d, queries, nq, qnorm, nullptr,
                                           scores, sub, sub_shift);
}

typedef void (*Approx)(const float*, const float*, unsigned, unsigned, const float*, unsigned,
                       const float*, float*, float*, unsigned);

struct Data {
    unsigned n, d, nq;
    std::vector<float> x, q, xn, qn;
    float *dx, *dq, *dxn, *dqn, *ds;
};

static void fill(Data& a, unsigned n, unsigned d, unsigned nq, bool scaled) {
    a.n = n;
    a.d = d;
    a.nq = nq;
    a.x.resize((size_t)n * d);
    a.q.resize((size_t)nq * d);
    unsigned s = 2024;
    auto uni = [&]() {
        s = s * 1664525u + 1013904223u;
        return (s >> 8) * (1.0f / 16777216.0f) - 0.5f;
    };
    for (size_t r = 0; r < n; ++r) {
        const float sc = scaled ? std::ldexp(1.0f, (int)(r % 41) - 20) : 1.0f;
        for (size_t i = 0; i < d; ++i) a.x[r * d + i] = (uni() + uni() + uni()) * sc;
    }
    // Queries near rows (so that some pairs score high), plus noise.
    for (size_t j = 0; j < nq; ++j) {
        const size_t r = (j * 7919) % n;
        for (size_t i = 0; i < d; ++i) a.q[j * d + i] = a.x[r * d + i] * 0.7f + uni() * 0.3f;
    }
    a.xn.resize(n);
    a.qn.resize(nq);
    for (size_t r = 0; r < n; ++r) {
        double t = 0;
        for (size_t i = 0; i < d; ++i) t += (double)a.x[r * d + i] * a.x[r * d + i];
        a.xn[r] = (float)std::sqrt(t);
    }
    for (size_t j = 0; j < nq; ++j) {
        double t = 0;
        for (size_t i = 0; i < d; ++i) t += (double)a.q[j * d + i] * a.q[j * d + i];
        a.qn[j] = (float)std::sqrt(t);
    }
    CK(cudaMalloc(&a.dx, a.x.size() * 4));
    CK(cudaMalloc(&a.dq, a.q.size() * 4));
    CK(cudaMalloc(&a.dxn, n * 4));
    CK(cudaMalloc(&a.dqn, nq * 4));
    CK(cudaMalloc(&a.ds, (size_t)n * nq * 4));
    CK(cudaMemcpy(a.dx, a.x.data(), a.x.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(a.dq, a.q.data(), a.q.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(a.dxn, a.xn.data(), n * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(a.dqn, a.qn.data(), nq * 4, cudaMemcpyHostToDevice));
}

static void release(Data& a) {
    CK(cudaFree(a.dx));
    CK(cudaFree(a.dq));
    CK(cudaFree(a.dxn));
    CK(cudaFree(a.dqn));
    CK(cudaFree(a.ds));
}

struct Kernel {
    const char* name;
    Approx f;
    unsigned bq, br, threads;
    size_t smem;
};

template <int WGQ, int WGR, int ST, int LAB = 0>
static Kernel w9_kernel(const char* name) {
    using SH = W9Shape<WGQ, WGR, ST>;
    Approx f = lab_w9<WGQ, WGR, ST, LAB>;
    CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, SH::SMEM));
    return Kernel{name, f, SH::BQ, SH::BR, SH::THREADS, SH::SMEM};
}

static void launch(const Kernel& k, const Data& a) {
    const unsigned blocks = ((a.nq + k.bq - 1) / k.bq) * ((a.n + k.br - 1) / k.br);
    k.f<<<blocks, k.threads, k.smem>>>(a.dx, a.dxn, a.n, a.d, a.dq, a.nq, a.dqn, a.ds, nullptr, 0);
    CK(cudaGetLastError());
}

// Dot only: p of sampled pairs and the tensor-core error.
static void check(const Kernel& k, const Data& a, const char* set) {
    launch(k, a);
    CK(cudaDeviceSynchronize());
    std::vector<float> lo((size_t)a.n * a.nq);
    CK(cudaMemcpy(lo.data(), a.ds, lo.size() * 4, cudaMemcpyDeviceToHost));
    double pmin = 1e30, pmax = -1e30, emax = 0;
    size_t bad = 0, pairs = 0;
    const double e = std::ldexp(1.0, -8) + a.d * std::ldexp(1.0, -22);
    for (size_t j = 0; j < a.nq; ++j) {
        for (size_t r = j % 7; r < a.n; r += 7) {
            double t = 0;
            for (size_t i = 0; i < a.d; ++i) t += (double)a.q[j * a.d + i] * a.x[r * a.d + i];
            const double qx = (double)a.qn[j] * a.xn[r];
            const double w = e * qx;
            const double l = lo[j * a.n + r];
            const double p = (t - l) / w;
            pmin = std::min(pmin, p);
            pmax = std::max(pmax, p);
            emax = std::max(emax, std::fabs(l + w - t) / qx);
            bad += !(p >= 0.0 && p <= 2.0);
            ++pairs;
        }
    }
    printf("{\"check\":\"%s\",\"set\":\"%s\",\"n\":%u,\"d\":%u,\"nq\":%u,\"pairs\":%zu,"
           "\"outside\":%zu,\"p_min\":%.4f,\"p_max\":%.4f,\"err_over_2^-10\":%.4f}\n",
           k.name, set, a.n, a.d, a.nq, pairs, bad, pmin, pmax, emax / std::ldexp(1.0, -10));
}

static void timing(const std::vector<Kernel>& ks, unsigned n, unsigned d, unsigned nq) {
    Data a;
    // Timing data need no host check: fill the device directly.
    a.n = n;
    a.d = d;
    a.nq = nq;
    CK(cudaMalloc(&a.dx, (size_t)n * d * 4));
    CK(cudaMalloc(&a.dq, (size_t)nq * d * 4));
    CK(cudaMalloc(&a.dxn, n * 4));
    CK(cudaMalloc(&a.dqn, nq * 4));
    CK(cudaMalloc(&a.ds, (size_t)n * nq * 4));
    std::vector<float> hq((size_t)nq * d);
    lab_fill_rows(a.dx, a.dq, n, d, 0);
    CK(cudaMemcpy(hq.data(), a.dx, hq.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(a.dq, hq.data(), hq.size() * 4, cudaMemcpyHostToDevice));
    topk_norms<<<1024, SCORE_THREADS>>>(a.dx, n, d, a.dxn);
    topk_norms<<<64, SCORE_THREADS>>>(a.dq, nq, d, a.dqn);
    CK(cudaDeviceSynchronize());
    const double flop = 2.0 * n * (double)d * nq;
    float base = 0.0f;
    for (const Kernel& k : ks) {
        const float t = lab_event_ms(3, 10, [&] { launch(k, a); });
        if (base == 0.0f) base = t;
        printf("{\"timing\":\"%s\",\"n\":%u,\"d\":%u,\"nq\":%u,\"ms\":%.4f,"
               "\"over_mma_sync\":%.3f,\"tflops\":%.1f}\n",
               k.name, n, d, nq, t, t / base, flop / t / 1e9);
        fflush(stdout);
    }
    release(a);
}

int main() {
    CK(cudaFuncSetAttribute(topk_approx_dot, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            AX_STAGES * (AX_BQ + AX_BR) * AX_LD * 4));
    const Kernel old{"mma_sync", topk_approx_dot, AX_BQ, AX_BR, AX_THREADS,
                     (size_t)AX_STAGES * (AX_BQ + AX_BR) * AX_LD * 4};
    std::vector<Kernel> ks = {old,
                              w9_kernel<1, 2, 4>("wg_q64_r256_s4"),
                              w9_kernel<2, 1, 6>("wg_q128_r128_s6"),
                              w9_kernel<2, 1, 4>("wg_q128_r128_s4"),
                              w9_kernel<4, 1, 4>("wg_q256_r128_s4"),
                              w9_kernel<2, 2, 4>("wg_q128_r256_s4"),
                              w9_kernel<1, 1, 8>("wg_q64_r128_s8")};
    std::vector<Kernel> parts = {old,
                                 w9_kernel<2, 2, 4>("wg_q128_r256_s4"),
                                 w9_kernel<2, 2, 4, 1>("wg_q128_r256_s4_copies_only"),
                                 w9_kernel<2, 2, 4, 2>("wg_q128_r256_s4_products_only")};
    timing(parts, 1000000, 1024, 256);
    timing(parts, 1000000, 1024, 64);
    timing(parts, 1000000, 384, 256);
    if (getenv("LAB_PARTS_ONLY") != nullptr) return 0;
    for (int scaled = 0; scaled < 2; ++scaled) {
        for (unsigned d : {36u, 100u, 384u, 1024u}) {
            Data a;
            fill(a, 3000 + 17 * d % 300, d, d == 1024 ? 130 : 70, scaled != 0);
            const char* set = scaled ? "scaled" : "plain";
            for (const Kernel& k : ks) check(k, a, set);
            release(a);
            fflush(stdout);
        }
    }
    timing(ks, 1000000, 1024, 64);
    timing(ks, 1000000, 1024, 256);
    timing(ks, 1000000, 384, 256);
    timing(ks, 100000, 1024, 256);
    return 0;
}
