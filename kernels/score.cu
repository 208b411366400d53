// Canonical scoring of resident corpus rows against one or many queries
// (DESIGN.md §2) into a score buffer, which select.cu then reads.
//
// Mapping: a warp owns RT rows at a time; lane j walks d = j, j+32, ... in
// increasing order with one fmaf per step into its own partial, and the warp
// butterfly reduces the 32 partials. The single-query kernel stages the rows
// through shared memory with cp.async (whole 16-byte copies when D % 4 == 0),
// a few tiles deep, so that enough bytes are in flight to keep HBM busy
// without holding them in registers.
#include "common.cuh"
#include "select.cuh"

#define SCORE_WARPS 8
#define SCORE_THREADS (SCORE_WARPS * TOPK_WARP)

// Columns per staged tile.
#define STAGE_CW 128

// Rows of a staged tile are WARPS * RT consecutive corpus rows (warp w owns
// RT of them) by STAGE_CW columns; DEPTH tiles are in flight.
template <int WARPS, int RT, int DEPTH>
struct Stage {
    static constexpr unsigned THREADS = WARPS * TOPK_WARP;
    static constexpr unsigned ROWS = WARPS * RT;
    static constexpr unsigned TILE = ROWS * STAGE_CW;
};

// Starts the copy of work item `i` of this block (row group i / nchunks of
// the block's grid stride, column chunk i % nchunks) into its tile; commits a
// group even when there is no item, so group counting stays uniform.
template <class ST, bool VEC16, int DEPTH>
__device__ __forceinline__ void stage_issue(const float* __restrict__ corpus, unsigned n,
                                            unsigned d, unsigned nchunks, unsigned items,
                                            unsigned i, float* tiles) {
    if (i < items) {
        const size_t g = blockIdx.x + (size_t)(i / nchunks) * gridDim.x;
        const unsigned c0 = (i % nchunks) * STAGE_CW;
        float* tile = tiles + (i % DEPTH) * ST::TILE;
        constexpr unsigned W = VEC16 ? 4 : 1;
        for (unsigned idx = threadIdx.x; idx < ST::TILE / W; idx += ST::THREADS) {
            const unsigned r = idx / (STAGE_CW / W);
            const unsigned col = (idx % (STAGE_CW / W)) * W;
            const size_t row = g * ST::ROWS + r;
            if (row < n && c0 + col < d) {
                if (VEC16) {
                    topk_cp_async16(tile + r * STAGE_CW + col, corpus + row * d + c0 + col);
                } else {
                    topk_cp_async4(tile + r * STAGE_CW + col, corpus + row * d + c0 + col);
                }
            }
        }
    }
    topk_cp_async_commit();
}

// Scores every row against the query `qsh` (shared, already loaded) with the
// block's grid-stride share of row groups staged through `tiles` (shared,
// DEPTH tiles). qn is the query norm (cosine). Ends with every copy done.
template <int METRIC, bool VEC16, int WARPS, int RT, int DEPTH>
__device__ __forceinline__ void stage_score(const float* __restrict__ corpus,
                                            const float* __restrict__ rnorm, unsigned n,
                                            unsigned d, const float* qsh, float qn,
                                            float* __restrict__ scores, float* tiles) {
    using ST = Stage<WARPS, RT, DEPTH>;
    const unsigned lane = threadIdx.x & (TOPK_WARP - 1);
    const unsigned warp = threadIdx.x / TOPK_WARP;
    const unsigned nchunks = (d + STAGE_CW - 1) / STAGE_CW;
    const unsigned ngroups = (n + ST::ROWS - 1) / ST::ROWS;
    const unsigned my_groups =
        blockIdx.x < ngroups ? (ngroups - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
    const unsigned items = my_groups * nchunks;
#pragma unroll
    for (unsigned i = 0; i < DEPTH - 1; ++i) {
        stage_issue<ST, VEC16, DEPTH>(corpus, n, d, nchunks, items, i, tiles);
    }
    float acc[RT];
    for (unsigned i = 0; i < items; ++i) {
        topk_cp_async_wait<DEPTH - 2>();
        __syncthreads();
        // The tile refilled here was consumed in the previous iteration,
        // which every thread has finished (the barrier above).
        stage_issue<ST, VEC16, DEPTH>(corpus, n, d, nchunks, items, i + DEPTH - 1, tiles);
        const unsigned c = i % nchunks;
        if (c == 0) {
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                acc[r] = 0.0f;
            }
        }
        const float* tile = tiles + (i % DEPTH) * ST::TILE + warp * RT * STAGE_CW;
#pragma unroll
        for (unsigned s = 0; s < STAGE_CW / TOPK_WARP; ++s) {
            const unsigned col = c * STAGE_CW + TOPK_WARP * s + lane;
            // Only real columns take a step.
            if (col < d) {
                const float qv = qsh[col];
#pragma unroll
                for (int r = 0; r < RT; ++r) {
                    acc[r] = topk_step<METRIC>(qv, tile[r * STAGE_CW + TOPK_WARP * s + lane],
                                               acc[r]);
                }
            }
        }
        if (c == nchunks - 1) {
            const size_t row0 =
                ((size_t)blockIdx.x + (size_t)(i / nchunks) * gridDim.x) * ST::ROWS + warp * RT;
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                const float s = topk_butterfly(acc[r]);
                const size_t row = row0 + r;
                if (lane == (unsigned)r && row < n) {
                    const float rn = (METRIC == TOPK_COSINE) ? rnorm[row] : 0.0f;
                    scores[row] = topk_finish<METRIC>(s, qn, rn);
                }
            }
        }
    }
    topk_cp_async_wait<0>();
}

// Dynamic shared memory follows the kernel's static shared variables, so its
// start moves with them; staged tiles that do not start on a 128-byte
// boundary stream 20-30 % slower (bench/gpu/NOTES.md, v13). The staged
// kernels place their tiles at the first such boundary after the query,
// and the host allows TOPK_TILE_ALIGN bytes of slack for it.
#define TOPK_TILE_ALIGN 128
__device__ __forceinline__ float* topk_tiles_after(float* qsh, unsigned d) {
    float* end = qsh + ((d + 3u) & ~3u);
    const unsigned at = (unsigned)__cvta_generic_to_shared(end);
    return end + ((0u - at) & (TOPK_TILE_ALIGN - 1u)) / 4u;
}

// Loads the query into shared memory `qsh`; for cosine returns its canonical
// norm, computed by warp 0 and shared through `qn_sh`. Ends synchronised.
template <int METRIC>
__device__ __forceinline__ float load_query(const float* __restrict__ query, unsigned d,
                                            float* qsh, float* qn_sh) {
    for (unsigned i = threadIdx.x; i < d; i += blockDim.x) {
        qsh[i] = query[i];
    }
    __syncthreads();
    if (METRIC == TOPK_COSINE) {
        if (threadIdx.x < TOPK_WARP) {
            const float nq = topk_warp_norm(qsh, d, threadIdx.x);
            if (threadIdx.x == 0) {
                *qn_sh = nq;
            }
        }
        __syncthreads();
        return *qn_sh;
    }
    return 0.0f;
}

// Copies a host query of n floats from `src` (page-locked host memory
// mapped into the device's address space, read across the bus) into the
// device query buffer `dst`: one block, run as the first node of a host
// query's graph in place of a copy-engine transfer (bench/gpu/NOTES.md, v16).
extern "C" __global__ void __launch_bounds__(SCORE_THREADS)
    topk_fetch_query(const float* __restrict__ src, float* __restrict__ dst, unsigned n) {
    if (((reinterpret_cast<size_t>(src) | reinterpret_cast<size_t>(dst)) & 15u) == 0u &&
        n % 4u == 0u) {
        const float4* s4 = reinterpret_cast<const float4*>(src);
        float4* d4 = reinterpret_cast<float4*>(dst);
#pragma unroll 4
        for (unsigned i = threadIdx.x; i < n / 4u; i += blockDim.x) {
            d4[i] = s4[i];
        }
    } else {
        for (unsigned i = threadIdx.x; i < n; i += blockDim.x) {
            dst[i] = src[i];
        }
    }
}

// The separate scoring kernel of one query: 8 warps, 4 rows each, 3 tiles.
#define SINGLE_WARPS 8
#define SINGLE_RT 4
#define SINGLE_DEPTH 3

// One query against every row. Dynamic shared memory: the query (D floats,
// padded to 16 bytes), then the tiles (topk_tiles_after). With `area` (not
// null) each block then counts its rows in the query's level-1 histogram
// and the last block finds the threshold for k into `th`, so that
// topk_gather can follow directly (the work of topk_hist, without its pass
// over the scores).
template <int METRIC, bool VEC16>
__device__ void score_single(const float* __restrict__ corpus, const float* __restrict__ rnorm,
                             unsigned n, unsigned d, const float* __restrict__ query,
                             float* __restrict__ scores, unsigned* __restrict__ area, unsigned k,
                             TopkThreshold* __restrict__ th) {
    using ST = Stage<SINGLE_WARPS, SINGLE_RT, SINGLE_DEPTH>;
    static_assert(ST::THREADS == SCORE_THREADS, "single scoring block");
    static_assert(ST::TILE * SINGLE_DEPTH >= TOPK_L1_BINS, "the histogram reuses the tiles");
    extern __shared__ float4 topk_dyn_smem[];
    __shared__ float qn_sh;
    float* qsh = reinterpret_cast<float*>(topk_dyn_smem);
    float* tiles = topk_tiles_after(qsh, d);
    const float qn = load_query<METRIC>(query, d, qsh, &qn_sh);
    stage_score<METRIC, VEC16, SINGLE_WARPS, SINGLE_RT, SINGLE_DEPTH>(corpus, rnorm, n, d, qsh,
                                                                     qn, scores, tiles);
    if (area != nullptr) {
        topk_threshold_own_rows<ST::THREADS, ST::ROWS>(
            scores, n, reinterpret_cast<unsigned*>(tiles), area, k, th);
    }
}

// The one-launch search of one query (a cooperative launch: every block is
// resident, so blocks can wait for each other): 32 warps, 2 rows each, 4
// tiles. Scores every row, then between grid barriers counts the level-1
// histogram, finds the threshold (each block for itself), gathers the
// candidates, and the last block to finish selects into `out`. Dynamic shared
// memory as score_single; the tiles are reused by the selection. (Counting
// each block's own rows before one barrier, as score_single does, was not
// faster here: bench/gpu/NOTES.md, v13; nor was counting each score in a
// shared histogram as it is written, which slowed the scoring loop: v17.)
#define SEARCH_WARPS 32
#define SEARCH_RT 2
#define SEARCH_DEPTH 4

template <int METRIC, bool VEC16>
__device__ void search_single(const float* __restrict__ corpus, const float* __restrict__ rnorm,
                              unsigned n, unsigned d, const float* __restrict__ query,
                              float* __restrict__ scores, unsigned* __restrict__ area, unsigned k,
                              unsigned long long* __restrict__ cand,
                              unsigned long long* __restrict__ maybe,
                              TopkNeighbor* __restrict__ out) {
    using ST = Stage<SEARCH_WARPS, SEARCH_RT, SEARCH_DEPTH>;
    static_assert(ST::TILE * SEARCH_DEPTH * 4 >= 2 * TOPK_CAND_CAP * 8,
                  "the selection's keys and scratch reuse the tiles");
    extern __shared__ float4 topk_dyn_smem[];
    __shared__ float qn_sh;
    float* qsh = reinterpret_cast<float*>(topk_dyn_smem);
    float* tiles = topk_tiles_after(qsh, d);
    topk_mark(0);
    const float qn = load_query<METRIC>(query, d, qsh, &qn_sh);
    stage_score<METRIC, VEC16, SEARCH_WARPS, SEARCH_RT, SEARCH_DEPTH>(corpus, rnorm, n, d, qsh,
                                                                     qn, scores, tiles);
    topk_grid_sync(area);
    topk_mark(1);
    unsigned* h = reinterpret_cast<unsigned*>(tiles);
    topk_zero_shared(h, TOPK_L1_BINS);
    topk_hist_rows(scores, n, blockIdx.x * TOPK_SEL_THREADS, gridDim.x * TOPK_SEL_THREADS, h,
                   nullptr);
    __syncthreads();
    topk_mark(8);
    topk_flush_hist(h, area);
    topk_grid_sync(area);
    topk_mark(9);
    const TopkThreshold t = topk_threshold_block<true, false>(area, k);
    topk_mark(2);
    topk_gather_rows(scores, nullptr, n, t, blockIdx.x * TOPK_SEL_THREADS,
                     gridDim.x * TOPK_SEL_THREADS, &area[TOPK_AREA_CTR + TOPK_CTR_CAND], cand,
                     maybe);
    if (!topk_last_block(&area[TOPK_AREA_CTR + TOPK_CTR_GATHER], gridDim.x)) {
        return;
    }
    topk_mark(3);
    // Every block has read the histogram: clear it for the next search.
    for (unsigned i = threadIdx.x; i < TOPK_L1_BINS; i += TOPK_SEL_THREADS) {
        area[i] = 0u;
    }
    unsigned long long* keys = reinterpret_cast<unsigned long long*>(tiles);
    topk_select_block(scores, t, k, area, cand, maybe, keys, keys + TOPK_CAND_CAP, out);
}

// A tile of QT queries against RT rows per warp. The queries pass through
// shared memory in chunks of CH values, so any D works; the block index is
// row_block * query_tiles + query_tile, so that the query tiles sharing a
// row block run together and read its rows from L2 rather than HBM.
#define BATCH_UNROLL 8
#define BATCH_CH (TOPK_WARP * BATCH_UNROLL)

template <int METRIC, int QT, int RT>
__device__ void score_batch(const float* __restrict__ corpus, const float* __restrict__ rnorm,
                            unsigned n, unsigned d, const float* __restrict__ queries,
                            unsigned nq, const float* __restrict__ qnorm,
                            float* __restrict__ scores) {
    __shared__ float qs[QT][BATCH_CH];
    const unsigned lane = threadIdx.x & (TOPK_WARP - 1);
    const unsigned warp = threadIdx.x / TOPK_WARP;
    const unsigned tiles = (nq + QT - 1) / QT;
    const unsigned q0 = (blockIdx.x % tiles) * QT;
    const size_t row0 = ((size_t)(blockIdx.x / tiles) * SCORE_WARPS + warp) * RT;

    const float* rows[RT];
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
                    rv[r] = __ldg(rows[r] + dd);
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
__device__ void score_batch_resident(const float* __restrict__ corpus,
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
    float* stages = reinterpret_cast<float*>(topk_dyn_smem);
    float* qs = stages + DEPTH * STAGE;
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
    const float* src_rb = corpus + ((size_t)rb * BR + row_t) * d + col;
    unsigned issue_rb = rb;
    unsigned issue_c = 0;
    unsigned issue_slot = 0;
    auto issue = [&]() {
        if (issue_rb < nrb) {
            const size_t r = (size_t)issue_rb * BR + row_t;
            // Rows from this thread's first one to the end of the corpus.
            const unsigned left = r < n ? (unsigned)(n - r) : 0u;
            const unsigned c0 = issue_c * SW;
            const float* src = src_rb + c0;
            const unsigned dst = dst0 + issue_slot * STAGE * 4;
            if (c0 + col < d) {
                if (vec16) {
#pragma unroll
                    for (unsigned k = 0; k < BR / ROWS16; ++k) {
                        if (k * ROWS16 < left) {
                            topk_cp_async16_s(dst + k * ROWS16 * SW * 4, src);
                        }
                        src += src_pass;
                    }
                } else {
                    for (unsigned k = 0; k * rows_pass < BR; ++k) {
                        if (k * rows_pass < left) {
                            topk_cp_async4_s(dst + k * rows_pass * SW * 4, src);
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
            const float* st = stages + slot * STAGE + (wr * RT) * SW + h * BCH_CH;
#pragma unroll
            for (int r = 0; r < RT; ++r) {
                // Slot r holds tile row r ^ ((lane >> 2) & 7).
                const float* row = st + (r ^ ((lane >> 2) & 7u)) * SW;
#pragma unroll
                for (int s = 0; s < 4; ++s) {
                    rv[s][r] = row[s * TOPK_WARP + lane];
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

// Canonical norms sqrt(canon_dot(x, x)) of n vectors of length d, a warp per
// vector: the corpus rows once at upload, the queries of a cosine search.
extern "C" __global__ void __launch_bounds__(SCORE_THREADS)
    topk_norms(const float* __restrict__ x, unsigned n, unsigned d, float* __restrict__ out) {
    const unsigned lane = threadIdx.x & (TOPK_WARP - 1);
    const size_t warps = (size_t)gridDim.x * SCORE_WARPS;
    for (size_t row = (size_t)blockIdx.x * SCORE_WARPS + threadIdx.x / TOPK_WARP; row < n;
         row += warps) {
        const float nv = topk_warp_norm(x + row * d, d, lane);
        if (lane == 0) {
            out[row] = nv;
        }
    }
}

// Scores listed (query, row) pairs, a warp per pair: the graph index's
// "distances to these neighbours" step, against the resident corpus.
template <int METRIC>
__device__ void score_ids(const float* __restrict__ corpus, const float* __restrict__ rnorm,
                          unsigned d, const float* __restrict__ queries,
                          const float* __restrict__ qnorm, const unsigned* __restrict__ ids,
                          const unsigned* __restrict__ owner, unsigned count,
                          float* __restrict__ out) {
    const unsigned lane = threadIdx.x & (TOPK_WARP - 1);
    const size_t warps = (size_t)gridDim.x * SCORE_WARPS;
    for (size_t i = (size_t)blockIdx.x * SCORE_WARPS + threadIdx.x / TOPK_WARP; i < count;
         i += warps) {
        const unsigned row = ids[i];
        const unsigned q = owner[i];
        const float qn = (METRIC == TOPK_COSINE) ? qnorm[q] : 0.0f;
        const float rn = (METRIC == TOPK_COSINE) ? rnorm[row] : 0.0f;
        const float s = topk_warp_score<METRIC>(queries + (size_t)q * d,
                                                corpus + (size_t)row * d, d, qn, rn, lane);
        if (lane == 0) {
            out[i] = s;
        }
    }
}

#define BATCH_QT 8
#define BATCH_RT 4

// The two resident-query batch shapes (topk-cuda mirrors these numbers):
// 32 queries x 32 rows per block for larger batches, 16 x 64 for small ones;
// both with two stages of two chunks (one barrier per 256 columns: 9-11 %
// faster than three or four stages of one chunk at 100k-1M rows on an H200,
// 13 % with the copies addressed incrementally, 16.0 against 18.6 ms at
// 1M x 1024 x 256; at most 0.7 us slower on the smallest lab shapes).
#ifndef BQ32_WR
#define BQ32_WR 4
#endif
#ifndef BQ32_WQ
#define BQ32_WQ 2
#endif
#define BQ32_RT 8
#ifndef BQ32_QT
#define BQ32_QT 16
#endif
#ifndef BQ32_DEPTH
#define BQ32_DEPTH 2
#endif
#ifndef BQ32_SUB
#define BQ32_SUB 2
#endif
#define BQ32_THREADS (BQ32_WR * BQ32_WQ * TOPK_WARP)
#define BQ16_WR 8
#define BQ16_WQ 1
#define BQ16_RT 8
#define BQ16_QT 16
#ifndef BQ16_DEPTH
#define BQ16_DEPTH 2
#endif
#ifndef BQ16_SUB
#define BQ16_SUB 2
#endif
#define BQ16_THREADS (BQ16_WR * BQ16_WQ * TOPK_WARP)

// The staged single-query scoring kernel of one metric, for 16-byte copies
// (D % 4 == 0, SUFFIX empty) or 4-byte copies (SUFFIX u).
#define TOPK_SCORE1_KERNEL(NAME, METRIC, SUFFIX, VEC16)                                      \
    extern "C" __global__ void __launch_bounds__(SCORE_THREADS) topk_score1##SUFFIX##_##NAME( \
        const float* __restrict__ corpus, const float* __restrict__ rnorm, unsigned n,       \
        unsigned d, const float* __restrict__ query, float* __restrict__ scores,            \
        unsigned* __restrict__ area, unsigned k, TopkThreshold* __restrict__ th) {           \
        score_single<METRIC, VEC16>(corpus, rnorm, n, d, query, scores, area, k, th);        \
    }

// The one-launch search kernel of one metric, copies as TOPK_SCORE1_KERNEL.
#define TOPK_SEARCH1_KERNEL(NAME, METRIC, SUFFIX, VEC16)                                     \
    extern "C" __global__ void __launch_bounds__(TOPK_SEL_THREADS)                           \
        topk_search1##SUFFIX##_##NAME(                                                       \
            const float* __restrict__ corpus, const float* __restrict__ rnorm, unsigned n,   \
            unsigned d, const float* __restrict__ query, float* __restrict__ scores,         \
            unsigned* __restrict__ area, unsigned k, unsigned long long* __restrict__ cand,  \
            unsigned long long* __restrict__ maybe, TopkNeighbor* __restrict__ out) {        \
        search_single<METRIC, VEC16>(corpus, rnorm, n, d, query, scores, area, k, cand,     \
                                     maybe, out);                                            \
    }

// The resident-query batch kernel of one metric for the block shape whose
// constants start with SHAPE (BQ32 or BQ16), named topk_score<Q>_<NAME>.
#define TOPK_SCOREQ_KERNEL(NAME, METRIC, Q, SHAPE)                                           \
    extern "C" __global__ void __launch_bounds__(SHAPE##_THREADS, 1) topk_score##Q##_##NAME( \
        const float* __restrict__ corpus, const float* __restrict__ rnorm, unsigned n,       \
        unsigned d, const float* __restrict__ queries, unsigned nq,                         \
        const float* __restrict__ qnorm, float* __restrict__ scores) {                       \
        score_batch_resident<METRIC, SHAPE##_WR, SHAPE##_WQ, SHAPE##_RT, SHAPE##_QT,         \
                             SHAPE##_DEPTH, SHAPE##_SUB>(corpus, rnorm, n, d, queries, nq,   \
                                                         qnorm, scores);                     \
    }

#define TOPK_SCORE_KERNELS(NAME, METRIC)                                                     \
    TOPK_SCORE1_KERNEL(NAME, METRIC, , true)                                                 \
    TOPK_SCORE1_KERNEL(NAME, METRIC, u, false)                                               \
    TOPK_SEARCH1_KERNEL(NAME, METRIC, , true)                                                \
    TOPK_SEARCH1_KERNEL(NAME, METRIC, u, false)                                              \
    extern "C" __global__ void __launch_bounds__(SCORE_THREADS) topk_scoreb_##NAME(          \
        const float* __restrict__ corpus, const float* __restrict__ rnorm, unsigned n,       \
        unsigned d, const float* __restrict__ queries, unsigned nq,                         \
        const float* __restrict__ qnorm, float* __restrict__ scores) {                       \
        score_batch<METRIC, BATCH_QT, BATCH_RT>(corpus, rnorm, n, d, queries, nq, qnorm,     \
                                                scores);                                     \
    }                                                                                        \
    TOPK_SCOREQ_KERNEL(NAME, METRIC, q32, BQ32)                                              \
    TOPK_SCOREQ_KERNEL(NAME, METRIC, q16, BQ16)                                              \
    extern "C" __global__ void __launch_bounds__(SCORE_THREADS) topk_score_ids_##NAME(       \
        const float* __restrict__ corpus, const float* __restrict__ rnorm, unsigned d,       \
        const float* __restrict__ queries, const float* __restrict__ qnorm,                  \
        const unsigned* __restrict__ ids, const unsigned* __restrict__ owner,                \
        unsigned count, float* __restrict__ out) {                                           \
        score_ids<METRIC>(corpus, rnorm, d, queries, qnorm, ids, owner, count, out);         \
    }

TOPK_SCORE_KERNELS(dot, TOPK_DOT)
TOPK_SCORE_KERNELS(cosine, TOPK_COSINE)
TOPK_SCORE_KERNELS(l2, TOPK_L2)
