// Graph walks on the device: the whole HNSW search of every query of a batch
// in one launch, one block per query (topk-hnsw's GPU graph search).
//
// A block descends the upper layers greedily from the entry node, then runs
// the ef-wide beam search of layer 0, every score the canonical score of a
// whole warp (common.cuh). The walk is the CPU walk of
// crates/topk-hnsw/src/search.rs, restated so that it needs no unbounded
// heap (docs/CONTRACTS.md §13):
//
//   The beam B is a list sorted best first of the nodes still in play, each
//   flagged expanded or not and allowed or not. It holds at most `ef`
//   allowed nodes, and a node (allowed or not) stays only while fewer than
//   `ef` allowed nodes rank above it. Each step expands the best
//   unexpanded node of B: its neighbours not seen before are scored, those
//   that could enter are merged into B, and B is cut again. The walk ends
//   when every node of B is expanded.
//
// The CPU walk pops its candidate heap and stops at the first candidate
// below the ef-th allowed result: a candidate that fell out of B. Both
// therefore expand the same nodes in the same order, and the result (the
// allowed nodes of B) is the CPU's, bit for bit. Two things differ only in
// cost: the set of seen nodes is a small hash table in shared memory that
// may forget (a forgotten node is scored again and either is found in B by
// its key, which encodes the id, or ranks below the cut, as it did the first
// time), and the neighbours of one expansion are merged at once rather than
// one by one (the cut of the union is the same). A query never reads what
// another query of the batch does, so its answer does not depend on the
// batch.
//
// A query is a row of `queries` or, where `qrows` is given, the corpus row
// qrows[q] (the batched build searches for the rows it inserts).
//
// Status per query: OK, OVERFLOW (B needed more than `cap` entries, only
// possible with an allow-list; the walk stops) or SHORT (the walk ended with
// fewer than `want` allowed nodes). The host finishes the last two on the
// CPU path, which gives the same answer an OK walk would.
//
// Width w > 1 (the CPU walk's `width`): each step expands the w best
// unexpanded nodes of B at once (fewer if B has fewer), their unseen
// neighbours scored and merged together; the CPU walk pops its w best
// candidates still above the cut. A step then costs about what one
// expansion costs (the lists and the rows of all w are read in the same
// round trips), so a lone walk ends in about 1/w of the steps. The answer
// depends on w as it does on ef, and on nothing else.
#include "common.cuh"
#include "prune.cuh"

// Threads of one query's block: a team of WALK_TEAMS sizes, one kernel per
// size and metric (topk_walk_<metric>_<threads>). Large batches run small
// blocks, so that more queries share a multiprocessor; a single query runs
// the largest. The team size changes how the work of a step is spread over
// threads, never which nodes are expanded or how a score is computed.
#define WALK_MAX_THREADS 256
// Largest layer-0 degree (m0) and upper-layer degree (m) the kernel takes;
// a block of T threads takes at most min(T, WALK_MAX_DEGREE) (one thread
// per neighbour when a list is read).
#define WALK_MAX_DEGREE 128
// Largest width (nodes expanded per step). A step reads width * m0 slots,
// every THREADS-th by one thread.
#define WALK_MAX_WIDTH 8
#define WALK_EXPANDED 1u
#define WALK_ALLOWED 2u
#define WALK_STATUS_OK 0u
#define WALK_STATUS_OVERFLOW 1u
#define WALK_STATUS_SHORT 2u
// An empty slot of the seen-set table (never a node: ids are below n < 2^32 - 1).
#define WALK_EMPTY 0xffffffffu
// Slots probed before a node is taken as unseen (wide table), and the slots
// of one bucket of the narrow table (log2: WALK_BUCKET_BITS).
#define WALK_PROBES 8
#define WALK_BUCKET 8
#define WALK_BUCKET_BITS 3
// An empty slot of the narrow table (no tag reaches it: tags have at most 15 bits).
#define WALK_EMPTY16 0xffffu
// Rows a warp scores at once, their canonical chains interleaved so that
// their loads are in flight together.
#define WALK_ROWS_PER_WARP 4
// Steps of 32 values per lane whose loads are issued before their additions:
// more for the largest team, which runs alone or nearly so on a
// multiprocessor (small batches), where registers are free and each step's
// latency is the walk's; fewer for the others, whose registers bound how
// many walks share a multiprocessor.
#define WALK_LOAD_STEPS 8
#define WALK_LOAD_STEPS_ALONE 12

// One node of the beam: its ranking key (§3; 0 marks no node, as no id
// reaches 2^32 - 1), its score as computed, and the WALK_* flags.
struct WalkEntry {
    unsigned long long key;
    float score;
    unsigned flags;
};

// The set of nodes a walk has seen: an open-addressing table in shared
// memory that may forget (a node it cannot place is taken as unseen, which
// costs a second scoring and nothing else), in one of two forms:
// - wide (`id_bits` 0): `mask + 1` slots of node ids, linear probing;
// - narrow (`id_bits` k > 0, every id below 2^k): `mask + 1` 16-bit slots in
//   buckets of WALK_BUCKET. The odd multiplier permutes [0, 2^k), so a node
//   is known by its bucket (the high bits of the product) and its tag (the
//   low k - log2(buckets) bits, at most 15, never WALK_EMPTY16): half the
//   bytes of the wide table for the same slots.
// A slot is taken with a compare-and-swap, so two threads of one step never
// both take it. The host picks the narrow table where it lets more walks of
// a large batch share a multiprocessor (topk_cuda::SeenSet::Auto): its
// 16-bit swaps cost a single walk more than 32-bit ones.
struct WalkSeen {
    unsigned* table;
    unsigned mask;
    unsigned id_bits;

    // Marks `id` seen; true if it was not seen before (or the table cannot
    // tell).
    __device__ __forceinline__ bool visit(unsigned id) const {
        const unsigned x = id * 2654435761u;
        if (id_bits == 0u) {
            unsigned h = x & mask;
#pragma unroll 1
            for (int p = 0; p < WALK_PROBES; ++p) {
                const unsigned prev = atomicCAS(&table[h], WALK_EMPTY, id);
                if (prev == WALK_EMPTY) {
                    return true;
                }
                if (prev == id) {
                    return false;
                }
                h = (h + 1u) & mask;
            }
            return true;
        }
        const unsigned tag_bits = id_bits - (__popc(mask) - WALK_BUCKET_BITS);
        const unsigned h = x & ((1u << id_bits) - 1u);
        const unsigned short tag = (unsigned short)(h & ((1u << tag_bits) - 1u));
        unsigned short* bucket =
            reinterpret_cast<unsigned short*>(table) + (h >> tag_bits) * WALK_BUCKET;
#pragma unroll 1
        for (int p = 0; p < WALK_BUCKET; ++p) {
            const unsigned short prev =
                atomicCAS(&bucket[p], (unsigned short)WALK_EMPTY16, tag);
            if (prev == WALK_EMPTY16) {
                return true;
            }
            if (prev == tag) {
                return false;
            }
        }
        return true;
    }
};

// Entries of `a[0..n)` (sorted by key, best first) whose key is above `key`.
__device__ __forceinline__ unsigned walk_count_above(const WalkEntry* a, unsigned n,
                                                     unsigned long long key) {
    unsigned lo = 0, hi = n;
    while (lo < hi) {
        const unsigned mid = (lo + hi) >> 1;
        if (a[mid].key > key) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

__device__ __forceinline__ bool walk_allowed(const unsigned* __restrict__ allow, unsigned id) {
    return allow == nullptr || ((allow[id >> 5] >> (id & 31u)) & 1u) != 0u;
}

template <int METRIC>
__device__ __forceinline__ float walk_score(const float* qs, const float* __restrict__ corpus,
                                            const float* __restrict__ rnorm, unsigned d,
                                            float qn, unsigned row, unsigned lane) {
    const float rn = (METRIC == TOPK_COSINE) ? rnorm[row] : 0.0f;
    return topk_warp_score<METRIC>(qs, corpus + (size_t)row * d, d, qn, rn, lane);
}

// The canonical scores of rows ids[0..count) (count <= WALK_ROWS_PER_WARP)
// by one whole warp: each row's chain is topk_warp_score's (lane j adds
// d = j, j+32, ... in order, then the butterfly and the finish), the chains
// of the rows interleaved step by step. Slots past count repeat the last row.
template <int METRIC, int STEPS>
__device__ __forceinline__ void walk_score_rows(const float* qs, const float* __restrict__ corpus,
                                                const float* __restrict__ rnorm, unsigned d,
                                                float qn, const unsigned* ids, unsigned count,
                                                unsigned lane,
                                                float (&out)[WALK_ROWS_PER_WARP]) {
    const float* rows[WALK_ROWS_PER_WARP];
    float p[WALK_ROWS_PER_WARP];
#pragma unroll
    for (int r = 0; r < WALK_ROWS_PER_WARP; ++r) {
        rows[r] = corpus + (size_t)ids[min((unsigned)r, count - 1u)] * d;
        p[r] = 0.0f;
    }
    // Loads run STEPS steps ahead of the arithmetic, so that a row costs a
    // round trip to memory per STEPS * 32 values rather than per 32; each
    // row's additions keep the canonical order.
    for (unsigned base = lane; base < d; base += STEPS * TOPK_WARP) {
        float v[STEPS][WALK_ROWS_PER_WARP];
#pragma unroll
        for (int u = 0; u < STEPS; ++u) {
            const unsigned dd = base + u * TOPK_WARP;
#pragma unroll
            for (int r = 0; r < WALK_ROWS_PER_WARP; ++r) {
                v[u][r] = dd < d ? __ldg(rows[r] + dd) : 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < STEPS; ++u) {
            const unsigned dd = base + u * TOPK_WARP;
            if (dd < d) {
                const float q = qs[dd];
#pragma unroll
                for (int r = 0; r < WALK_ROWS_PER_WARP; ++r) {
                    p[r] = topk_step<METRIC>(q, v[u][r], p[r]);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < WALK_ROWS_PER_WARP; ++r) {
        const unsigned row = ids[min((unsigned)r, count - 1u)];
        const float rn = (METRIC == TOPK_COSINE) ? rnorm[row] : 0.0f;
        out[r] = topk_finish<METRIC>(topk_butterfly(p[r]), qn, rn);
    }
}

// The walk of query blockIdx.x by a block of THREADS threads (at least
// max(m0, m): the descent reads a list with a thread per slot), expanding
// `width` nodes per step. With deg = max(m0 * width, m) (the most
// neighbours one step scores), the dynamic shared memory holds, in
// order: the query (d floats, rounded up to 16 bytes), two beam buffers of
// cap + deg entries, the scored and the sorted neighbours (deg entries
// each), their ids, and the seen-set table (mask + 1 slots of 4 bytes, or
// of 2 when `id_bits` is not 0: WalkSeen).
template <int METRIC, unsigned THREADS>
__device__ __forceinline__ void walk_query(
    const float* __restrict__ corpus, const float* __restrict__ rnorm, unsigned d,
    const float* __restrict__ queries, const unsigned* __restrict__ qrows,
    const unsigned* __restrict__ layer0, unsigned m0,
    const unsigned* __restrict__ upper, const unsigned* __restrict__ upper_off, unsigned m,
    unsigned entry, unsigned top, const unsigned* __restrict__ allow, unsigned ef,
    unsigned width, unsigned want, unsigned cap, unsigned mask, unsigned id_bits,
    TopkNeighbor* __restrict__ out, unsigned* __restrict__ status) {
    constexpr unsigned WARPS = THREADS / TOPK_WARP;
    constexpr int STEPS = THREADS == WALK_MAX_THREADS ? WALK_LOAD_STEPS_ALONE : WALK_LOAD_STEPS;
    static_assert(WARPS * TOPK_WARP == THREADS && THREADS <= WALK_MAX_THREADS, "walk block shape");
    extern __shared__ __align__(16) unsigned char walk_smem[];
    const unsigned tid = threadIdx.x;
    const unsigned lane = tid & (TOPK_WARP - 1);
    const unsigned warp = tid / TOPK_WARP;
    const size_t q = blockIdx.x;
    const unsigned deg = max(m0 * width, m);

    float* qs = reinterpret_cast<float*>(walk_smem);
    size_t off = ((size_t)d * sizeof(float) + 15u) & ~(size_t)15u;
    WalkEntry* beam = reinterpret_cast<WalkEntry*>(walk_smem + off);
    off += (size_t)(cap + deg) * sizeof(WalkEntry);
    WalkEntry* spare = reinterpret_cast<WalkEntry*>(walk_smem + off);
    off += (size_t)(cap + deg) * sizeof(WalkEntry);
    WalkEntry* fresh = reinterpret_cast<WalkEntry*>(walk_smem + off);
    off += deg * sizeof(WalkEntry);
    WalkEntry* sorted = reinterpret_cast<WalkEntry*>(walk_smem + off);
    off += deg * sizeof(WalkEntry);
    unsigned* fresh_ids = reinterpret_cast<unsigned*>(walk_smem + off);
    off += deg * sizeof(unsigned);
    const WalkSeen seen{reinterpret_cast<unsigned*>(walk_smem + off), mask, id_bits};

    __shared__ unsigned s_warp[WARPS];
    __shared__ unsigned s_nb, s_first, s_fresh, s_moved, s_overflow, s_cut, s_nexp;
    __shared__ unsigned s_next[WALK_MAX_WIDTH];
    __shared__ unsigned long long s_worst, s_cut_worst;
    __shared__ float s_qn;
    __shared__ WalkEntry s_cur;

    for (unsigned i = tid; i < d; i += THREADS) {
        qs[i] = qrows != nullptr ? corpus[(size_t)qrows[q] * d + i] : queries[q * d + i];
    }
    const unsigned table_words = id_bits == 0u ? mask + 1u : (mask + 1u) / 2u;
    for (unsigned i = tid; i < table_words; i += THREADS) {
        seen.table[i] = WALK_EMPTY;
    }
    __syncthreads();
    if (METRIC == TOPK_COSINE && warp == 0) {
        const float qn = topk_warp_norm(qs, d, lane);
        if (lane == 0) {
            s_qn = qn;
        }
    }
    __syncthreads();
    const float qn = (METRIC == TOPK_COSINE) ? s_qn : 0.0f;

    // Greedy descent through layers top..1 (every node navigates).
    if (warp == 0) {
        const float s = walk_score<METRIC>(qs, corpus, rnorm, d, qn, entry, lane);
        if (lane == 0) {
            s_cur.key = topk_rank_key(s, entry);
            s_cur.score = s;
            s_cur.flags = 0u;
        }
    }
    __syncthreads();
    for (unsigned level = top; level >= 1u; --level) {
        for (;;) {
            const unsigned cur = topk_key_index(s_cur.key);
            const unsigned* list = upper + upper_off[cur] + (size_t)(level - 1u) * (1u + m);
            const unsigned slot = tid < m ? list[1 + tid] : 0u;
            const unsigned cnt = min(list[0], m);
            if (tid < cnt) {
                fresh_ids[tid] = slot;
            }
            __syncthreads();
            for (unsigned base = warp * WALK_ROWS_PER_WARP; base < cnt;
                 base += WARPS * WALK_ROWS_PER_WARP) {
                const unsigned c = min(cnt - base, (unsigned)WALK_ROWS_PER_WARP);
                float s[WALK_ROWS_PER_WARP];
                walk_score_rows<METRIC, STEPS>(qs, corpus, rnorm, d, qn, fresh_ids + base, c, lane, s);
                if (lane == 0) {
                    for (unsigned r = 0; r < c; ++r) {
                        fresh[base + r].key = topk_rank_key(s[r], fresh_ids[base + r]);
                        fresh[base + r].score = s[r];
                    }
                }
            }
            __syncthreads();
            if (tid == 0) {
                unsigned best = cnt;
                for (unsigned j = 0; j < cnt; ++j) {
                    if (best == cnt || fresh[j].key > fresh[best].key) {
                        best = j;
                    }
                }
                s_moved = (best < cnt && fresh[best].key > s_cur.key) ? 1u : 0u;
                if (s_moved) {
                    s_cur.key = fresh[best].key;
                    s_cur.score = fresh[best].score;
                }
            }
            __syncthreads();
            if (!s_moved) {
                break;
            }
        }
    }

    // Beam search of layer 0 from the node the descent ended on.
    if (tid == 0) {
        const unsigned start = topk_key_index(s_cur.key);
        seen.visit(start);
        const bool ok = walk_allowed(allow, start);
        beam[0].key = s_cur.key;
        beam[0].score = s_cur.score;
        beam[0].flags = ok ? WALK_ALLOWED : 0u;
        s_nb = 1u;
        s_first = 0u;
        s_fresh = 0u;
        s_overflow = 0u;
        s_worst = (ok && ef == 1u) ? s_cur.key : 0ull;
    }
    __syncthreads();
    for (;;) {
        const unsigned nb = s_nb;
        const unsigned first = s_first;
        if (first >= nb || s_overflow) {
            break;
        }
        // The nodes this step expands: beam[first], or with width > 1 the
        // first `width` unexpanded entries from there (one warp's ballots).
        unsigned nexp = 1;
        if (width > 1u) {
            if (warp == 0) {
                unsigned got = 0;
                for (unsigned base = first; base < nb && got < width; base += TOPK_WARP) {
                    const unsigned i = base + lane;
                    const bool open = i < nb && (beam[i].flags & WALK_EXPANDED) == 0u;
                    const unsigned ballot = __ballot_sync(0xffffffffu, open);
                    const unsigned at = got + __popc(ballot & ((1u << lane) - 1u));
                    if (open && at < width) {
                        s_next[at] = i;
                    }
                    got += __popc(ballot);
                }
                if (lane == 0) {
                    s_nexp = min(got, width);
                }
            }
            __syncthreads();
            nexp = s_nexp;
        }
        // No thread reads an entry's flags before the merge.
        if (tid < nexp) {
            beam[width > 1u ? s_next[tid] : first].flags |= WALK_EXPANDED;
        }
        // Each node's count and slots are read together (every slot of the
        // block is in the graph), saving a round trip per expansion.
        for (unsigned t = tid; t < nexp * m0; t += THREADS) {
            const unsigned e = t / m0;
            const unsigned j = t - e * m0;
            const unsigned node = topk_key_index(beam[width > 1u ? s_next[e] : first].key);
            const unsigned* list = layer0 + (size_t)node * (1u + m0);
            const unsigned slot = list[1 + j];
            if (j < min(list[0], m0) && seen.visit(slot)) {
                fresh_ids[atomicAdd(&s_fresh, 1u)] = slot;
            }
        }
        __syncthreads();
        const unsigned nf = s_fresh;
        const unsigned long long worst = s_worst;
        for (unsigned base = warp * WALK_ROWS_PER_WARP; base < nf;
             base += WARPS * WALK_ROWS_PER_WARP) {
            const unsigned c = min(nf - base, (unsigned)WALK_ROWS_PER_WARP);
            float s[WALK_ROWS_PER_WARP];
            walk_score_rows<METRIC, STEPS>(qs, corpus, rnorm, d, qn, fresh_ids + base, c, lane, s);
            if (lane < c) {
                const unsigned j = base + lane;
                const unsigned id = fresh_ids[j];
                float sj = s[0];
#pragma unroll
                for (int r = 1; r < WALK_ROWS_PER_WARP; ++r) {
                    sj = (lane == (unsigned)r) ? s[r] : sj;
                }
                const unsigned long long key = topk_rank_key(sj, id);
                // Below the ef-th allowed node: it could never enter the beam.
                fresh[j].key = (worst == 0ull || key > worst) ? key : 0ull;
                fresh[j].score = sj;
                fresh[j].flags = walk_allowed(allow, id) ? WALK_ALLOWED : 0u;
            }
        }
        __syncthreads();
        // Drop nodes already in the beam (seen but forgotten) and repeats
        // within the list, then sort the rest best first by rank. The kept
        // keys go to the spare buffer (stale until the merge), so that the
        // repeat check's reads of `fresh` need no barrier before them.
        // A step of w nodes may score more neighbours than the block has
        // threads, so each thread takes every THREADS-th.
        unsigned long long* kept = reinterpret_cast<unsigned long long*>(spare);
        unsigned mine_count = 0;
        for (unsigned j = tid; j < nf; j += THREADS) {
            unsigned long long mine = fresh[j].key;
            if (mine != 0ull) {
                const unsigned at = walk_count_above(beam, nb, mine);
                bool repeat = at < nb && beam[at].key == mine;
                for (unsigned i = 0; i < j && !repeat; ++i) {
                    repeat = fresh[i].key == mine;
                }
                if (repeat) {
                    mine = 0ull;
                }
            }
            kept[j] = mine;
            mine_count += mine != 0ull ? 1u : 0u;
        }
        unsigned nv;
        if (nf <= THREADS) {
            nv = __syncthreads_count(mine_count != 0u);
        } else {
            // s_warp is next written by the filtered cut, after two barriers.
            const unsigned in_warp = __reduce_add_sync(0xffffffffu, mine_count);
            if (lane == 0) {
                s_warp[warp] = in_warp;
            }
            __syncthreads();
            nv = 0;
#pragma unroll
            for (unsigned w = 0; w < WARPS; ++w) {
                nv += s_warp[w];
            }
        }
        for (unsigned j = tid; j < nf; j += THREADS) {
            const unsigned long long mine = kept[j];
            if (mine != 0ull) {
                unsigned rank = 0;
                for (unsigned i = 0; i < nf; ++i) {
                    rank += kept[i] > mine ? 1u : 0u;
                }
                sorted[rank] = fresh[j];
            }
        }
        __syncthreads();
        // Merge beam and sorted neighbours into the spare buffer.
        for (unsigned i = tid; i < nb; i += THREADS) {
            spare[i + walk_count_above(sorted, nv, beam[i].key)] = beam[i];
        }
        for (unsigned j = tid; j < nv; j += THREADS) {
            spare[j + walk_count_above(beam, nb, sorted[j].key)] = sorted[j];
        }
        const unsigned total = nb + nv;
        if (tid == 0) {
            s_first = total;
        }
        __syncthreads();
        // Cut after the ef-th allowed node.
        unsigned cut = total;
        unsigned long long new_worst = 0ull;
        if (allow == nullptr) {
            if (total >= ef) {
                cut = ef;
                new_worst = spare[ef - 1u].key;
            }
        } else {
            const unsigned seg = (total + THREADS - 1u) / THREADS;
            const unsigned lo = min(tid * seg, total);
            const unsigned hi = min(lo + seg, total);
            unsigned c = 0;
            for (unsigned i = lo; i < hi; ++i) {
                c += (spare[i].flags & WALK_ALLOWED) ? 1u : 0u;
            }
            unsigned allowed = 0;
            const unsigned before =
                topk_block_exclusive_scan<THREADS, true>(c, s_warp, &allowed);
            if (before < ef && before + c >= ef) {
                unsigned a = before;
                for (unsigned i = lo; i < hi; ++i) {
                    if (spare[i].flags & WALK_ALLOWED) {
                        if (++a == ef) {
                            s_cut = i + 1u;
                            s_cut_worst = spare[i].key;
                        }
                    }
                }
            }
            if (tid == 0 && allowed < ef) {
                s_cut = total;
                s_cut_worst = 0ull;
            }
            __syncthreads();
            cut = s_cut;
            new_worst = s_cut_worst;
            if (cut > cap) {
                if (tid == 0) {
                    s_overflow = 1u;
                }
                cut = cap;
            }
        }
        for (unsigned i = tid; i < cut; i += THREADS) {
            if ((spare[i].flags & WALK_EXPANDED) == 0u) {
                atomicMin(&s_first, i);
            }
        }
        // Every thread has the same cut; s_nb and s_worst are next read
        // after the barrier below.
        if (tid == 0) {
            s_nb = cut;
            s_worst = new_worst;
            s_fresh = 0u;
        }
        WalkEntry* t = beam;
        beam = spare;
        spare = t;
        __syncthreads();
    }

    // The first `want` allowed nodes of the beam, best first.
    const unsigned nb = s_nb;
    TopkNeighbor* row = out + q * want;
    if (allow == nullptr) {
        for (unsigned i = tid; i < want && i < nb; i += THREADS) {
            row[i].index = topk_key_index(beam[i].key);
            row[i].score = beam[i].score;
        }
        if (tid == 0) {
            status[q] = s_overflow ? WALK_STATUS_OVERFLOW
                                   : (nb < want ? WALK_STATUS_SHORT : WALK_STATUS_OK);
        }
    } else if (tid == 0) {
        unsigned got = 0;
        for (unsigned i = 0; i < nb && got < want; ++i) {
            if (beam[i].flags & WALK_ALLOWED) {
                row[got].index = topk_key_index(beam[i].key);
                row[got].score = beam[i].score;
                ++got;
            }
        }
        status[q] = s_overflow ? WALK_STATUS_OVERFLOW
                               : (got < want ? WALK_STATUS_SHORT : WALK_STATUS_OK);
    }
}

// The largest team is told it runs one block per multiprocessor, so that its
// registers hold every load in flight (unbounded, the compiler caps it at 128
// and spills); the others are left to the compiler (0), which keeps them at
// the registers of about a dozen blocks.
#define WALK_MIN_BLOCKS(THREADS) ((THREADS) == WALK_MAX_THREADS ? 1 : 0)
#define TOPK_WALK_KERNEL(NAME, METRIC, THREADS)                                               \
    extern "C" __global__ void __launch_bounds__(THREADS, WALK_MIN_BLOCKS(THREADS))          \
        topk_walk_##NAME##_##THREADS(                                                         \
        const float* __restrict__ corpus, const float* __restrict__ rnorm, unsigned d,        \
        const float* __restrict__ queries, const unsigned* __restrict__ qrows,                \
        const unsigned* __restrict__ layer0, unsigned m0,                                     \
        const unsigned* __restrict__ upper, const unsigned* __restrict__ upper_off,           \
        unsigned m, unsigned entry, unsigned top, const unsigned* __restrict__ allow,         \
        unsigned ef, unsigned width, unsigned want, unsigned cap, unsigned mask,              \
        unsigned id_bits, TopkNeighbor* __restrict__ out, unsigned* __restrict__ status) {    \
        walk_query<METRIC, THREADS>(corpus, rnorm, d, queries, qrows, layer0, m0, upper,      \
                                    upper_off, m, entry, top, allow, ef, width, want, cap,    \
                                    mask, id_bits, out, status);                              \
    }
#define TOPK_WALK_TEAMS(NAME, METRIC)    \
    TOPK_WALK_KERNEL(NAME, METRIC, 32)   \
    TOPK_WALK_KERNEL(NAME, METRIC, 64)   \
    TOPK_WALK_KERNEL(NAME, METRIC, 128)  \
    TOPK_WALK_KERNEL(NAME, METRIC, 256)

TOPK_WALK_TEAMS(dot, TOPK_DOT)
TOPK_WALK_TEAMS(cosine, TOPK_COSINE)
TOPK_WALK_TEAMS(l2, TOPK_L2)

TOPK_PRUNE_KERNEL(dot, TOPK_DOT)
TOPK_PRUNE_KERNEL(cosine, TOPK_COSINE)
TOPK_PRUNE_KERNEL(l2, TOPK_L2)
