// Lab: where a single query's selection spends its time, stage by stage,
// inside the engine's own kernels.
//
// Not part of the engine: compiles kernels/score.cu and kernels/select.cu
// with TOPK_TRACE, so that each topk_mark records the global timer (the
// earliest and the latest block to pass it; see common.cuh). Marks:
//   0 kernel entry              1 scores written (one-launch: after barrier 1;
//   8 level-1 histogram counted   one-block select: histogram done)
//   9 histogram summed (barrier 2)
//   2 threshold known           3 candidates gathered (last block's ticket)
//   4 topk_select_block entered 5 keys collected in shared memory
//   6 keys ranked               7 results and header written
//  10-12 inside the bucket ranking: keys counted in their buckets, bucket
//   sizes scanned, keys laid out by bucket
// For each configuration it prints, per mark, the median over REPS launches
// of (latest block at the mark - earliest block at the entry), in µs, and
// the event time of the same launch. Runs:
// - `small`: topk_select_small over seeded Gaussian scores (one block);
//   `small-dup` the same with one score far above the rest;
// - `search1`: the cooperative one-launch search of topk_search1_dot, for a
//   query unlike any row, and (`search1-dup`) for a query that is row 7
//   (its own score stands far above the rest, as a near-duplicate's does);
// - `gather`, `gather-dup`: topk_score1_dot with its threshold, then
//   topk_gather (marks from topk_gather's entry).
// Every result is checked against a host sort of the scores the device
// computed (indices and score bits).
// Build: nvcc -O3 -arch=sm_90 -fmad=false -I kernels -o trace_lab bench/gpu/lab/trace_lab.cu
#define TOPK_TRACE
#include <cmath>
#include <cstring>
#include <vector>

#include "lab.cuh"
#include "score_single.cu"
#include "select.cu"

#define REPS 200
#define SEARCH_THREADS 1024
#define SEARCH_ROWS 64
#define SEARCH_TILE_BYTES (4 * 64 * 128 * 4)
#define SINGLE_TILE_BYTES (3 * 32 * 128 * 4)

typedef unsigned long long u64;

static void trace_reset() {
    std::vector<u64> first(TOPK_TRACE_MARKS, ~0ull), last(TOPK_TRACE_MARKS, 0ull);
    CK(cudaMemcpyToSymbol(topk_trace_first, first.data(), TOPK_TRACE_MARKS * 8));
    CK(cudaMemcpyToSymbol(topk_trace_last, last.data(), TOPK_TRACE_MARKS * 8));
}

// Runs `launch` REPS times (after 10 untimed), tracing each, and prints the
// median of every mark reached relative to mark `base`'s earliest block.
template <typename F>
static void trace_run(const char* kind, unsigned n, unsigned d, unsigned k, int base, F launch) {
    for (int i = 0; i < 10; ++i) launch();
    CK(cudaDeviceSynchronize());
    std::vector<std::vector<float>> at(TOPK_TRACE_MARKS);
    for (int r = 0; r < REPS; ++r) {
        trace_reset();
        launch();
        CK(cudaDeviceSynchronize());
        u64 first[TOPK_TRACE_MARKS], last[TOPK_TRACE_MARKS];
        CK(cudaMemcpyFromSymbol(first, topk_trace_first, sizeof(first)));
        CK(cudaMemcpyFromSymbol(last, topk_trace_last, sizeof(last)));
        for (int m = 0; m < TOPK_TRACE_MARKS; ++m) {
            if (last[m] != 0ull && first[base] != ~0ull) {
                at[m].push_back((float)(last[m] - first[base]) * 1e-3f);
            }
        }
    }
    const float ev = lab_event_ms(10, REPS, launch) * 1e3f;
    printf("{\"kind\":\"%s\",\"n\":%u,\"d\":%u,\"k\":%u,\"event_us\":%.2f,\"marks_us\":{", kind,
           n, d, k, ev);
    bool comma = false;
    for (int m = 0; m < TOPK_TRACE_MARKS; ++m) {
        if (at[m].empty()) continue;
        double mean = 0;
        for (float x : at[m]) mean += x;
        mean /= at[m].size();
        printf("%s\"%d\":[%.2f,%.2f]", comma ? "," : "", m, lab_median(at[m]), mean);
        comma = true;
    }
    printf("}");
}

// Whether `out` (k + 1 entries: header, results) holds the best k of the n
// scores at `sc` (device), bit for bit; printed as the end of the line.
static void trace_check(const float* sc, unsigned n, unsigned k, const TopkNeighbor* out) {
    std::vector<float> hs(n);
    std::vector<TopkNeighbor> got(k + 1);
    CK(cudaMemcpy(hs.data(), sc, n * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(got.data(), out, (k + 1) * 8, cudaMemcpyDeviceToHost));
    std::vector<unsigned> idx(n);
    for (unsigned i = 0; i < n; ++i) idx[i] = i;
    std::stable_sort(idx.begin(), idx.end(), [&](unsigned a, unsigned b) { return hs[a] > hs[b]; });
    bool ok = got[0].index == TOPK_STATUS_OK;
    for (unsigned r = 0; ok && r < k; ++r) {
        ok = got[1 + r].index == idx[r] && memcmp(&got[1 + r].score, &hs[idx[r]], 4) == 0;
    }
    printf(",\"correct\":%s}\n", ok ? "true" : "false");
    fflush(stdout);
}

int main() {
    const unsigned ks[] = {8, 100, 1000};
    const size_t maxn = 500000, maxd = 1024;
    float *corpus, *query, *scores;
    unsigned* area;
    TopkThreshold* th;
    u64 *cand, *maybe;
    TopkNeighbor* out;
    CK(cudaMalloc(&corpus, maxn * maxd * 4));
    CK(cudaMalloc(&query, maxd * 4));
    CK(cudaMalloc(&scores, maxn * 4));
    CK(cudaMalloc(&area, TOPK_AREA_STRIDE * 4));
    CK(cudaMemset(area, 0, TOPK_AREA_STRIDE * 4));
    CK(cudaMalloc(&th, sizeof(TopkThreshold)));
    CK(cudaMalloc(&cand, TOPK_CAND_CAP * 8));
    CK(cudaMalloc(&maybe, TOPK_MAYBE_CAP * 8));
    CK(cudaMalloc(&out, 2048 * 8 + 8));
    lab_fill_rows(corpus, query, maxn, maxd, 7);
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));

    // The one-block select over seeded Gaussian scores (sigma 0.05).
    {
        const unsigned n = 10000;
        std::vector<float> hs = lab_gaussian_scores(n);
        // The stash, at least the ranking's scratch (as the engine launches it).
        const unsigned small_smem = std::max(n * 4, (unsigned)TOPK_CAND_CAP * 8);
        CK(cudaFuncSetAttribute(topk_select_small, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                TOPK_STASH_ROWS * 4));
        CK(cudaFuncSetAttribute(topk_gather, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                TOPK_CAND_CAP * 8));
        for (int dup = 0; dup < 2; ++dup) {
            if (dup) {
                hs[7] = 0.9f;
            }
            CK(cudaMemcpy(scores, hs.data(), n * 4, cudaMemcpyHostToDevice));
            for (unsigned k : ks) {
                trace_run(dup ? "small-dup" : "small", n, 0, k, 0, [&] {
                    topk_select_small<<<1, TOPK_SEL_THREADS, small_smem>>>(scores, n, area, cand,
                                                                     maybe, k, out, k + 1);
                });
                trace_check(scores, n, k, out);
            }
        }
    }
    // A query unlike any row (the default) and row 7 itself (`dup`).
    float* fresh;
    CK(cudaMalloc(&fresh, maxd * 4));
    {
        std::vector<float> q(maxd);
        unsigned s = 4242;
        for (auto& x : q) {
            s = s * 1664525u + 1013904223u;
            x = ((s >> 8) * (1.0f / 16777216.0f) - 0.5f) * 0.1f;
        }
        CK(cudaMemcpy(fresh, q.data(), maxd * 4, cudaMemcpyHostToDevice));
    }
    float* const queries[2] = {fresh, query};

    // The one-launch search (cooperative), as the engine sizes its grid.
    const unsigned ns1[] = {50000, 100000};
    const unsigned ds[] = {384, 1024};
    for (unsigned d : ds) {
        const size_t smem = (size_t)d * 4 + TOPK_TILE_ALIGN + SEARCH_TILE_BYTES;
        for (unsigned n : ns1) {
            const unsigned blocks =
                lab_staged_grid(topk_search1_dot, SEARCH_THREADS, smem, n, SEARCH_ROWS);
            for (int dup = 0; dup < 2; ++dup) {
                for (unsigned k : ks) {
                    const float* rn = nullptr;
                    float* qp = queries[dup];
                    trace_run(dup ? "search1-dup" : "search1", n, d, k, 0, [&] {
                        void* args[] = {(void*)&corpus, (void*)&rn,     (void*)&n,
                                        (void*)&d,      (void*)&qp,     (void*)&scores,
                                        (void*)&area,   (void*)&k,      (void*)&cand,
                                        (void*)&maybe,  (void*)&out};
                        CK(cudaLaunchCooperativeKernel((void*)topk_search1_dot, dim3(blocks),
                                                       dim3(SEARCH_THREADS), args, smem, 0));
                    });
                    trace_check(scores, n, k, out);
                }
            }
        }
    }

    // Scoring with its threshold, then the grid-wide gather (500k rows).
    {
        const unsigned n = 500000, d = 384;
        const size_t smem = (size_t)d * 4 + TOPK_TILE_ALIGN + SINGLE_TILE_BYTES;
        const unsigned blocks = lab_staged_grid(topk_score1_dot, 256, smem, n, 32);
        const unsigned gblocks = std::min<unsigned>((n + 4095) / 4096, sms);
        for (int dup = 0; dup < 2; ++dup) {
            for (unsigned k : ks) {
                const float* qp = queries[dup];
                trace_run(dup ? "gather-dup" : "gather", n, d, k, 2, [&] {
                    topk_score1_dot<<<blocks, 256, smem>>>(corpus, nullptr, n, d, qp, scores,
                                                          area, k, th);
                    topk_gather<<<dim3(gblocks, 1), TOPK_SEL_THREADS, TOPK_CAND_CAP * 8>>>(scores, n, area, th,
                                                                       cand, maybe, k, out,
                                                                       k + 1);
                });
                trace_check(scores, n, k, out);
            }
        }
    }
    return 0;
}
