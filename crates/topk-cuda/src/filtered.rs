//! The filtered batch chunk (`kernels/filter.cu`): tensor-core lower
//! bounds of every score, the selection over them, the listing of the rows
//! whose upper bound reaches the K-th lower bound, their canonical scores
//! and the exact selection among them; and the canonical rerun of a chunk
//! whose bounds did not separate.

use std::sync::atomic::Ordering;

use crate::driver::DevSlice;
use crate::engine::Engine;
use crate::error::CudaError;
use crate::launch::{HalfQueries, Listed, Queue};
use crate::slot::Slot;

impl Engine {
    /// Queues the filtered path for `nq` queries of a batch chunk, results
    /// to rows `first..first + nq` of the turn (`first` a multiple of the
    /// chunk size). `fcount` (zeroed by the caller) gets the chunk's flag
    /// (run it again on the canonical path) and each query's count of
    /// listed rows.
    pub(crate) fn enqueue_filtered(
        &self,
        slot: &Slot,
        queries: DevSlice<'_, f32>,
        first: usize,
        nq: usize,
        k: usize,
    ) -> Result<(), CudaError> {
        self.enqueue_filtered_masked(slot, queries, first, nq, k, None)
    }

    /// [`Self::enqueue_filtered`] with the rows outside `allow` (one bitset
    /// for every query, 64 rows a word) hidden from the lower bounds, so that
    /// only allowed rows are selected, listed and rescored (the mutable
    /// resident corpus; `k` at most the allowed rows).
    pub(crate) fn enqueue_filtered_masked(
        &self,
        slot: &Slot,
        queries: DevSlice<'_, f32>,
        first: usize,
        nq: usize,
        k: usize,
        allow: Option<DevSlice<'_, u64>>,
    ) -> Result<(), CudaError> {
        let s = Queue::Stream(slot.stream.as_inner());
        let chunks = self.sizes.turn_chunks();
        let ci = first / self.sizes.chunk;
        let fcount = DevSlice::of(&slot.fcount);
        let lists = Listed {
            list: DevSlice::of(&slot.flist),
            count: fcount.range("filter counts", chunks + first, nq)?,
            flag: fcount.range("filter flags", ci, 1)?,
        };
        let bufs = slot.select_bufs(first, k)?;
        let ops = self.operands(slot, queries, nq);
        let (k32, metric, ks) = (k as u32, self.metric(), &self.kernels);
        ks.norms(s, queries, ops.nq, ops.d, ops.qnorm)?;
        let half = HalfQueries {
            values: slot.q16.view(),
            inv: DevSlice::of(&slot.q16_inv),
        };
        ks.approx(s, metric, &ops, (slot.q16_inv.len() >= nq).then_some(half))?;
        if let Some(words) = allow {
            ks.mask_scores(s, ops.scores, ops.n, ops.nq, words, 0)?;
        }
        ks.hist(s, &bufs, ops.n, ops.nq, k32)?;
        ks.gather(s, &bufs, ops.n, ops.nq, k32)?;
        ks.filter(s, metric, &ops, bufs.out, k32, &lists)?;
        ks.rescore(s, metric, &ops, &lists)?;
        ks.select_listed(s, &ops, &lists, k32, bufs.out)
    }

    /// After a filtered turn of `tq` queries has finished and its counts
    /// are in `fcount_host`: queues the canonical path for every chunk the
    /// device flagged (its bounds did not separate the top K within the
    /// list's capacity, or its first selection did not finish on the
    /// device) and says whether there were any.
    pub(crate) fn refilter(&self, slot: &mut Slot, tq: usize, k: usize) -> Result<bool, CudaError> {
        let chunk = self.sizes.chunk;
        let chunks = self.sizes.turn_chunks();
        let mut again = false;
        for (ci, first) in (0..tq).step_by(chunk).enumerate() {
            let cq = chunk.min(tq - first);
            let counts = slot.fcount_host.as_slice();
            let listed = &counts[chunks + first..chunks + first + cq];
            let most = listed.iter().copied().max().unwrap_or(0);
            tracing::trace!(
                chunk = ci,
                most,
                "filtered chunk: most rows listed by a query"
            );
            if counts[ci] != 0 {
                tracing::debug!(
                    chunk = ci,
                    most,
                    "bounds did not separate the top K; canonical path"
                );
                let plan = self.planner.canonical(k, cq);
                let chunk_queries = slot.queries_at(self.dim(), first, cq)?;
                self.enqueue(slot, plan, chunk_queries, first, cq, k)?;
                self.reruns.fetch_add(1, Ordering::Relaxed);
                again = true;
            }
        }
        Ok(again)
    }
}
