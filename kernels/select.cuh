// Block-level helpers of the exact top-k selection (docs/CONTRACTS.md §3),
// used by the kernels of select.cu, score_single.cu and filter.cu. Every
// function here is run by a whole block of TOPK_SEL_THREADS threads. These passes are short and latency-bound, so
// they are written for few instructions per row: whole warps load several
// rows at once, and only warps holding a candidate take the append path.
//
// The selection of one query, given its N scores:
// 1. topk_hist_rows: a histogram of the top 12 ordered bits of every score
//    (level 1), in shared memory, summed into the query area when several
//    blocks share a query.
// 2. topk_threshold_block: the level-1 bin `bucket` where the count from the
//    best bin down reaches k. Rows above it (`above` < k) are in the answer.
// 3. topk_gather_rows: rows above the bin are appended to `cand`, rows in the
//    bin to `maybe` (global lists; the one-block select appends straight
//    into its shared sort buffer when both fit there).
// 4. topk_select_block (topk_rank_write once the keys are in shared
//    memory): when the bin's rows do not all fit beside the candidates, a
//    histogram of their next 12 bits (level 2) narrows them to those at or
//    above its own threshold; the kept keys are ranked (by counting for
//    small sets, by equal-ratio buckets of their scores for larger ones, by
//    a bitonic network held in registers when a bucket is crowded) into the
//    front of the key buffer, from where the best k, then the header, are
//    written (topk_write_row). Too many exact ties for the buffer set the
//    overflow status, and the host finishes that query from the scores.
#pragma once
#include "common.cuh"

// Rows each thread loads before using them: independent loads in flight.
#define TOPK_ROWS_ILP 8
// Largest candidate set ranked by counting rather than sorted.
#ifndef TOPK_RANK_MAX
#define TOPK_RANK_MAX 256
#endif

// Loads the ordered bits of rows base + threadIdx.x + j * step, for j in
// [0, TOPK_ROWS_ILP); rows past the end read as 0 (the bits of NaN, below
// every score). From `stash` (shared, indexed by row) when it is not null,
// else from the scores through L2 (another launch wrote them).
__device__ __forceinline__ void topk_load_bits(const float* __restrict__ sc,
                                               const unsigned* stash, size_t n, size_t base,
                                               unsigned step, unsigned* ob) {
#pragma unroll
    for (unsigned j = 0; j < TOPK_ROWS_ILP; ++j) {
        const size_t i = base + (size_t)j * step + threadIdx.x;
        if (i >= n) {
            ob[j] = 0u;
        } else if (stash != nullptr) {
            ob[j] = stash[i];
        } else {
            ob[j] = topk_ordered_bits(__ldcg(sc + i));
        }
    }
}

// Counts rows first + threadIdx.x + j * step (< n) in the level-1 histogram
// `h` (shared memory, zeroed by the caller). With `keep` (shared, indexed by
// row), also stores each row's ordered bits there for a second pass.
__device__ __forceinline__ void topk_hist_rows(const float* __restrict__ sc, unsigned n,
                                               unsigned first, unsigned step, unsigned* h,
                                               unsigned* keep) {
    for (size_t base = first; base < n; base += (size_t)step * TOPK_ROWS_ILP) {
        unsigned ob[TOPK_ROWS_ILP];
        topk_load_bits(sc, nullptr, n, base, step, ob);
#pragma unroll
        for (unsigned j = 0; j < TOPK_ROWS_ILP; ++j) {
            const size_t i = base + (size_t)j * step + threadIdx.x;
            if (i < n) {
                if (keep != nullptr) {
                    keep[i] = ob[j];
                }
                atomicAdd(&h[ob[j] >> (32 - TOPK_L1_BITS)], 1u);
            }
        }
    }
}

// Adds a block's shared level-1 histogram `h` to the query area's (global);
// the block has THREADS threads.
template <unsigned THREADS = TOPK_SEL_THREADS>
__device__ __forceinline__ void topk_flush_hist(const unsigned* h, unsigned* __restrict__ area) {
    for (unsigned i = threadIdx.x; i < TOPK_L1_BINS; i += THREADS) {
        if (h[i] != 0u) {
            atomicAdd(&area[i], h[i]);
        }
    }
}

// Makes this block's writes visible to every block, then takes a ticket on
// `counter`: true in the one block that arrives last, which also resets the
// counter for the next search. Ends with the block synchronised. As in
// topk_grid_sync, one fence by thread 0 after the block barrier publishes
// the whole block's writes (a fence is cumulative over the writes the
// barrier ordered before it), so the threads that appended keys do not each
// wait for their own.
__device__ __forceinline__ bool topk_last_block(unsigned* counter, unsigned blocks) {
    __shared__ bool is_last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        is_last = atomicAdd(counter, 1u) == blocks - 1;
        if (is_last) {
            *counter = 0u;
        }
    }
    __syncthreads();
    if (is_last) {
        __threadfence();
    }
    return is_last;
}

// Grid-wide barrier of a cooperative launch (every block resident), on one
// word of the query area whose low 31 bits are zero between barriers: block 0
// adds 2^31 - (blocks - 1) and every other block 1, so the word's bit 31
// flips exactly when the last block arrives, and the sum over one barrier is
// 2^31 whatever the order. Each block waits for the bit to differ from the
// one its own arrival returned. One atomic per block is the whole critical
// path (a counter reset and a separate generation word cost a fence and a
// second atomic after the last arrival: bench/gpu/NOTES.md). Writes
// before it are visible to every block after it.
__device__ __forceinline__ void topk_grid_sync(unsigned* __restrict__ area) {
    unsigned* word = area + TOPK_AREA_CTR + TOPK_CTR_BAR;
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned add = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1u) : 1u;
        __threadfence();
        const unsigned before = atomicAdd(word, add);
        const volatile unsigned* poll = word;
        while (((*poll ^ before) & 0x80000000u) == 0u) {
        }
        __threadfence();
    }
    __syncthreads();
}

// Zeroes `words` words of shared memory at `p` with a block of THREADS
// threads; ends with the block synchronised.
template <unsigned THREADS = TOPK_SEL_THREADS>
__device__ __forceinline__ void topk_zero_shared(unsigned* p, unsigned words) {
    for (unsigned i = threadIdx.x; i < words; i += THREADS) {
        p[i] = 0u;
    }
    __syncthreads();
}

// Finds, in the 4,096-bin histogram `h` (16-byte aligned), the bin where the
// count from the best bin down reaches k (1 <= k <= total), and with ZERO
// zeroes the histogram. With GLOBAL the bins are in global memory, filled by
// other blocks' atomics, and read through L2. Run by a block of THREADS
// threads; every thread gets the result.
template <bool GLOBAL, bool ZERO = true, unsigned THREADS = TOPK_SEL_THREADS>
__device__ __noinline__ TopkThreshold topk_threshold_block(unsigned* h, unsigned k) {
    constexpr unsigned PER = TOPK_L1_BINS / THREADS;
    static_assert(PER * THREADS == TOPK_L1_BINS && PER % 4 == 0, "threshold block shape");
    __shared__ unsigned warp_sums[THREADS / TOPK_WARP];
    __shared__ TopkThreshold result;
    // Thread t owns bins hi, hi - 1, ..., lo = hi - PER + 1 (best first),
    // read as PER / 4 aligned 16-byte words, all issued before any is used
    // (a load per bin and a two-barrier scan measured more than twice as
    // slow in every block of the one-launch search: bench/gpu/NOTES.md).
    const unsigned lo = TOPK_L1_BINS - PER * (threadIdx.x + 1);
    const unsigned hi = lo + PER - 1;
    uint4* v4 = reinterpret_cast<uint4*>(h + lo);
    uint4 words[PER / 4];
#pragma unroll
    for (unsigned q = 0; q < PER / 4; ++q) {
        words[q] = GLOBAL ? __ldcg(v4 + q) : v4[q];
    }
    unsigned c[PER];
    unsigned sum = 0;
#pragma unroll
    for (unsigned q = 0; q < PER / 4; ++q) {
        const uint4 v = words[q];
        c[PER - 1 - 4 * q] = v.x;
        c[PER - 2 - 4 * q] = v.y;
        c[PER - 3 - 4 * q] = v.z;
        c[PER - 4 - 4 * q] = v.w;
        sum += v.x + v.y + v.z + v.w;
    }
    const unsigned before = topk_block_exclusive_scan<THREADS>(sum, warp_sums);
    const unsigned incl = before + sum;
    if (before < k && incl >= k) {
        unsigned run = before;
#pragma unroll
        for (unsigned j = 0; j < PER; ++j) {
            if (run < k && run + c[j] >= k) {
                result.bucket = hi - j;
                result.above = run;
                result.in_bucket = c[j];
                result.pad = 0u;
            }
            run += c[j];
        }
    }
    if (ZERO) {
#pragma unroll
        for (unsigned q = 0; q < PER / 4; ++q) {
            v4[q] = make_uint4(0u, 0u, 0u, 0u);
        }
    }
    __syncthreads();
    return result;
}

// Run by every block of THREADS threads of a grid-stride scoring grid once
// its scores are written: counts the rows this block scored (row groups
// blockIdx.x + j * gridDim.x of ROWS rows each) in the level-1 histogram `h`
// (shared, TOPK_L1_BINS words, free for reuse once the block is
// synchronised) and adds it to the query area. Reads back only scores this
// block wrote, so no grid-wide barrier has to come first.
template <unsigned THREADS, unsigned ROWS>
__device__ __forceinline__ void topk_hist_own_rows(const float* __restrict__ scores, unsigned n,
                                                   unsigned* h, unsigned* __restrict__ area) {
    // Other warps may still be reading the memory `h` reuses.
    __syncthreads();
    topk_zero_shared<THREADS>(h, TOPK_L1_BINS);
    const unsigned groups = (n + ROWS - 1) / ROWS;
    const unsigned mine =
        blockIdx.x < groups ? (groups - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
    const unsigned slots = mine * ROWS;
    for (unsigned base = 0; base < slots; base += THREADS * TOPK_ROWS_ILP) {
        unsigned ob[TOPK_ROWS_ILP];
        bool real[TOPK_ROWS_ILP];
#pragma unroll
        for (unsigned j = 0; j < TOPK_ROWS_ILP; ++j) {
            const unsigned i = base + j * THREADS + threadIdx.x;
            const size_t row =
                ((size_t)blockIdx.x + (size_t)(i / ROWS) * gridDim.x) * ROWS + i % ROWS;
            real[j] = i < slots && row < n;
            ob[j] = real[j] ? topk_ordered_bits(__ldcg(scores + row)) : 0u;
        }
#pragma unroll
        for (unsigned j = 0; j < TOPK_ROWS_ILP; ++j) {
            if (real[j]) {
                atomicAdd(&h[ob[j] >> (32 - TOPK_L1_BITS)], 1u);
            }
        }
    }
    __syncthreads();
    topk_flush_hist<THREADS>(h, area);
}

// Run by every block of a grid of `blocks` blocks of THREADS threads that
// has added its counts to the query area: the last block to arrive finds
// the threshold for k into `th`, leaving the area's histogram at zero.
template <unsigned THREADS>
__device__ __forceinline__ void topk_last_block_threshold(unsigned* __restrict__ area,
                                                          unsigned blocks, unsigned k,
                                                          TopkThreshold* __restrict__ th) {
    if (!topk_last_block(&area[TOPK_AREA_CTR + TOPK_CTR_HIST], blocks)) {
        return;
    }
    const TopkThreshold t = topk_threshold_block<true, true, THREADS>(area, k);
    if (threadIdx.x == 0) {
        *th = t;
    }
}

// topk_hist_own_rows, then topk_last_block_threshold: the work of a
// topk_hist pass, without its pass over the scores.
template <unsigned THREADS, unsigned ROWS>
__device__ __forceinline__ void topk_threshold_own_rows(const float* __restrict__ scores,
                                                        unsigned n, unsigned* h,
                                                        unsigned* __restrict__ area, unsigned k,
                                                        TopkThreshold* __restrict__ th) {
    topk_hist_own_rows<THREADS, ROWS>(scores, n, h, area);
    topk_last_block_threshold<THREADS>(area, gridDim.x, k, th);
}

// Whether any of a round's TOPK_ROWS_ILP rows of this lane falls in or
// above level-1 bin `bucket` (a candidate of topk_gather_rows).
__device__ __forceinline__ bool topk_round_has_candidate(const unsigned* ob, unsigned bucket) {
    bool any = false;
#pragma unroll
    for (unsigned j = 0; j < TOPK_ROWS_ILP; ++j) {
        any |= (ob[j] >> (32 - TOPK_L1_BITS)) >= bucket;
    }
    return any;
}

// Appends rows first + threadIdx.x + j * step (< n) above the threshold bin
// to `cand` and those in it to `maybe`, taking their places from the two
// counters ctr[0] (cand) and ctr[1] (maybe), shared or global. Each warp
// takes its places once per round of TOPK_ROWS_ILP rows per lane, both
// lists' atomics issued together, so that an atomic's round trip is paid
// once per round rather than once per row (at K = 1000 most rounds of a
// small corpus hold candidates). Taking them once per block instead, with
// block barriers in every round, was slower where blocks run many rounds
// and no faster in the one-launch search's single round, even at K = 1000
// (bench/gpu/NOTES.md). Bits come from `stash` when it is not null (see topk_load_bits).
__device__ __forceinline__ void topk_gather_rows(const float* __restrict__ sc,
                                                 const unsigned* stash, unsigned n,
                                                 TopkThreshold t, unsigned first, unsigned step,
                                                 unsigned* ctr,
                                                 unsigned long long* __restrict__ cand,
                                                 unsigned long long* __restrict__ maybe) {
    const unsigned lane = threadIdx.x & (TOPK_WARP - 1);
    const unsigned lanes_below = (1u << lane) - 1u;
    for (size_t base = first; base < n; base += (size_t)step * TOPK_ROWS_ILP) {
        unsigned ob[TOPK_ROWS_ILP];
        topk_load_bits(sc, stash, n, base, step, ob);
        // Most rounds hold no candidate: one vote skips them.
        if (!__any_sync(TOPK_FULL_MASK, topk_round_has_candidate(ob, t.bucket))) {
            continue;
        }
        unsigned ma[TOPK_ROWS_ILP];
        unsigned mb[TOPK_ROWS_ILP];
        unsigned na = 0;
        unsigned nb = 0;
#pragma unroll
        for (unsigned j = 0; j < TOPK_ROWS_ILP; ++j) {
            const size_t i = base + (size_t)j * step + threadIdx.x;
            const unsigned b1 = ob[j] >> (32 - TOPK_L1_BITS);
            ma[j] = __ballot_sync(TOPK_FULL_MASK, i < n && b1 > t.bucket);
            mb[j] = __ballot_sync(TOPK_FULL_MASK, i < n && b1 == t.bucket);
            na += __popc(ma[j]);
            nb += __popc(mb[j]);
        }
        unsigned pa = 0;
        unsigned pb = 0;
        if (lane == 0) {
            // Both issued before either result is used.
            if (na != 0u) {
                pa = atomicAdd(&ctr[0], na);
            }
            if (nb != 0u) {
                pb = atomicAdd(&ctr[1], nb);
            }
        }
        pa = __shfl_sync(TOPK_FULL_MASK, pa, 0);
        pb = __shfl_sync(TOPK_FULL_MASK, pb, 0);
#pragma unroll
        for (unsigned j = 0; j < TOPK_ROWS_ILP; ++j) {
            const unsigned i = (unsigned)(base + (size_t)j * step) + threadIdx.x;
            const unsigned long long key =
                ((unsigned long long)ob[j] << 32) | (unsigned long long)(0xffffffffu - i);
            if ((ma[j] >> lane) & 1u) {
                const unsigned p = pa + __popc(ma[j] & lanes_below);
                if (p < TOPK_CAND_CAP) {
                    cand[p] = key;
                }
            }
            if ((mb[j] >> lane) & 1u) {
                const unsigned p = pb + __popc(mb[j] & lanes_below);
                if (p < TOPK_MAYBE_CAP) {
                    maybe[p] = key;
                }
            }
            pa += __popc(ma[j]);
            pb += __popc(mb[j]);
        }
    }
}

// The score of a ranked key: its ordered bits map back to the score's bits,
// except for the one value that -0.0 and +0.0 share and for NaN, whose bits
// are read back from `sc` so that they stay exactly what was scored.
__device__ __forceinline__ float topk_key_score(unsigned long long key,
                                                const float* __restrict__ sc) {
    const unsigned ob = (unsigned)(key >> 32);
    if (ob == 0u || ob == 0x80000000u) {
        return __ldcg(sc + topk_key_index(key));
    }
    return topk_score_of_bits(ob);
}

// Writes the query's row from the first `count` keys of `s` (shared, best
// first, complete for every thread of the block): row[1 + r] = result r,
// then the header row[0] = OK; ends with the block synchronised. Each result
// is one 8-byte store, consecutive threads on consecutive results, so that
// results in mapped host memory cross the bus as whole lines rather than as
// scattered words. The header must come after every result is visible
// system-wide (the host polls it in mapped memory, then reads the results):
// after the block barrier, thread 0 fences at system scope, which covers the
// results the barrier ordered before it, then writes the header.
__device__ __forceinline__ void topk_write_row(const unsigned long long* s, unsigned count,
                                               const float* __restrict__ sc,
                                               TopkNeighbor* __restrict__ row) {
    uint2* out = reinterpret_cast<uint2*>(row + 1);
    for (unsigned r = threadIdx.x; r < count; r += TOPK_SEL_THREADS) {
        const unsigned long long key = s[r];
        out[r] = make_uint2(topk_key_index(key), __float_as_uint(topk_key_score(key, sc)));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence_system();
        row[0].score = 0.0f;
        row[0].index = TOPK_STATUS_OK;
    }
}

// Buckets of topk_bucket_place: low bits kept per octave of a key's
// distance above the floor, the buckets that gives, and the largest bucket
// ranked by counting.
#define TOPK_BUCKET_SUB 6
#define TOPK_BUCKETS ((32 - TOPK_BUCKET_SUB + 1) << TOPK_BUCKET_SUB)
#define TOPK_BUCKET_MAX 256

// Shared words of the rankers (the counts of topk_rank_place; the bucket
// starts, then the crowded flag, of topk_bucket_place), which never run at
// the same time: one allocation keeps the selection kernels' static shared
// memory under 48 KiB. They must be zero when a ranker starts
// (topk_rank_prepare), so that neither spends a block barrier clearing them.
#define TOPK_RANK_SCRATCH (TOPK_BUCKETS + 2)
#define TOPK_RANK_CROWDED (TOPK_BUCKETS + 1)
__device__ __forceinline__ unsigned* topk_rank_scratch() {
    __shared__ unsigned scratch[TOPK_RANK_SCRATCH];
    return scratch;
}

// Clears the rankers' scratch; the caller synchronises the block before
// topk_rank_write (any barrier in between will do).
__device__ __forceinline__ void topk_rank_prepare() {
    unsigned* scratch = topk_rank_scratch();
    for (unsigned i = threadIdx.x; i < TOPK_RANK_SCRATCH; i += TOPK_SEL_THREADS) {
        scratch[i] = 0u;
    }
}

// Ranks the `count` (<= TOPK_RANK_MAX) distinct keys of `s` by counting, for
// each, the keys larger than it, and moves those ranked below k to s[rank].
// The scratch starts at zero (topk_rank_prepare).
__device__ __forceinline__ void topk_rank_place(unsigned long long* s, unsigned count,
                                                unsigned k) {
    constexpr unsigned SLICES = TOPK_SEL_THREADS / TOPK_RANK_MAX;
    static_assert(TOPK_RANK_MAX <= TOPK_RANK_SCRATCH, "rank scratch");
    unsigned* rank = topk_rank_scratch();
    const unsigned i = threadIdx.x % TOPK_RANK_MAX;
    const unsigned slice = threadIdx.x / TOPK_RANK_MAX;
    if (i < count) {
        const unsigned long long key = s[i];
        const unsigned per = (count + SLICES - 1) / SLICES;
        const unsigned end = min(count, (slice + 1) * per);
        unsigned above = 0;
        for (unsigned j = slice * per; j < end; ++j) {
            above += s[j] > key;
        }
        if (above != 0u) {
            atomicAdd(&rank[i], above);
        }
    }
    __syncthreads();
    const bool placed = threadIdx.x < count && rank[threadIdx.x] < k;
    const unsigned long long key = placed ? s[threadIdx.x] : 0ull;
    __syncthreads();
    if (placed) {
        s[rank[threadIdx.x]] = key;
    }
}

// The bucket (0 = best) of ordered bits `ob` at or above `floor`: a monotone
// map of the distance x = ob - floor that keeps its leading bit and the
// TOPK_BUCKET_SUB bits below it (each x below 2^SUB has a bucket of its own),
// so a bucket spans a fixed fraction of its distance. Candidates crowd just
// above the threshold and thin out toward the best score, which equal-ratio
// buckets follow; equal-width buckets between the smallest and the largest
// key pile most keys into a few buckets as soon as one score stands far
// above the rest (a query with a near-duplicate row: bench/gpu/NOTES.md).
__device__ __forceinline__ unsigned topk_bucket_of(unsigned ob, unsigned floor) {
    const unsigned x = ob - floor;
    unsigned b = x;
    if (x >= (1u << TOPK_BUCKET_SUB)) {
        const unsigned e = 31u - __clz(x);
        b = ((e - TOPK_BUCKET_SUB + 1u) << TOPK_BUCKET_SUB) |
            ((x >> (e - TOPK_BUCKET_SUB)) & ((1u << TOPK_BUCKET_SUB) - 1u));
    }
    return TOPK_BUCKETS - 1u - b;
}

// Ranks the `count` (<= TOPK_CAND_CAP) distinct keys of `s`, whose ordered
// bits are all >= `floor`, without sorting them all: each key takes a slot
// in its bucket (topk_bucket_of), the bucket sizes are scanned into starts,
// the keys are laid out bucket by bucket in `tmp` (shared, TOPK_CAND_CAP
// keys), a key's place is its bucket's start plus the keys of its bucket
// that are larger (consecutive in `tmp`, so independent loads), and those
// placed below k move to s[place]. Returns false, having moved nothing, when
// a bucket holds more than TOPK_BUCKET_MAX keys (exact or near ties); the
// caller then sorts. The scratch starts at zero (topk_rank_prepare); the
// caller synchronises the block before reading `s`.
__device__ __noinline__ bool topk_bucket_place(unsigned long long* s, unsigned long long* tmp,
                                               unsigned count, unsigned k, unsigned floor) {
    constexpr unsigned PER_THREAD = TOPK_CAND_CAP / TOPK_SEL_THREADS;
    constexpr unsigned PER_SCAN = (TOPK_BUCKETS + TOPK_SEL_THREADS - 1) / TOPK_SEL_THREADS;
    static_assert(PER_SCAN == 2, "two buckets per thread in the scan");
    static_assert(TOPK_BUCKETS + 1 <= TOPK_RANK_SCRATCH, "bucket scratch");
    unsigned* start = topk_rank_scratch();
    __shared__ unsigned warp_sums[TOPK_SEL_THREADS / TOPK_WARP];
    const unsigned t = threadIdx.x;
    // Each key's bucket and its slot there, kept in registers until the keys
    // are laid out in `tmp`: `s` is not read again, so the ranked keys can
    // move straight to their places.
    unsigned long long key[PER_THREAD];
    unsigned bucket[PER_THREAD];
    unsigned slot[PER_THREAD];
#pragma unroll
    for (unsigned r = 0; r < PER_THREAD; ++r) {
        const unsigned i = t + r * TOPK_SEL_THREADS;
        key[r] = 0ull;
        bucket[r] = 0u;
        slot[r] = 0u;
        if (i < count) {
            key[r] = s[i];
            bucket[r] = topk_bucket_of((unsigned)(key[r] >> 32), floor);
            slot[r] = atomicAdd(&start[bucket[r]], 1u);
        }
    }
    __syncthreads();
    topk_mark(10);
    // Exclusive scan of the sizes: thread t owns buckets 2t and 2t + 1.
    const unsigned b0 = PER_SCAN * t;
    const unsigned c0 = b0 < TOPK_BUCKETS ? start[b0] : 0u;
    const unsigned c1 = b0 + 1 < TOPK_BUCKETS ? start[b0 + 1] : 0u;
    if (c0 > TOPK_BUCKET_MAX || c1 > TOPK_BUCKET_MAX) {
        start[TOPK_RANK_CROWDED] = 1u;
    }
    // The scan's barrier also publishes the crowded flag; the sizes are
    // overwritten by the starts only after it.
    const unsigned b0_start = topk_block_exclusive_scan<TOPK_SEL_THREADS>(c0 + c1, warp_sums);
    topk_mark(11);
    if (start[TOPK_RANK_CROWDED] != 0u) {
        return false;
    }
    if (b0 < TOPK_BUCKETS) {
        start[b0] = b0_start;
        if (b0 + 1 < TOPK_BUCKETS) {
            start[b0 + 1] = b0_start + c0;
        }
    }
    if (t == 0) {
        start[TOPK_BUCKETS] = count;
    }
    __syncthreads();
#pragma unroll
    for (unsigned r = 0; r < PER_THREAD; ++r) {
        if (t + r * TOPK_SEL_THREADS < count) {
            tmp[start[bucket[r]] + slot[r]] = key[r];
        }
    }
    __syncthreads();
    topk_mark(12);
    // Each thread ranks the keys at its own positions of `tmp`, so that the
    // lanes of a warp mostly share a bucket and walk the same words together
    // (broadcast reads, the same trip count). Ranking each thread's own keys
    // of `s` instead spread a warp over up to 32 buckets, walked as long as
    // the largest of them, measured slower: bench/gpu/NOTES.md).
    for (unsigned i = t; i < count; i += TOPK_SEL_THREADS) {
        const unsigned long long k_i = tmp[i];
        const unsigned b = topk_bucket_of((unsigned)(k_i >> 32), floor);
        const unsigned first = start[b];
        if (first < k) {
            const unsigned end = start[b + 1];
            unsigned place = first;
            for (unsigned j = first; j < end; ++j) {
                place += tmp[j] > k_i;
            }
            if (place < k) {
                s[place] = k_i;
            }
        }
    }
    return true;
}

// One compare-exchange of a bitonic network on element e (value v, partner
// value w): the pair's lower element keeps the larger key in a descending
// run (e & size == 0), the smaller in an ascending one.
__device__ __forceinline__ unsigned long long topk_bitonic_pick(unsigned long long v,
                                                                unsigned long long w, unsigned e,
                                                                unsigned stride, unsigned size) {
    const bool keep_max = ((e & stride) == 0) == ((e & size) == 0);
    return keep_max ? (v > w ? v : w) : (v < w ? v : w);
}

// Sorts the E * TOPK_SEL_THREADS keys of `s` (shared) largest first and leaves
// the best k in s[0..k). Thread t holds elements t*E .. t*E + E - 1 in registers:
// compare distances below E stay in the thread, those below 32*E go through
// warp shuffles, and only the rest through shared memory (stored
// element-major across threads, so that a warp's accesses are consecutive).
template <int E>
__device__ __forceinline__ void topk_sort_place(unsigned long long* s, unsigned k) {
    constexpr unsigned LEN = E * TOPK_SEL_THREADS;
    const unsigned t = threadIdx.x;
    unsigned long long v[E];
#pragma unroll
    for (int r = 0; r < E; ++r) {
        v[r] = s[t * E + r];
    }
#pragma unroll
    for (unsigned size = 2; size <= LEN; size <<= 1) {
#pragma unroll
        for (unsigned stride = size >> 1; stride > 0; stride >>= 1) {
            if (stride < (unsigned)E) {
#pragma unroll
                for (int r = 0; r < E; ++r) {
                    const unsigned p = r ^ stride;
                    if ((unsigned)r < p) {
                        const unsigned e = t * E + r;
                        const unsigned long long a = v[r];
                        const unsigned long long b = v[p];
                        v[r] = topk_bitonic_pick(a, b, e, stride, size);
                        v[p] = topk_bitonic_pick(b, a, e + stride, stride, size);
                    }
                }
            } else if (stride < (unsigned)E * TOPK_WARP) {
#pragma unroll
                for (int r = 0; r < E; ++r) {
                    const unsigned long long w =
                        __shfl_xor_sync(TOPK_FULL_MASK, v[r], stride / E);
                    v[r] = topk_bitonic_pick(v[r], w, t * E + r, stride, size);
                }
            } else {
                __syncthreads();
#pragma unroll
                for (int r = 0; r < E; ++r) {
                    s[r * TOPK_SEL_THREADS + t] = v[r];
                }
                __syncthreads();
                const unsigned tp = t ^ (stride / E);
#pragma unroll
                for (int r = 0; r < E; ++r) {
                    v[r] = topk_bitonic_pick(v[r], s[r * TOPK_SEL_THREADS + tp], t * E + r,
                                             stride, size);
                }
            }
        }
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < E; ++r) {
        const unsigned e = t * E + r;
        if (e < k) {
            s[e] = v[r];
        }
    }
}

// Ranks the `count` distinct keys of `keys` (shared, room for TOPK_CAND_CAP
// keys, complete for every thread of the block; k <= count <= TOPK_CAND_CAP;
// ordered bits all >= `floor`), with `tmp` (shared, as many keys) and the
// rankers' scratch (cleared by topk_rank_prepare before the keys' barrier),
// and writes the best k of them into `row` (topk_write_row): by counting
// for small sets, by buckets of their scores for larger ones, by a bitonic
// network held in registers when a bucket is crowded.
__device__ __noinline__ void topk_rank_write(unsigned long long* keys,
                                             unsigned long long* tmp, unsigned count,
                                             unsigned k, unsigned floor,
                                             const float* __restrict__ sc,
                                             TopkNeighbor* __restrict__ row) {
    if (count <= TOPK_RANK_MAX) {
        topk_rank_place(keys, count, k);
    } else if (!topk_bucket_place(keys, tmp, count, k, floor)) {
        unsigned len = TOPK_SEL_THREADS;
        while (len < count) {
            len <<= 1;
        }
        // Every real key is >= 1 (the index complement of a u32 row < N is
        // nonzero), so zero padding sorts last.
        for (unsigned i = count + threadIdx.x; i < len; i += TOPK_SEL_THREADS) {
            keys[i] = 0ull;
        }
        __syncthreads();
        switch (len / TOPK_SEL_THREADS) {
        case 1:
            topk_sort_place<1>(keys, k);
            break;
        case 2:
            topk_sort_place<2>(keys, k);
            break;
        default:
            topk_sort_place<TOPK_CAND_CAP / TOPK_SEL_THREADS>(keys, k);
            break;
        }
    }
    __syncthreads();
    topk_mark(6);
    topk_write_row(keys, min(k, count), sc, row);
    topk_mark(7);
}

// Run by the one block that finishes a query, once every gather_rows of the
// query is visible to it: keeps the candidates and the threshold-bin rows
// needed for the best k (k <= TOPK_CAND_CAP / 2), collects them in `keys`
// (shared, room for TOPK_CAND_CAP keys; `tmp` as many more for the ranking)
// and ranks and writes them (topk_rank_write): row[0] = status,
// row[1..=k] = results, the status last. Leaves the query area's list
// counters at zero.
__device__ __noinline__ void topk_select_block(const float* __restrict__ sc, TopkThreshold t,
                                               unsigned k, unsigned* __restrict__ area,
                                               const unsigned long long* __restrict__ cand,
                                               const unsigned long long* __restrict__ maybe,
                                               unsigned long long* keys,
                                               unsigned long long* tmp,
                                               TopkNeighbor* __restrict__ row) {
    __shared__ unsigned fill;
    topk_mark(4);
    topk_rank_prepare();
    const unsigned above = t.above;
    const unsigned in_bin = t.in_bucket;
    bool ok = in_bin <= TOPK_MAYBE_CAP;
    // Rows of the bin are kept when their level-2 bin is >= min_b2.
    unsigned min_b2 = 0;
    unsigned kept = in_bin;
    if (ok && above + in_bin > TOPK_CAND_CAP) {
        // Level 2, built here (rarely needed) in the sort buffer.
        unsigned* h2 = reinterpret_cast<unsigned*>(keys);
        topk_zero_shared(h2, TOPK_L2_BINS);
        for (unsigned i = threadIdx.x; i < in_bin; i += TOPK_SEL_THREADS) {
            const unsigned ob = (unsigned)(__ldcg(maybe + i) >> 32);
            atomicAdd(&h2[(ob >> (32 - TOPK_L1_BITS - TOPK_L2_BITS)) & (TOPK_L2_BINS - 1)], 1u);
        }
        __syncthreads();
        const TopkThreshold t2 = topk_threshold_block<false>(h2, k - above);
        min_b2 = t2.bucket;
        kept = t2.above + t2.in_bucket;
        ok = above + kept <= TOPK_CAND_CAP;
    }
    if (threadIdx.x == 0) {
        area[TOPK_AREA_CTR + TOPK_CTR_CAND] = 0u;
        area[TOPK_AREA_CTR + TOPK_CTR_MAYBE] = 0u;
        fill = above;
    }
    if (!ok) {
        if (threadIdx.x == 0) {
            row[0].index = TOPK_STATUS_OVERFLOW;
            row[0].score = 0.0f;
        }
        return;
    }
    if (kept == in_bin) {
        // Every row of the bin is kept (the usual case): the candidates, then
        // the bin's rows, at most TOPK_CAND_CAP keys, every load issued
        // before the first store, so that they share one round trip.
        constexpr unsigned PER = TOPK_CAND_CAP / TOPK_SEL_THREADS;
        unsigned long long v[PER];
#pragma unroll
        for (unsigned r = 0; r < PER; ++r) {
            const unsigned i = threadIdx.x + r * TOPK_SEL_THREADS;
            v[r] = i < above ? __ldcg(cand + i)
                             : (i < above + in_bin ? __ldcg(maybe + (i - above)) : 0ull);
        }
#pragma unroll
        for (unsigned r = 0; r < PER; ++r) {
            const unsigned i = threadIdx.x + r * TOPK_SEL_THREADS;
            if (i < above + in_bin) {
                keys[i] = v[r];
            }
        }
    } else {
        for (unsigned i = threadIdx.x; i < above; i += TOPK_SEL_THREADS) {
            keys[i] = __ldcg(cand + i);
        }
    }
    __syncthreads();
    if (kept != in_bin) {
        // Otherwise whole warps iterate together: one atomic per warp for
        // its kept keys (`fill` published by the barrier above).
        const unsigned lane = threadIdx.x & (TOPK_WARP - 1);
        for (unsigned base = 0; base < in_bin; base += TOPK_SEL_THREADS) {
            const unsigned i = base + threadIdx.x;
            unsigned long long key = 0;
            bool keep = false;
            if (i < in_bin) {
                key = __ldcg(maybe + i);
                const unsigned b2 =
                    ((unsigned)(key >> 32) >> (32 - TOPK_L1_BITS - TOPK_L2_BITS)) &
                    (TOPK_L2_BINS - 1);
                keep = b2 >= min_b2;
            }
            const unsigned m = __ballot_sync(TOPK_FULL_MASK, keep);
            unsigned pos = 0;
            if (lane == 0 && m != 0u) {
                pos = atomicAdd(&fill, (unsigned)__popc(m));
            }
            pos = __shfl_sync(TOPK_FULL_MASK, pos, 0) + __popc(m & ((1u << lane) - 1u));
            if (keep) {
                keys[pos] = key;
            }
        }
        __syncthreads();
    }
    topk_mark(5);
    // Every kept key is in or above the threshold bin, and at or above the
    // level-2 threshold within it.
    const unsigned floor = (t.bucket << (32 - TOPK_L1_BITS)) |
                           (min_b2 << (32 - TOPK_L1_BITS - TOPK_L2_BITS));
    topk_rank_write(keys, tmp, above + kept, k, floor, sc, row);
}
