// The lower bounds of a filtered batch on Hopper: the same bounds as
// filter.cu's topk_approx_* (bounds.cuh), from warpgroup tensor-core
// products (wgmma) whose operands the tensor cores read from shared memory
// themselves, so that no lane converts or moves an operand. Built for
// sm_90a only (its own PTX, loaded where the device is compute capability
// 9.0); every other device runs filter.cu's mma.sync kernel. Built once
// per storage type (TOPK_ROW_DTYPE, common.cuh): f32 rows are multiplied
// as TF32, f16 and bf16 rows as they are stored.
//
// Block tile (W9Shape): WGQ x WGR warpgroups, each multiplying 64 queries
// (the M of one wgmma) by 128 rows (its N), so 64 WGQ queries by 128 WGR
// rows, staged 128 bytes of each vector (W9_BK = 32 f32 or 64 half
// columns, one swizzle row) at a time, STAGES deep, with cp.async; the
// engine runs 2 x 2 (W9_WGQ, W9_WGR). Both operands are K-major (a query
// or a row is 128 contiguous bytes of a stage), in the 128-byte swizzle the
// descriptors name: 16-byte piece c of vector v sits at v * 128 +
// ((c ^ (v % 8)) * 16) from a 1024-byte aligned base. One wgmma takes 32
// bytes of K (8 TF32 or 16 half columns), so a stage is 4 of them whatever
// the type.
//
// TF32 operands: the tensor cores use the top 19 bits of each fp32 input,
// a relative error below 2^-10 each whether they round or truncate, so the
// product of a pair is within 2^-9 Σ|q_i x_i| <= 2^-9 |q| |x| of the exact
// one before accumulation; bounds.cuh's width allows 2^-8 for it (and
// D 2^-22 for the accumulation).
//
// Half operands (docs/CONTRACTS.md §5): the stored rows are the operand,
// exact; each query is scaled by a power of two s (max_i |s q_i| in
// [2^13, 2^14), s at most 2^127) and rounded to the rows' type to nearest
// even by topk_queries16, so |s q_i - h_i| <= 2^-11 |s q_i| (f16) or
// 2^-8 |s q_i| (bf16), plus half a subnormal step (2^-25 for f16, whose
// effect after the 1/s below is at most 2^-38 |q| per unit of |x_i|). A
// product of two halves is exact in fp32, so the products are within
// 2^-11 |q| |x| (f16) or 2^-8 |q| |x| (bf16) of the exact ones, which the
// width's 2^-8 covers (for bf16 with no margin: the rest of the width,
// D 2^-22, covers the accumulation twice over and the other roundings).
// The accumulation is scaled back by 1/s exactly (a power of two; a result
// below 2^-126 loses at most 2^-150, inside the width's absolute part; one
// past 2^128 comes from a pair that is always listed).
//
// The f16 copy of f32 rows (topk_rows16, Tuning::shadow_bounds): each row
// scaled by its own power of two t (max_i |t x_i| in [2^13, 2^14)) and
// rounded to f16, multiplied by the queries of the f16 case: every value
// of both sides within 2^-11 of itself (plus subnormal steps worth at most
// 2^-37 |x| or |q|), so the products are within about 2^-10 |q| |x|,
// inside the TF32 term, and the same width holds. w9_unscale applies 1/t,
// then 1/s.
#include "bounds.cuh"

// f32 columns of a stage (128 bytes); a half type's stage holds twice as
// many.
#define W9_BK 32
#define W9_ALIGN 1024


// A block of WGQ x WGR warpgroups: warpgroup (i, j) multiplies queries
// 64 i .. + 64 by rows 128 j .. + 128 of the block tile, STAGES stages.
template <int WGQ_, int WGR_, int STAGES_>
struct W9Shape {
    static constexpr unsigned WGQ = WGQ_;
    static constexpr unsigned WGR = WGR_;
    static constexpr unsigned STAGES = STAGES_;
    static constexpr unsigned BQ = 64 * WGQ;
    static constexpr unsigned BR = 128 * WGR;
    static constexpr unsigned THREADS = 128 * WGQ * WGR;
    // Bytes of one stage: queries then rows, 128 bytes each.
    static constexpr unsigned STAGE_BYTES = (BQ + BR) * W9_BK * 4;
    static constexpr unsigned SMEM = STAGES * STAGE_BYTES + W9_ALIGN;
    // The copy engine's kernel (w9_scores_tma) also holds two barriers a
    // stage after the stages, and a producer warp.
    static constexpr unsigned TMA_SMEM = SMEM + 16 * STAGES;
    static constexpr unsigned TMA_THREADS = THREADS + 32;
    // Row stride of the products' tile in shared memory at the end (floats;
    // 8-byte stores of a warp fall on distinct banks in pairs).
    static constexpr unsigned LD = BR + 4;
    static_assert(BQ * LD * 4 <= STAGES * STAGE_BYTES, "the products fit the stages");
    static_assert(W9_BK * 4 == 128, "a stage row is one 128-byte swizzle row");
    static_assert(STAGES >= 3, "one stage multiplied, one finishing, one in flight");
    static_assert((BQ * 128) % W9_ALIGN == 0 && STAGE_BYTES % W9_ALIGN == 0,
                  "every operand base stays 1024-byte aligned");
};

// The shared-memory matrix descriptor of a K-major operand in the 128-byte
// swizzle starting at shared address `saddr`: start address, leading byte
// offset 1 (unused for this layout), stride byte offset 1024 (8 rows of 128
// bytes), swizzle mode 1 (PTX ISA, "Matrix Descriptor Format").
__device__ __forceinline__ unsigned long long w9_desc(unsigned saddr) {
    return (unsigned long long)((saddr & 0x3ffffu) >> 4) | (1ull << 16) | (64ull << 32) |
           (1ull << 62);
}

// The 64 accumulator registers of one wgmma, as asm operands and their
// placeholders.
#define W9_ACC_REGS                                                                          \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "       \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "       \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define W9_ACC_OPERANDS(d)                                                                   \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),      \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),           \
        "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),        \
        "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),        \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),        \
        "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),        \
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),        \
        "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),        \
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),        \
        "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]),        \
        "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// acc (64 per thread) += A B^T over 32 bytes of K: A the 64 queries, B the
// 128 rows, both K-major in shared memory, of the operand type of T (TF32
// for f32, k = 8; f16 or bf16, k = 16, neither transposed).
#define W9_MMA(T, SHAPE, IMM)                                                                \
    __device__ __forceinline__ void w9_mma(float (&d)[64], unsigned long long da,           \
                                           unsigned long long db, T) {                       \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                               \
                     "wgmma.mma_async.sync.aligned." SHAPE " " W9_ACC_REGS                   \
                     ", %64, %65, p, " IMM ";\n}\n"                                          \
                     : W9_ACC_OPERANDS(d)                                                    \
                     : "l"(da), "l"(db));                                                    \
    }
W9_MMA(float, "m64n128k8.f32.tf32.tf32", "1, 1")
W9_MMA(TopkF16, "m64n128k16.f32.f16.f16", "1, 1, 0, 0")
W9_MMA(TopkBf16, "m64n128k16.f32.bf16.bf16", "1, 1, 0, 0")

// Keeps the compiler from moving accesses of the accumulators across the
// asynchronous products (which read and write them without its knowledge).
__device__ __forceinline__ void w9_fence_acc(float (&d)[64]) {
#pragma unroll
    for (int i = 0; i < 64; ++i) {
        asm volatile("" : "+f"(d[i])::"memory");
    }
}

// The block's tile: which queries and rows it multiplies, and which
// warpgroup and warp of it a consumer thread is. Blocks take (query tile,
// row tile) pairs with the query tile varying fastest, so the blocks that
// share a row tile run together and read it from L2. Warpgroup (gq, gr)
// owns queries 64 gq .. + 64 and rows 128 gr .. + 128 of the block tile;
// warp w of it queries 16 w .. + 16 of those.
template <class SH>
struct W9Tile {
    size_t q0, r0;
    unsigned gq, gr, warp, lane;
    // Tile `tile` of the launch, as consumer thread `tid` of the
    // SH::THREADS that multiply it.
    __device__ __forceinline__ W9Tile(unsigned nq, unsigned tile, unsigned tid) {
        const unsigned qtiles = (nq + SH::BQ - 1) / SH::BQ;
        q0 = (size_t)(tile % qtiles) * SH::BQ;
        r0 = (size_t)(tile / qtiles) * SH::BR;
        gq = (tid / 128u) / SH::WGR;
        gr = (tid / 128u) % SH::WGR;
        warp = (tid / TOPK_WARP) % 4u;
        lane = tid & (TOPK_WARP - 1);
    }
    // The block's own tile (one block a tile).
    __device__ __forceinline__ explicit W9Tile(unsigned nq)
        : W9Tile(nq, blockIdx.x, threadIdx.x) {}
};

// The four products of one stage at shared address `st` into acc, then
// waits until at most the products just issued are in flight (those of
// the stage before are done).
template <class SH, class T>
__device__ __forceinline__ void w9_stage_products(float (&acc)[64], unsigned st,
                                                  const W9Tile<SH>& t, bool skip) {
    const unsigned a = st + t.gq * 64u * 128u;
    const unsigned b = st + (SH::BQ + t.gr * 128u) * 128u;
    w9_fence_acc(acc);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    if (!skip) {
#pragma unroll
        for (unsigned kk = 0; kk < 4; ++kk) {
            // One product's K is 32 bytes along the swizzled row.
            w9_mma(acc, w9_desc(a + kk * 32u), w9_desc(b + kk * 32u), T{});
        }
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
    w9_fence_acc(acc);
}

// A half product `a` scaled back to the pair's dot product: times 1 / s of
// the row (`rinv[row]`, where the rows are the 16-bit copy of f32 rows,
// nullptr where they are stored as halves) and then of the query (`qinv`).
// Both are powers of two. The row's lies in [2^-73, 2^37] (topk_rows16),
// and a nonzero |a| is at least 2^-48 (every product a multiple of the
// smallest f16 step squared) and below 2^44, so the first product is
// exact; the second rounds only a result below 2^-126 (at most 2^-150) or
// past 2^128 (infinite: the pair is always listed). A row outside its band
// has rinv NaN, so its bound is -inf and it is always listed.
__device__ __forceinline__ float w9_unscale(float a, float qinv, const float* __restrict__ rinv,
                                            size_t row) {
    if (rinv != nullptr) {
        a = __fmul_rn(a, rinv[row]);
    }
    return __fmul_rn(a, qinv);
}
// The same with the row's 1 / s already loaded (`rscale`; 1 for rows
// stored as halves, a product that changes nothing).
__device__ __forceinline__ float w9_unscale_by(float a, float qinv, float rscale) {
    return __fmul_rn(__fmul_rn(a, rscale), qinv);
}

// The lower bounds of the block's products (acc of each consumer thread)
// into scores (and the sampled ones into sub), written through shared
// memory at `sm` (the stages, free once every product is done) so that a
// query's rows are written together. acc[4 j + 2 h + c] is query 16 warp +
// lane / 4 + 8 h, row 8 j + 2 (lane % 4) + c of the warpgroup's 64 x 128
// (PTX ISA, "Register Fragments", wgmma .m64nNk8 / k16 accumulators).
// Every thread of the block calls it; those past SH::THREADS hold no
// products. Row r of the tile is row r << rshift of the corpus (the
// sampled rows of the Hopper listing, rshift > 0, read through a tensor map
// of every 2^rshift-th row) for its norm.
template <int METRIC, class SH, class T>
__device__ __forceinline__ void w9_write(const float (&acc)[64], float* tile, const W9Tile<SH>& t,
                                         unsigned n, unsigned d, unsigned nq,
                                         const float* __restrict__ rnorm,
                                         const float* __restrict__ qnorm,
                                         const float* __restrict__ qinv,
                                         const float* __restrict__ rinv,
                                         float* __restrict__ scores, float* __restrict__ sub,
                                         unsigned sub_shift, unsigned rshift) {
    __syncthreads();
    if (threadIdx.x < SH::THREADS) {
        const unsigned g = t.lane / 4;
        const unsigned c = t.lane % 4;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const unsigned q = t.gq * 64 + t.warp * 16 + g + 8 * h;
#pragma unroll
            for (int j = 0; j < 16; ++j) {
                const unsigned r = t.gr * 128 + j * 8 + 2 * c;
                *reinterpret_cast<float2*>(tile + q * SH::LD + r) =
                    make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
            }
        }
    }
    __syncthreads();
    for (unsigned i = threadIdx.x; i < SH::BQ * SH::BR; i += blockDim.x) {
        const unsigned qi = i / SH::BR;
        const unsigned ri = i % SH::BR;
        const size_t q = t.q0 + qi;
        const size_t row = t.r0 + ri;
        if (q < nq && row < n) {
            float a = tile[qi * SH::LD + ri];
            if constexpr (sizeof(T) == 2) {
                a = w9_unscale(a, qinv[q], rinv, row << rshift);
            }
            topk_write_lower(scores, sub, sub_shift, n, q, row,
                             topk_approx_lower<METRIC>(a, qnorm[q], rnorm[row << rshift], d));
        }
    }
}

// A tensor map of the copy engine (CUtensorMap: 128 bytes, 64-byte
// aligned), as the host encodes it: a 2-D tensor of `rows` vectors of D
// values, a box of 128 bytes of each of 128 (queries) or 256 (rows)
// vectors, 128-byte swizzle, zeros past the tensor's edges.
struct alignas(64) W9Map {
    unsigned long long words[16];
};

__device__ __forceinline__ void w9_bar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Arrives on `bar` and adds `bytes` to the copies it waits for.
__device__ __forceinline__ void w9_bar_expect(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
                 "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void w9_bar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the phase of `bar` with this parity has completed.
__device__ __forceinline__ void w9_bar_wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n.reg .pred p;\nW9_WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra W9_WAIT;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}
// The box at (column c0, vector v0) of `map` into shared address `dst`, its
// bytes counted on `bar`.
__device__ __forceinline__ void w9_tma(unsigned dst, const W9Map* map, unsigned c0, unsigned v0,
                                       unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
        "l"(map), "r"(c0), "r"(v0), "r"(bar)
        : "memory");
}

// Where the listing bound kernel (topk_emit90_*) puts a chunk's rows
// (docs/CONTRACTS.md §5): `sel` holds the selection over the lower bounds
// of a sample of the rows (rows of k + 1: header, then results best first),
// whose K-th, T0, is at most the query's K-th best canonical score; every
// (query q, row) whose upper bound reaches T0 gets its lower bound
// elo[q * cap + i] and its row erow[q * cap + i], i counted in ecount[q].
// `flag` becomes nonzero when a query lists more than `cap` rows or its
// sample's selection did not finish on the device.
struct W9Emit {
    const TopkNeighbor* sel;
    unsigned k;
    float* elo;
    unsigned* erow;
    unsigned* ecount;
    unsigned cap;
    unsigned* flag;
};

// The listing epilogue of a tile's products: each consumer thread (t)
// tests its own 64 accumulators (fragment layout as in w9_write) against
// its queries' T0 with bounds.cuh's test, and appends the rows that pass;
// no bound is stored for the rest. Every load is unconditional (indices
// past nq or n are clamped, and those queries and rows skipped after), so
// the compiler may issue them ahead of the tests: its two queries' values
// first, then each pair of rows' norms and scales once for both queries.
// A row's scale multiplies as 1 where the rows are stored as halves (rinv
// nullptr), which leaves every product unchanged.
template <int METRIC, class SH, class T>
__device__ __forceinline__ void w9_emit(const float (&acc)[64], const W9Tile<SH>& t, unsigned n,
                                        unsigned d, unsigned nq, const float* __restrict__ rnorm,
                                        const float* __restrict__ qnorm,
                                        const float* __restrict__ qinv,
                                        const float* __restrict__ rinv, const W9Emit& e) {
    const unsigned g = t.lane / 4;
    const unsigned c = t.lane % 4;
    size_t qs[2];
    float t0[2], qn[2], inv[2];
    bool live[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        qs[h] = t.q0 + t.gq * 64 + t.warp * 16 + g + 8 * h;
        const size_t q = qs[h] < nq ? qs[h] : nq - 1u;
        const TopkNeighbor* res = e.sel + q * (e.k + 1);
        const bool done = res[0].index == TOPK_STATUS_OK;
        if (qs[h] < nq && !done && c == 0 && t.gr == 0) {
            atomicOr(e.flag, 1u);
        }
        live[h] = qs[h] < nq && done;
        t0[h] = res[e.k].score;
        qn[h] = qnorm[q];
        inv[h] = sizeof(T) == 2 ? qinv[q] : 1.0f;
    }
#pragma unroll
    for (int j = 0; j < 16; ++j) {
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
            const size_t row = t.r0 + t.gr * 128 + j * 8 + 2 * c + cc;
            const size_t at_row = row < n ? row : n - 1u;
            const float rn = rnorm[at_row];
            const float ri = (sizeof(T) == 2 && rinv != nullptr) ? rinv[at_row] : 1.0f;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                if (!live[h] || row >= n) {
                    continue;
                }
                float a = acc[4 * j + 2 * h + cc];
                if constexpr (sizeof(T) == 2) {
                    a = w9_unscale_by(a, inv[h], ri);
                }
                const float lo = topk_approx_lower<METRIC>(a, qn[h], rn, d);
                if (topk_listed(lo, topk_approx_width<METRIC>(qn[h], rn, d), t0[h])) {
                    const size_t q = qs[h];
                    const unsigned at = atomicAdd(e.ecount + q, 1u);
                    if (at < e.cap) {
                        e.elo[q * e.cap + at] = lo;
                        e.erow[q * e.cap + at] = (unsigned)row;
                    } else {
                        atomicOr(e.flag, 1u);
                    }
                }
            }
        }
    }
}

// The copy engine's ring of SH::STAGES stages in dynamic shared memory:
// the stages from `sm` (W9_ALIGN-aligned, `raw` the allocation's start),
// then a full and an empty barrier a stage (full[s]: the producer's
// arrival and the bytes; empty[s]: one arrival per consumer warp once the
// stage's products are done), then any barriers of the caller's own.
template <class SH>
struct W9Ring {
    unsigned raw, sm, full, empty;
    __device__ __forceinline__ W9Ring() {
        extern __shared__ float4 topk_dyn_smem[];
        raw = (unsigned)__cvta_generic_to_shared(topk_dyn_smem);
        sm = (raw + W9_ALIGN - 1u) & ~(W9_ALIGN - 1u);
        full = sm + SH::STAGES * SH::STAGE_BYTES;
        empty = full + 8u * SH::STAGES;
    }
    // The barriers after the ring's, 8 bytes each.
    __device__ __forceinline__ unsigned extra() const { return empty + 8u * SH::STAGES; }
    // Thread 0 sets up the ring's barriers (`consumers` warps release a
    // stage) and `more` barriers after them of `count` arrivals each.
    __device__ __forceinline__ void init(unsigned consumers, unsigned more, unsigned count) const {
        for (unsigned s = 0; s < SH::STAGES; ++s) {
            w9_bar_init(full + 8u * s, 1u);
            w9_bar_init(empty + 8u * s, consumers);
        }
        for (unsigned b = 0; b < more; ++b) {
            w9_bar_init(extra() + 8u * b, count);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    // The producer's g-th fill of the ring: once the slot's previous use
    // is released, the boxes of tile t's queries and rows at column k0.
    __device__ __forceinline__ void fill(unsigned g, const W9Map& qmap, const W9Map& cmap,
                                         unsigned k0, const W9Tile<SH>& t) const {
        const unsigned s = g % SH::STAGES;
        if (g >= SH::STAGES) {
            w9_bar_wait(empty + 8u * s, ((g / SH::STAGES) + 1u) & 1u);
        }
        const unsigned st = sm + s * SH::STAGE_BYTES;
        w9_bar_expect(full + 8u * s, SH::STAGE_BYTES);
        w9_tma(st, &qmap, k0, (unsigned)t.q0, full + 8u * s);
        w9_tma(st + SH::BQ * 128u, &cmap, k0, (unsigned)t.r0, full + 8u * s);
    }
};

// w9_scores with the stages filled by the copy engine: the block's last
// warp (thread SH::THREADS) issues each stage's two boxes (queries, rows;
// zeros past nq, n and d) as soon as the consumers have released it, and
// the SH::THREADS consumer threads multiply each stage once its bytes have
// arrived, with no block barrier between stages. Stage s has two
// barriers: full[s] (one arrival, the producer's, and the bytes) and
// empty[s] (one arrival per consumer warp once its products of the stage
// are done). `qmap` and `cmap` are the queries' and the rows' tensor maps
// (of T). Block: SH::TMA_THREADS threads; dynamic shared memory:
// SH::TMA_SMEM bytes. Every bound is written (w9_write, with `rshift` its
// norms' stride).
template <int METRIC, class SH, class T>
__device__ void w9_scores_tma(const W9Map& qmap, const W9Map& cmap, const float* __restrict__ rnorm,
                              unsigned n, unsigned d, unsigned nq, const float* __restrict__ qnorm,
                              const float* __restrict__ qinv, const float* __restrict__ rinv,
                              float* __restrict__ scores, float* __restrict__ sub,
                              unsigned sub_shift, unsigned rshift) {
    constexpr unsigned STAGES = SH::STAGES;
    constexpr unsigned BK = 128u / sizeof(T);
    extern __shared__ float4 topk_dyn_smem[];
    const W9Ring<SH> ring;
    const unsigned sm = ring.sm;
    const unsigned full = ring.full;
    const unsigned empty = ring.empty;
    const W9Tile<SH> t(nq);
    const unsigned nk = (d + BK - 1) / BK;
    if (threadIdx.x == 0) {
        ring.init(SH::THREADS / TOPK_WARP, 0u, 0u);
    }
    __syncthreads();

    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) {
        acc[i] = 0.0f;
    }
    if (threadIdx.x >= SH::THREADS) {
        if (threadIdx.x == SH::THREADS) {
            for (unsigned kt = 0; kt < nk; ++kt) {
                ring.fill(kt, qmap, cmap, kt * BK, t);
            }
        }
    } else {
        for (unsigned kt = 0; kt < nk; ++kt) {
            const unsigned s = kt % STAGES;
            w9_bar_wait(full + 8u * s, (kt / STAGES) & 1u);
            w9_stage_products<SH, T>(acc, sm + s * SH::STAGE_BYTES, t, false);
            // The products of stage kt - 1 are done: release it.
            if (kt > 0 && t.lane == 0) {
                w9_bar_arrive(empty + 8u * ((kt - 1) % STAGES));
            }
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        w9_fence_acc(acc);
    }
    // Every copy has landed (the consumers waited for each) and every
    // product is done, so the stages hold the products' tile next.
    float* tile = reinterpret_cast<float*>(topk_dyn_smem) + (sm - ring.raw) / 4u;
    w9_write<METRIC, SH, T>(acc, tile, t, n, d, nq, rnorm, qnorm, qinv, rinv, scores, sub,
                            sub_shift, rshift);
}

// The Hopper listing (topk_emit90_*) from persistent blocks: gridDim.x
// blocks (one an SM) take tiles blockIdx.x, blockIdx.x + gridDim.x, ...
// (W9Tile's order), and the block's NG = 2 groups of SH::THREADS consumer
// threads take its tiles in turn (its i-th tile is group i % 2's). The
// producer thread issues the boxes of every stage of every tile of the
// block in that order into one ring of SH::STAGES stages (the block's
// stage g = i nk + kt in slot g % STAGES), so the next tile's first stages
// load while a tile is multiplied and listed. The groups take turns at the
// tensor cores: a group starts its tile's products once the other group
// has issued all of its previous tile's (turn[grp], one arrival per warp of
// the other group), so one group's listing epilogue runs beside the other
// group's products. That order also keeps each slot's barrier phases
// waited in order: every earlier use of a slot belongs to a tile whose
// products were issued before, so its phase has completed. Block:
// 2 SH::THREADS + 32 threads; dynamic shared memory: SH::TMA_SMEM + 16.
template <int METRIC, class SH, class T>
__device__ void w9_list(const W9Map& qmap, const W9Map& cmap, const float* __restrict__ rnorm,
                        unsigned n, unsigned d, unsigned nq, const float* __restrict__ qnorm,
                        const float* __restrict__ qinv, const float* __restrict__ rinv,
                        const W9Emit& e) {
    constexpr unsigned NG = 2;
    constexpr unsigned STAGES = SH::STAGES;
    constexpr unsigned BK = 128u / sizeof(T);
    constexpr unsigned GROUP_WARPS = SH::THREADS / TOPK_WARP;
    const W9Ring<SH> ring;
    const unsigned sm = ring.sm;
    const unsigned full = ring.full;
    const unsigned empty = ring.empty;
    const unsigned turn = ring.extra();
    const unsigned nk = (d + BK - 1) / BK;
    const unsigned tiles = ((nq + SH::BQ - 1) / SH::BQ) * ((n + SH::BR - 1) / SH::BR);
    const unsigned mine =
        blockIdx.x < tiles ? (tiles - blockIdx.x + gridDim.x - 1u) / gridDim.x : 0u;
    if (threadIdx.x == 0) {
        ring.init(GROUP_WARPS, 2u, GROUP_WARPS);
    }
    __syncthreads();
    if (threadIdx.x >= NG * SH::THREADS) {
        if (threadIdx.x == NG * SH::THREADS) {
            for (unsigned i = 0; i < mine; ++i) {
                const W9Tile<SH> t(nq, blockIdx.x + i * gridDim.x, 0u);
                for (unsigned kt = 0; kt < nk; ++kt) {
                    ring.fill(i * nk + kt, qmap, cmap, kt * BK, t);
                }
            }
        }
        return;
    }
    const unsigned grp = threadIdx.x / SH::THREADS;
    const unsigned lane = threadIdx.x & (TOPK_WARP - 1);
    float acc[64];
    for (unsigned i = grp, j = 0; i < mine; i += NG, ++j) {
        const W9Tile<SH> t(nq, blockIdx.x + i * gridDim.x, threadIdx.x % SH::THREADS);
#pragma unroll
        for (int v = 0; v < 64; ++v) {
            acc[v] = 0.0f;
        }
        if (i > 0) {
            // Group 0's j-th tile follows group 1's (j - 1)-th; group 1's
            // follows group 0's j-th.
            w9_bar_wait(turn + 8u * grp, (grp == 0 ? j - 1u : j) & 1u);
        }
        for (unsigned kt = 0; kt < nk; ++kt) {
            const unsigned g = i * nk + kt;
            const unsigned s = g % STAGES;
            w9_bar_wait(full + 8u * s, (g / STAGES) & 1u);
            w9_stage_products<SH, T>(acc, sm + s * SH::STAGE_BYTES, t, false);
            if (kt > 0 && lane == 0) {
                w9_bar_arrive(empty + 8u * ((g - 1u) % STAGES));
            }
        }
        if (lane == 0) {
            w9_bar_arrive(turn + 8u * (1u - grp));
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        w9_fence_acc(acc);
        if (lane == 0) {
            w9_bar_arrive(empty + 8u * ((i * nk + nk - 1u) % STAGES));
        }
        w9_emit<METRIC, SH, T>(acc, t, n, d, nq, rnorm, qnorm, qinv, rinv, e);
    }
}

// 2^e as a float, e in [-149, 127] (exact).
__device__ __forceinline__ float w9_pow2(int e) {
    return e >= -126 ? __int_as_float((e + 127) << 23) : __int_as_float(1 << (e + 149));
}

// An f32 value rounded to nearest even to the half types.
__device__ __forceinline__ TopkF16 w9_round(float x, TopkF16) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(h) : "f"(x));
    return TopkF16{h};
}
__device__ __forceinline__ TopkBf16 w9_round(float x, TopkBf16) {
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(h) : "f"(x));
    return TopkBf16{h};
}

// The half operands of nq f32 vectors (nq x d, finite): vector j scaled by
// s = 2^k, k = min(13 - floor(log2 max_i |v_ji|), 127) (k = 0 for a zero
// vector), each value rounded to T into out[j * d + i], and 1 / s into
// inv[j] (see the top). A warp per vector. ROWS (the 16-bit copy of f32
// rows that the Hopper bounds multiply in their place, docs/CONTRACTS.md
// §5): a row whose largest |value| lies outside [2^-60, 2^50) gets zeros
// and inv NaN instead, so that w9_unscale's first product stays exact and
// such a row is always listed.
template <class T, bool ROWS = false>
__device__ void w9_halves(const float* __restrict__ vectors, unsigned nv, unsigned d,
                          T* __restrict__ out, float* __restrict__ inv) {
    const unsigned lane = threadIdx.x & (TOPK_WARP - 1);
    const size_t warps = (size_t)gridDim.x * (blockDim.x / TOPK_WARP);
    for (size_t j = (size_t)blockIdx.x * (blockDim.x / TOPK_WARP) + threadIdx.x / TOPK_WARP;
         j < nv; j += warps) {
        const float* v = vectors + j * d;
        float m = 0.0f;
        for (unsigned i = lane; i < d; i += TOPK_WARP) {
            m = fmaxf(m, fabsf(v[i]));
        }
#pragma unroll
        for (int o = TOPK_WARP / 2; o > 0; o /= 2) {
            m = fmaxf(m, __shfl_xor_sync(TOPK_FULL_MASK, m, o));
        }
        const bool banded = !ROWS || m == 0.0f || (m >= 0x1p-60f && m < 0x1p50f);
        const int k = m > 0.0f ? min(13 - ilogbf(m), 127) : 0;
        const float s = banded ? w9_pow2(k) : 0.0f;
        for (unsigned i = lane; i < d; i += TOPK_WARP) {
            out[j * d + i] = w9_round(__fmul_rn(v[i], s), T{});
        }
        if (lane == 0) {
            inv[j] = banded ? w9_pow2(-k) : __int_as_float(0x7fc00000u);
        }
    }
}

// The engine's shape (topk-cuda mirrors these numbers).
#define W9_WGQ 2
#define W9_WGR 2
#define W9_STAGES 4
#define W9_QUERY_THREADS 256
using W9Engine = W9Shape<W9_WGQ, W9_WGR, W9_STAGES>;
// The listing's two groups that take turns, each 2 x 1 warpgroups (128
// queries x 128 rows), over a ring of W9_TURN_STAGES stages.
#define W9_TURN_STAGES 6
using W9Turns = W9Shape<2, 1, W9_TURN_STAGES>;

// topk_approx90_* writes every lower bound and the sampled ones
// (topk_write_lower), tile row r being corpus row r << rshift for its norm
// (rshift > 0: `cmap` maps every 2^rshift-th row); topk_emit90_* lists the
// rows whose upper bound reaches the sample's K-th lower bound (w9_list,
// one block an SM: its grid is at most the device's SM count).
// `qmap` is the tensor map of the queries (f32 rows: the f32 queries; half
// rows: topk_queries16's, with `qinv` their inverse scales, nullptr for
// f32), `cmap` that of the rows.
#define TOPK_FILTER90_KERNELS(NAME, METRIC)                                                  \
    extern "C" __global__ void __launch_bounds__(W9Engine::TMA_THREADS, 1)                  \
        topk_approx90_##NAME(const __grid_constant__ W9Map qmap,                            \
                             const __grid_constant__ W9Map cmap,                            \
                             const float* __restrict__ rnorm, unsigned n, unsigned d,       \
                             unsigned nq, const float* __restrict__ qnorm,                  \
                             const float* __restrict__ qinv, const float* __restrict__ rinv, \
                             float* __restrict__ scores, float* __restrict__ sub,           \
                             unsigned sub_shift, unsigned rshift) {                         \
        w9_scores_tma<METRIC, W9Engine, topk_row_t>(qmap, cmap, rnorm, n, d, nq, qnorm, qinv, \
                                                   rinv, scores, sub, sub_shift, rshift);   \
    }                                                                                        \
    extern "C" __global__ void __launch_bounds__(2 * W9Turns::THREADS + 32, 1)               \
        topk_emit90_##NAME(const __grid_constant__ W9Map qmap,                              \
                           const __grid_constant__ W9Map cmap, const float* __restrict__ rnorm, \
                           unsigned n, unsigned d, unsigned nq, const float* __restrict__ qnorm, \
                           const float* __restrict__ qinv, const float* __restrict__ rinv, \
                           const TopkNeighbor* __restrict__ sel,                              \
                           unsigned k, float* __restrict__ elo, unsigned* __restrict__ erow,   \
                           unsigned* __restrict__ ecount, unsigned cap,                       \
                           unsigned* __restrict__ flag) {                                     \
        w9_list<METRIC, W9Turns, topk_row_t>(qmap, cmap, rnorm, n, d, nq, qnorm, qinv, rinv,   \
                                             W9Emit{sel, k, elo, erow, ecount, cap, flag});    \
    }

#if TOPK_ROW_DTYPE != 0
extern "C" __global__ void __launch_bounds__(W9_QUERY_THREADS)
    topk_queries16(const float* __restrict__ queries, unsigned nq, unsigned d,
                   topk_row_t* __restrict__ out, float* __restrict__ inv) {
    w9_halves(queries, nq, d, out, inv);
}
#endif
#if TOPK_ROW_DTYPE == 1
// The f16 copy of n f32 rows (w9_halves with ROWS) that an f32 corpus's
// Hopper bounds multiply instead of TF32 products of the rows.
extern "C" __global__ void __launch_bounds__(W9_QUERY_THREADS)
    topk_rows16(const float* __restrict__ rows, unsigned n, unsigned d,
                topk_row_t* __restrict__ out, float* __restrict__ inv) {
    w9_halves<topk_row_t, true>(rows, n, d, out, inv);
}
#endif

TOPK_FILTER90_KERNELS(dot, TOPK_DOT)
TOPK_FILTER90_KERNELS(cosine, TOPK_COSINE)
TOPK_FILTER90_KERNELS(l2, TOPK_L2)
