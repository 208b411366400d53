// The batch scoring kernels: many queries per launch, the general tiled
// kernel (any D) and the resident-query kernels (queries kept in shared
// memory, rows staged through it), into one score row per query.
#include "shapes.cuh"
#include "stage.cuh"

// A tile of QT queries against RT rows per warp. The queries pass through
// shared memory in chunks of CH values, so any D works; the block index is
// row_block * query_tiles + query_tile, so that the query tiles sharing a
// row block run together and read its rows from L2 rather than HBM.
#define BATCH_UNROLL 8
#define BATCH_CH (TOPK_WARP * BATCH_UNROLL)

template <int METRIC, int QT, int RT>
__device__ void score_batch(const topk_row_t* __restrict__ corpus, const float* __restrict__ rnorm,
                            unsigned n, unsigned d, const float* __restrict__ queries,
                            unsigned nq, const float* __restrict__ qnorm,
                            float* __restrict__ scores) {
    __shared__ float qs[QT][BATCH_CH];
    const unsigned lane = threadIdx.x & (TOPK_WARP - 1);
    const unsigned warp = threadIdx.x / TOPK_WARP;
    const unsigned tiles = (nq + QT - 1) / QT;
    const unsigned q0 = (blockIdx.x % tiles) * QT;
    const size_t row0 = ((size_t)(blockIdx.x / tiles) * SCORE_WARPS + warp) * RT;

    const topk_row_t* rows[RT];
    float acc[RT][QT];
#pragma unroll
    for (int r = 0; r < RT; ++r) {
        size_t row = (row0 + r < n) ? row0 + r : 0;
        rows[r] = corpus + row * d;
#pragma unroll
        for (int qi = 0; qi < QT; ++qi) {
            acc[r][qi] = 0.0f;
        }
    }
    const bool any_row = row0 < n;
    for (unsigned c0 = 0; c0 < d; c0 += BATCH_CH) {
        __syncthreads();
        for (unsigned i = threadIdx.x; i < QT * BATCH_CH; i += blockDim.x) {
            unsigned qi = i / BATCH_CH;
            unsigned j = i % BATCH_CH;
            unsigned q = q0 + qi;
            unsigned dd = c0 + j;
            qs[qi][j] = (q < nq && dd < d) ? queries[(size_t)q * d + dd] : 0.0f;
        }
        __syncthreads();
        if (!any_row) {
            continue;
        }
#pragma unroll
        for (int t = 0; t < BATCH_UNROLL; ++t) {
            const unsigned dd = c0 + lane + TOPK_WARP * t;
            // Only real columns take a step: an extra fma with zeros could
            // turn a -0.0 partial into +0.0.
            if (dd < d) {
                float rv[RT];
#pragma unroll
                for (int r = 0; r < RT; ++r) {
                    rv[r] = topk_ldg_row(rows[r] + dd);
                }
#pragma unroll
                for (int qi = 0; qi < QT; ++qi) {
                    const float qv = qs[qi][lane + TOPK_WARP * t];
#pragma unroll
                    for (int r = 0; r < RT; ++r) {
                        acc[r][qi] = topk_step<METRIC>(qv, rv[r], acc[r][qi]);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < RT; ++r) {
        const size_t row = row0 + r;
        const float rn = (METRIC == TOPK_COSINE && row < n) ? rnorm[row] : 0.0f;
#pragma unroll
        for (int qi = 0; qi < QT; ++qi) {
            float s = topk_butterfly(acc[r][qi]);
            const unsigned q = q0 + qi;
            if (lane == (unsigned)((r * QT + qi) & (TOPK_WARP - 1)) && row < n && q < nq) {
                float qn = (METRIC == TOPK_COSINE) ? qnorm[q] : 0.0f;
                scores[(size_t)q * n + row] = topk_finish<METRIC>(s, qn, rn);
            }
        }
    }
}

// Batch scoring with the queries resident in shared memory.
//
// A block of WR x WQ warps owns BQ = WQ * QT queries for the whole call and
// walks row blocks of BR = WR * RT rows (grid stride), so only rows stream
// through the DEPTH cp.async stages: 4 / BQ bytes of L2 traffic per fma.
// Lane j keeps the canonical columns d = j, j+32, ... of an RT-row x QT-query
// register tile, and the 32 partials of each output are added by
// topk_reduce32. Each staged chunk has BCH_CH columns; the queries are
// stored permuted so that lane j's four columns of a chunk (32 s + j,
// s = 0..3) are adjacent and one 128-bit load fetches them.
//
// Register slot (query qi, row r) of lane j holds output (qi ^ (j & 3),
// r ^ ((j >> 2) & 7)), the placement topk_reduce32 needs (each group of 32
// slots is 4 queries x 8 rows). The resident queries are stored permuted
// (lane j's columns of query q at query place q ^ (j & 3)), so their loads
// stay the same for every lane; each lane reads its rows in its own order.
// (Permuting the staged rows instead, so that the row loads were the same
// for every lane too, scattered each 128-byte line of a cp.async copy over
// eight stage rows: the kernel ran 26-55 % slower.)
//
// Dynamic shared memory: DEPTH row stages of BR x (SUB x BCH_CH) floats,
// then BQ queries of D floats rounded up to whole chunks (topk-cuda mirrors
// this).
#define BCH_CH 128

__device__ __forceinline__ unsigned bch_perm(unsigned col) {
    return (col % TOPK_WARP) * 4 + col / TOPK_WARP;
}

template <int METRIC, int WR, int WQ, int RT, int QT, int DEPTH, int SUB>
__device__ void score_batch_resident(const topk_row_t* __restrict__ corpus,
                                     const float* __restrict__ rnorm, unsigned n, unsigned d,
                                     const float* __restrict__ queries, unsigned nq,
                                     const float* __restrict__ qnorm,
                                     float* __restrict__ scores) {
    constexpr unsigned THREADS = WR * WQ * TOPK_WARP;
    constexpr unsigned BR = WR * RT;
    constexpr unsigned BQ = WQ * QT;
    // A stage holds SUB chunks of each row: one barrier per SUB chunks.
    constexpr unsigned SW = SUB * BCH_CH;
    constexpr unsigned STAGE = BR * SW;
    static_assert(RT == 8 && QT % 4 == 0, "groups of 4 queries x 8 rows (topk_slot_perm)");
    static_assert(BCH_CH == 4 * TOPK_WARP, "four columns per lane per chunk");
    extern __shared__ float4 topk_dyn_smem[];
    // The stages hold the stored values as they are stored (a half-width
    // stage fills half of its f32-sized room, the host sizing both alike).
    topk_row_t* stages = reinterpret_cast<topk_row_t*>(topk_dyn_smem);
    float* qs = reinterpret_cast<float*>(topk_dyn_smem) + DEPTH * STAGE;
    const unsigned lane = threadIdx.x & (TOPK_WARP - 1);
    const unsigned warp = threadIdx.x / TOPK_WARP;
    const unsigned wr = warp % WR;
    const unsigned wq = warp / WR;
    const unsigned nchunks = (d + SW - 1) / SW;
    const unsigned dp = (d + BCH_CH - 1) / BCH_CH * BCH_CH;
    const unsigned qtiles = (nq + BQ - 1) / BQ;
    const unsigned nrb = (n + BR - 1) / BR;
    const unsigned rbstep = gridDim.x / qtiles;
    const size_t q0 = (size_t)(blockIdx.x % qtiles) * BQ;
    unsigned rb = blockIdx.x / qtiles;
    if (rb >= nrb) {
        return;
    }
    // The block's queries, permuted within each chunk (one group), lane j's
    // columns of query qi at place qi ^ (j & 3).
    for (unsigned idx = threadIdx.x; idx < BQ * d; idx += THREADS) {
        const unsigned qi = idx / d;
        const unsigned col = idx % d;
        if (q0 + qi < nq) {
            topk_cp_async4(qs + (qi ^ (col & 3u)) * dp + col / BCH_CH * BCH_CH +
                               bch_perm(col % BCH_CH),
                           queries + (q0 + qi) * d + col);
        }
    }
    topk_cp_async_commit();

    // Copy state: the next (row block, chunk) to stage and its slot. Thread
    // t copies column `col` of rows t / PER_ROW + k * ROWS of a stage.
    constexpr unsigned ROWS16 = THREADS / (SW / 4);
    const bool vec16 = (d % 4) == 0;
    const unsigned per_row = vec16 ? SW / 4 : SW;
    const unsigned col = (threadIdx.x % per_row) * (vec16 ? 4 : 1);
    const unsigned row_t = threadIdx.x / per_row;
    const unsigned rows_pass = THREADS / per_row;
    const unsigned dst0 = (unsigned)__cvta_generic_to_shared(stages + row_t * SW + col);
    const size_t src_pass = (size_t)rows_pass * d;
    const size_t rb_stride = (size_t)rbstep * BR * d;
    // This thread's first source row of the next stage's row block, column
    // `col` of chunk 0: advanced by one stride per row block, so a copy
    // costs a 64-bit add rather than the address from scratch.
    const topk_row_t* src_rb = corpus + ((size_t)rb * BR + row_t) * d + col;
    unsigned issue_rb = rb;
    unsigned issue_c = 0;
    unsigned issue_slot = 0;
    auto issue = [&]() {
        if (issue_rb < nrb) {
            const size_t r = (size_t)issue_rb * BR + row_t;
            // Rows from this thread's first one to the end of the corpus.
            const unsigned left = r < n ? (unsigned)(n - r) : 0u;
            const unsigned c0 = issue_c * SW;
            const topk_row_t* src = src_rb + c0;
            constexpr unsigned B = sizeof(topk_row_t);
            const unsigned dst = dst0 + issue_slot * STAGE * B;
            if (c0 + col < d) {
                if (vec16) {
#pragma unroll
                    for (unsigned k = 0; k < BR / ROWS16; ++k) {
                        if (k * ROWS16 < left) {
                            topk_cp_async_row4_s(dst + k * ROWS16 * SW * B, src);
                        }
                        src += src_pass;
                    }
                } else {
                    for (unsigned k = 0; k * rows_pass < BR; ++k) {
                        if (k * rows_pass < left) {
                            topk_cp_async_row1_s(dst + k * rows_pass * SW * B, src);
                        }
                        src += src_pass;
                    }
                }
            }
            if (++issue_c == nchunks) {
                issue_c = 0;
                issue_rb += rbstep;
                src_rb += rb_stride;
            }
        }
        topk_cp_async_commit();
        issue_slot = (issue_slot + 1 == DEPTH) ? 0 : issue_slot + 1;
    };
#pragma unroll
    for (int i = 0; i < DEPTH - 1; ++i) {
        issue();
    }

    float acc[RT * QT];
#pragma unroll
    for (int k = 0; k < RT * QT; ++k) {
        acc[k] = 0.0f;
    }
    unsigned c = 0;
    unsigned slot = 0;
    while (rb < nrb) {
        topk_cp_async_wait<DEPTH - 2>();
        __syncthreads();
        // The slot refilled here was consumed in the previous iteration,
        // which every thread has finished (the barrier above).
        issue();
#pragma unroll
        for (int h = 0; h < SUB; ++h) {
            // Column block cc of BCH_CH columns; past D only in the last stage.
            const unsigned cc = c * SUB + h;
            if (h > 0 && cc * BCH_CH >= d) {
                break;
            }
            const bool full = (cc + 1) * BCH_CH <= d;
            float rv[4][RT];
            const topk_row_t* st = stages + slot * STAGE + (wr * RT) * SW + h * BCH_CH;
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                // Slot r holds tile row r ^ ((lane >> 2) & 7).
                const topk_row_t* row = st + (r ^ ((lane >> 2) & 7u)) * SW;
#pragma unroll
                for (int s = 0; s < 4; ++s) {
                    rv[s][r] = topk_widen(row[s * TOPK_WARP + lane]);
                }
            }
            const float* qp = qs + (wq * QT) * dp + cc * BCH_CH + lane * 4;
#pragma unroll
            for (int qi = 0; qi < QT; ++qi) {
                const float4 x = *reinterpret_cast<const float4*>(qp + qi * dp);
                const float qv[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
                for (int s = 0; s < 4; ++s) {
                    // Only real columns take a step.
                    if (full || cc * BCH_CH + s * TOPK_WARP + lane < d) {
#pragma unroll
                        for (int r = 0; r < RT; ++r) {
                            acc[qi * RT + r] =
                                topk_step<METRIC>(qv[s], rv[s][r], acc[qi * RT + r]);
                        }
                    }
                }
            }
        }
        if (++c == nchunks) {
            // This lane's output of each group: query (j & 3), row (j >> 2) & 7.
            const size_t r0 = (size_t)rb * BR + wr * RT + ((lane >> 2) & 7u);
            const size_t qb = q0 + wq * QT + (lane & 3u);
#pragma unroll
            for (int g = 0; g < RT * QT / TOPK_WARP; ++g) {
                float v[TOPK_WARP];
#pragma unroll
                for (int k = 0; k < TOPK_WARP; ++k) {
                    v[k] = acc[g * TOPK_WARP + k];
                    acc[g * TOPK_WARP + k] = 0.0f;
                }
                const float sc = topk_reduce32(v);
                const size_t row = r0;
                const size_t q = qb + g * 4;
                if (row < n && q < nq) {
                    const float qn = (METRIC == TOPK_COSINE) ? qnorm[q] : 0.0f;
                    const float rn = (METRIC == TOPK_COSINE) ? rnorm[row] : 0.0f;
                    scores[q * n + row] = topk_finish<METRIC>(sc, qn, rn);
                }
            }
            c = 0;
            rb += rbstep;
        }
        slot = (slot + 1 == DEPTH) ? 0 : slot + 1;
    }
    topk_cp_async_wait<0>();
}

// The resident-query batch kernel of one metric for the block shape whose
// constants start with SHAPE (BQ32 or BQ16), named topk_score<Q>_<NAME>.
#define TOPK_SCOREQ_KERNEL(NAME, METRIC, Q, SHAPE)                                           \
    extern "C" __global__ void __launch_bounds__(SHAPE##_THREADS, 1) topk_score##Q##_##NAME( \
        const topk_row_t* __restrict__ corpus, const float* __restrict__ rnorm, unsigned n,  \
        unsigned d, const float* __restrict__ queries, unsigned nq,                         \
        const float* __restrict__ qnorm, float* __restrict__ scores) {                       \
        score_batch_resident<METRIC, SHAPE##_WR, SHAPE##_WQ, SHAPE##_RT, SHAPE##_QT,         \
                             SHAPE##_DEPTH, SHAPE##_SUB>(corpus, rnorm, n, d, queries, nq,   \
                                                         qnorm, scores);                     \
    }

#define TOPK_BATCH_KERNELS(NAME, METRIC)                                                     \
    extern "C" __global__ void __launch_bounds__(SCORE_THREADS) topk_scoreb_##NAME(          \
        const topk_row_t* __restrict__ corpus, const float* __restrict__ rnorm, unsigned n,  \
        unsigned d, const float* __restrict__ queries, unsigned nq,                         \
        const float* __restrict__ qnorm, float* __restrict__ scores) {                       \
        score_batch<METRIC, BATCH_QT, BATCH_RT>(corpus, rnorm, n, d, queries, nq, qnorm,     \
                                                scores);                                     \
    }                                                                                        \
    TOPK_SCOREQ_KERNEL(NAME, METRIC, q32, BQ32)                                              \
    TOPK_SCOREQ_KERNEL(NAME, METRIC, q16, BQ16)

TOPK_BATCH_KERNELS(dot, TOPK_DOT)
TOPK_BATCH_KERNELS(cosine, TOPK_COSINE)
TOPK_BATCH_KERNELS(l2, TOPK_L2)
