//! Building a host backend by name, behind `Box<dyn Retriever>`, so the
//! harness measures every backend through the same trait.

use ndarray::ArrayView2;
use topk_core::{Metric, Retriever};

use crate::config::Backend;
use crate::error::{BenchError, Result};

/// Builds a backend that answers on the host (`cpu`, `oracle`).
///
/// `cuda` goes through [`crate::gpu::Gpu`], which also provides the
/// round-trip path; asking for it here is an error that says so. `hnsw` is an
/// approximate index and has its own recall/QPS sweep in the topk-hnsw crate;
/// this exact-latency harness refuses it with that explanation.
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
        Backend::Hnsw => Err(hnsw_unavailable()),
    }
}

/// Why this exact-latency harness does not time HNSW.
pub fn hnsw_unavailable() -> BenchError {
    BenchError::BackendUnavailable {
        backend: "hnsw",
        reason: "HNSW is approximate, so it cannot pass the bit-exact gate of this harness; \
                 its recall/QPS sweep lives in the topk-hnsw crate"
            .into(),
    }
}
