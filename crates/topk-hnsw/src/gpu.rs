//! GPU-batched distances (feature `cuda`): the walk stays on the host, the
//! distance arithmetic goes to topk-cuda's resident corpus.
//!
//! Every expansion of a walk (greedy descent on the upper layers and the
//! beam search of layer 0, during search and during construction) collects
//! the node's unvisited neighbours and scores them in one
//! [`CudaRetriever::score_ids`] launch. The corpus is uploaded once, with
//! the engine; a launch moves the query and the ids in and the scores out.
//! The GPU computes the canonical score, so it returns the CPU's bits and
//! the walk visits the same nodes in the same order: a sequential build
//! through the GPU yields the byte-identical graph, and a search the
//! identical results (both tested on the device).
//!
//! One query in flight pays a launch and a synchronisation per expansion.
//! [`Hnsw::search_batch_gpu`] keeps many queries in flight instead (the
//! `batched` module): each runs its walk on its own host thread, and a
//! batcher thread merges the pending expansions of up to 64 queries into
//! one launch.

use ndarray::ArrayView2;
use topk_core::{validate, Metric, Neighbor};
use topk_cuda::{CudaError, CudaRetriever};

use crate::batched::BatchEngine;
use crate::build::{build, Mode, ScorerSource};
use crate::error::{HnswError, Result};
use crate::index::Hnsw;
use crate::params::{check_ef, HnswParams};
use crate::search::Scorer;
use crate::vectors::Vectors;

impl From<CudaError> for HnswError {
    fn from(e: CudaError) -> Self {
        HnswError::Gpu {
            source: Box::new(e),
        }
    }
}

/// The engine must hold exactly this corpus under this metric.
pub(crate) fn check_engine(gpu: &CudaRetriever, v: &Vectors) -> Result<()> {
    use topk_core::Retriever;
    if gpu.len() != v.len() || gpu.dim() != v.dim() || gpu.metric() != v.metric() {
        return Err(HnswError::GpuMismatch {
            engine: format!("{} x {} {}", gpu.len(), gpu.dim(), gpu.metric()),
            index: format!("{} x {} {}", v.len(), v.dim(), v.metric()),
        });
    }
    Ok(())
}

/// Queries per `score_ids` launch (the engine's documented ceiling).
const MAX_QUERIES_PER_LAUNCH: usize = 64;

impl BatchEngine for CudaRetriever {
    fn max_queries(&self) -> usize {
        self.config().max_batch.clamp(1, MAX_QUERIES_PER_LAUNCH)
    }

    fn max_ids(&self) -> usize {
        CudaRetriever::max_gather(self).max(1)
    }

    fn score_batch(
        &self,
        queries: &[f32],
        ids: &[u32],
        offsets: &[usize],
        out: &mut [f32],
    ) -> Result<()> {
        Ok(self.score_ids(queries, ids, offsets, out)?)
    }
}

/// Scores up to 16 rows spread over the corpus on both sides and compares
/// the bits: an engine loaded with other rows (same shape) would otherwise
/// steer the walk with foreign distances without any error.
pub(crate) fn spot_check(gpu: &CudaRetriever, v: &Vectors) -> Result<()> {
    let n = v.len();
    let step = n.div_ceil(16).max(1);
    let ids: Vec<u32> = (0..n).step_by(step).map(|i| i as u32).collect();
    let q = v.row_query(0);
    let mut got = vec![0.0_f32; ids.len()];
    gpu.score_ids(q.values, &ids, &[0, ids.len()], &mut got)?;
    for (&id, &g) in ids.iter().zip(&got) {
        let want = v.score(q, id);
        if g.to_bits() != want.to_bits() {
            return Err(HnswError::GpuMismatch {
                engine: format!("row 0 vs row {id} scores {g}"),
                index: format!("{want} on the CPU"),
            });
        }
    }
    Ok(())
}

/// One query, one launch per expansion (chunked at the engine's capacity).
struct DirectScorer<'a> {
    gpu: &'a CudaRetriever,
    query: &'a [f32],
}

impl Scorer for DirectScorer<'_> {
    fn score_ids(&mut self, ids: &[u32], out: &mut [f32]) -> Result<()> {
        let cap = self.gpu.max_gather().max(1);
        for (chunk, o) in ids.chunks(cap).zip(out.chunks_mut(cap)) {
            self.gpu
                .score_ids(self.query, chunk, &[0, chunk.len()], o)?;
        }
        Ok(())
    }
}

/// Construction through the GPU: the node being inserted is the query.
struct GpuSource<'a> {
    vectors: &'a Vectors,
    gpu: &'a CudaRetriever,
}

impl ScorerSource for GpuSource<'_> {
    type Scorer<'s>
        = DirectScorer<'s>
    where
        Self: 's;

    fn for_row(&self, row: u32) -> Result<DirectScorer<'_>> {
        Ok(DirectScorer {
            gpu: self.gpu,
            query: self.vectors.row(row),
        })
    }
}

impl Hnsw {
    /// Builds an index whose layer searches score through `gpu`, an engine
    /// already holding the same rows (`CudaRetriever::from_rowmajor(data, dim,
    /// metric, ..)`), on every rayon thread or on one as
    /// [`HnswParams::parallel`] says. Sequential builds are byte-identical to
    /// [`Hnsw::build`].
    pub fn build_gpu(
        data: &[f32],
        dim: usize,
        metric: Metric,
        params: HnswParams,
        gpu: &CudaRetriever,
    ) -> Result<Self> {
        params.validate()?;
        validate::corpus(data, dim)?;
        let vectors = Vectors::new(data.to_vec(), dim, metric);
        check_engine(gpu, &vectors)?;
        spot_check(gpu, &vectors)?;
        let mode = if params.parallel {
            Mode::Parallel
        } else {
            Mode::Sequential
        };
        let graph = build(
            &vectors,
            &GpuSource {
                vectors: &vectors,
                gpu,
            },
            params,
            mode,
            None,
        )?;
        Ok(Hnsw::from_parts(params, vectors, graph))
    }

    /// [`Hnsw::search_with_ef`] with distances from `gpu` (one launch per
    /// expansion). Same results as the CPU path.
    pub fn search_gpu(
        &self,
        gpu: &CudaRetriever,
        query: &[f32],
        k: usize,
        ef: usize,
        out: &mut Vec<Neighbor>,
    ) -> Result<()> {
        validate::query(query, self.vectors.dim())?;
        validate::k(k, self.vectors.len())?;
        check_ef(ef)?;
        check_engine(gpu, &self.vectors)?;
        let mut scorer = DirectScorer { gpu, query };
        let mut sc = self.pool.take();
        let r = self.search_scored(&mut scorer, k, ef, &mut sc, out);
        self.pool.put(sc);
        r
    }

    /// Searches a `Q × D` batch with `in_flight` walks running at once, their
    /// expansions merged into shared launches (up to 64 queries each). Same
    /// results as the CPU path.
    pub fn search_batch_gpu(
        &self,
        gpu: &CudaRetriever,
        queries: ArrayView2<'_, f32>,
        k: usize,
        ef: usize,
        in_flight: usize,
    ) -> Result<Vec<Vec<Neighbor>>> {
        check_engine(gpu, &self.vectors)?;
        spot_check(gpu, &self.vectors)?;
        self.search_in_flight(gpu, queries, k, ef, in_flight)
    }
}
