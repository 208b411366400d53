//! Building a host backend by name, behind `Box<dyn Retriever>`, so the
//! harness measures every backend through the same trait.

use ndarray::ArrayView2;
use topk_core::{Metric, Retriever};

use crate::config::Backend;
use crate::error::{BenchError, Result};

/// Builds a backend that answers on the host (`cpu`, `oracle`).
///
/// `cuda` goes through [`crate::gpu::Gpu`], which also provides the
/// round-trip path, and `hnsw` through [`hnsw`], which takes graph
/// parameters; asking for either here is an error that says so.
pub fn host(
    backend: Backend,
    corpus: ArrayView2<'_, f32>,
    metric: Metric,
) -> Result<Box<dyn Retriever>> {
    match backend {
        Backend::Cpu => Ok(Box::new(topk_cpu::CpuRetriever::new(corpus, metric)?)),
        Backend::Oracle => Ok(Box::new(topk_cpu::Oracle::new(corpus, metric)?)),
        Backend::Cuda => Err(if cfg!(feature = "cuda") {
            BenchError::BackendUnavailable {
                backend: "cuda",
                reason: "the GPU engine is built by the GPU path, not as a host backend".into(),
            }
        } else {
            BenchError::NoCuda
        }),
        Backend::Hnsw => Err(BenchError::BackendUnavailable {
            backend: "hnsw",
            reason: "an HNSW index is built with graph parameters (see backends::hnsw)".into(),
        }),
    }
}

/// Graph parameters of the HNSW backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HnswFlags {
    /// Links per node (`M`).
    pub m: usize,
    /// Beam width while building.
    pub ef_construction: usize,
    /// Beam width of a search.
    pub ef: usize,
}

impl Default for HnswFlags {
    fn default() -> Self {
        let p = topk_hnsw::HnswParams::default();
        HnswFlags {
            m: p.m,
            ef_construction: p.ef_construction,
            ef: p.ef_search,
        }
    }
}

/// Builds an HNSW index over the corpus on every rayon thread.
pub fn hnsw(
    corpus: ArrayView2<'_, f32>,
    metric: Metric,
    flags: HnswFlags,
) -> Result<Box<dyn Retriever>> {
    let params = topk_hnsw::HnswParams {
        m: flags.m,
        ef_construction: flags.ef_construction,
        ef_search: flags.ef,
        ..topk_hnsw::HnswParams::default()
    };
    let t = std::time::Instant::now();
    let index = topk_hnsw::Hnsw::build_view(corpus, metric, params, true)
        .map_err(|e| BenchError::Topk(topk_core::Error::backend("hnsw", e)))?;
    tracing::info!(
        n = corpus.nrows(),
        secs = t.elapsed().as_secs_f64(),
        m = flags.m,
        ef_construction = flags.ef_construction,
        "built the HNSW index"
    );
    Ok(Box::new(index))
}
