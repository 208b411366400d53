//! The batched graph build's device steps (`kernels/prune.cuh`): the
//! neighbour-selection heuristic over listed candidates, one block per job,
//! and the writes of whole layer-0 lists into a resident graph.

use std::ffi::c_void;

use topk_core::Metric;

use super::{allow_shared, fits_shared, kernel_args, metric_slot, Kernels, Launch, Queue};
use crate::driver::DevSlice;
use crate::error::CudaError;

/// Threads of one job's block (`PRUNE_THREADS`).
const PRUNE_THREADS: u32 = 128;
/// Most candidates of one job (`PRUNE_MAX_CANDS`).
pub(crate) const PRUNE_MAX_CANDS: usize = 2048;
/// Most neighbours one job keeps (`PRUNE_MAX_CAP`).
pub(crate) const PRUNE_MAX_CAP: usize = 128;

/// One launch of the selection: job `j` keeps at most `cap` of the
/// candidates of node `base[j]` (at most `max_cands`) into `out[j * cap ..]`
/// (their scores into `out_scores` when given), their count into
/// `counts[j]`. The candidates are the ids `cands[(first + i) * stride]`:
/// `first = off[j]` up to `off[j + 1]`, or, without `off`, `uniform` of them
/// from `j * uniform` (a walk's results, `stride` 2); with `status`, a job
/// whose status is not 0 keeps nothing.
pub(crate) struct PruneArgs<'a> {
    pub(crate) corpus: DevSlice<'a, f32>,
    pub(crate) rnorm: DevSlice<'a, f32>,
    pub(crate) n: u32,
    pub(crate) d: u32,
    pub(crate) base: DevSlice<'a, u32>,
    pub(crate) off: Option<DevSlice<'a, u32>>,
    pub(crate) uniform: u32,
    pub(crate) cands: DevSlice<'a, u32>,
    pub(crate) stride: u32,
    pub(crate) status: Option<DevSlice<'a, u32>>,
    pub(crate) jobs: u32,
    pub(crate) max_cands: u32,
    pub(crate) cap: u32,
    pub(crate) out: DevSlice<'a, u32>,
    pub(crate) out_scores: Option<DevSlice<'a, f32>>,
    pub(crate) counts: DevSlice<'a, u32>,
}

/// One write of `count` whole layer-0 blocks (`stride` = 1 + m0 slots
/// each) to the nodes `nodes`.
pub(crate) struct SetListsArgs<'a> {
    pub(crate) layer0: DevSlice<'a, u32>,
    pub(crate) stride: u32,
    pub(crate) nodes: DevSlice<'a, u32>,
    pub(crate) blocks: DevSlice<'a, u32>,
    pub(crate) count: u32,
}

/// Dynamic shared memory of a job of at most `max_cands` candidates: their
/// keys as scored, two spare keys, then the keys sorted and two more spare
/// (the kernel's `prune_sorted_at`: a vector load of the last key may read
/// the next 8 bytes, which must be neither a key being written nor past
/// the block's memory).
fn prune_smem(max_cands: usize) -> usize {
    let m = max_cands.max(1);
    (((m + 3) & !1) + m + 2) * 8
}

impl Kernels {
    /// Launches the selection of every job on `q`. Checks the buffers'
    /// sizes; the ids and offsets were checked on the host.
    pub(crate) fn prune(
        &self,
        q: Queue<'_>,
        metric: Metric,
        a: &PruneArgs<'_>,
    ) -> Result<(), CudaError> {
        let (n, d, jobs) = (a.n as usize, a.d as usize, a.jobs as usize);
        a.corpus.need("corpus", n * d)?;
        if metric == Metric::Cosine {
            a.rnorm.need("row norms", n)?;
        }
        a.base.need("prune bases", jobs)?;
        match a.off {
            Some(off) => off.need("prune offsets", jobs + 1)?,
            None => a.cands.need(
                "prune candidates",
                (jobs * a.uniform as usize).saturating_sub(1) * a.stride as usize + 1,
            )?,
        }
        if let Some(st) = a.status {
            st.need("prune status", jobs)?;
        }
        a.out.need("pruned lists", jobs * a.cap as usize)?;
        if let Some(sc) = a.out_scores {
            sc.need("pruned scores", jobs * a.cap as usize)?;
        }
        a.counts.need("pruned counts", jobs)?;
        if a.stride == 0 {
            return Err(CudaError::InvalidOption {
                name: "prune candidate stride",
                value: 0,
                reason: "must be at least 1",
            });
        }
        if a.cap == 0 || a.cap as usize > PRUNE_MAX_CAP {
            return Err(CudaError::InvalidOption {
                name: "prune capacity",
                value: a.cap as usize,
                reason: "a job keeps 1 ..= 128 neighbours",
            });
        }
        if a.max_cands as usize > PRUNE_MAX_CANDS {
            return Err(CudaError::InvalidOption {
                name: "prune candidates",
                value: a.max_cands as usize,
                reason: "a job takes at most 2,048 candidates",
            });
        }
        if jobs == 0 {
            return Ok(());
        }
        let f = self.prune[metric_slot(metric)];
        let smem = prune_smem(a.max_cands as usize);
        if !fits_shared(f, smem)? {
            return Err(CudaError::InvalidOption {
                name: "prune shared memory (bytes)",
                value: smem,
                reason: "too many candidates for one block of this device",
            });
        }
        allow_shared(f, smem)?;
        kernel_args!(
            args = [
                corpus = a.corpus.ptr(),
                rnorm = a.rnorm.ptr(),
                d = a.d,
                base = a.base.ptr(),
                off = a.off.map_or(0, |s| s.ptr()),
                uniform = a.uniform,
                cands = a.cands.ptr(),
                stride = a.stride,
                status = a.status.map_or(0, |s| s.ptr()),
                max_cands = a.max_cands,
                cap = a.cap,
                out = a.out.ptr(),
                out_scores = a.out_scores.map_or(0, |s| s.ptr()),
                counts = a.counts.ptr()
            ]
        );
        let launch = Launch::new("topk_prune", f, (a.jobs, 1), PRUNE_THREADS).shared(smem);
        // SAFETY: the parameter list of topk_prune_*; every buffer checked
        // above; bases and candidates below n and offsets increasing inside
        // `cands` by the caller's host check (or the walk's own results, read
        // only for walks that finished); the shared memory allowed above.
        unsafe { launch.run(q, &mut args) }
    }

    /// Launches the write of `a.count` layer-0 blocks on `q`.
    pub(crate) fn set_lists(&self, q: Queue<'_>, a: &SetListsArgs<'_>) -> Result<(), CudaError> {
        let total = a.count as usize * a.stride as usize;
        a.layer0.need("layer-0 lists", a.stride as usize)?;
        a.nodes.need("list nodes", a.count as usize)?;
        a.blocks.need("list blocks", total)?;
        if total == 0 {
            return Ok(());
        }
        kernel_args!(
            args = [
                layer0 = a.layer0.ptr(),
                stride = a.stride,
                nodes = a.nodes.ptr(),
                blocks = a.blocks.ptr(),
                count = a.count
            ]
        );
        let threads = 256u32;
        let blocks = (total.div_ceil(threads as usize)).min(self.sm_count as usize * 8) as u32;
        let launch = Launch::new("topk_set_lists", self.set_lists, (blocks, 1), threads);
        // SAFETY: the parameter list of topk_set_lists; the nodes and blocks
        // buffers checked above; every node below the graph's n (so its
        // block lies inside `layer0`) by the caller's host check.
        unsafe { launch.run(q, &mut args) }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::define;
    use super::*;

    #[test]
    fn host_constants_mirror_the_prune_kernel() {
        let src = include_str!("../../../../kernels/prune.cuh");
        assert_eq!(define(src, "PRUNE_THREADS"), PRUNE_THREADS as usize);
        assert_eq!(define(src, "PRUNE_MAX_CANDS"), PRUNE_MAX_CANDS);
        assert_eq!(define(src, "PRUNE_MAX_CAP"), PRUNE_MAX_CAP);
        assert_eq!(prune_smem(100), (102 + 102) * 8);
        assert_eq!(prune_smem(101), (104 + 103) * 8);
    }
}
