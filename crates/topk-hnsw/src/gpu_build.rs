//! The graph builds on the GPU (feature `cuda`): the batched insertion
//! build with every round's walks and selections on the device
//! ([`Hnsw::build_batched_gpu`]), and topk-cuda's exact batch engine as the
//! [`KnnSource`] of [`Hnsw::build_from_knn`].
//!
//! The engine already holds the corpus; every batch of [`crate::KNN_BATCH_ROWS`]
//! corpus rows goes in as queries and their exact top-`c + 1` comes back, with
//! the canonical scores the host-side pruning compares. Upper layers large
//! enough to pay for an engine of their own ([`GPU_LAYER_MIN_ROWS`] rows) are
//! searched on a second engine over their rows, with the first engine's
//! configuration; smaller ones on topk-cpu.

use ndarray::ArrayView2;
use rayon::prelude::*;
use topk_core::{validate, Metric, Neighbor, Retriever};
use topk_cpu::CpuRetriever;
use topk_cuda::{CudaRetriever, DeviceGraph, GraphLayout, PruneJobs, WalkStatus};

use crate::batch_build::{
    build_with, walk_select_row, BatchEngine, BatchSchedule, CpuBatch, Flat, Jobs, SubEngines,
    MAX_SELECT_CANDIDATES,
};
use crate::error::{HnswError, Result};
use crate::gpu::{check_engine, spot_check, upper_offsets};
use crate::graph::Links;
use crate::index::Hnsw;
use crate::knn_build::{KnnSource, Schedule};
use crate::params::HnswParams;
use crate::search::{Cand, ScratchPool};
use crate::vectors::{check_corpus, Vectors};

/// Rows from which an upper layer's kNN runs on a GPU engine of its own
/// rather than on the CPU: below it, the CPU's `rows²` scores take less time
/// than uploading the rows and building an engine.
pub const GPU_LAYER_MIN_ROWS: usize = 8192;

impl KnnSource for CudaRetriever {
    fn rows(&self) -> usize {
        Retriever::len(self)
    }

    fn knn_batch(&self, queries: &[f32], k: usize) -> Result<Vec<Vec<Neighbor>>> {
        Ok(self.search_batch_rowmajor(queries, k)?)
    }

    fn sub_source(&self, data: Vec<f32>, dim: usize, metric: Metric) -> Result<Box<dyn KnnSource>> {
        let rows = validate::corpus_shape(data.len(), dim)?;
        if rows >= GPU_LAYER_MIN_ROWS {
            let gpu = CudaRetriever::from_rowmajor(data, dim, metric, self.config().clone())?;
            Ok(Box::new(gpu))
        } else {
            Ok(Box::new(CpuRetriever::from_rowmajor(data, dim, metric)?))
        }
    }
}

impl Hnsw {
    /// [`Hnsw::build_from_knn`] with `gpu` as the exact kNN source: an engine
    /// already holding the same rows (`CudaRetriever::from_rowmajor(data,
    /// dim, metric, ..)`). Deterministic, and the same index as
    /// [`Hnsw::build_knn_cpu`] of the same inputs (both engines return the
    /// canonical scores and the §3 order).
    ///
    /// Errors: those of [`Hnsw::build_from_knn`], and
    /// [`crate::HnswError::GpuMismatch`] when the engine holds another shape,
    /// metric or corpus (a sample of its scores is compared bit for bit).
    pub fn build_knn_gpu(
        data: &[f32],
        dim: usize,
        metric: Metric,
        params: HnswParams,
        gpu: &CudaRetriever,
    ) -> Result<Self> {
        check_corpus(data, dim)?;
        params.validate()?;
        let vectors = Vectors::new(data.to_vec(), dim, metric);
        check_engine(gpu, &vectors)?;
        spot_check(gpu, &vectors)?;
        Self::knn_build_vectors(vectors, params, gpu, Schedule::DEFAULT, None)
    }
}

/// The engine a batched build runs on: the caller's, or one of its own
/// over an upper layer's rows.
enum Held<'g> {
    Borrowed(&'g CudaRetriever),
    Owned(Box<CudaRetriever>),
}

impl std::ops::Deref for Held<'_> {
    type Target = CudaRetriever;
    fn deref(&self) -> &CudaRetriever {
        match self {
            Held::Borrowed(g) => g,
            Held::Owned(g) => g,
        }
    }
}

/// The rounds of a batched build on the device: the walks by topk-cuda's
/// `walk_graph_rows` over a resident copy of the graph being built, the
/// selections by `prune_lists`, the changed lists written back with
/// `set_graph_lists`. A walk the device hands back (one that ended short
/// of the nodes asked for) is walked again on the host, which gives the
/// same beam.
struct GpuBatch<'v, 'g> {
    vectors: &'v Vectors,
    gpu: Held<'g>,
    graph: Option<DeviceGraph>,
    pool: ScratchPool,
}

impl<'v, 'g> GpuBatch<'v, 'g> {
    fn new(vectors: &'v Vectors, gpu: Held<'g>) -> Self {
        GpuBatch {
            vectors,
            gpu,
            graph: None,
            pool: ScratchPool::new(vectors.len()),
        }
    }
}

/// A round before `begin` (a bug of the build, never of its input).
const NOT_UPLOADED: HnswError = HnswError::InvalidParameter {
    name: "device graph",
    value: 0,
    reason: "a round ran before the graph was uploaded",
};

impl BatchEngine for GpuBatch<'_, '_> {
    fn begin(&mut self, links: &Links<u32>, entry: u32) -> Result<()> {
        let offsets = upper_offsets(links)?;
        let layout = GraphLayout {
            layer0: &links.layer0,
            m0: links.layout.m0,
            upper: &links.upper,
            upper_offset: &offsets,
            levels: &links.layout.levels,
            m: links.layout.m,
            entry,
        };
        self.graph = None;
        self.graph = Some(self.gpu.upload_graph(&layout)?);
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
        let (mut lists, mut scores, mut counts, mut status) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let graph = self.graph.as_ref().ok_or(NOT_UPLOADED)?;
        let want = want.min(MAX_SELECT_CANDIDATES);
        self.gpu.walk_select_rows(
            graph,
            rows,
            ef,
            want,
            cap,
            &mut lists,
            &mut scores,
            &mut counts,
            &mut status,
        )?;
        let (vectors, pool) = (self.vectors, &self.pool);
        Flat::par_fill(rows.len(), cap, |i, out| {
            if status[i] == WalkStatus::Done {
                let at = i * cap;
                let count = counts[i] as usize;
                for (slot, x) in out.iter_mut().zip(at..at + count) {
                    *slot = Cand::new(lists[x], scores[x]);
                }
                Ok(count)
            } else {
                let kept = walk_select_row(vectors, pool, links, entry, rows[i], ef, want, cap)?;
                out[..kept.len()].copy_from_slice(&kept);
                Ok(kept.len())
            }
        })
    }

    fn select(&mut self, jobs: &Jobs, cap: usize) -> Result<Flat<u32>> {
        let (mut items, mut counts) = (Vec::new(), Vec::new());
        let prune = PruneJobs {
            base: &jobs.base,
            offsets: &jobs.off,
            candidates: &jobs.cands,
        };
        self.gpu.prune_lists(&prune, cap, &mut items, &mut counts)?;
        Ok(Flat { cap, items, counts })
    }

    fn update(&mut self, links: &Links<u32>, nodes: &[u32]) -> Result<()> {
        let stride = 1 + links.layout.m0;
        let mut blocks = vec![0_u32; nodes.len() * stride];
        blocks
            .par_chunks_mut(stride)
            .zip(nodes)
            .for_each(|(block, &v)| {
                block.copy_from_slice(&links.layer0[v as usize * stride..][..stride]);
            });
        let graph = self.graph.as_mut().ok_or(NOT_UPLOADED)?;
        self.gpu.set_graph_lists(graph, nodes, &blocks)?;
        Ok(())
    }
}

/// Engines for the upper layers: a device engine of their own (the
/// caller's configuration) for layers of [`GPU_LAYER_MIN_ROWS`] rows or
/// more, the host below.
struct GpuSubEngines {
    config: topk_cuda::CudaConfig,
}

impl SubEngines for GpuSubEngines {
    fn make<'v>(&self, vectors: &'v Vectors) -> Result<Box<dyn BatchEngine + 'v>> {
        if vectors.len() < GPU_LAYER_MIN_ROWS {
            return Ok(Box::new(CpuBatch::new(vectors)));
        }
        // The engine uploads the rows from the view: no host copy.
        let rows = ArrayView2::from_shape((vectors.len(), vectors.dim()), vectors.data()).map_err(
            |_| HnswError::InvalidParameter {
                name: "upper-layer rows",
                value: vectors.len() as u64,
                reason: "the rows do not fill an N × D view",
            },
        )?;
        let gpu = CudaRetriever::new(rows, vectors.metric(), self.config.clone())?;
        Ok(Box::new(GpuBatch::new(vectors, Held::Owned(Box::new(gpu)))))
    }
}

impl Hnsw {
    /// [`Hnsw::build_batched`] on the device of `gpu`, an engine already
    /// holding the same rows as `data` (taken) (`CudaRetriever::from_rowmajor(data, dim,
    /// metric, ..)`, f32 storage): the same index, bit for bit, with the
    /// walks and selections of every round run on the GPU. Upper layers of
    /// [`GPU_LAYER_MIN_ROWS`] rows or more get an engine of their own.
    ///
    /// Errors: those of [`Hnsw::build_batched`];
    /// [`crate::HnswError::GpuMismatch`] when the engine holds another shape,
    /// metric or corpus; the device's errors (out of memory, `2 m` above
    /// [`topk_cuda::MAX_WALK_DEGREE`]).
    pub fn build_batched_gpu(
        data: Vec<f32>,
        dim: usize,
        metric: Metric,
        params: HnswParams,
        schedule: BatchSchedule,
        gpu: &CudaRetriever,
    ) -> Result<Self> {
        Self::build_batched_gpu_with_progress(data, dim, metric, params, schedule, gpu, None)
    }

    /// [`Hnsw::build_batched_gpu`], calling `progress` with the rows in
    /// layer 0 after every round (the graph does not depend on it).
    pub fn build_batched_gpu_with_progress(
        data: Vec<f32>,
        dim: usize,
        metric: Metric,
        params: HnswParams,
        schedule: BatchSchedule,
        gpu: &CudaRetriever,
        progress: Option<&(dyn Fn(usize) + Sync)>,
    ) -> Result<Self> {
        check_corpus(&data, dim)?;
        params.validate()?;
        let vectors = Vectors::new(data, dim, metric);
        check_engine(gpu, &vectors)?;
        spot_check(gpu, &vectors)?;
        let subs = GpuSubEngines {
            config: gpu.config().clone(),
        };
        let graph = {
            let mut engine = GpuBatch::new(&vectors, Held::Borrowed(gpu));
            build_with(&vectors, &params, schedule, &mut engine, &subs, progress)?
        };
        Ok(Hnsw::from_parts(params, vectors, graph))
    }
}
