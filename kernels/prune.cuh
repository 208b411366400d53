// Neighbour selection of the batched graph build (topk-hnsw's
// `batch_build`), on the device: included by walk.cu, whose module it
// shares.
//
// A job is a base node and a list of candidate nodes. One block
// per job scores every candidate against the base (the canonical score of a
// whole warp, the base row as the query), ranks them by the §3 key (best
// first) and keeps at most `cap` of them with the Algorithm 4 heuristic
// exactly as topk-hnsw's `select_neighbours` does on the host: fewer
// candidates than `cap` are all kept; otherwise, best first, a candidate is
// kept when no neighbour kept before it scores strictly higher against it
// than the base does (ties and NaN keep it), until `cap` are kept. Every
// score is the canonical one, so the kept lists are the host's, bit for bit.

// Threads of a job's block.
#define PRUNE_THREADS 128
// Most candidates of one job (the host trims longer lists) and most
// neighbours a job keeps.
#define PRUNE_MAX_CANDS 2048
#define PRUNE_MAX_CAP 128

// Where a job's sorted keys start in its dynamic shared memory: past its
// scored keys and two spare ones, at an even key (16 bytes). The host sizes
// the memory as prune_sorted_at(max_cands) + max_cands + 2 keys.
__device__ __forceinline__ unsigned prune_sorted_at(unsigned max_cands) {
    return (max_cands + 3u) & ~1u;
}

// The job of block blockIdx.x: node base[j] and its candidates, the ids
// cands[(first + i) * stride] for i < count, where first = off[j] and count
// = off[j + 1] - first, or (no `off`) first = j * uniform and count =
// uniform: a walk's results (TopkNeighbor rows, stride 2, the walk's query
// rows as `base`). With `status`, a job whose status is not 0 (a walk that
// did not finish) keeps nothing. The kept ids go to out[j * cap ...], best
// first, their scores against the base to out_scores (when given), their
// count to counts[j]. Dynamic shared memory: see prune_sorted_at.
template <int METRIC>
__device__ __forceinline__ void prune_job(const float* __restrict__ corpus,
                                          const float* __restrict__ rnorm, unsigned d,
                                          const unsigned* __restrict__ base,
                                          const unsigned* __restrict__ off, unsigned uniform,
                                          const unsigned* __restrict__ cands, unsigned stride,
                                          const unsigned* __restrict__ status,
                                          unsigned max_cands, unsigned cap,
                                          unsigned* __restrict__ out,
                                          float* __restrict__ out_scores,
                                          unsigned* __restrict__ counts) {
    constexpr unsigned WARPS = PRUNE_THREADS / TOPK_WARP;
    extern __shared__ __align__(16) unsigned long long prune_smem[];
    __shared__ unsigned s_kept[PRUNE_MAX_CAP];
    __shared__ float s_kept_score[PRUNE_MAX_CAP];
    __shared__ unsigned s_n, s_reject;
    const unsigned tid = threadIdx.x;
    const unsigned lane = tid & (TOPK_WARP - 1);
    const unsigned warp = tid / TOPK_WARP;
    const size_t j = blockIdx.x;
    if (status != nullptr && status[j] != 0u) {
        if (tid == 0) {
            counts[j] = 0u;
        }
        return;
    }
    const unsigned b = base[j];
    const size_t first = off != nullptr ? (size_t)off[j] : j * uniform;
    const unsigned c =
        min(off != nullptr ? off[j + 1] - off[j] : uniform, max_cands);
    // Two spare keys after the scored ones (`sorted` starts 16-byte aligned
    // past them): the rank loop's vector loads may read one key beyond the
    // last, which must not be a key another thread is writing.
    unsigned long long* keys = prune_smem;
    unsigned long long* sorted = prune_smem + prune_sorted_at(max_cands);
    const float* brow = corpus + (size_t)b * d;
    const float bn = (METRIC == TOPK_COSINE) ? rnorm[b] : 0.0f;

    for (unsigned i = warp; i < c; i += WARPS) {
        const unsigned id = cands[(first + i) * stride];
        const float rn = (METRIC == TOPK_COSINE) ? rnorm[id] : 0.0f;
        const float s = topk_warp_score<METRIC>(brow, corpus + (size_t)id * d, d, bn, rn, lane);
        if (lane == 0) {
            keys[i] = topk_rank_key(s, id);
        }
    }
    __syncthreads();
    // Rank sort, stable: a key's rank is the number of keys above it and of
    // equal keys before it (equal keys only come from a candidate listed
    // twice, which is kept twice, as the host heuristic would see it).
    for (unsigned i = tid; i < c; i += PRUNE_THREADS) {
        const unsigned long long k = keys[i];
        unsigned rank = 0;
        for (unsigned x = 0; x < c; ++x) {
            rank += (keys[x] > k || (keys[x] == k && x < i)) ? 1u : 0u;
        }
        sorted[rank] = k;
    }
    __syncthreads();
    unsigned* row = out + j * cap;
    if (c < cap) {
        for (unsigned i = tid; i < c; i += PRUNE_THREADS) {
            row[i] = topk_key_index(sorted[i]);
            if (out_scores != nullptr) {
                out_scores[j * cap + i] = topk_score_of_bits((unsigned)(sorted[i] >> 32));
            }
        }
        if (tid == 0) {
            counts[j] = c;
        }
        return;
    }
    if (tid == 0) {
        s_n = 0u;
    }
    __syncthreads();
    for (unsigned i = 0; i < c; ++i) {
        const unsigned kept = s_n;
        if (kept >= cap) {
            break;
        }
        const unsigned long long k = sorted[i];
        const unsigned e = topk_key_index(k);
        // The candidate's own score, read back from its key: exact but for
        // the sign of a zero and the payload of a NaN, neither of which
        // changes a comparison with `>`.
        const float to_base = topk_score_of_bits((unsigned)(k >> 32));
        if (tid == 0) {
            s_reject = 0u;
        }
        __syncthreads();
        const float* erow = corpus + (size_t)e * d;
        const float en = (METRIC == TOPK_COSINE) ? rnorm[e] : 0.0f;
        for (unsigned r = warp; r < kept; r += WARPS) {
            const unsigned o = s_kept[r];
            const float rn = (METRIC == TOPK_COSINE) ? rnorm[o] : 0.0f;
            const float p = topk_warp_score<METRIC>(erow, corpus + (size_t)o * d, d, en, rn, lane);
            if (p > to_base) {
                if (lane == 0) {
                    atomicOr(&s_reject, 1u);
                }
                break;
            }
        }
        __syncthreads();
        if (tid == 0 && s_reject == 0u) {
            s_kept[kept] = e;
            s_kept_score[kept] = to_base;
            s_n = kept + 1u;
        }
        __syncthreads();
    }
    const unsigned kept = s_n;
    for (unsigned i = tid; i < kept; i += PRUNE_THREADS) {
        row[i] = s_kept[i];
        if (out_scores != nullptr) {
            out_scores[j * cap + i] = s_kept_score[i];
        }
    }
    if (tid == 0) {
        counts[j] = kept;
    }
}

#define TOPK_PRUNE_KERNEL(NAME, METRIC)                                                         \
    extern "C" __global__ void __launch_bounds__(PRUNE_THREADS) topk_prune_##NAME(              \
        const float* __restrict__ corpus, const float* __restrict__ rnorm, unsigned d,          \
        const unsigned* __restrict__ base, const unsigned* __restrict__ off, unsigned uniform,  \
        const unsigned* __restrict__ cands, unsigned stride,                                    \
        const unsigned* __restrict__ status, unsigned max_cands, unsigned cap,                  \
        unsigned* __restrict__ out, float* __restrict__ out_scores,                             \
        unsigned* __restrict__ counts) {                                                        \
        prune_job<METRIC>(corpus, rnorm, d, base, off, uniform, cands, stride, status,         \
                          max_cands, cap, out, out_scores, counts);                             \
    }

// Writes `count` whole layer-0 blocks (a count slot, then m0 id slots:
// `stride` = 1 + m0 slots each) to the nodes `nodes` (distinct, checked on
// the host with the blocks' counts and ids).
extern "C" __global__ void topk_set_lists(unsigned* __restrict__ layer0, unsigned stride,
                                          const unsigned* __restrict__ nodes,
                                          const unsigned* __restrict__ blocks, unsigned count) {
    const size_t total = (size_t)count * stride;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t node = nodes[i / stride];
        layer0[node * stride + i % stride] = blocks[i];
    }
}
