//! Building a host backend through the `topk` facade, behind
//! `Box<dyn Retriever>`, so the harness measures every backend through the
//! same trait.

use ndarray::ArrayView2;
use topk::{Backend, HnswParams, Options};
use topk_core::{Metric, Retriever};

use crate::error::{BenchError, Result};

/// Builds a backend that answers on the host (`cpu`, `oracle`); `cpu` with
/// its certified-path state built at open (`Options::prepare_certified`),
/// the steady state of a long-lived retriever, which its first batch of 16
/// queries would build too.
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
        Backend::Cpu | Backend::Oracle => {
            let options = Options::new().prepare_certified(true);
            Ok(topk::open(backend, corpus, metric, &options)?)
        }
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

/// Builds an HNSW index over the corpus (on every rayon thread unless
/// `params.parallel` is false).
pub fn hnsw(
    corpus: ArrayView2<'_, f32>,
    metric: Metric,
    params: HnswParams,
) -> Result<Box<dyn Retriever>> {
    let t = std::time::Instant::now();
    let index = topk::open(Backend::Hnsw, corpus, metric, &Options::new().hnsw(params))?;
    tracing::info!(
        n = corpus.nrows(),
        secs = t.elapsed().as_secs_f64(),
        m = params.m,
        ef_construction = params.ef_construction,
        "built the HNSW index"
    );
    Ok(index)
}
