//! GPU graph search (feature `cuda`): the whole walk of every query on the
//! device, one block per query and one launch per batch
//! (topk-cuda's `walk_graph`, `kernels/walk.cu`).
//!
//! [`Hnsw::upload_graph`] puts the layer-0 lists and the upper layers next
//! to the engine's resident corpus; [`Hnsw::search_graph_gpu`] then runs
//! the greedy descent and the `ef`-wide beam search of each query inside one
//! kernel, with no host round trip per step. The device walk is the CPU walk
//! restated without an unbounded heap (docs/CONTRACTS.md §13), so a
//! query's answer is the CPU answer, bit for bit, whatever else is in its
//! batch. The few queries the device cannot finish (an allow-list that
//! overflows the on-chip beam, or a walk that ends short of `k`) and the
//! searches the CPU path would not walk at all (`ef ≥ n`, a selective
//! allow-list) are answered by the CPU path, which gives the same answer.

use ndarray::ArrayView2;
use rayon::prelude::*;
use topk_core::{validate, Neighbor};
use topk_cuda::{CudaRetriever, DeviceGraph, GraphLayout, WalkStatus};

use crate::error::{HnswError, Result};
use crate::filter::SlotFilter;
use crate::gpu::{check_engine, spot_check, upper_offsets};
use crate::index::Hnsw;
use crate::params::{check_ef, check_width};

/// An index's graph resident on the device of one engine (which holds the
/// index's rows), from [`Hnsw::upload_graph`].
pub struct GpuGraph<'g> {
    gpu: &'g CudaRetriever,
    graph: DeviceGraph,
    stamp: u64,
}

impl std::fmt::Debug for GpuGraph<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuGraph")
            .field("graph", &self.graph)
            .finish()
    }
}

impl GpuGraph<'_> {
    /// The engine whose corpus the walks score.
    pub fn engine(&self) -> &CudaRetriever {
        self.gpu
    }
}

/// How many queries of a GPU graph search the device finished, and how
/// many the CPU path answered instead.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuWalkCounts {
    /// Walks the device finished.
    pub device: usize,
    /// Queries answered on the CPU path (the whole batch when the CPU path
    /// would not walk the graph, else the walks the device handed back).
    pub host: usize,
}

impl Hnsw {
    /// Uploads this index's graph next to `gpu`'s corpus, which must hold
    /// exactly this index's rows under its metric (checked by shape and by
    /// comparing the scores of sampled rows).
    ///
    /// Errors: [`HnswError::GpuMismatch`] for another corpus, or the
    /// device's errors (out of memory, a degree above
    /// [`topk_cuda::MAX_WALK_DEGREE`]).
    pub fn upload_graph<'g>(&self, gpu: &'g CudaRetriever) -> Result<GpuGraph<'g>> {
        check_engine(gpu, &self.vectors)?;
        spot_check(gpu, &self.vectors)?;
        let links = &self.graph.links;
        let offsets = upper_offsets(links)?;
        let layout = GraphLayout {
            layer0: &links.layer0,
            m0: links.layout.m0,
            upper: &links.upper,
            upper_offset: &offsets,
            levels: &links.layout.levels,
            m: links.layout.m,
            entry: self.graph.entry,
        };
        Ok(GpuGraph {
            gpu,
            graph: gpu.upload_graph(&layout)?,
            stamp: self.stamp,
        })
    }

    /// Searches every row of a `Q × D` batch with beam width `max(ef, k)`
    /// on the device: the same results as [`Hnsw::search_batch_with_ef`].
    pub fn search_graph_gpu(
        &self,
        graph: &GpuGraph<'_>,
        queries: ArrayView2<'_, f32>,
        k: usize,
        ef: usize,
    ) -> Result<Vec<Vec<Neighbor>>> {
        self.search_graph_gpu_counted(graph, queries, k, ef, 1, None)
            .map(|(hits, _)| hits)
    }

    /// [`Hnsw::search_graph_gpu`] over the live slots of `filter`: the same
    /// results as [`Hnsw::search_filtered_with_ef`] for each query.
    pub fn search_graph_gpu_filtered(
        &self,
        graph: &GpuGraph<'_>,
        queries: ArrayView2<'_, f32>,
        k: usize,
        ef: usize,
        filter: &SlotFilter,
    ) -> Result<Vec<Vec<Neighbor>>> {
        self.search_graph_gpu_counted(graph, queries, k, ef, 1, Some(filter))
            .map(|(hits, _)| hits)
    }

    /// The GPU graph search expanding `width` nodes per step (1 ..=
    /// [`crate::MAX_WALK_WIDTH`]), over the live slots of `filter` where
    /// given, with the count of queries each side answered: the same
    /// results as [`Hnsw::search_batch_wide`].
    pub fn search_graph_gpu_counted(
        &self,
        graph: &GpuGraph<'_>,
        queries: ArrayView2<'_, f32>,
        k: usize,
        ef: usize,
        width: usize,
        filter: Option<&SlotFilter>,
    ) -> Result<(Vec<Vec<Neighbor>>, GpuWalkCounts)> {
        let n = self.vectors.len();
        validate::queries(queries, self.vectors.dim())?;
        validate::k(k, n)?;
        check_ef(ef)?;
        check_width(width)?;
        if graph.stamp != self.stamp {
            return Err(HnswError::GpuGraphStale);
        }
        check_engine(graph.gpu, &self.vectors)?;
        let nq = queries.nrows();
        // Who may be returned: the filter's live slots, the live slots, or all.
        let (allowed, allow) = match filter {
            Some(f) => (
                f.count_below_minus(n, &self.deleted),
                Some(SlotFilter::allow_bits(n, Some(f), &self.deleted)),
            ),
            None if self.deleted_count > 0 => (
                self.live_len(),
                Some(SlotFilter::allow_bits(n, None, &self.deleted)),
            ),
            None => (n, None),
        };
        let want = k.min(allowed);
        let ef = ef.max(k);
        let host_one = |i: usize| -> Result<Vec<Neighbor>> {
            let q: Vec<f32> = queries.row(i).iter().copied().collect();
            let mut out = Vec::with_capacity(want);
            self.search_one(&q, k, ef, width, filter, &mut out)?;
            Ok(out)
        };
        if want == 0 || self.scores_directly(allowed, ef) {
            let hits = (0..nq)
                .into_par_iter()
                .map(host_one)
                .collect::<Result<_>>()?;
            return Ok((
                hits,
                GpuWalkCounts {
                    device: 0,
                    host: nq,
                },
            ));
        }
        let flat: std::borrow::Cow<'_, [f32]> = match queries.as_slice() {
            Some(s) => s.into(),
            None => queries.iter().copied().collect::<Vec<f32>>().into(),
        };
        let (mut hits, mut status) = (Vec::new(), Vec::new());
        graph.gpu.walk_graph(
            &graph.graph,
            &flat,
            ef,
            width,
            want,
            allow.as_deref(),
            &mut hits,
            &mut status,
        )?;
        let host: Vec<usize> = (0..nq).filter(|&i| status[i] != WalkStatus::Done).collect();
        let redone: Vec<Vec<Neighbor>> = host
            .par_iter()
            .map(|&i| host_one(i))
            .collect::<Result<_>>()?;
        let mut results: Vec<Vec<Neighbor>> = hits.chunks(want).map(<[Neighbor]>::to_vec).collect();
        for (&i, r) in host.iter().zip(redone) {
            results[i] = r;
        }
        if !host.is_empty() {
            tracing::debug!(
                handed_back = host.len(),
                "GPU walks finished on the CPU path"
            );
        }
        let counts = GpuWalkCounts {
            device: nq - host.len(),
            host: host.len(),
        };
        Ok((results, counts))
    }
}
