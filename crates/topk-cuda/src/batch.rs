//! Batches: staged a turn of up to the slot's `staged` queries at a time,
//! scored and selected a chunk at a time, each chunk by the plan for its
//! size, with one wait per turn.

use topk_core::{validate, Neighbor};

use crate::driver::DevSlice;
use crate::engine::Engine;
use crate::error::CudaError;
use crate::launch::{self, Queue};
use crate::slot::{Sizes, Slot};

impl Engine {
    /// A batch of `nq` row-major queries: staged a turn of up to the slot's
    /// `staged` queries at a time, whose chunks are all queued before the
    /// host waits once for the turn's results (with K past `max_k`, each
    /// chunk's scores are read back before the next chunk overwrites them).
    pub(crate) fn search_batch(
        &self,
        queries: &[f32],
        k: usize,
    ) -> Result<Vec<Vec<Neighbor>>, CudaError> {
        let d = self.dim();
        let k = validate::k(k, self.len())?;
        let nq = queries.len() / d;
        let mut results = Vec::with_capacity(nq);
        let mut slot = self.slot()?;
        let outcome = self.batch_turns(&mut slot, queries, k, &mut results);
        if outcome.is_err() {
            // A failure part way through a turn can leave its earlier chunks
            // running; let them finish, so that none of them writes a result
            // header after the slot's next search has marked it pending.
            if let Err(e) = slot.stream.synchronize() {
                tracing::debug!("batch stream after an error: {e}");
            }
        }
        outcome.map(|()| results)
    }

    /// The turns of [`Self::search_batch`] on `slot`, appending each query's
    /// answer to `results`.
    fn batch_turns(
        &self,
        slot: &mut Slot,
        queries: &[f32],
        k: usize,
        results: &mut Vec<Vec<Neighbor>>,
    ) -> Result<(), CudaError> {
        let d = self.dim();
        let Sizes { staged, chunk } = self.sizes;
        for (t, turn) in queries.chunks(staged * d).enumerate() {
            let tq = turn.len() / d;
            // The first chunk is the largest: a turn filters any chunk only
            // if it filters that one.
            let filtered = self.planner.filtered(k, chunk.min(tq));
            if filtered {
                launch::zero32(slot.stream.as_inner(), DevSlice::of(&slot.fcount))?;
            }
            Self::stage_queries(slot, turn)?;
            for first in (0..tq).step_by(chunk) {
                let cq = chunk.min(tq - first);
                let plan = self.planner.chunk(k, cq);
                self.paths.add(plan.path, cq);
                let chunk_queries = slot.queries_at(d, first, cq)?;
                self.enqueue(slot, plan, chunk_queries, first, cq, k)?;
                if !plan.device_selects() {
                    for qi in 0..cq {
                        let mut v = Vec::with_capacity(k);
                        self.select_on_host(slot, qi, k, &mut v)?;
                        results.push(v);
                    }
                }
            }
            if self.planner.device_k(k) {
                if filtered {
                    // Read on the host after fetch_results waits.
                    let counts = DevSlice::of(&slot.fcount);
                    let s = Queue::Stream(slot.stream.as_inner());
                    launch::d2h(s, &mut slot.fcount_host, counts)?;
                }
                Self::fetch_results(slot, tq, k)?;
                if filtered && self.refilter(slot, tq, k)? {
                    Self::fetch_results(slot, tq, k)?;
                }
                for qi in 0..tq {
                    let mut v = Vec::with_capacity(k);
                    self.collect(slot, qi, k, Some(qi), &mut v)?;
                    results.push(v);
                }
            }
            tracing::trace!(turn = t, queries = tq, chunk, "batch turn done");
        }
        Ok(())
    }
}
