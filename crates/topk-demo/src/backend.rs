//! Choosing the engine: one enum variant and one match arm per backend.
//!
//! The rest of the demo only sees a `Box<dyn Retriever>`, so adding an engine
//! (cuda behind the `cuda` feature, hnsw) touches this file alone.

use clap::ValueEnum;
use ndarray::Array2;
use topk_core::{Metric, Retriever};
use topk_cpu::{CpuRetriever, Oracle};
use topk_cuda::{CudaOptions, CudaRetriever};
use topk_hnsw::{Hnsw, HnswParams};

use crate::error::DemoError;

/// The engines `--backend` can pick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// Multi-threaded SIMD search on the CPU.
    Cpu,
    /// Scalar reference: every row scored, one comparator; slow and obviously right.
    Oracle,
    /// GPU-resident corpus (needs a build with `--features cuda`).
    Cuda,
    /// Approximate: an HNSW graph index (`--m`, `--ef-construction`, `--ef`).
    Hnsw,
}

/// Builds the chosen backend over `corpus`, which moves into it when the
/// backend keeps rows in host memory (no second copy of a large corpus).
///
/// `origin` says where the corpus came from, for error messages.
pub fn build(
    kind: BackendKind,
    corpus: Array2<f32>,
    metric: Metric,
    origin: &str,
    hnsw: HnswParams,
) -> Result<Box<dyn Retriever>, DemoError> {
    let dim = corpus.ncols();
    let rejected = |source| DemoError::Corpus {
        origin: origin.to_owned(),
        source,
    };
    Ok(match kind {
        BackendKind::Cpu => Box::new(
            CpuRetriever::from_rowmajor(into_rowmajor(corpus), dim, metric).map_err(rejected)?,
        ),
        BackendKind::Oracle => {
            Box::new(Oracle::from_rowmajor(into_rowmajor(corpus), dim, metric).map_err(rejected)?)
        }
        // Without the `cuda` feature the engine is a stub whose constructor
        // says how to get it (never a link error); with it, a machine without
        // a driver or device gets the driver's reason.
        BackendKind::Cuda => Box::new(
            CudaRetriever::new(corpus.view(), metric, CudaOptions::default()).map_err(
                |source| DemoError::Cuda {
                    origin: origin.to_owned(),
                    source,
                },
            )?,
        ),
        BackendKind::Hnsw => Box::new(
            Hnsw::build_owned(into_rowmajor(corpus), dim, metric, hnsw, true).map_err(
                |source| DemoError::Hnsw {
                    origin: origin.to_owned(),
                    source,
                },
            )?,
        ),
    })
}

/// The row-major values of `a`, reusing its buffer when it already is one.
fn into_rowmajor(a: Array2<f32>) -> Vec<f32> {
    let len = a.len();
    if !a.is_standard_layout() {
        return a.iter().copied().collect();
    }
    let (mut data, offset) = a.into_raw_vec_and_offset();
    let offset = offset.unwrap_or(0);
    if offset == 0 && data.len() == len {
        return data;
    }
    // A standard-layout array over part of its buffer: its values are one run.
    data.truncate(offset + len);
    data.drain(..offset);
    data
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{array, s};

    #[test]
    fn rowmajor_of_any_layout() {
        let a = array![[1.0_f32, 2.0, 3.0], [4.0, 5.0, 6.0]];
        assert_eq!(into_rowmajor(a.clone()), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(
            into_rowmajor(a.t().to_owned()),
            vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
        );
        let mut b = a.clone();
        b.slice_collapse(s![1.., ..]);
        assert_eq!(into_rowmajor(b), vec![4.0, 5.0, 6.0]);
        let mut f = a.reversed_axes();
        f = f.as_standard_layout().into_owned();
        assert_eq!(into_rowmajor(f), vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    }

    #[test]
    #[cfg(not(feature = "cuda"))]
    fn cuda_without_the_feature_says_how_to_get_it() {
        let Err(e) = build(
            BackendKind::Cuda,
            Array2::ones((2, 2)),
            Metric::Dot,
            "x",
            HnswParams::default(),
        ) else {
            panic!("a build without the cuda feature built a cuda backend");
        };
        assert!(e.to_string().contains("--features cuda"), "{e}");
    }
}
