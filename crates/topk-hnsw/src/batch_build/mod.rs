//! The batched insertion build: HNSW's own insertion (Malkov & Yashunin,
//! Algorithms 1 and 4), many nodes per round, so that a round is one batch
//! of walks and one batch of neighbour selections, the two steps a GPU does
//! at once for thousands of nodes.
//!
//! # Algorithm
//!
//! 1. **Levels** are drawn as the insertion build draws them (the same
//!    SplitMix64 stream from [`HnswParams::seed`]); the entry is the first
//!    node drawn on the top layer.
//! 2. **Upper layers first.** The nodes on layer 1 and above form an HNSW of
//!    their own, one layer shorter, with lists of capacity `m` on its bottom
//!    layer: it is built by this same algorithm over those rows (recursively;
//!    on a device engine of its own where it is large enough) and becomes
//!    layers `1..` here. Each of those nodes starts layer 0 with its layer-1
//!    list, so every node a walk's descent can end on is already in layer 0.
//! 3. **Rounds.** The other nodes go into layer 0 in id order, one round at
//!    a time; a round takes `max(1, min(in / divisor, max_batch))` nodes,
//!    `in` being the nodes already in the graph ([`BatchSchedule`]). For
//!    each node of the round:
//!    - **walk**: the `ef_construction` beam of layer 0 over the graph as it
//!      was at the start of the round (greedy descent from the entry
//!      through the upper layers, as every search);
//!    - **select**: `m` of the beam's nodes with the heuristic
//!      ([`crate::build`]'s `select_neighbours`), the node's layer-0 list;
//!    - **link back**: each selected node `e` is offered the new node. All
//!      offers to `e` in the round are taken at once: its list, then the
//!      offers best first; if that fits in `m0` slots it is the new list,
//!      otherwise the heuristic keeps `m0` of them, all ranked against `e`.
//!
//! The nodes of a round do not see each other while they walk; they meet
//! through the nodes they link to. A round is at most a quarter of the
//! graph by default, so a node sees at least four fifths of the nodes
//! inserted before the end of its round.
//!
//! # Determinism
//!
//! The graph depends only on the corpus, the metric, the parameters and
//! the schedule: every walk and every selection of a round reads the graph
//! as it was at the start of the round and is decided on canonical scores
//! and §3 keys, and offers are ordered by key. The thread count and the
//! engine do not change it: the CPU engine and the GPU engine (topk-cuda's
//! walk and `prune_lists`, the same walks and selections bit for bit) build
//! the same index, and the same saved file.

mod round;
#[cfg(test)]
mod tests;

use std::time::Instant;

use rayon::prelude::*;
use topk_core::Metric;

use crate::build::{select_neighbours, Graph, Progress};
use crate::error::{HnswError, Result};
use crate::graph::{Layout, Links};
use crate::index::Hnsw;
use crate::params::{draw_levels, HnswParams};
use crate::search::{greedy, search_layer, All, Cand, CpuScorer, ScratchPool};
use crate::vectors::{check_corpus, Vectors};
pub(crate) use round::Flat;
use round::{insert_round, Phases};

/// How many nodes each round of [`Hnsw::build_batched`] inserts: changes the
/// graph (a node does not see the others of its round), so it is part of
/// what a build depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSchedule {
    /// A round takes at most the nodes already in the graph divided by this
    /// (at least one node).
    pub divisor: usize,
    /// A round takes at most this many nodes.
    pub max_batch: usize,
}

impl Default for BatchSchedule {
    fn default() -> Self {
        // Measured (bench/gpu/NOTES.md, "The batched build"): on 1M × 384
        // divisors 1 and 2 beat the insertion build's recall and 4 was
        // within 0.002 of it, at about the same time; on 5,000 and 20,000
        // rows (the tests, MiniLM) larger rounds cost up to 0.03 at ef 16.
        BatchSchedule {
            divisor: 4,
            max_batch: 1 << 16,
        }
    }
}

impl BatchSchedule {
    fn validate(self) -> Result<()> {
        for (name, value) in [
            ("batch divisor", self.divisor),
            ("max batch", self.max_batch),
        ] {
            if value == 0 {
                return Err(HnswError::InvalidParameter {
                    name,
                    value: 0,
                    reason: "must be at least 1",
                });
            }
        }
        Ok(())
    }

    /// Nodes of the next round when `inserted` are in the graph.
    pub(crate) fn round(self, inserted: usize) -> usize {
        (inserted / self.divisor).min(self.max_batch).max(1)
    }
}

/// Most candidates of one selection: the device heuristic's limit
/// (topk-cuda's `PRUNE_MAX_CANDS`). A longer list (a node offered more new
/// neighbours in one round than this) keeps its best offers.
pub(crate) const MAX_SELECT_CANDIDATES: usize = 2048;

/// Selection jobs: node `base[j]` and its candidates
/// `cands[off[j]..off[j + 1]]`.
#[derive(Debug, Default)]
pub(crate) struct Jobs {
    pub(crate) base: Vec<u32>,
    pub(crate) off: Vec<u32>,
    pub(crate) cands: Vec<u32>,
}

impl Jobs {
    fn len(&self) -> usize {
        self.base.len()
    }

    pub(crate) fn job(&self, j: usize) -> (u32, &[u32]) {
        (
            self.base[j],
            &self.cands[self.off[j] as usize..self.off[j + 1] as usize],
        )
    }
}

/// The two batched steps of a round, on some device.
pub(crate) trait BatchEngine {
    /// The graph is about to be walked: its upper layers are final, its
    /// layer 0 holds the nodes inserted so far.
    fn begin(&mut self, links: &Links<u32>, entry: u32) -> Result<()>;

    /// For every row of `rows`: the best `want` nodes (best first) of the
    /// `ef`-wide walk of `links` from `entry` with that row as the query
    /// (at most [`MAX_SELECT_CANDIDATES`] of them), and of those the at
    /// most `cap` the heuristic keeps, best first, with their scores (item
    /// `i` of the result for `rows[i]`).
    fn walk_select(
        &mut self,
        links: &Links<u32>,
        entry: u32,
        rows: &[u32],
        ef: usize,
        want: usize,
        cap: usize,
    ) -> Result<Flat<Cand>>;

    /// For every job, at most `cap` candidates kept by the heuristic.
    fn select(&mut self, jobs: &Jobs, cap: usize) -> Result<Flat<u32>>;

    /// The layer-0 lists of `nodes` (strictly increasing) changed in
    /// `links`.
    fn update(&mut self, links: &Links<u32>, nodes: &[u32]) -> Result<()>;
}

/// Makes the engine of the HNSW over the upper nodes' rows.
pub(crate) trait SubEngines: Sync {
    fn make<'v>(&self, vectors: &'v Vectors) -> Result<Box<dyn BatchEngine + 'v>>;
}

/// Both steps on the host, on the rayon pool.
pub(crate) struct CpuBatch<'v> {
    vectors: &'v Vectors,
    pool: ScratchPool,
}

impl<'v> CpuBatch<'v> {
    pub(crate) fn new(vectors: &'v Vectors) -> Self {
        CpuBatch {
            vectors,
            pool: ScratchPool::new(vectors.len()),
        }
    }
}

/// The walk of one row: what [`crate::Hnsw`]'s search does (without the
/// exact fallbacks), over the graph being built.
pub(crate) fn walk_row(
    vectors: &Vectors,
    pool: &ScratchPool,
    links: &Links<u32>,
    entry: u32,
    row: u32,
    ef: usize,
    want: usize,
) -> Result<Vec<Cand>> {
    let mut scorer = CpuScorer {
        vectors,
        query: vectors.row_query(row),
    };
    let mut sc = pool.take();
    let mut cur = Cand::new(entry, vectors.score(scorer.query, entry));
    let top = links.layout.level(entry);
    if top > 0 {
        cur = greedy(links, &mut scorer, &mut sc, cur, top, 1, &All)?;
    }
    search_layer(links, &mut scorer, &mut sc, cur, ef, 0, &All)?;
    sc.sort_results();
    let out = sc.sorted.iter().take(want).copied().collect();
    pool.put(sc);
    Ok(out)
}

/// [`walk_row`], then the heuristic over the beam (already ranked against
/// the row): one node's step of a round on the host.
#[allow(clippy::too_many_arguments)]
pub(crate) fn walk_select_row(
    vectors: &Vectors,
    pool: &ScratchPool,
    links: &Links<u32>,
    entry: u32,
    row: u32,
    ef: usize,
    want: usize,
    cap: usize,
) -> Result<Vec<Cand>> {
    let beam = walk_row(
        vectors,
        pool,
        links,
        entry,
        row,
        ef,
        want.min(MAX_SELECT_CANDIDATES),
    )?;
    let mut kept = Vec::with_capacity(cap);
    select_neighbours(vectors, &beam, cap, &mut kept);
    Ok(kept)
}

/// The heuristic of one job on the host: the candidates ranked against the
/// base node, then `select_neighbours`.
pub(crate) fn select_job(vectors: &Vectors, base: u32, cands: &[u32], cap: usize) -> Vec<u32> {
    let q = vectors.row_query(base);
    let mut ranked: Vec<Cand> = cands
        .iter()
        .map(|&x| Cand::new(x, vectors.score(q, x)))
        .collect();
    ranked.sort_unstable_by_key(|c| std::cmp::Reverse(c.key));
    let mut kept = Vec::with_capacity(cap);
    select_neighbours(vectors, &ranked, cap, &mut kept);
    kept.iter().map(|c| c.id()).collect()
}

impl BatchEngine for CpuBatch<'_> {
    fn begin(&mut self, _: &Links<u32>, _: u32) -> Result<()> {
        Ok(())
    }

    fn walk_select(
        &mut self,
        links: &Links<u32>,
        entry: u32,
        rows: &[u32],
        ef: usize,
        want: usize,
        cap: usize,
    ) -> Result<Flat<Cand>> {
        let (vectors, pool) = (self.vectors, &self.pool);
        Flat::par_fill(rows.len(), cap, |i, out| {
            let kept = walk_select_row(vectors, pool, links, entry, rows[i], ef, want, cap)?;
            out[..kept.len()].copy_from_slice(&kept);
            Ok(kept.len())
        })
    }

    fn select(&mut self, jobs: &Jobs, cap: usize) -> Result<Flat<u32>> {
        let vectors = self.vectors;
        Flat::par_fill(jobs.len(), cap, |j, out| {
            let (base, cands) = jobs.job(j);
            let kept = select_job(vectors, base, cands, cap);
            out[..kept.len()].copy_from_slice(&kept);
            Ok(kept.len())
        })
    }

    fn update(&mut self, _: &Links<u32>, _: &[u32]) -> Result<()> {
        Ok(())
    }
}

/// Upper layers on the host engine too.
pub(crate) struct CpuSubEngines;

impl SubEngines for CpuSubEngines {
    fn make<'v>(&self, vectors: &'v Vectors) -> Result<Box<dyn BatchEngine + 'v>> {
        Ok(Box::new(CpuBatch::new(vectors)))
    }
}

/// Builds the graph of `vectors` whose nodes sit on `levels`, layer-0
/// lists of capacity `cap0` and upper lists of `params.m`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn batch_graph(
    vectors: &Vectors,
    levels: Vec<u8>,
    cap0: usize,
    params: &HnswParams,
    schedule: BatchSchedule,
    engine: &mut dyn BatchEngine,
    subs: &dyn SubEngines,
    progress: Progress<'_>,
) -> Result<Graph> {
    let n = vectors.len();
    let max_level = levels.iter().copied().max().map_or(0, usize::from);
    let entry = levels
        .iter()
        .position(|&l| usize::from(l) == max_level)
        .unwrap_or(0) as u32;
    let mut links = Links::empty(Layout::new(params.m, cap0, levels)).freeze();
    let upper: Vec<u32> = (0..n as u32)
        .filter(|&i| links.layout.level(i) > 0)
        .collect();
    if !upper.is_empty() {
        let mut clock = Instant::now();
        let dim = vectors.dim();
        let mut rows = vec![0.0_f32; upper.len() * dim];
        rows.par_chunks_mut(dim)
            .zip(&upper)
            .for_each(|(row, &u)| row.copy_from_slice(vectors.row(u)));
        let sub_vectors = Vectors::new(rows, vectors.dim(), vectors.metric());
        let sub_levels: Vec<u8> = upper
            .iter()
            .map(|&u| links.layout.levels[u as usize] - 1)
            .collect();
        let gather_s = round::lap(&mut clock);
        let mut sub_engine = subs.make(&sub_vectors)?;
        let engine_s = round::lap(&mut clock);
        let sub = batch_graph(
            &sub_vectors,
            sub_levels,
            params.m,
            params,
            schedule,
            sub_engine.as_mut(),
            subs,
            None,
        )?;
        drop(sub_engine);
        let build_s = round::lap(&mut clock);
        let mut ids = Vec::with_capacity(params.m0());
        for (local, &u) in upper.iter().enumerate() {
            for level in 0..=sub.links.layout.level(local as u32) {
                ids.clear();
                ids.extend(
                    sub.links
                        .neighbours(local as u32, level)
                        .iter()
                        .map(|&x| upper[x as usize]),
                );
                links.set(u, level + 1, &ids);
                if level == 0 {
                    links.set(u, 0, &ids);
                }
            }
        }
        tracing::info!(
            n,
            upper = upper.len(),
            gather_s,
            engine_s,
            build_s,
            copy_s = round::lap(&mut clock),
            "batched upper layers done"
        );
    }
    // Every node but those already in layer 0 (the upper nodes, or the
    // entry of a one-layer graph), in id order.
    let rest: Vec<u32> = (0..n as u32)
        .filter(|&i| links.layout.level(i) == 0 && i != entry)
        .collect();
    let mut inserted = n - rest.len();
    engine.begin(&links, entry)?;
    let started = Instant::now();
    let mut t = Phases::default();
    let mut at = 0;
    while at < rest.len() {
        let take = schedule.round(inserted).min(rest.len() - at);
        let rows = &rest[at..at + take];
        insert_round(&mut links, entry, rows, inserted, params, engine, &mut t)?;
        at += take;
        inserted += take;
        t.rounds += 1;
        if let Some(report) = progress {
            report(inserted);
        }
    }
    tracing::info!(
        n,
        upper = upper.len(),
        rounds = t.rounds,
        secs = started.elapsed().as_secs_f64(),
        walk = t.walk,
        offers = t.offers,
        group = t.group,
        relink = t.relink,
        apply = t.apply,
        update = t.update,
        "batched layer 0 done"
    );
    Ok(Graph {
        links,
        entry,
        max_level,
    })
}

impl Hnsw {
    /// Builds an index over row-major `data` (`N × dim`, taken) by batched
    /// insertion on the host (see the `batch_build` module): deterministic
    /// whatever the thread count, and the same index as
    /// `Hnsw::build_batched_gpu` of the same inputs.
    ///
    /// Errors: parameters or schedule out of range
    /// ([`HnswError::InvalidParameter`]) or a corpus that breaks a rule of
    /// docs/CONTRACTS.md §4 ([`HnswError::Input`]).
    pub fn build_batched(
        data: Vec<f32>,
        dim: usize,
        metric: Metric,
        params: HnswParams,
        schedule: BatchSchedule,
    ) -> Result<Self> {
        // The corpus's rules first, as every build checks them.
        check_corpus(&data, dim)?;
        params.validate()?;
        schedule.validate()?;
        let vectors = Vectors::new(data, dim, metric);
        let graph = {
            let mut engine = CpuBatch::new(&vectors);
            build_with(
                &vectors,
                &params,
                schedule,
                &mut engine,
                &CpuSubEngines,
                None,
            )?
        };
        Ok(Hnsw::from_parts(params, vectors, graph))
    }
}

/// The whole batched build over `vectors` with `engine` for the full graph.
pub(crate) fn build_with(
    vectors: &Vectors,
    params: &HnswParams,
    schedule: BatchSchedule,
    engine: &mut dyn BatchEngine,
    subs: &dyn SubEngines,
    progress: Progress<'_>,
) -> Result<Graph> {
    schedule.validate()?;
    let started = Instant::now();
    let levels = draw_levels(vectors.len(), params);
    let graph = batch_graph(
        vectors,
        levels,
        params.m0(),
        params,
        schedule,
        engine,
        subs,
        progress,
    )?;
    tracing::info!(
        n = vectors.len(),
        dim = vectors.dim(),
        m = params.m,
        ef_construction = params.ef_construction,
        max_level = graph.max_level,
        secs = started.elapsed().as_secs_f64(),
        "hnsw graph built by batched insertion"
    );
    Ok(graph)
}
