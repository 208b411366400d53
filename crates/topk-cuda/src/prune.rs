//! The batched graph build's device steps (topk-hnsw's `batch_build`): the
//! neighbour-selection heuristic over listed candidates, and writes of
//! whole layer-0 lists into a resident graph between two rounds of walks.

use cust::memory::CopyDestination;
use cust::stream::{Stream, StreamFlags};
use rayon::prelude::*;
use topk_core::Dtype;

use crate::device::upload;
use crate::driver::{alloc, DevSlice};
use crate::engine::Engine;
use crate::error::{CudaError, DriverResult};
use crate::launch::{self, PruneArgs, Queue, SetListsArgs};
use crate::walk::DeviceGraph;
use crate::walk_layout::PruneJobs;

fn invalid(name: &'static str, value: usize, reason: &'static str) -> CudaError {
    CudaError::InvalidOption {
        name,
        value,
        reason,
    }
}

/// The first id of `ids` that is not a row of a corpus of `n` rows.
pub(crate) fn out_of_range(ids: &[u32], n: usize) -> Option<u32> {
    ids.par_iter().copied().find_first(|&id| id as usize >= n)
}

/// The smallest id that `ids` holds more than once: in parallel, and
/// without a copy when `ids` is strictly increasing (as the batched build
/// passes them).
fn repeated(ids: &[u32]) -> Option<u32> {
    if ids.par_windows(2).all(|w| w[0] < w[1]) {
        return None;
    }
    let mut sorted = ids.to_vec();
    sorted.par_sort_unstable();
    sorted
        .par_windows(2)
        .find_first(|w| w[0] == w[1])
        .map(|w| w[0])
}

impl Engine {
    fn f32_rows(&self, what: &'static str) -> Result<(), CudaError> {
        if self.dtype() != Dtype::F32 {
            return Err(CudaError::BadGraph {
                reason: format!("{what} reads f32 rows; this corpus stores {}", self.dtype()),
            });
        }
        Ok(())
    }

    /// Keeps at most `cap` candidates of every job with the Algorithm 4
    /// heuristic (kernels/prune.cuh), into `out` (`cap` slots per job, the
    /// kept ids first, best first) and `counts` (per job).
    pub(crate) fn prune_lists(
        &self,
        jobs: &PruneJobs<'_>,
        cap: usize,
        out: &mut Vec<u32>,
        counts: &mut Vec<u32>,
    ) -> Result<(), CudaError> {
        self.f32_rows("the neighbour selection")?;
        let n = self.len();
        let nj = jobs.base.len();
        if cap == 0 || cap > launch::PRUNE_MAX_CAP {
            return Err(invalid(
                "prune capacity",
                cap,
                "a job keeps 1 ..= 128 neighbours",
            ));
        }
        if jobs.offsets.len() != nj + 1 {
            return Err(invalid(
                "prune offsets",
                jobs.offsets.len(),
                "need one more offset than jobs",
            ));
        }
        if jobs.offsets[0] != 0 || jobs.offsets[nj] as usize != jobs.candidates.len() {
            return Err(invalid(
                "prune offsets",
                jobs.offsets[nj] as usize,
                "must run from 0 to the number of candidates",
            ));
        }
        let mut max_cands = 0usize;
        for w in jobs.offsets.windows(2) {
            let len = w[1]
                .checked_sub(w[0])
                .ok_or_else(|| invalid("prune offsets", w[1] as usize, "must not decrease"))?
                as usize;
            max_cands = max_cands.max(len);
        }
        if max_cands > launch::PRUNE_MAX_CANDS {
            return Err(invalid(
                "prune candidates",
                max_cands,
                "a job takes at most 2,048 candidates",
            ));
        }
        for ids in [jobs.base, jobs.candidates] {
            if let Some(bad) = out_of_range(ids, n) {
                return Err(invalid(
                    "prune node",
                    bad as usize,
                    "must be a row of the engine's corpus",
                ));
            }
        }
        out.clear();
        counts.clear();
        if nj == 0 {
            return Ok(());
        }
        let (jobs_u32, cap_u32) = (
            u32::try_from(nj).map_err(|_| invalid("prune jobs", nj, "at most 2^32 - 1"))?,
            cap as u32,
        );
        self.ctx().make_current()?;
        let base = upload("prune bases", jobs.base)?;
        let off = upload("prune offsets", jobs.offsets)?;
        let cands = upload(
            "prune candidates",
            if jobs.candidates.is_empty() {
                &[0]
            } else {
                jobs.candidates
            },
        )?;
        let out_d = alloc::<u32>("pruned lists", nj * cap)?;
        let counts_d = alloc::<u32>("pruned counts", nj)?;
        let stream = Stream::new(StreamFlags::NON_BLOCKING, None).op("cuStreamCreate")?;
        let args = PruneArgs {
            corpus: self.corpus.view().as_f32("prune corpus")?,
            rnorm: DevSlice::of(&self.rnorm),
            n: n as u32,
            d: self.dim() as u32,
            base: DevSlice::of(&base),
            off: Some(DevSlice::of(&off)),
            uniform: 0,
            cands: DevSlice::of(&cands),
            stride: 1,
            status: None,
            jobs: jobs_u32,
            max_cands: max_cands as u32,
            cap: cap_u32,
            out: DevSlice::of(&out_d),
            out_scores: None,
            counts: DevSlice::of(&counts_d),
        };
        self.kernels
            .prune(Queue::Stream(stream.as_inner()), self.metric(), &args)?;
        stream.synchronize().op("cuStreamSynchronize")?;
        out.resize(nj * cap, 0);
        counts.resize(nj, 0);
        out_d.copy_to(&mut out[..]).op("cuMemcpyDtoH")?;
        counts_d.copy_to(&mut counts[..]).op("cuMemcpyDtoH")?;
        Ok(())
    }

    /// Replaces the layer-0 lists of `nodes` (distinct) in `graph` with
    /// `blocks` (`1 + m0` slots per node: a count of at most `m0`, then
    /// that many ids of the graph's nodes, then anything).
    pub(crate) fn set_graph_lists(
        &self,
        graph: &mut DeviceGraph,
        nodes: &[u32],
        blocks: &[u32],
    ) -> Result<(), CudaError> {
        let n = self.len();
        if graph.device != self.config.device || graph.n != n {
            return Err(invalid(
                "graph nodes",
                graph.n,
                "the graph was uploaded for another engine",
            ));
        }
        let stride = 1 + graph.m0;
        if blocks.len() != nodes.len() * stride {
            return Err(invalid(
                "list blocks",
                blocks.len(),
                "need 1 + m0 slots per node",
            ));
        }
        if let Some(bad) = out_of_range(nodes, n) {
            return Err(invalid(
                "list node",
                bad as usize,
                "must be a node of the graph",
            ));
        }
        if let Some(v) = repeated(nodes) {
            return Err(invalid("list node", v as usize, "given twice"));
        }
        let bad_block = blocks.par_chunks(stride).find_first(|b| {
            let count = b[0] as usize;
            count > graph.m0 || b[1..=count].iter().any(|&id| id as usize >= n)
        });
        if let Some(b) = bad_block {
            return Err(invalid(
                "list count",
                b[0] as usize,
                "a list holds at most m0 ids of the graph's nodes",
            ));
        }
        if nodes.is_empty() {
            return Ok(());
        }
        let count = u32::try_from(nodes.len())
            .map_err(|_| invalid("list nodes", nodes.len(), "at most 2^32 - 1"))?;
        graph.ctx.make_current()?;
        let nodes_d = upload("list nodes", nodes)?;
        let blocks_d = upload("list blocks", blocks)?;
        let stream = Stream::new(StreamFlags::NON_BLOCKING, None).op("cuStreamCreate")?;
        let args = SetListsArgs {
            layer0: graph.layer0.view(),
            stride: stride as u32,
            nodes: DevSlice::of(&nodes_d),
            blocks: DevSlice::of(&blocks_d),
            count,
        };
        self.kernels
            .set_lists(Queue::Stream(stream.as_inner()), &args)?;
        stream.synchronize().op("cuStreamSynchronize")?;
        Ok(())
    }
}
