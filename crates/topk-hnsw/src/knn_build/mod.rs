//! Construction from an exact kNN graph: a second way to build [`Hnsw`],
//! whose expensive part is one exact batch search of the corpus against
//! itself, the work a GPU batch engine does at its memory floor.
//!
//! # Algorithm
//!
//! 1. **Levels** are drawn exactly as the insertion build draws them (the
//!    same SplitMix64 stream from [`HnswParams::seed`]), so the same nodes sit
//!    on the same layers as in [`Hnsw::build`] of the same corpus, and the
//!    entry point is the same node: the first one drawn on the top layer.
//! 2. **Layer 0.** Every row is a query: its exact top-`c + 1` rows come from
//!    a [`KnnSource`], [`KNN_BATCH_ROWS`] query rows per call so that memory
//!    stays bounded. The row itself is dropped, leaving the `c` nearest
//!    other rows, `c = ef_construction` capped at [`MAX_KNN_CANDIDATES`]
//!    but never below `m0` (and at most `N − 1`). They are pruned to `m0`
//!    with the insertion build's neighbour-selection heuristic (Malkov &
//!    Yashunin, Algorithm 4). While the source answers one batch, the
//!    previous batch is pruned on the rayon pool.
//! 3. **Reverse edges.** For every kept link `u → v`, `v → u` is offered to
//!    `v`: each list becomes its kept links plus its in-links; a list longer
//!    than `m0` is pruned again with the same heuristic, as the insertion
//!    build re-prunes a neighbour whose list overflows.
//! 4. **Upper layers** (the nodes on layer `l ≥ 1`, about `N / m^l` of them,
//!    capacity `m`): each node takes its exact top-`c` among the layer's
//!    nodes *before* it (by id), pruned with the heuristic, then the kept
//!    links get their reverse links as on layer 0. That is what an insertion
//!    in id order with an exact beam would link, and it keeps the
//!    insertion build's long links: the first nodes see only a few
//!    predecessors, far away, and link to them. The first 1,024
//!    nodes are scored on the host; later ones go in blocks of an eighth of
//!    the nodes before them, searched through a source over those nodes
//!    ([`KnnSource::sub_source`]: topk-cpu's exact engine by default, the GPU
//!    engine for large layers), their predecessors inside the block scored
//!    on the host. Layer 1 costs about `(N / m)² / 2` scores, `2m²` times
//!    less than layer 0. Measured on Gaussian clusters (5k × 32, 20k × 64):
//!    an exact kNN graph *within* each layer's node set instead (no order)
//!    left greedy descents stuck in the wrong cluster for 1 % of the queries;
//!    running the insertion build over the upper nodes gives the same recall
//!    but is sequential (about `N / m` beam searches on one thread, the
//!    longest part of a 1M build) or, in parallel, timing-dependent.
//! 5. **Long links on layer 0.** A kNN graph of clustered data falls apart
//!    into its clusters, and a walk that enters the wrong one cannot leave
//!    it. Three steps give layer 0 what the insertion build gets from its
//!    early, far-reaching links: the first [`EARLY_NODES`] rows also take
//!    their `c` nearest predecessors as candidates (as their insertion
//!    would); every node on layer 1 keeps its layer-1 links on layer 0
//!    (appended while its list has room); and every layer is made reachable
//!    from the entry: while some node is not, the first (by id) is linked
//!    from the nearest reachable node with a free slot, found by an
//!    `ef_construction` beam search of that layer. On the 20k × 64 set
//!    (64 clusters, `m = 16`, `ef_construction = 100`) recall@10 at
//!    `ef = 16` / `64` goes from 0.918 / 0.995 without the early rows' extra
//!    candidates to 0.955 / 1.000 (the parallel insertion build: 0.951 /
//!    0.999).
//!
//! The result is an ordinary [`Hnsw`]: the same graph storage, searched,
//! saved, loaded, inserted into and deleted from by the same code.
//!
//! # Determinism
//!
//! The graph depends only on the corpus, the metric and the parameters: not
//! on the thread count, the batch size or the source (any source returning the
//! exact top-k with canonical scores gives the same answer, docs/CONTRACTS.md
//! §2 and §3). Every list is sorted by the §3 ranking key before it is pruned,
//! and the reverse links of a node are sorted the same way whatever order the
//! threads found them in. The same inputs give the same saved file.
//!
//! # Checks on the source
//!
//! A source's answer is checked before it is used: one list per query, each
//! of `min(k, N)` rows in range and strictly in §3 order, and the best row's
//! score equal, bit for bit, to the canonical score computed here. A source
//! over other rows, or one that is not exact in order, is
//! [`HnswError::KnnSource`] rather than a silently worse graph.

mod layer0;
#[cfg(test)]
mod tests;
mod upper;

use std::time::Instant;

use ndarray::ArrayView2;
use topk_core::{validate, Metric, Neighbor, Retriever};
use topk_cpu::CpuRetriever;

use crate::build::{Graph, Progress};
use crate::error::{HnswError, Result};
use crate::graph::{Layout, Links};
use crate::index::Hnsw;
use crate::params::{draw_levels, HnswParams};
use crate::vectors::{check_corpus, Vectors};

use layer0::layer_lists;
use upper::{connect_from_entry, lift_upper_links, prefix_lists, write_layer};

/// Query rows per [`KnnSource::knn_batch`] call: a batch's answers hold
/// `KNN_BATCH_ROWS · (c + 1)` neighbours of 8 bytes (3.3 MB at the default
/// `c = 100`), and a GPU batch engine is at full speed well below this size.
pub const KNN_BATCH_ROWS: usize = 4096;

/// Most candidates a node's list is pruned from (`ef_construction` above it
/// is clamped): past a few hundred, extra candidates almost never survive the
/// heuristic, while the kNN answers and the pruning grow linearly.
pub const MAX_KNN_CANDIDATES: usize = 512;

/// An exact batch engine over the corpus being indexed: the expensive part of
/// [`Hnsw::build_from_knn`].
///
/// Implemented for topk-cpu's [`CpuRetriever`] and, with the `cuda`
/// feature, for `topk_cuda::CudaRetriever`.
pub trait KnnSource: Sync {
    /// Rows of the corpus the source searches (the index's `N`).
    fn rows(&self) -> usize;

    /// The exact `min(k, N)` best rows of each query of the row-major
    /// `queries` (rows of the corpus dimension), best first in the §3 order
    /// of docs/CONTRACTS.md, with canonical scores (§2).
    fn knn_batch(&self, queries: &[f32], k: usize) -> Result<Vec<Vec<Neighbor>>>;

    /// An exact source over other rows (an upper layer's node set, row-major).
    /// By default topk-cpu's exact engine over `data`.
    fn sub_source(&self, data: Vec<f32>, dim: usize, metric: Metric) -> Result<Box<dyn KnnSource>> {
        Ok(Box::new(CpuRetriever::from_rowmajor(data, dim, metric)?))
    }
}

impl KnnSource for CpuRetriever {
    fn rows(&self) -> usize {
        Retriever::len(self)
    }

    fn knn_batch(&self, queries: &[f32], k: usize) -> Result<Vec<Vec<Neighbor>>> {
        let dim = Retriever::dim(self);
        let nq = validate::queries_rowmajor(queries, dim)?;
        let view =
            ArrayView2::from_shape((nq, dim), queries).map_err(|e| HnswError::KnnSource {
                what: format!("{nq} queries of dimension {dim}: {e}"),
            })?;
        let mut out = Vec::with_capacity(nq);
        self.search_batch_into(view, k, &mut out)?;
        Ok(out)
    }
}

impl Hnsw {
    /// Builds an index over row-major `data` (`N × dim`, copied) from the
    /// exact kNN graph that `knn`, an exact engine holding the same rows,
    /// computes (see the `knn_build` module: exact candidates, the
    /// Algorithm 4 heuristic, reverse links).
    ///
    /// Deterministic: the graph, and the saved file, depend only on `data`,
    /// `metric` and `params`, whatever the thread count or the source.
    ///
    /// Errors: parameters out of range ([`HnswError::InvalidParameter`]), a
    /// corpus that breaks a rule of docs/CONTRACTS.md §4
    /// ([`HnswError::Input`]), a source over a different number of rows or
    /// whose answers are not exact ([`HnswError::KnnSource`]), or the
    /// source's own failure.
    pub fn build_from_knn(
        data: &[f32],
        dim: usize,
        metric: Metric,
        params: HnswParams,
        knn: &dyn KnnSource,
    ) -> Result<Self> {
        Self::knn_build(data, dim, metric, params, knn, Schedule::DEFAULT, None)
    }

    /// [`Hnsw::build_from_knn`], calling `progress` with the number of rows
    /// whose layer-0 candidates are in (after every batch of
    /// [`KNN_BATCH_ROWS`], and once with `N` when the graph is done), from
    /// the calling thread. The callback only observes: the index is the one
    /// [`Hnsw::build_from_knn`] builds, bit for bit.
    pub fn build_from_knn_with_progress(
        data: &[f32],
        dim: usize,
        metric: Metric,
        params: HnswParams,
        knn: &dyn KnnSource,
        progress: &(dyn Fn(usize) + Sync),
    ) -> Result<Self> {
        Self::knn_build(
            data,
            dim,
            metric,
            params,
            knn,
            Schedule::DEFAULT,
            Some(progress),
        )
    }

    /// [`Hnsw::build_from_knn`] with topk-cpu's exact batch engine as the
    /// source (on the current rayon pool).
    pub fn build_knn_cpu(
        data: &[f32],
        dim: usize,
        metric: Metric,
        params: HnswParams,
    ) -> Result<Self> {
        // The corpus's rules first, as every build checks them.
        check_corpus(data, dim)?;
        params.validate()?;
        let cpu = CpuRetriever::from_rowmajor(data.to_vec(), dim, metric)?;
        Self::build_from_knn(data, dim, metric, params, &cpu)
    }

    /// The one kNN build, with the schedule as a parameter (the tests vary
    /// it to show the graph does not depend on it).
    pub(crate) fn knn_build(
        data: &[f32],
        dim: usize,
        metric: Metric,
        params: HnswParams,
        knn: &dyn KnnSource,
        schedule: Schedule,
        progress: Progress<'_>,
    ) -> Result<Self> {
        check_corpus(data, dim)?;
        params.validate()?;
        let vectors = Vectors::new(data.to_vec(), dim, metric);
        Self::knn_build_vectors(vectors, params, knn, schedule, progress)
    }

    /// [`Hnsw::knn_build`] over rows already validated and copied.
    pub(crate) fn knn_build_vectors(
        vectors: Vectors,
        params: HnswParams,
        knn: &dyn KnnSource,
        schedule: Schedule,
        progress: Progress<'_>,
    ) -> Result<Self> {
        let graph = knn_graph(&vectors, params, knn, schedule, progress)?;
        Ok(Hnsw::from_parts(params, vectors, graph))
    }
}

/// Candidates per node: `want` (`ef_construction`) capped at
/// [`MAX_KNN_CANDIDATES`], but never below the list capacity `cap`.
fn candidate_count(want: usize, cap: usize) -> usize {
    want.min(MAX_KNN_CANDIDATES).max(cap)
}

/// The nodes of one layer: all rows (layer 0) or an increasing id list.
#[derive(Clone, Copy)]
enum Nodes<'a> {
    All(usize),
    Some(&'a [u32]),
}

impl Nodes<'_> {
    fn len(self) -> usize {
        match self {
            Nodes::All(n) => n,
            Nodes::Some(ids) => ids.len(),
        }
    }

    /// The corpus id of the layer's `local`-th node.
    fn global(self, local: usize) -> u32 {
        match self {
            Nodes::All(_) => local as u32,
            Nodes::Some(ids) => ids[local],
        }
    }

    /// The position of corpus id `id` among the layer's nodes.
    fn local(self, id: u32) -> Option<usize> {
        match self {
            Nodes::All(n) => Some(id as usize).filter(|&i| i < n),
            Nodes::Some(ids) => ids.binary_search(&id).ok(),
        }
    }
}

/// The steps of the module docs: levels, layer 0's lists from `knn`, each
/// upper layer from its nodes' predecessors, then layer 0 written with the
/// lifted layer-1 links, every layer bridged to the entry.
fn knn_graph(
    vectors: &Vectors,
    params: HnswParams,
    knn: &dyn KnnSource,
    schedule: Schedule,
    progress: Progress<'_>,
) -> Result<Graph> {
    let batch_rows = schedule.batch_rows.max(1);
    let n = vectors.len();
    let started = Instant::now();
    if knn.rows() != n {
        return Err(HnswError::KnnSource {
            what: format!("the source holds {} rows, the corpus has {n}", knn.rows()),
        });
    }
    let levels = draw_levels(n, &params);
    let max_level = levels.iter().copied().max().map_or(0, usize::from);
    // The insertion build's entry: the first node drawn on the top layer.
    let entry = levels
        .iter()
        .position(|&l| usize::from(l) == max_level)
        .unwrap_or(0) as u32;
    let links = Links::empty(Layout::new(params.m, params.m0(), levels));

    let lists = layer_lists(
        vectors,
        knn,
        Nodes::All(n),
        params.m0(),
        params.ef_construction,
        batch_rows,
        progress,
    )?;
    let layer0_secs = started.elapsed().as_secs_f64();
    let mut bridges = 0;

    for level in 1..=max_level {
        let ids: Vec<u32> = (0..n as u32)
            .filter(|&i| links.layout.level(i) >= level)
            .collect();
        let nodes = Nodes::Some(&ids);
        let lists = prefix_lists(
            vectors,
            knn,
            &ids,
            params.m,
            params.ef_construction,
            Schedule {
                batch_rows,
                ..schedule
            },
        )?;
        write_layer(&links, nodes, level, &lists);
        bridges += connect_from_entry(vectors, &links, nodes, level, entry, &params)?;
    }
    lift_upper_links(&links, lists);
    bridges += connect_from_entry(vectors, &links, Nodes::All(n), 0, entry, &params)?;
    if let Some(report) = progress {
        report(n);
    }
    tracing::info!(
        n,
        dim = vectors.dim(),
        m = params.m,
        ef_construction = params.ef_construction,
        max_level,
        layer0_secs,
        bridges,
        secs = started.elapsed().as_secs_f64(),
        "hnsw graph built from an exact kNN graph"
    );
    Ok(Graph {
        links: links.freeze(),
        entry,
        max_level,
    })
}

/// The first rows whose layer-0 candidates include their nearest
/// predecessors (step 5 of the module docs). Costs `EARLY_NODES² / 2`
/// scores on the host.
pub const EARLY_NODES: usize = 4096;

/// The first nodes of an upper layer whose predecessors are all scored on
/// the host, without a source.
const HOST_PREFIX: usize = 1024;

/// How the work is cut up: changes the time a build takes, never its graph.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Schedule {
    /// Query rows per [`KnnSource::knn_batch`] call.
    pub(crate) batch_rows: usize,
    /// The first nodes of an upper layer scored on the host ([`HOST_PREFIX`]).
    pub(crate) host_prefix: usize,
}

impl Schedule {
    pub(crate) const DEFAULT: Schedule = Schedule {
        batch_rows: KNN_BATCH_ROWS,
        host_prefix: HOST_PREFIX,
    };
}
