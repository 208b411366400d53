// The filtered batch's lower bounds over half-width rows from wgmma
// (kernels/filter90.cu, f16 x f16 and bf16 x bf16 products of the stored
// rows and each query scaled and rounded by w9_halves) against the f32
// rows' TF32 wgmma bounds and the half rows' mma.sync ones: where each
// bound puts the exact score inside its interval, and their times side by
// side.
//
// Not part of the engine: a standalone CUDA C++ program, built with the
// pinned nvcc of `cargo xtask cuda-toolchain` (static cudart):
//   $NVCC -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -fmad=false -I kernels \
//       -o wgmma16_lab bench/gpu/lab/wgmma16_lab.cu
// Usage: wgmma16_lab. Output: one JSON object per line.
//
// Check: for sampled pairs, p = (exact - lower) / w with the exact dot
// product in double of the f32 query and the stored row; every bound must
// give 0 <= p <= 2, and |a - exact| / (|q| |x|) shows the tensor cores' own
// error against the 2^-8 the width allows. The data sets scale rows by
// powers of two (f16 from 2^-14, subnormal values included, to 2^10; bf16
// from 2^-40 to 2^40) and queries by 2^-60 to 2^60.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "norms.cu"
#include "filter90.cu"
#include "w9_copy.cuh"
#include "lab.cuh"
#include "w9_lab.cuh"

template <int LAB, class T>
__global__ void __launch_bounds__(W9Engine::THREADS)
    lab_w9h(const T* __restrict__ corpus, const float* __restrict__ rnorm, unsigned n, unsigned d,
            const T* __restrict__ queries, unsigned nq, const float* __restrict__ qnorm,
            const float* __restrict__ qinv, float* __restrict__ scores) {
    w9_scores<TOPK_DOT, W9_WGQ, W9_WGR, W9_STAGES, LAB>(corpus, rnorm, n, d, queries, nq, qnorm,
                                                        qinv, scores, nullptr, 0);
}

__global__ void __launch_bounds__(W9Engine::THREADS)
    lab_w9f(const float* __restrict__ corpus, const float* __restrict__ rnorm, unsigned n,
            unsigned d, const float* __restrict__ queries, unsigned nq,
            const float* __restrict__ qnorm, float* __restrict__ scores) {
    w9_scores<TOPK_DOT, W9_WGQ, W9_WGR, W9_STAGES>(corpus, rnorm, n, d, queries, nq, qnorm,
                                                   nullptr, scores, nullptr, 0);
}

template <class T>
struct Half {
    unsigned n, d, nq;
    std::vector<float> x, q, xn, qn;  // x: the stored values, widened
    T *dx, *dq16;
    float *dxf, *dq, *dxn, *dqn, *dinv, *ds;

    void alloc(unsigned n_, unsigned d_, unsigned nq_) {
        n = n_;
        d = d_;
        nq = nq_;
        CK(cudaMalloc(&dx, (size_t)n * d * sizeof(T)));
        CK(cudaMalloc(&dq16, (size_t)nq * d * sizeof(T)));
        CK(cudaMalloc(&dxf, (size_t)n * d * 4));
        CK(cudaMalloc(&dq, (size_t)nq * d * 4));
        CK(cudaMalloc(&dxn, n * 4));
        CK(cudaMalloc(&dqn, nq * 4));
        CK(cudaMalloc(&dinv, nq * 4));
        CK(cudaMalloc(&ds, (size_t)n * nq * 4));
    }
    // Rows from f32 `hx` (host), rounded on the device; queries `hq` as they are.
    void upload(const std::vector<float>& hx, const std::vector<float>& hq) {
        float* tmp;
        CK(cudaMalloc(&tmp, hx.size() * 4));
        CK(cudaMemcpy(tmp, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
        lab_narrow<T><<<1024, 256>>>(tmp, hx.size(), dx, dxf);
        CK(cudaGetLastError());
        CK(cudaFree(tmp));
        CK(cudaMemcpy(dq, hq.data(), hq.size() * 4, cudaMemcpyHostToDevice));
        topk_norms<<<1024, SCORE_THREADS>>>(dxf, n, d, dxn);
        topk_norms<<<64, SCORE_THREADS>>>(dq, nq, d, dqn);
        CK(cudaDeviceSynchronize());
    }
    void fetch() {
        x.resize((size_t)n * d);
        q.resize((size_t)nq * d);
        xn.resize(n);
        qn.resize(nq);
        CK(cudaMemcpy(x.data(), dxf, x.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(q.data(), dq, q.size() * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(xn.data(), dxn, n * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(qn.data(), dqn, nq * 4, cudaMemcpyDeviceToHost));
    }
    void release() {
        for (void* p : {(void*)dx, (void*)dq16, (void*)dxf, (void*)dq, (void*)dxn, (void*)dqn,
                        (void*)dinv, (void*)ds}) {
            CK(cudaFree(p));
        }
    }
};

static unsigned blocks_of(unsigned nq, unsigned n) {
    return ((nq + W9Engine::BQ - 1) / W9Engine::BQ) * ((n + W9Engine::BR - 1) / W9Engine::BR);
}

template <int LAB, class T>
static void run_half(Half<T>& a, bool convert = true) {
    if (convert) {
        lab_queries16<T><<<(a.nq + 7) / 8, 256>>>(a.dq, a.nq, a.d, a.dq16, a.dinv);
    }
    lab_w9h<LAB, T><<<blocks_of(a.nq, a.n), W9Engine::THREADS, W9Engine::SMEM>>>(
        a.dx, a.dxn, a.n, a.d, a.dq16, a.nq, a.dqn, a.dinv, a.ds);
    CK(cudaGetLastError());
}

template <class T>
static void check(const char* type, Half<T>& a, const char* set) {
    run_half<0>(a);
    CK(cudaDeviceSynchronize());
    a.fetch();
    std::vector<float> lo((size_t)a.n * a.nq);
    CK(cudaMemcpy(lo.data(), a.ds, lo.size() * 4, cudaMemcpyDeviceToHost));
    double pmin = 1e30, pmax = -1e30, emax = 0;
    size_t bad = 0, pairs = 0, unbounded = 0;
    const double e = std::ldexp(1.0, -8) + a.d * std::ldexp(1.0, -22);
    for (size_t j = 0; j < a.nq; ++j) {
        for (size_t r = j % 5; r < a.n; r += 5) {
            const double l = lo[j * a.n + r];
            const double qx = (double)a.qn[j] * a.xn[r];
            if (std::isinf(l)) {
                // Only where the pair is always listed (|q|^2 + |x|^2 > 2^100).
                const double s2 = (double)a.qn[j] * a.qn[j] + (double)a.xn[r] * a.xn[r];
                unbounded += 1;
                bad += !(s2 > std::ldexp(1.0, 100) || qx == 0.0);
                continue;
            }
            double t = 0;
            for (size_t i = 0; i < a.d; ++i) t += (double)a.q[j * a.d + i] * a.x[r * a.d + i];
            const double w = e * qx + std::ldexp(1.0, -100) * (a.qn[j] + a.xn[r] + 1.0);
            const double p = (t - l) / w;
            pmin = std::min(pmin, p);
            pmax = std::max(pmax, p);
            if (qx > 0) emax = std::max(emax, std::fabs(l + e * qx - t) / qx);
            bad += !(p >= 0.0 && p <= 2.0);
            ++pairs;
        }
    }
    printf("{\"check\":\"%s\",\"set\":\"%s\",\"n\":%u,\"d\":%u,\"nq\":%u,\"pairs\":%zu,"
           "\"always_listed\":%zu,\"outside\":%zu,\"p_min\":%.4f,\"p_max\":%.4f,"
           "\"err_over_2^-10\":%.4f}\n",
           type, set, a.n, a.d, a.nq, pairs, unbounded, bad, pmin, pmax,
           emax / std::ldexp(1.0, -10));
    fflush(stdout);
}

// Rows: sums of three uniforms in +-0.5, row r scaled by 2^(lo + r % span);
// queries near rows plus noise, query j scaled by 2^qexp[j % 5].
static void make(unsigned n, unsigned d, unsigned nq, int lo, int span, bool qscaled,
                 std::vector<float>& x, std::vector<float>& q) {
    x.resize((size_t)n * d);
    q.resize((size_t)nq * d);
    unsigned s = 2024;
    auto uni = [&]() {
        s = s * 1664525u + 1013904223u;
        return (s >> 8) * (1.0f / 16777216.0f) - 0.5f;
    };
    for (size_t r = 0; r < n; ++r) {
        const float sc = std::ldexp(1.0f, lo + (int)(r % span));
        for (size_t i = 0; i < d; ++i) x[r * d + i] = (uni() + uni() + uni()) * sc;
    }
    const int qexp[5] = {0, -60, 60, -20, 20};
    for (size_t j = 0; j < nq; ++j) {
        const size_t r = (j * 7919) % n;
        const float sc = qscaled ? std::ldexp(1.0f, qexp[j % 5]) : 1.0f;
        for (size_t i = 0; i < d; ++i) q[j * d + i] = (x[r * d + i] * 0.7f + uni() * 0.3f) * sc;
    }
}

template <class T>
static void checks(const char* type, int lo, int span) {
    for (unsigned d : {8u, 40u, 104u, 384u, 1024u}) {
        for (int set = 0; set < 2; ++set) {
            Half<T> a;
            const unsigned n = 3000 + 17 * d % 300, nq = d == 1024 ? 130 : 70;
            std::vector<float> x, q;
            if (set == 0) {
                make(n, d, nq, 0, 1, false, x, q);
            } else {
                make(n, d, nq, lo, span, true, x, q);
            }
            a.alloc(n, d, nq);
            a.upload(x, q);
            check(type, a, set == 0 ? "plain" : "scaled");
            a.release();
        }
    }
}

template <class T>
static void timing(const char* type, unsigned n, unsigned d, unsigned nq, float f32_ms) {
    Half<T> a;
    a.alloc(n, d, nq);
    std::vector<float> hx((size_t)n * d), hq((size_t)nq * d);
    float* tmp;
    CK(cudaMalloc(&tmp, hx.size() * 4));
    lab_fill_rows(tmp, a.dq, n, d, 0);
    CK(cudaMemcpy(hq.data(), tmp, hq.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hx.data(), tmp, hx.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaFree(tmp));
    a.upload(hx, hq);
    const double flop = 2.0 * n * (double)d * nq;
    const float conv = lab_event_ms(3, 20, [&] {
        lab_queries16<T><<<(a.nq + 7) / 8, 256>>>(a.dq, a.nq, a.d, a.dq16, a.dinv);
    });
    const float full = lab_event_ms(3, 10, [&] { run_half<0>(a); });
    const float noprod = lab_event_ms(3, 10, [&] { run_half<1>(a, false); });
    const float nocopy = lab_event_ms(3, 10, [&] { run_half<2>(a, false); });
    printf("{\"timing\":\"%s\",\"n\":%u,\"d\":%u,\"nq\":%u,\"ms\":%.4f,\"over_f32\":%.3f,"
           "\"tflops\":%.1f,\"queries16_ms\":%.4f,\"copies_only_ms\":%.4f,"
           "\"products_only_ms\":%.4f}\n",
           type, n, d, nq, full, full / f32_ms, flop / full / 1e9, conv, noprod, nocopy);
    fflush(stdout);
    a.release();
}

static float timing_f32(unsigned n, unsigned d, unsigned nq) {
    float *x, *q, *xn, *qn, *s;
    CK(cudaMalloc(&x, (size_t)n * d * 4));
    CK(cudaMalloc(&q, (size_t)nq * d * 4));
    CK(cudaMalloc(&xn, n * 4));
    CK(cudaMalloc(&qn, nq * 4));
    CK(cudaMalloc(&s, (size_t)n * nq * 4));
    lab_fill_rows(x, q, n, d, 0);
    CK(cudaMemcpy(q, x, (size_t)nq * d * 4, cudaMemcpyDeviceToDevice));
    topk_norms<<<1024, SCORE_THREADS>>>(x, n, d, xn);
    topk_norms<<<64, SCORE_THREADS>>>(q, nq, d, qn);
    CK(cudaDeviceSynchronize());
    const float t = lab_event_ms(3, 10, [&] {
        lab_w9f<<<blocks_of(nq, n), W9Engine::THREADS, W9Engine::SMEM>>>(x, xn, n, d, q, nq, qn,
                                                                          s);
        CK(cudaGetLastError());
    });
    printf("{\"timing\":\"f32_tf32\",\"n\":%u,\"d\":%u,\"nq\":%u,\"ms\":%.4f,\"tflops\":%.1f}\n", n,
           d, nq, t, 2.0 * n * (double)d * nq / t / 1e9);
    fflush(stdout);
    for (void* p : {(void*)x, (void*)q, (void*)xn, (void*)qn, (void*)s}) CK(cudaFree(p));
    return t;
}

int main() {
    CK(cudaFuncSetAttribute(lab_w9f, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            W9Engine::SMEM));
    for (auto f : {lab_w9h<0, TopkF16>, lab_w9h<1, TopkF16>, lab_w9h<2, TopkF16>}) {
        CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, W9Engine::SMEM));
    }
    for (auto f : {lab_w9h<0, TopkBf16>, lab_w9h<1, TopkBf16>, lab_w9h<2, TopkBf16>}) {
        CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, W9Engine::SMEM));
    }
    checks<TopkF16>("f16", -14, 25);
    checks<TopkBf16>("bf16", -40, 81);
    for (unsigned d : {1024u, 384u}) {
        for (unsigned nq : {256u, 64u}) {
            const float f = timing_f32(1000000, d, nq);
            timing<TopkF16>("f16", 1000000, d, nq, f);
            timing<TopkBf16>("bf16", 1000000, d, nq, f);
        }
    }
    return 0;
}
