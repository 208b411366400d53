//! The subjects of this workspace's backends, one per path: the CPU
//! retriever on each kernel path, the oracle, the GPU engine on each plan
//! path (which must serve at least one query), and the HNSW index.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use topk_core::{Dtype, Error, RowStore};
use topk_cpu::{CpuRetriever, Kernels, Oracle, Path};
use topk_cuda::{CudaConfig, CudaError, CudaRetriever, PlanPath};
use topk_hnsw::{Hnsw, HnswError, HnswParams};

use crate::conformance::Subject;

/// A backend of this workspace on one of its paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Label {
    /// [`CpuRetriever`] forced onto one kernel path.
    Cpu(Path),
    /// The scalar reference itself.
    Oracle,
    /// [`CpuRetriever`] on one kernel path over a corpus stored at a half
    /// width (docs/CONTRACTS.md §14).
    CpuStored(Path, Dtype),
    /// The oracle over a corpus stored at a half width.
    OracleStored(Dtype),
    /// [`CudaRetriever`] tuned so that `PlanPath` serves every shape it can;
    /// the tester fails when that path served no query.
    Cuda(PlanPath),
    /// The HNSW index, built sequentially (approximate: input rules only,
    /// plus the shape and scores of its answers).
    Hnsw,
}

impl Label {
    /// The CPU kernel paths this machine runs.
    pub fn cpu_paths() -> Vec<Label> {
        Path::available().into_iter().map(Label::Cpu).collect()
    }

    /// Every CPU kernel path this machine runs, and the oracle, over each
    /// half-width storage type.
    pub fn cpu_stored() -> Vec<Label> {
        let mut out = Vec::new();
        for dtype in [Dtype::F16, Dtype::Bf16] {
            out.push(Label::OracleStored(dtype));
            out.extend(
                Path::available()
                    .into_iter()
                    .map(|p| Label::CpuStored(p, dtype)),
            );
        }
        out
    }

    /// Every plan path of the GPU engine.
    pub fn cuda_paths() -> Vec<Label> {
        PlanPath::ALL.iter().copied().map(Label::Cuda).collect()
    }

    /// The subject that opens this backend on this path.
    pub fn subject(self) -> Subject<'static> {
        let label = self.to_string();
        match self {
            Label::Cpu(path) => Subject::exact(label, move |data, dim, metric| {
                let kernels = Kernels::new(path)?;
                Ok(Box::new(
                    CpuRetriever::from_rowmajor(data, dim, metric)?.with_kernels(kernels),
                ))
            }),
            Label::Oracle => Subject::exact(label, |data, dim, metric| {
                Ok(Box::new(Oracle::from_rowmajor(data, dim, metric)?))
            }),
            Label::CpuStored(path, dtype) => Subject::exact(label, move |data, dim, metric| {
                let kernels = Kernels::new(path)?;
                let store = RowStore::from_f32(data, dim, dtype)?;
                Ok(Box::new(
                    CpuRetriever::from_store(store, metric)?.with_kernels(kernels),
                ))
            })
            .stored_as(dtype),
            Label::OracleStored(dtype) => Subject::exact(label, move |data, dim, metric| {
                Ok(Box::new(Oracle::from_store(
                    RowStore::from_f32(data, dim, dtype)?,
                    metric,
                )?))
            })
            .stored_as(dtype),
            Label::Hnsw => Subject::approximate(label, |data, dim, metric| {
                let params = HnswParams {
                    parallel: false,
                    ..HnswParams::default()
                };
                Ok(Box::new(
                    Hnsw::from_rowmajor(data, dim, metric, params).map_err(hnsw_error)?,
                ))
            }),
            Label::Cuda(path) => cuda_subject(label, path),
        }
    }
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Label::Cpu(path) => write!(f, "cpu/{path}"),
            Label::Oracle => f.write_str("oracle"),
            Label::CpuStored(path, dtype) => write!(f, "cpu/{path}/{dtype}"),
            Label::OracleStored(dtype) => write!(f, "oracle/{dtype}"),
            Label::Cuda(path) => write!(f, "cuda/{path}"),
            Label::Hnsw => f.write_str("hnsw"),
        }
    }
}

/// The input rules as topk-core errors, anything else as a backend error.
fn hnsw_error(e: HnswError) -> Error {
    match e {
        HnswError::Input(e) => e,
        e => Error::backend("hnsw", e),
    }
}

fn cuda_error(e: CudaError) -> Error {
    match e {
        CudaError::Input(e) => e,
        e => Error::backend("cuda", e),
    }
}

/// Engines opened with `CudaConfig::for_path(path)`, and a final check that
/// they served at least one query on `path`.
fn cuda_subject(label: String, path: PlanPath) -> Subject<'static> {
    let engines: Arc<Mutex<Vec<Arc<CudaRetriever>>>> = Arc::default();
    let opened = Arc::clone(&engines);
    Subject::exact(label, move |data, dim, metric| {
        let engine = CudaRetriever::from_rowmajor(data, dim, metric, CudaConfig::for_path(path))
            .map_err(cuda_error)?;
        let engine = Arc::new(engine);
        opened
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::clone(&engine));
        Ok(Box::new(engine))
    })
    .after(move || {
        let engines = engines.lock().unwrap_or_else(PoisonError::into_inner);
        let served: u64 = engines.iter().map(|e| e.path_counts().get(path)).sum();
        if served == 0 {
            let all: Vec<String> = PlanPath::ALL
                .iter()
                .map(|&p| {
                    let n: u64 = engines.iter().map(|e| e.path_counts().get(p)).sum();
                    format!("{p} {n}")
                })
                .collect();
            return Err(format!(
                "the labelled path {path} served no query (served: {})",
                all.join(", ")
            ));
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_name_their_path() {
        assert_eq!(Label::Cpu(Path::Scalar).to_string(), "cpu/scalar");
        assert_eq!(
            Label::Cuda(PlanPath::OneLaunch).to_string(),
            "cuda/one-launch"
        );
        assert!(Label::cpu_paths().contains(&Label::Cpu(Path::Scalar)));
        assert_eq!(Label::cuda_paths().len(), PlanPath::ALL.len());
    }
}
