// Lab: where the one-block select of a small corpus spends its time.
//
// Runs the engine's own helpers (kernels/select.cuh) in a copy of
// topk_select_small that stops after a given stage, so that differences of
// event times give each pass's cost:
//   0  zero the histogram only
//   1  + level-1 histogram of every score (kept in the shared stash)
//   2  + threshold scan of the 4,096 bins
//   3  + gather of the candidates into the lists
//   4  + topk_select_block into device memory (the whole selection)
//   5  the whole selection into mapped host memory (as the engine's default)
//   6  stage 1 with 16 rows per thread in flight instead of TOPK_ROWS_ILP
//   7  stage 2, then the gather's loads and votes without its appends
// Scores are seeded Gaussian (sigma 0.05, like the dot products of
// L2-normalised 384-dimensional rows); stage 4 is checked against a host sort.
// Build: nvcc -O3 -arch=sm_90 -fmad=false -I kernels -o select_lab bench/gpu/lab/select_lab.cu
// Prints one JSON line per (n, k, stage).
#include <cmath>
#include <cstring>

#include "lab.cuh"
#include "select.cuh"

// topk_hist_rows with ILP rows per thread in flight (stage 6).
template <unsigned ILP>
__device__ __forceinline__ void hist_rows_ilp(const float* __restrict__ sc, unsigned n,
                                              unsigned* h, unsigned* keep) {
    for (unsigned base = 0; base < n; base += TOPK_SEL_THREADS * ILP) {
        unsigned ob[ILP];
#pragma unroll
        for (unsigned j = 0; j < ILP; ++j) {
            const unsigned i = base + j * TOPK_SEL_THREADS + threadIdx.x;
            ob[j] = i < n ? topk_ordered_bits(__ldcg(sc + i)) : 0u;
        }
#pragma unroll
        for (unsigned j = 0; j < ILP; ++j) {
            const unsigned i = base + j * TOPK_SEL_THREADS + threadIdx.x;
            if (i < n) {
                keep[i] = ob[j];
                atomicAdd(&h[ob[j] >> (32 - TOPK_L1_BITS)], 1u);
            }
        }
    }
}

template <int STAGE>
__global__ void __launch_bounds__(TOPK_SEL_THREADS)
    select_stages(const float* __restrict__ sc, unsigned n, unsigned* __restrict__ area,
                  unsigned long long* __restrict__ cand, unsigned long long* __restrict__ maybe,
                  unsigned k, TopkNeighbor* __restrict__ out, unsigned* __restrict__ sink) {
    __shared__ unsigned long long keys[TOPK_CAND_CAP];
    extern __shared__ unsigned topk_stash[];
    unsigned* h = reinterpret_cast<unsigned*>(keys);
    __shared__ unsigned ctr[2];
    if (threadIdx.x < 2) {
        ctr[threadIdx.x] = 0u;
    }
    topk_zero_shared(h, TOPK_L1_BINS);
    if (STAGE == 6) {
        hist_rows_ilp<16>(sc, n, h, topk_stash);
        __syncthreads();
    } else if (STAGE >= 1) {
        topk_hist_rows(sc, n, 0, TOPK_SEL_THREADS, h, topk_stash);
        __syncthreads();
    }
    if (STAGE < 2 || STAGE == 6) {
        if (threadIdx.x == 0) {
            sink[0] = h[TOPK_L1_BINS - 1] + h[0];
        }
        return;
    }
    const TopkThreshold t = topk_threshold_block<false>(h, k);
    if (STAGE < 3) {
        if (threadIdx.x == 0) {
            sink[0] = t.bucket + t.above;
        }
        return;
    }
    if (STAGE == 7) {
        unsigned seen = 0;
        for (unsigned base = 0; base < n; base += TOPK_SEL_THREADS * TOPK_ROWS_ILP) {
            unsigned ob[TOPK_ROWS_ILP];
            topk_load_bits(sc, topk_stash, n, base, TOPK_SEL_THREADS, ob);
            seen += __any_sync(TOPK_FULL_MASK, topk_round_has_candidate(ob, t.bucket));
        }
        __syncthreads();
        if (seen == 12345u) {
            sink[0] = seen;
        }
        return;
    }
    topk_gather_rows(sc, topk_stash, n, t, 0, TOPK_SEL_THREADS, ctr, cand, maybe);
    __syncthreads();
    if (STAGE < 4) {
        if (threadIdx.x == 0) {
            sink[0] = ctr[0] + ctr[1];
        }
        return;
    }
    // The stash (n >= 8,192 words here) is the ranking's scratch, as in the engine.
    topk_select_block(sc, t, k, area, cand, maybe, keys,
                      reinterpret_cast<unsigned long long*>(topk_stash), out);
}

typedef void (*Kernel)(const float*, unsigned, unsigned*, unsigned long long*,
                       unsigned long long*, unsigned, TopkNeighbor*, unsigned*);

int main() {
    const unsigned ns[] = {10000, 16384};
    const unsigned ks[] = {8, 100, 1000};
    const Kernel stages[] = {select_stages<0>, select_stages<1>, select_stages<2>,
                             select_stages<3>, select_stages<4>, select_stages<4>,
                             select_stages<6>, select_stages<7>};
    const unsigned nmax = 16384;
    const std::vector<float> hs = lab_gaussian_scores(nmax);
    float* sc;
    unsigned *area, *sink;
    unsigned long long *cand, *maybe;
    TopkNeighbor *out, *mapped, *mapped_dev;
    CK(cudaMalloc(&sc, nmax * 4));
    CK(cudaMemcpy(sc, hs.data(), nmax * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&area, TOPK_AREA_STRIDE * 4));
    CK(cudaMemset(area, 0, TOPK_AREA_STRIDE * 4));
    CK(cudaMalloc(&sink, 4));
    CK(cudaMalloc(&cand, TOPK_CAND_CAP * 8));
    CK(cudaMalloc(&maybe, TOPK_MAYBE_CAP * 8));
    CK(cudaMalloc(&out, 1024 * 8 + 8));
    CK(cudaHostAlloc(&mapped, 1024 * 8 + 8, cudaHostAllocMapped));
    CK(cudaHostGetDevicePointer(&mapped_dev, mapped, 0));
    for (int st = 0; st <= 7; ++st) {
        CK(cudaFuncSetAttribute(stages[st], cudaFuncAttributeMaxDynamicSharedMemorySize,
                                TOPK_STASH_ROWS * 4));
    }
    for (unsigned n : ns) {
        for (unsigned k : ks) {
            const size_t smem = n * 4;
            for (int st = 0; st <= 7; ++st) {
                const Kernel f = stages[st];
                TopkNeighbor* o = st != 5 ? out : mapped_dev;
                const float ms = lab_event_ms(20, 200, [&] {
                    f<<<1, TOPK_SEL_THREADS, smem>>>(sc, n, area, cand, maybe, k, o, sink);
                });
                CK(cudaGetLastError());
                int correct = -1;
                if (st == 4 || st == 5) {
                    std::vector<TopkNeighbor> got(k + 1);
                    if (st == 4) {
                        CK(cudaMemcpy(got.data(), out, (k + 1) * 8, cudaMemcpyDeviceToHost));
                    } else {
                        CK(cudaDeviceSynchronize());
                        memcpy(got.data(), mapped, (k + 1) * 8);
                    }
                    std::vector<unsigned> idx(n);
                    for (unsigned i = 0; i < n; ++i) idx[i] = i;
                    std::stable_sort(idx.begin(), idx.end(),
                                     [&](unsigned a, unsigned b) { return hs[a] > hs[b]; });
                    correct = got[0].index == TOPK_STATUS_OK;
                    for (unsigned r = 0; r < k; ++r) {
                        correct &= got[1 + r].index == idx[r] &&
                                   memcmp(&got[1 + r].score, &hs[idx[r]], 4) == 0;
                    }
                }
                printf("{\"kind\":\"select_small_stage\",\"n\":%u,\"k\":%u,\"stage\":%d,"
                       "\"us\":%.2f,\"correct\":%d}\n",
                       n, k, st, ms * 1e3f, correct);
            }
        }
    }
    return 0;
}
