//! The graph walk (`kernels/walk.cu`): every query's whole HNSW search in
//! one launch, one block per query.

use std::ffi::c_void;

use topk_core::Metric;

use super::{
    allow_shared, blocks_per_sm, fits_shared, kernel_args, metric_slot, Kernels, Launch, Queue,
};
use crate::config::{SeenSet, WALK_TEAMS};
use crate::device::DevNeighbor;
use crate::driver::DevSlice;
use crate::error::CudaError;
use crate::walk_layout::MAX_WALK_DEGREE as WALK_MAX_DEGREE;

/// Most nodes a walk expands per step (`WALK_MAX_WIDTH`).
pub(crate) const WALK_MAX_WIDTH: usize = 8;

/// Slots of one bucket of the narrow seen table (`WALK_BUCKET`).
const WALK_BUCKET: usize = 8;

/// Bits of the node ids of the walk's narrow seen table
/// (`WalkSeen::id_bits` in `kernels/walk.cu`) for a graph of `n` nodes and a
/// table of `slots` (a power of two, at least one bucket): the id space
/// `2^k` covers the nodes and the buckets, and a tag (`k` less the bucket
/// bits) fits in 15 bits; 0 (the wide table of 32-bit ids) where it does
/// not.
fn narrow_id_bits(n: usize, slots: usize) -> u32 {
    let bucket_bits = (slots / WALK_BUCKET).max(1).trailing_zeros();
    let node_bits = usize::BITS - n.saturating_sub(1).leading_zeros();
    let k = node_bits.max(bucket_bits);
    if slots >= WALK_BUCKET && k - bucket_bits <= 15 {
        k
    } else {
        0
    }
}

/// Bytes of one beam entry (`WalkEntry`).
const ENTRY_BYTES: usize = 16;

/// The resident graph as the walk reads it: layer 0 (`n` blocks of
/// `1 + m0` slots: a count, then ids), the upper layers' blocks of `1 + m`
/// slots and, per node, the offset of its first upper block.
#[derive(Clone, Copy)]
pub(crate) struct WalkGraph<'a> {
    pub(crate) layer0: DevSlice<'a, u32>,
    pub(crate) m0: u32,
    pub(crate) upper: DevSlice<'a, u32>,
    pub(crate) upper_off: DevSlice<'a, u32>,
    pub(crate) m: u32,
    pub(crate) entry: u32,
    pub(crate) top: u32,
}

/// One walk launch: `nq` queries (`queries`, nq × d, or the corpus rows
/// `qrows` where given) against the corpus
/// (`corpus`, n × d, row norms `rnorm` for cosine), results into `out`
/// (nq × want) and `status` (nq), optionally restricted to the nodes whose
/// bit is set in `allow` (n bits, 32 per word).
pub(crate) struct WalkArgs<'a> {
    pub(crate) corpus: DevSlice<'a, f32>,
    pub(crate) rnorm: DevSlice<'a, f32>,
    pub(crate) n: u32,
    pub(crate) d: u32,
    pub(crate) queries: DevSlice<'a, f32>,
    /// Corpus rows to take as the queries instead of `queries` (each below
    /// `n`, checked by the caller).
    pub(crate) qrows: Option<DevSlice<'a, u32>>,
    pub(crate) nq: u32,
    pub(crate) graph: WalkGraph<'a>,
    pub(crate) allow: Option<DevSlice<'a, u32>>,
    pub(crate) ef: u32,
    /// Nodes expanded per step (1 ..= [`WALK_MAX_WIDTH`]).
    pub(crate) width: u32,
    pub(crate) want: u32,
    pub(crate) cap: u32,
    pub(crate) table_slots: u32,
    /// How the walks keep their seen sets (`Tuning::walk_seen`).
    pub(crate) seen: SeenSet,
    /// Threads of each query's block, one of [`WALK_TEAMS`], or 0 for
    /// [`walk_team`]'s choice.
    pub(crate) threads: u32,
    pub(crate) out: DevSlice<'a, DevNeighbor>,
    pub(crate) status: DevSlice<'a, u32>,
}

/// Dynamic shared memory of a walk whose steps score at most `deg`
/// neighbours (the wider of `width` layer-0 lists and one upper-layer list:
/// the layout of `walk_query`), its seen table of 2-byte slots when
/// `narrow`.
fn walk_smem(d: usize, cap: usize, table_slots: usize, narrow: bool, deg: usize) -> usize {
    let query = (d * 4).div_ceil(16) * 16;
    let slot = if narrow { 2 } else { 4 };
    query + 2 * (cap + deg) * ENTRY_BYTES + 2 * deg * ENTRY_BYTES + deg * 4 + table_slots * slot
}

/// The block size of a walk of `nq` queries on a device of `sm_count`
/// multiprocessors whose steps read `step` list slots (`width` lists of
/// `m0`, at least the widest list): 256 threads for fewer than 2 queries per
/// multiprocessor, 128 for fewer than 32, else 64 (more walks side by side
/// on each multiprocessor), never fewer than `step` up to 256 (a thread per
/// slot of a step: width 4 of 32-slot lists took 620k QPS at batch 10,000
/// with 128 threads against 535k with 64; measured on an H200,
/// `bench/gpu/NOTES.md`, "Walk teams" and "Wide walks").
fn walk_team(nq: u32, sm_count: u32, step: u32) -> u32 {
    let team = match nq / sm_count.max(1) {
        0..=1 => 256,
        2..=31 => 128,
        _ => 64,
    };
    WALK_TEAMS
        .into_iter()
        .find(|&t| t >= team.max(step))
        .unwrap_or(256)
}

impl Kernels {
    /// Launches the walk of every query on `q`. Checks every buffer
    /// against the sizes the kernel reads and writes; the graph's ids and
    /// offsets were checked on the host when it was uploaded.
    pub(crate) fn walk(
        &self,
        q: Queue<'_>,
        metric: Metric,
        a: &WalkArgs<'_>,
    ) -> Result<(), CudaError> {
        let (n, d, nq) = (a.n as usize, a.d as usize, a.nq as usize);
        let g = &a.graph;
        a.corpus.need("corpus", n * d)?;
        if metric == Metric::Cosine {
            a.rnorm.need("row norms", n)?;
        }
        match a.qrows {
            Some(rows) => rows.need("walk query rows", nq)?,
            None => a.queries.need("walk queries", nq * d)?,
        }
        g.layer0.need("layer-0 lists", n * (1 + g.m0 as usize))?;
        g.upper_off.need("upper-layer offsets", n)?;
        if let Some(allow) = a.allow {
            allow.need("allowed nodes", n.div_ceil(32))?;
        }
        a.out.need("walk results", nq * a.want as usize)?;
        a.status.need("walk status", nq)?;
        let bad = |name, value: usize, reason| {
            Err(CudaError::InvalidOption {
                name,
                value,
                reason,
            })
        };
        if g.m0.max(g.m) as usize > WALK_MAX_DEGREE {
            return bad(
                "graph degree",
                g.m0.max(g.m) as usize,
                "the GPU walk takes at most 128 neighbours per list",
            );
        }
        if a.width == 0 || a.width as usize > WALK_MAX_WIDTH {
            return bad("walk width", a.width as usize, "must be 1 ..= 8");
        }
        // The descent reads a list with a thread per slot; a step's
        // `width` lists are spread over the block.
        let degree = g.m0.max(g.m);
        let step = (g.m0 * a.width).max(g.m);
        let threads = match a.threads {
            0 => walk_team(a.nq, self.sm_count, step),
            t => t,
        };
        let Some(team) = WALK_TEAMS.iter().position(|&t| t == threads) else {
            return bad(
                "walk threads",
                threads as usize,
                "must be one of 32, 64, 128, 256",
            );
        };
        if degree > threads {
            return bad(
                "walk threads",
                threads as usize,
                "a block needs a thread per neighbour of the graph's widest list",
            );
        }
        if a.ef == 0 || a.want == 0 || a.want > a.ef || a.cap < a.ef {
            return bad("walk ef", a.ef as usize, "need 1 <= want <= ef <= cap");
        }
        if !a.table_slots.is_power_of_two() {
            return bad(
                "seen-set slots",
                a.table_slots as usize,
                "must be a power of two",
            );
        }
        if g.entry as usize >= n.max(1) {
            return bad(
                "entry node",
                g.entry as usize,
                "must be a node of the graph",
            );
        }
        if nq == 0 {
            return Ok(());
        }
        let f = self.walk[team][metric_slot(metric)];
        let smem_of = |narrow| {
            walk_smem(
                d,
                a.cap as usize,
                a.table_slots as usize,
                narrow,
                step as usize,
            )
        };
        let wide = smem_of(false);
        let tag_bits = narrow_id_bits(n, a.table_slots as usize);
        let id_bits = match a.seen {
            _ if tag_bits == 0 => 0,
            SeenSet::Ids => 0,
            SeenSet::Tags => tag_bits,
            SeenSet::Auto if !fits_shared(f, wide)? => tag_bits,
            SeenSet::Auto => {
                allow_shared(f, wide)?;
                let with_ids = blocks_per_sm(f, threads, wide)?;
                let crowded = a.nq > with_ids.saturating_mul(self.sm_count);
                if crowded && blocks_per_sm(f, threads, smem_of(true))? > with_ids {
                    tag_bits
                } else {
                    0
                }
            }
        };
        let smem = smem_of(id_bits != 0);
        if !fits_shared(f, smem)? {
            return bad(
                "walk shared memory (bytes)",
                smem,
                "ef, D or the walk width too large for one block of this device",
            );
        }
        allow_shared(f, smem)?;
        kernel_args!(
            args = [
                corpus = a.corpus.ptr(),
                rnorm = a.rnorm.ptr(),
                d = a.d,
                queries = a.queries.ptr(),
                qrows = a.qrows.map_or(0, |s| s.ptr()),
                layer0 = g.layer0.ptr(),
                m0 = g.m0,
                upper = g.upper.ptr(),
                upper_off = g.upper_off.ptr(),
                m = g.m,
                entry = g.entry,
                top = g.top,
                allow = a.allow.map_or(0, |s| s.ptr()),
                ef = a.ef,
                width = a.width,
                want = a.want,
                cap = a.cap,
                mask = a.table_slots - 1,
                id_bits = id_bits,
                out = a.out.ptr(),
                status = a.status.ptr()
            ]
        );
        let launch = Launch::new("topk_walk", f, (a.nq, 1), threads).shared(smem);
        // SAFETY: the parameter list of topk_walk_*; every buffer checked
        // above; list ids and upper offsets in range by the upload's host
        // check; the dynamic shared memory is allowed just above.
        unsafe { launch.run(q, &mut args) }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{define, WALK_CU};
    use super::*;

    #[test]
    fn teams_shrink_with_the_batch_but_never_below_a_step() {
        // (queries, multiprocessors, slots of a step, team)
        for (nq, sms, deg, team) in [
            (1, 132, 32, 256),
            (263, 132, 32, 256),
            (264, 132, 32, 128),
            (4_223, 132, 32, 128),
            (4_224, 132, 32, 64),
            (100_000, 132, 32, 64),
            (100_000, 132, 24, 64),
            (100_000, 132, 96, 128),
            (100_000, 132, 128, 128),
            (1_000, 132, 128, 128),
            (10, 0, 32, 128),
            // Wide steps: width 4 or 8 of 32-slot lists.
            (100_000, 132, 128, 128),
            (100_000, 132, 256, 256),
            (100_000, 132, 512, 256),
        ] {
            assert_eq!(walk_team(nq, sms, deg), team, "{nq} {sms} {deg}");
        }
    }

    #[test]
    fn narrow_tables_take_every_id_or_none() {
        // (nodes, slots, id bits)
        for (n, slots, bits) in [
            (1, 1024, 7),
            (100, 1024, 7),
            (129, 1024, 8),
            (1 << 22, 1024, 22),
            ((1 << 22) + 1, 1024, 0),
            (1_000_000, 4096, 20),
            (1 << 24, 4096, 24),
            ((1 << 24) + 1, 4096, 0),
            (10_000_000, 16384, 24),
            (100, 4, 0),
        ] {
            assert_eq!(narrow_id_bits(n, slots), bits, "{n} nodes, {slots} slots");
            if bits > 0 {
                let bucket_bits = (slots / WALK_BUCKET).trailing_zeros();
                assert!(n <= 1 << bits && bits >= bucket_bits && bits - bucket_bits <= 15);
            }
        }
    }

    #[test]
    fn shared_memory_follows_the_kernel_layout() {
        // ef 192 at D = 384 over a graph of m = 16 (lists of 32), 4,096
        // seen slots: the query (1,536), two beams of 224 entries (7,168),
        // the scored and sorted neighbours (1,024), their ids (128), then
        // the table in 2-byte tags (8,192) or 4-byte ids (16,384). The tag
        // figure is the 18,048 bytes per block ncu reported on an H200.
        assert_eq!(walk_smem(384, 192, 4096, true, 32), 18_048);
        assert_eq!(walk_smem(384, 192, 4096, false, 32), 26_240);
        // A query of 3 floats still takes 16 bytes.
        assert_eq!(walk_smem(3, 1, 1024, false, 1), 16 + 64 + 32 + 4 + 4096);
    }

    #[test]
    fn host_constants_mirror_the_walk_kernel() {
        assert_eq!(define(WALK_CU, "WALK_MAX_DEGREE"), WALK_MAX_DEGREE);
        assert_eq!(define(WALK_CU, "WALK_MAX_WIDTH"), WALK_MAX_WIDTH);
        assert_eq!(define(WALK_CU, "WALK_BUCKET"), WALK_BUCKET);
        assert_eq!(1 << define(WALK_CU, "WALK_BUCKET_BITS"), WALK_BUCKET);
        assert_eq!(
            define(WALK_CU, "WALK_MAX_THREADS"),
            *WALK_TEAMS.last().unwrap() as usize
        );
        for t in WALK_TEAMS {
            let line = format!("TOPK_WALK_KERNEL(NAME, METRIC, {t})");
            assert!(WALK_CU.contains(&line), "walk.cu builds no team of {t}");
        }
    }
}
