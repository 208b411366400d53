// Shared by the lab programs of bench/gpu/lab (not part of the engine):
// error checks and timing.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

// A CUDA runtime call that fails ends the program with the call and reason.

#define CK(x)                                                                                \
    do {                                                                                     \
        cudaError_t e = (x);                                                                 \
        if (e != cudaSuccess) {                                                              \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

// The grid the engine gives a staged kernel `f` of `threads` threads with
// `smem` bytes of dynamic shared memory (which it lets `f` use) over n rows
// taken `rows` at a time by a block: every block that fits the device at
// once, but no more than there are row groups. With `per_sm`, also the
// blocks that fit one SM.
template <typename F>
static unsigned lab_staged_grid(F* f, int threads, size_t smem, unsigned n, unsigned rows,
                                int* per_sm = nullptr) {
    CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int per = 0, sms = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, f, threads, smem));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    if (per_sm != nullptr) *per_sm = per;
    return std::min<unsigned>((n + rows - 1) / rows, (unsigned)(per * sms));
}

static float lab_median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Median time of `reps` launches in ms, each between two CUDA events, after
// `warmup` untimed ones.
template <typename F>
static float lab_event_ms(int warmup, int reps, F launch) {
    for (int i = 0; i < warmup; ++i) launch();
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> t;
    for (int i = 0; i < reps; ++i) {
        CK(cudaEventRecord(a));
        launch();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms);
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return lab_median(t);
}

// Fills `corpus` (device, n x d floats) with the labs' deterministic rows (an
// LCG, values within +-0.05) and `query` (device, d floats) with row `qrow`.
static void lab_fill_rows(float* corpus, float* query, size_t n, size_t d, size_t qrow) {
    std::vector<float> h(n * d);
    unsigned s = 12345;
    for (auto& x : h) {
        s = s * 1664525u + 1013904223u;
        x = ((s >> 8) * (1.0f / 16777216.0f) - 0.5f) * 0.1f;
    }
    CK(cudaMemcpy(corpus, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(query, h.data() + qrow * d, d * 4, cudaMemcpyHostToDevice));
}

// The labs' seeded Gaussian scores (sigma 0.05, like the dot products of
// L2-normalised 384-dimensional rows): `n` (even) values from one LCG by
// Box-Muller, both outputs used, so a shorter list is a prefix of a longer.
static std::vector<float> lab_gaussian_scores(unsigned n) {
    std::vector<float> hs(n);
    unsigned s = 777;
    for (unsigned i = 0; i + 1 < n; i += 2) {
        float u[2];
        for (float& x : u) {
            s = s * 1664525u + 1013904223u;
            x = std::max((s >> 8) * (1.0f / 16777216.0f), 1e-7f);
        }
        const float r = std::sqrt(-2.0f * std::log(u[0])) * 0.05f;
        hs[i] = r * std::cos(6.2831853f * u[1]);
        hs[i + 1] = r * std::sin(6.2831853f * u[1]);
    }
    return hs;
}
