//! What every GPU path of the index shares (feature `cuda`): the error
//! conversion and the checks that an engine holds exactly the index's rows.
//! The paths themselves are `gpu_walk` (GPU graph search) and `gpu_build`
//! (the build from the exact GPU engine's kNN graph).

use topk_cuda::{CudaError, CudaRetriever};

use crate::error::{HnswError, Result};
use crate::graph::Links;
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

/// Per node, the start of its first upper-layer block, as the device walk
/// addresses it.
pub(crate) fn upper_offsets(links: &Links<u32>) -> Result<Vec<u32>> {
    links
        .layout
        .upper_offsets()
        .iter()
        .map(|&o| u32::try_from(o))
        .collect::<std::result::Result<Vec<u32>, _>>()
        .map_err(|_| HnswError::InvalidParameter {
            name: "upper-layer slots",
            value: links.upper.len() as u64,
            reason: "the GPU walk addresses at most 2^32 - 2 upper-layer slots",
        })
}
