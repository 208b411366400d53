//! The public index type: construction, searches, and the `Retriever` impl.

use ndarray::ArrayView2;
use rayon::prelude::*;
use topk_core::{validate, Metric, Neighbor, Retriever};

use crate::build::{build, Graph, Mode};
use crate::error::Result;
use crate::filter::SlotFilter;
use crate::params::{check_ef, check_width, rng_after, HnswParams, SplitMix64};
use crate::search::{
    greedy, search_layer_wide, All, Allow, Cand, CpuScorer, Scorer, Scratch, ScratchPool,
};
use crate::vectors::{check_corpus, Vectors};

/// Default of [`Hnsw::set_filter_walk_cost`], measured on the MiniLM 20k
/// set (the crate README has the sweep and the command).
///
/// A walk that must find `ef` allowed rows when a fraction `s` of the graph's
/// `N` nodes is allowed scores about `c · ef / s` rows; scoring the allowed
/// rows exactly costs `s · N`. A search is exact when `s · N ≤ c · ef / s`,
/// that is when the allowed rows number at most `sqrt(c · ef · N)`. The
/// crossovers measured at N = 5k, 10k and 20k with ef = 64, and at 20k with
/// ef = 128, gave c between 15 and 20; at N = 20k and ef = 64 the rule
/// switches to exact scoring below about 4,500 allowed rows (selectivity 0.23).
pub const DEFAULT_FILTER_WALK_COST: f64 = 16.0;

/// An HNSW graph over a corpus it owns, searched with canonical scores.
///
/// Built once (sequentially and deterministically with [`Hnsw::build`], or
/// from all rayon threads with [`Hnsw::build_parallel`]); searches take
/// `&self` and may run from many threads at once, each drawing reusable
/// working memory from an internal pool. Rows are *slots* `0..len()`:
/// [`Hnsw::insert`] adds one (reusing a deleted slot when there is one) and
/// [`Hnsw::mark_deleted`] takes one out of every later result.
pub struct Hnsw {
    pub(crate) params: HnswParams,
    pub(crate) vectors: Vectors,
    pub(crate) graph: Graph,
    pub(crate) pool: ScratchPool,
    /// Deletion marks: deleted slots navigate but are never returned.
    pub(crate) deleted: SlotFilter,
    pub(crate) deleted_count: usize,
    /// Deleted slots in the order [`Hnsw::insert`] reuses them (last first);
    /// always exactly the marked slots.
    pub(crate) free: Vec<u32>,
    /// The level generator, continued by every insertion of a new slot.
    pub(crate) rng: SplitMix64,
    /// `c` of [`DEFAULT_FILTER_WALK_COST`]: when a search is exact.
    pub(crate) walk_cost: f64,
    /// Unique to this index and its current rows and lists: a new value at
    /// construction, on clone and on every insertion, so that a graph
    /// uploaded to a device can tell it no longer matches.
    pub(crate) stamp: u64,
}

/// A value no index has had before in this process (see `Hnsw::stamp`).
pub(crate) fn fresh_stamp() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl std::fmt::Debug for Hnsw {
    // The rows and lists would print millions of numbers; show the shape.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hnsw")
            .field("n", &self.vectors.len())
            .field("dim", &self.vectors.dim())
            .field("metric", &self.vectors.metric())
            .field("params", &self.params)
            .field("max_level", &self.graph.max_level)
            .field("entry", &self.graph.entry)
            .field("deleted", &self.deleted_count)
            .finish()
    }
}

impl Clone for Hnsw {
    /// A copy of the rows, the graph, the deletion marks and the level
    /// stream: the copy answers and inserts exactly as the original would.
    /// Its search working memory starts empty.
    fn clone(&self) -> Self {
        Hnsw {
            params: self.params,
            vectors: self.vectors.clone(),
            graph: self.graph.clone(),
            pool: ScratchPool::new(self.vectors.len()),
            deleted: self.deleted.clone(),
            deleted_count: self.deleted_count,
            free: self.free.clone(),
            rng: self.rng.clone(),
            walk_cost: self.walk_cost,
            stamp: fresh_stamp(),
        }
    }
}

/// Shape of a built graph, for logs and reports.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphStats {
    /// Number of nodes.
    pub n: usize,
    /// Highest layer.
    pub max_level: usize,
    /// Entry node of every search (a node on `max_level`).
    pub entry: u32,
    /// Nodes on each layer, layer 0 first.
    pub nodes_per_layer: Vec<usize>,
    /// Mean out-degree on each layer, layer 0 first.
    pub mean_degree: Vec<f64>,
}

impl Hnsw {
    /// Builds from an `N × D` view of any layout (copied into the index), on
    /// every rayon thread or on one as [`HnswParams::parallel`] says.
    ///
    /// Errors: parameters out of range, or a corpus that breaks an input rule
    /// of `docs/CONTRACTS.md §4`.
    pub fn new(rows: ArrayView2<'_, f32>, metric: Metric, params: HnswParams) -> Result<Self> {
        let (_, dim) = validate::corpus_view(rows)?;
        let data: Vec<f32> = rows.iter().copied().collect();
        Self::from_rowmajor(data, dim, metric, params)
    }

    /// Builds from an owned row-major buffer of `data.len() / dim` rows,
    /// without copying it, on every rayon thread or on one as
    /// [`HnswParams::parallel`] says.
    pub fn from_rowmajor(
        data: Vec<f32>,
        dim: usize,
        metric: Metric,
        params: HnswParams,
    ) -> Result<Self> {
        Self::build_rowmajor(data, dim, metric, params, None)
    }

    /// [`Hnsw::from_rowmajor`], calling `progress` with the number of rows
    /// inserted so far while the graph is built: every
    /// 1,024 rows and once, with `N`, at the end, from the building threads.
    /// The callback only observes: the index is the one
    /// [`Hnsw::from_rowmajor`] builds (bit for bit for a sequential build).
    ///
    /// ```
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use topk_core::Metric;
    /// use topk_hnsw::{Hnsw, HnswParams};
    ///
    /// let data: Vec<f32> = (0..2048).map(|i| (i as f32 * 0.37).sin()).collect();
    /// let last = AtomicUsize::new(0);
    /// let report = |rows: usize| last.store(rows, Ordering::Relaxed);
    /// let index = Hnsw::from_rowmajor_with_progress(
    ///     data, 2, Metric::L2, HnswParams::default(), &report,
    /// )?;
    /// assert_eq!(last.load(Ordering::Relaxed), 1024);
    /// # let _ = index;
    /// # Ok::<_, topk_hnsw::HnswError>(())
    /// ```
    pub fn from_rowmajor_with_progress(
        data: Vec<f32>,
        dim: usize,
        metric: Metric,
        params: HnswParams,
        progress: &(dyn Fn(usize) + Sync),
    ) -> Result<Self> {
        Self::build_rowmajor(data, dim, metric, params, Some(progress))
    }

    /// The one build of [`Hnsw::from_rowmajor`] and
    /// [`Hnsw::from_rowmajor_with_progress`].
    fn build_rowmajor(
        data: Vec<f32>,
        dim: usize,
        metric: Metric,
        params: HnswParams,
        progress: Option<&(dyn Fn(usize) + Sync)>,
    ) -> Result<Self> {
        // The corpus's rules first, then the parameters: the order of every
        // backend (docs/CONTRACTS.md §4).
        check_corpus(&data, dim)?;
        params.validate()?;
        let vectors = Vectors::new(data, dim, metric);
        let mode = if params.parallel {
            Mode::Parallel
        } else {
            Mode::Sequential
        };
        let graph = build(&vectors, &vectors, params, mode, progress)?;
        Ok(Self::from_parts(params, vectors, graph))
    }

    /// Builds an index over row-major `data` (`N × dim`, copied) on one
    /// thread, whatever `params.parallel` says.
    ///
    /// Deterministic: the same data, metric and parameters (seed included)
    /// always give the same graph and the same saved file.
    pub fn build(data: &[f32], dim: usize, metric: Metric, params: HnswParams) -> Result<Self> {
        let params = HnswParams {
            parallel: false,
            ..params
        };
        Self::from_rowmajor(data.to_vec(), dim, metric, params)
    }

    /// Builds an index over row-major `data` (copied) on all threads of the
    /// current rayon pool, whatever `params.parallel` says. Faster; the graph
    /// depends on thread timing (see the `build` module's determinism
    /// statement) while its recall does not.
    pub fn build_parallel(
        data: &[f32],
        dim: usize,
        metric: Metric,
        params: HnswParams,
    ) -> Result<Self> {
        let params = HnswParams {
            parallel: true,
            ..params
        };
        Self::from_rowmajor(data.to_vec(), dim, metric, params)
    }

    /// A freshly built index: no deletions, the level stream continued after
    /// the build's `n` draws.
    pub(crate) fn from_parts(params: HnswParams, vectors: Vectors, graph: Graph) -> Self {
        let n = vectors.len();
        Hnsw {
            params,
            pool: ScratchPool::new(n),
            vectors,
            graph,
            deleted: SlotFilter::new(),
            deleted_count: 0,
            free: Vec::new(),
            rng: rng_after(params.seed, n),
            walk_cost: DEFAULT_FILTER_WALK_COST,
            stamp: fresh_stamp(),
        }
    }

    /// The parameters the index was built with (and its default `ef`).
    pub fn params(&self) -> HnswParams {
        self.params
    }

    /// The default beam width of [`Retriever::search_into`].
    pub fn ef(&self) -> usize {
        self.params.ef_search
    }

    /// Sets the default beam width. `ef = 0` is rejected; values below a
    /// search's `k` are raised to `k`.
    pub fn set_ef(&mut self, ef: usize) -> Result<()> {
        check_ef(ef)?;
        self.params.ef_search = ef;
        Ok(())
    }

    /// The rows of every slot, row-major (`len() × dim()`); a deleted
    /// slot still holds its last row until [`Hnsw::insert`] reuses it.
    pub fn vectors(&self) -> &[f32] {
        self.vectors.data()
    }

    /// Layer counts and degrees of the graph.
    pub fn stats(&self) -> GraphStats {
        let links = &self.graph.links;
        let layout = &links.layout;
        let layers = self.graph.max_level + 1;
        let mut nodes = vec![0usize; layers];
        let mut edges = vec![0usize; layers];
        for node in 0..layout.len() as u32 {
            for (l, (nodes_l, edges_l)) in nodes
                .iter_mut()
                .zip(edges.iter_mut())
                .enumerate()
                .take(layout.level(node) + 1)
            {
                *nodes_l += 1;
                *edges_l += links.neighbours(node, l).len();
            }
        }
        GraphStats {
            n: layout.len(),
            max_level: self.graph.max_level,
            entry: self.graph.entry,
            mean_degree: nodes
                .iter()
                .zip(&edges)
                .map(|(&v, &e)| if v == 0 { 0.0 } else { e as f64 / v as f64 })
                .collect(),
            nodes_per_layer: nodes,
        }
    }

    /// Writes the `min(k, live)` best live neighbours found with beam width
    /// `max(ef, k)` into `out`, best first.
    pub fn search_with_ef(
        &self,
        query: &[f32],
        k: usize,
        ef: usize,
        out: &mut Vec<Neighbor>,
    ) -> Result<()> {
        validate::query(query, self.vectors.dim())?;
        validate::k(k, self.vectors.len())?;
        check_ef(ef)?;
        self.search_one(query, k, ef, 1, None, out)
    }

    /// Searches every row of a `Q × D` batch in parallel with beam width `ef`.
    pub fn search_batch_with_ef(
        &self,
        queries: ArrayView2<'_, f32>,
        k: usize,
        ef: usize,
    ) -> Result<Vec<Vec<Neighbor>>> {
        self.search_batch_wide(queries, k, ef, 1, None)
    }

    /// Searches every row of a `Q × D` batch in parallel with beam width
    /// `max(ef, k)`, expanding the `width` best open candidates of the beam
    /// per step (1 ..= [`crate::MAX_WALK_WIDTH`]), over the live slots of `filter`
    /// where one is given. Width 1 is [`Hnsw::search_batch_with_ef`] (and
    /// [`Hnsw::search_filtered_with_ef`]); a wider step scores the unseen
    /// neighbours of several nodes at once, so a walk takes fewer, larger
    /// steps, and its answer may differ as one with another `ef` would. The
    /// GPU walk with the same width gives the same answers
    /// (`Hnsw::search_graph_gpu_counted`, docs/CONTRACTS.md §13).
    pub fn search_batch_wide(
        &self,
        queries: ArrayView2<'_, f32>,
        k: usize,
        ef: usize,
        width: usize,
        filter: Option<&SlotFilter>,
    ) -> Result<Vec<Vec<Neighbor>>> {
        validate::queries(queries, self.vectors.dim())?;
        validate::k(k, self.vectors.len())?;
        check_ef(ef)?;
        check_width(width)?;
        (0..queries.nrows())
            .into_par_iter()
            .map(|i| {
                let q: Vec<f32> = queries.row(i).iter().copied().collect();
                let mut out = Vec::with_capacity(k.min(self.vectors.len()));
                self.search_one(&q, k, ef, width, filter, &mut out)?;
                Ok(out)
            })
            .collect()
    }

    /// One checked query's search: the live rows, or the live rows of
    /// `filter`.
    pub(crate) fn search_one(
        &self,
        query: &[f32],
        k: usize,
        ef: usize,
        width: usize,
        filter: Option<&SlotFilter>,
        out: &mut Vec<Neighbor>,
    ) -> Result<()> {
        let mut scorer = CpuScorer {
            vectors: &self.vectors,
            query: self.vectors.query(query),
        };
        let mut sc = self.pool.take();
        let r = match filter {
            None => self.search_scored(&mut scorer, k, ef, width, &mut sc, out),
            Some(filter) => {
                let allowed = filter.count_below_minus(self.vectors.len(), &self.deleted);
                let allow = InButNot {
                    filter,
                    deleted: &self.deleted,
                };
                self.walk(&mut scorer, k, ef, width, &mut sc, out, &allow, allowed)
            }
        };
        self.pool.put(sc);
        r
    }

    /// The search proper, for any scorer, over the live
    /// rows: [`Hnsw::walk`] with deleted slots disallowed.
    pub(crate) fn search_scored<F: Scorer>(
        &self,
        scorer: &mut F,
        k: usize,
        ef: usize,
        width: usize,
        sc: &mut Scratch,
        out: &mut Vec<Neighbor>,
    ) -> Result<()> {
        if self.deleted_count == 0 {
            let n = self.vectors.len();
            self.walk(scorer, k, ef, width, sc, out, &All, n)
        } else {
            let live = self.live_len();
            let allow = NotIn(&self.deleted);
            self.walk(scorer, k, ef, width, sc, out, &allow, live)
        }
    }

    /// Greedy descent to layer 1, beam search of layer 0 (`width` nodes
    /// expanded per step) admitting only rows `allow` accepts (`allowed` of
    /// them), best `min(k, allowed)` of the beam.
    ///
    /// Three cases leave the graph walk: a beam at least as wide as the
    /// graph, and an allowed set (some rows excluded) small enough that
    /// scoring it is cheaper than walking ([`DEFAULT_FILTER_WALK_COST`]),
    /// score every allowed row (the exact answer); and
    /// a beam that ended with fewer than `min(k, allowed)` nodes (the walk
    /// exhausted the part of the graph reachable from the entry) is completed
    /// by scoring the allowed rows it never reached, so a search always
    /// returns `min(k, allowed)` rows.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn walk<F: Scorer, A: Allow>(
        &self,
        scorer: &mut F,
        k: usize,
        ef: usize,
        width: usize,
        sc: &mut Scratch,
        out: &mut Vec<Neighbor>,
        allow: &A,
        allowed: usize,
    ) -> Result<()> {
        let n = self.vectors.len();
        let want = k.min(allowed);
        let ef = ef.max(k);
        out.clear();
        if want == 0 {
            return Ok(());
        }
        if self.scores_directly(allowed, ef) {
            sc.sorted.clear();
            let ids = allow.slots(n);
            return score_all_into(scorer, &ids, &mut sc.sorted, want, out);
        }
        let g = &self.graph;
        let mut cur = Cand::new(g.entry, scorer.score_one(g.entry)?);
        if g.max_level > 0 {
            cur = greedy(&g.links, scorer, sc, cur, g.max_level, 1, &All)?;
        }
        search_layer_wide(&g.links, scorer, sc, cur, ef, width, 0, allow)?;
        if sc.results.len() < want {
            let unseen: Vec<u32> = (0..n as u32)
                .filter(|&i| !sc.seen(i) && allow.allows(i))
                .collect();
            tracing::debug!(
                reached = sc.results.len(),
                unreached = unseen.len(),
                "beam ended short of k; scoring unreached rows"
            );
            sc.sort_results();
            let mut found = std::mem::take(&mut sc.sorted);
            let r = score_all_into(scorer, &unseen, &mut found, want, out);
            sc.sorted = found;
            return r;
        }
        sc.sort_results();
        out.extend(sc.sorted.iter().take(want).map(|c| c.neighbor()));
        Ok(())
    }

    /// Whether a search of beam width `ef` (already raised to `k`) over
    /// `allowed` rows scores the allowed rows instead of walking: a beam at
    /// least as wide as the graph, or an allowed set small enough that
    /// scoring it is cheaper ([`DEFAULT_FILTER_WALK_COST`]).
    pub(crate) fn scores_directly(&self, allowed: usize, ef: usize) -> bool {
        let n = self.vectors.len();
        let (a, e, nodes) = (allowed as f64, ef as f64, n as f64);
        // Only a search that excludes rows switches: an unfiltered search of
        // an index without deletions walks whatever its size, as it always
        // has, unless the walk cost is infinite ("always exact").
        let switches = allowed < n || self.walk_cost == f64::INFINITY;
        ef >= n || (switches && a * a <= self.walk_cost * e * nodes)
    }
}

/// Allows the slots not in a set (the live rows: not deleted).
pub(crate) struct NotIn<'a>(pub(crate) &'a SlotFilter);

impl Allow for NotIn<'_> {
    #[inline]
    fn allows(&self, id: u32) -> bool {
        !self.0.contains(id)
    }
}

/// Allows the slots of a filter that are not deleted.
pub(crate) struct InButNot<'a> {
    pub(crate) filter: &'a SlotFilter,
    pub(crate) deleted: &'a SlotFilter,
}

impl Allow for InButNot<'_> {
    #[inline]
    fn allows(&self, id: u32) -> bool {
        self.filter.contains(id) && !self.deleted.contains(id)
    }

    fn slots(&self, n: usize) -> Vec<u32> {
        self.filter
            .iter()
            .take_while(|&s| (s as usize) < n)
            .filter(|&s| !self.deleted.contains(s))
            .collect()
    }
}

/// Scores `ids`, adds them to the candidates already in `pool`, and writes
/// the best `want` of all of them to `out`.
fn score_all_into<F: Scorer>(
    scorer: &mut F,
    ids: &[u32],
    pool: &mut Vec<Cand>,
    want: usize,
    out: &mut Vec<Neighbor>,
) -> Result<()> {
    let mut scores = vec![0.0_f32; ids.len()];
    for (chunk, s) in ids.chunks(1024).zip(scores.chunks_mut(1024)) {
        scorer.score_ids(chunk, s)?;
    }
    pool.extend(ids.iter().zip(&scores).map(|(&i, &s)| Cand::new(i, s)));
    out.clear();
    if want == 0 {
        return Ok(());
    }
    if pool.len() > want {
        // Keys are unique (they encode the id), so the best `want` are exact.
        pool.select_nth_unstable_by_key(want - 1, |c| std::cmp::Reverse(c.key));
        pool.truncate(want);
    }
    pool.sort_unstable_by_key(|c| std::cmp::Reverse(c.key));
    out.extend(pool.iter().take(want).map(|c| c.neighbor()));
    Ok(())
}

impl Retriever for Hnsw {
    fn backend(&self) -> &'static str {
        "hnsw"
    }

    /// The number of slots, deleted ones included ([`Hnsw::live_len`] counts
    /// the rows a search can return).
    fn len(&self) -> usize {
        self.vectors.len()
    }

    fn dim(&self) -> usize {
        self.vectors.dim()
    }

    fn metric(&self) -> Metric {
        self.vectors.metric()
    }

    fn search_into(
        &self,
        query: &[f32],
        k: usize,
        out: &mut Vec<Neighbor>,
    ) -> topk_core::Result<()> {
        Ok(self.search_with_ef(query, k, self.params.ef_search, out)?)
    }

    fn search_batch(
        &self,
        queries: ArrayView2<'_, f32>,
        k: usize,
    ) -> topk_core::Result<Vec<Vec<Neighbor>>> {
        Ok(self.search_batch_with_ef(queries, k, self.params.ef_search)?)
    }
}
