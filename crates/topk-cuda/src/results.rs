//! Results back to the host: the copy of a slot's result rows, and the
//! host's exact selection (docs/CONTRACTS.md §3 key) where the device did
//! not finish a query (K past `max_k`, or more tied candidates than it
//! holds).

use topk_core::order::rank_key;
use topk_core::Neighbor;

use crate::driver::DevSlice;
use crate::engine::Engine;
use crate::error::{CudaError, DriverResult};
use crate::launch::{self, Queue, STATUS_OK, STATUS_OVERFLOW};
use crate::plan::Plan;
use crate::slot::Slot;

impl Engine {
    /// Copies the `nq × (k + 1)` result rows back and waits for the stream.
    pub(crate) fn fetch_results(slot: &mut Slot, nq: usize, k: usize) -> Result<(), CudaError> {
        let s = Queue::Stream(slot.stream.as_inner());
        Self::copy_results(slot, s, nq, k)?;
        slot.stream.synchronize().op("cuStreamSynchronize")
    }

    /// Queues on `s` the copy of the `nq × (k + 1)` result rows to the
    /// pinned host buffer; the host reads them after synchronising the stream.
    pub(crate) fn copy_results(
        slot: &mut Slot,
        s: Queue<'_>,
        nq: usize,
        k: usize,
    ) -> Result<(), CudaError> {
        if slot.mapped() {
            // The kernels wrote the rows into out_host already.
            return Ok(());
        }
        let rows = DevSlice::of(&slot.out).range("results", 0, nq * (k + 1))?;
        launch::d2h(s, &mut slot.out_host, rows)
    }

    /// Reads query `qi`'s results into `out`, finishing it on the host from its
    /// scores when the device path did not (k > max_k or too many ties). A
    /// query of a batch is named by its position in the slot's staged
    /// queries (`rescore`): its scores may have been overwritten by a later
    /// chunk's, so it is scored again alone (the same canonical scores)
    /// before the host selects; a single query's scores are still in row `qi`.
    pub(crate) fn collect(
        &self,
        slot: &mut Slot,
        qi: usize,
        k: usize,
        rescore: Option<usize>,
        out: &mut Vec<Neighbor>,
    ) -> Result<(), CudaError> {
        out.clear();
        if self.planner.device_k(k) {
            let row = &slot.out_host.as_slice()[qi * (k + 1)..(qi + 1) * (k + 1)];
            match row[0].index {
                STATUS_OK => {
                    out.extend(row[1..].iter().map(|r| Neighbor::new(r.index, r.score)));
                    return Ok(());
                }
                STATUS_OVERFLOW => {
                    tracing::debug!(
                        k,
                        "tied candidates over the device cap; selecting on the host"
                    );
                }
                other => {
                    return Err(CudaError::Driver {
                        op: "topk_gather",
                        reason: format!("unknown result status {other}"),
                    })
                }
            }
        }
        match rescore {
            Some(staged) => {
                // The scoring alone, into row 0.
                let query = slot.queries_at(self.dim(), staged, 1)?;
                self.enqueue(slot, Plan::SCORES_ONLY, query, 0, 1, k)?;
                self.select_on_host(slot, 0, k, out)
            }
            None => self.select_on_host(slot, qi, k, out),
        }
    }

    /// The slower exact path: brings query `qi`'s N scores to the host and
    /// selects there with the docs/CONTRACTS.md §3 key.
    pub(crate) fn select_on_host(
        &self,
        slot: &mut Slot,
        qi: usize,
        k: usize,
        out: &mut Vec<Neighbor>,
    ) -> Result<(), CudaError> {
        Self::select_scores_on_host(slot, qi, self.n, k, out)
    }

    /// [`Self::select_on_host`] over query `qi`'s row of `n` scores (rows of
    /// `n` apart in the slot's scores).
    pub(crate) fn select_scores_on_host(
        slot: &mut Slot,
        qi: usize,
        n: usize,
        k: usize,
        out: &mut Vec<Neighbor>,
    ) -> Result<(), CudaError> {
        let row = DevSlice::of(&slot.scores).range("score buffer", qi * n, n)?;
        launch::d2h(
            Queue::Stream(slot.stream.as_inner()),
            &mut slot.scores_host,
            row,
        )?;
        slot.stream.synchronize().op("cuStreamSynchronize")?;
        let scores = &slot.scores_host.as_slice()[..n];
        let mut keys: Vec<u64> = scores
            .iter()
            .enumerate()
            .map(|(i, &s)| rank_key(s, i as u32))
            .collect();
        if k < n {
            keys.select_nth_unstable_by(k - 1, |a, b| b.cmp(a));
            keys.truncate(k);
        }
        keys.sort_unstable_by(|a, b| b.cmp(a));
        out.clear();
        out.extend(keys.iter().map(|&key| {
            let i = u32::MAX - key as u32;
            Neighbor::new(i, scores[i as usize])
        }));
        Ok(())
    }
}
