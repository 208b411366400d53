//! The kNN build on the GPU (feature `cuda`): topk-cuda's exact batch engine
//! as the [`KnnSource`] of [`Hnsw::build_from_knn`].
//!
//! The engine already holds the corpus; every batch of [`crate::KNN_BATCH_ROWS`]
//! corpus rows goes in as queries and their exact top-`c + 1` comes back, with
//! the canonical scores the host-side pruning compares. Upper layers large
//! enough to pay for an engine of their own ([`GPU_LAYER_MIN_ROWS`] rows) are
//! searched on a second engine over their rows, with the first engine's
//! configuration; smaller ones on topk-cpu.

use topk_core::{validate, Metric, Neighbor, Retriever};
use topk_cpu::CpuRetriever;
use topk_cuda::CudaRetriever;

use crate::error::Result;
use crate::gpu::{check_engine, spot_check};
use crate::index::Hnsw;
use crate::knn_build::{KnnSource, Schedule};
use crate::params::HnswParams;
use crate::vectors::Vectors;

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
        params.validate()?;
        validate::corpus(data, dim)?;
        let vectors = Vectors::new(data.to_vec(), dim, metric);
        check_engine(gpu, &vectors)?;
        spot_check(gpu, &vectors)?;
        Self::knn_build_vectors(vectors, params, gpu, Schedule::DEFAULT, None)
    }
}
