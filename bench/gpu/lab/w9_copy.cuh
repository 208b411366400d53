// The Hopper bounds with every thread copying its share of each stage
// (cp.async), which the labs (wgmma_lab.cu, wgmma16_lab.cu, tma_lab.cu;
// not part of the engine) measure against the copy engine's stages of
// kernels/filter90.cu. Include after filter90.cu.
#pragma once

// Stages columns k0 .. k0 + 128 / sizeof(T) of the block's queries and rows into
// the stage at shared address `st` (swizzled, see the top), zeros past nq,
// n and d. A 16-byte piece is 16 / sizeof(T) values and D is a multiple of
// it, so a piece is wholly inside a vector or past it.
template <class SH, class T>
__device__ __forceinline__ void w9_stage(unsigned st, const T* __restrict__ corpus, unsigned n,
                                         unsigned d, const T* __restrict__ queries, unsigned nq,
                                         size_t q0, size_t r0, unsigned k0) {
    constexpr unsigned PIECES = 8;
    constexpr unsigned PER_PIECE = 16 / sizeof(T);
    for (unsigned i = threadIdx.x; i < (SH::BQ + SH::BR) * PIECES; i += SH::THREADS) {
        const unsigned v = i / PIECES;
        const unsigned c = i % PIECES;
        const unsigned col = k0 + c * PER_PIECE;
        const unsigned dst = st + v * 128u + ((c ^ (v & 7u)) * 16u);
        const bool is_q = v < SH::BQ;
        const size_t idx = is_q ? q0 + v : r0 + (v - SH::BQ);
        if (col < d && (is_q ? idx < nq : idx < n)) {
            topk_cp_async16_s(dst, (is_q ? queries : corpus) + idx * d + col);
        } else {
            asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(dst), "r"(0u));
        }
    }
    topk_cp_async_commit();
}

// Lower bounds of the canonical scores of nq queries against n rows into
// scores[q * n + row], as filter.cu's approx_scores, with every thread
// copying its share of each stage (cp.async; bench/gpu/lab only, where it
// is measured against w9_scores_tma). Rows and queries are both of type
// T: f32 queries as they are for f32 rows; for half rows, the queries
// topk_queries16 scaled and rounded, and `qinv` the inverse of each
// query's scale (nullptr for f32).
// Dynamic shared memory: STAGES stages plus W9_ALIGN bytes of slack.
// LAB: 1 leaves the products out, 2 the copies after the first stages.
template <int METRIC, int WGQ, int WGR, int STAGES, int LAB = 0, class T = float>
__device__ void w9_scores(const T* __restrict__ corpus, const float* __restrict__ rnorm,
                          unsigned n, unsigned d, const T* __restrict__ queries, unsigned nq,
                          const float* __restrict__ qnorm, const float* __restrict__ qinv,
                          float* __restrict__ scores, float* __restrict__ sub,
                          unsigned sub_shift) {
    using SH = W9Shape<WGQ, WGR, STAGES>;
    constexpr unsigned BK = 128u / sizeof(T);
    extern __shared__ float4 topk_dyn_smem[];
    const unsigned raw = (unsigned)__cvta_generic_to_shared(topk_dyn_smem);
    const unsigned sm = (raw + W9_ALIGN - 1u) & ~(W9_ALIGN - 1u);
    const W9Tile<SH> t(nq);
    const unsigned nk = (d + BK - 1) / BK;

    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) {
        acc[i] = 0.0f;
    }
    // Stages kt + 1 .. kt + STAGES - 2 are in flight while stage kt is
    // multiplied; the products of stage kt - 1 may still be reading theirs,
    // so the stage refilled at step kt is kt - 2's.
#pragma unroll
    for (unsigned s = 0; s + 2 < STAGES; ++s) {
        if (s < nk) {
            w9_stage<SH>(sm + s * SH::STAGE_BYTES, corpus, n, d, queries, nq, t.q0, t.r0, s * BK);
        } else {
            topk_cp_async_commit();
        }
    }
    for (unsigned kt = 0; kt < nk; ++kt) {
        topk_cp_async_wait<STAGES - 3>();
        // This thread's copies and zero stores of stage kt are done; make
        // them visible to the tensor cores' reads, then wait for every
        // thread's. Every warpgroup has also finished the products of stage
        // kt - 2 (it waited for them in step kt - 1 before this barrier).
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        const unsigned next = kt + STAGES - 2;
        if (next < nk && LAB != 2) {
            w9_stage<SH>(sm + (next % STAGES) * SH::STAGE_BYTES, corpus, n, d, queries, nq, t.q0,
                         t.r0, next * BK);
        } else {
            topk_cp_async_commit();
        }
        w9_stage_products<SH, T>(acc, sm + (kt % STAGES) * SH::STAGE_BYTES, t, LAB == 1);
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    w9_fence_acc(acc);
    topk_cp_async_wait<0>();
    float* tile = reinterpret_cast<float*>(topk_dyn_smem) + (sm - raw) / 4u;
    w9_write<METRIC, SH, T>(acc, tile, t, n, d, nq, rnorm, qnorm, qinv, nullptr, scores, sub,
                            sub_shift, 0u);
}

