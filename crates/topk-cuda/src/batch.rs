//! Batches: staged a turn of up to the slot's `staged` queries at a time
//! (from the host, or device to device from the caller's device memory),
//! scored and selected a chunk at a time, each chunk by the plan for its
//! size, with one wait per turn.

use topk_core::{validate, Neighbor};

use crate::driver::{self, DevSlice};
use crate::engine::Engine;
use crate::error::{CudaError, DriverResult};
use crate::launch::{self, Kernels, Queue};
use crate::slot::{Sizes, Slot};

/// Where a search's queries are (row-major, D values each): host memory
/// (checked by docs/CONTRACTS.md §4 by the caller, or not yet:
/// `HostUnchecked`), or device memory of the caller (a torch tensor, say),
/// checked there by [`Engine::check_device_queries`] and copied device to
/// device, or not checked yet (`Unchecked`: checked as they are staged).
#[derive(Clone, Copy)]
pub(crate) enum Source<'a> {
    Host(&'a [f32]),
    /// Host queries not checked yet: staged as `Host` ones are, then checked
    /// in place on the device (one kernel), the verdict read when the turn's
    /// results are; a batch at fault is checked on the host to name the
    /// query, column and value ([`Source::fault`]).
    HostUnchecked(&'a [f32]),
    Device(DevSlice<'a, f32>),
    /// Device queries not checked yet: checked as they are staged (one
    /// kernel), the verdict read when the turn's results are.
    Unchecked(DevSlice<'a, f32>),
}

impl<'a> Source<'a> {
    /// How many values of D it holds.
    pub(crate) fn values(&self) -> usize {
        match self {
            Source::Host(h) | Source::HostUnchecked(h) => h.len(),
            Source::Device(v) | Source::Unchecked(v) => v.len(),
        }
    }

    /// Queries `first..first + count` of rows of `d`.
    pub(crate) fn part(
        self,
        first: usize,
        count: usize,
        d: usize,
    ) -> Result<Source<'a>, CudaError> {
        let host = |h: &'a [f32]| {
            h.get(first * d..(first + count) * d)
                .ok_or(CudaError::CountMismatch {
                    what: "host query values",
                    got: h.len(),
                    expected: (first + count) * d,
                })
        };
        Ok(match self {
            Source::Host(h) => Source::Host(host(h)?),
            Source::HostUnchecked(h) => Source::HostUnchecked(host(h)?),
            Source::Device(v) => Source::Device(v.range("device queries", first * d, count * d)?),
            Source::Unchecked(v) => {
                Source::Unchecked(v.range("device queries", first * d, count * d)?)
            }
        })
    }

    /// Copies these queries into the start of the slot's query buffer (of
    /// `d` values each); unchecked ones are checked on the way, their verdict
    /// read by [`Engine::turn_verdict`] once the stream is synchronised.
    pub(crate) fn stage(
        self,
        slot: &mut Slot,
        kernels: &Kernels,
        d: usize,
    ) -> Result<(), CudaError> {
        match self {
            Source::Host(h) => Engine::stage_queries(slot, h),
            Source::HostUnchecked(h) => {
                Engine::stage_queries(slot, h)?;
                Engine::queue_query_check(slot, kernels, d, Check::Staged(h.len() / d.max(1)))
            }
            Source::Device(v) => {
                let dst = DevSlice::of(&slot.queries).range("query staging", 0, v.len())?;
                launch::d2d(slot.stream.as_inner(), dst, v)
            }
            Source::Unchecked(v) => Engine::queue_query_check(slot, kernels, d, Check::Stage(v)),
        }
    }

    /// Whether staging these queries queues their check.
    fn checked_as_staged(&self) -> bool {
        matches!(self, Source::HostUnchecked(_) | Source::Unchecked(_))
    }

    /// The error of a failed check of these queries (of `d` values): for
    /// host queries the host check's (the first query at fault, with its
    /// column and value, as [`validate::queries_rowmajor`] names it); for
    /// device queries, or where the host check finds nothing (a squared norm
    /// within rounding of the bound, summed in another order), `e` itself.
    pub(crate) fn fault(self, e: CudaError, d: usize) -> CudaError {
        match (self, &e) {
            (Source::HostUnchecked(h), CudaError::BadDeviceQuery { .. }) => {
                match validate::queries_rowmajor(h, d) {
                    Err(named) => named.into(),
                    Ok(_) => e,
                }
            }
            _ => e,
        }
    }
}

/// What a query check reads (row-major, D values a query).
#[derive(Clone, Copy)]
pub(crate) enum Check<'a> {
    /// The caller's device queries, read only.
    Caller(DevSlice<'a, f32>),
    /// The caller's device queries, copied into the start of the slot's query
    /// buffer as they are read.
    Stage(DevSlice<'a, f32>),
    /// The first `n` queries already staged in the slot's query buffer.
    Staged(usize),
}

impl Engine {
    /// [`Self::search_batch_from`] row-major host queries, checked by
    /// docs/CONTRACTS.md §4 on the device as they are staged (a batch at
    /// fault is checked again on the host, for its error). Errors come in
    /// the order of the host check's callers: the buffer's shape, the
    /// values, then K.
    pub(crate) fn search_batch(
        &self,
        queries: &[f32],
        k: usize,
    ) -> Result<Vec<Vec<Neighbor>>, CudaError> {
        let d = self.dim();
        if queries.len() % d != 0 || k == 0 {
            validate::queries_rowmajor(queries, d)?;
        }
        self.search_batch_from(Source::HostUnchecked(queries), k)
    }

    /// A batch of row-major queries from `src`: staged a turn of up to the
    /// slot's `staged` queries at a time, whose chunks are all queued before
    /// the host waits once for the turn's results (with K past `max_k`, each
    /// chunk's scores are read back before the next chunk overwrites them).
    pub(crate) fn search_batch_from(
        &self,
        src: Source<'_>,
        k: usize,
    ) -> Result<Vec<Vec<Neighbor>>, CudaError> {
        let d = self.dim();
        let k = validate::k(k, self.len())?;
        let nq = src.values() / d;
        let mut results = Vec::with_capacity(nq);
        let mut slot = self.slot()?;
        let outcome = self.batch_turns(&mut slot, src, nq, k, &mut results);
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
        src: Source<'_>,
        nq: usize,
        k: usize,
        results: &mut Vec<Vec<Neighbor>>,
    ) -> Result<(), CudaError> {
        let d = self.dim();
        let Sizes { staged, chunk } = self.sizes;
        for (t, start) in (0..nq).step_by(staged.max(1)).enumerate() {
            let tq = staged.min(nq - start);
            // The first chunk is the largest: a turn filters any chunk only
            // if it filters that one.
            let filtered = self.planner.filtered(k, chunk.min(tq));
            if filtered {
                launch::zero32(slot.stream.as_inner(), DevSlice::of(&slot.fcount))?;
            }
            let part = src.part(start, tq, d)?;
            part.stage(slot, &self.kernels, d)?;
            let checking = part.checked_as_staged();
            for first in (0..tq).step_by(chunk) {
                let cq = chunk.min(tq - first);
                let plan = self.planner.chunk(k, cq);
                self.paths.add(plan.path, cq);
                let chunk_queries = slot.queries_at(d, first, cq)?;
                self.enqueue(slot, plan, chunk_queries, first, cq, k)?;
                if !plan.device_selects() {
                    if checking && first == 0 {
                        slot.stream
                            .synchronize()
                            .op("cuStreamSynchronize (query check)")?;
                        Self::turn_verdict(slot, start).map_err(|e| src.fault(e, d))?;
                    }
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
                if checking {
                    Self::turn_verdict(slot, start).map_err(|e| src.fault(e, d))?;
                }
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

    /// Checks `nq` queries of D values in the caller's device memory by the
    /// rules of docs/CONTRACTS.md §4, on the device after the work queued
    /// so far on `wait_on` (a raw `CUstream`; 0 is the default stream), and
    /// waits for the verdict: the first query at fault is the error.
    pub(crate) fn check_device_queries(
        &self,
        slot: &mut Slot,
        view: DevSlice<'_, f32>,
        nq: usize,
        wait_on: u64,
    ) -> Result<(), CudaError> {
        driver::wait_for_stream(&slot.stream, wait_on)?;
        let d = self.dim();
        let values = view.range("device queries", 0, nq * d)?;
        Self::queue_query_check(slot, &self.kernels, d, Check::Caller(values))?;
        slot.stream
            .synchronize()
            .op("cuStreamSynchronize (query check)")?;
        Self::turn_verdict(slot, 0)
    }

    /// Queues on the slot's stream the check of the queries `what` names,
    /// and where the verdict is not mapped its copy back;
    /// [`Self::turn_verdict`] reads it once the stream is synchronised.
    pub(crate) fn queue_query_check(
        slot: &mut Slot,
        kernels: &Kernels,
        d: usize,
        what: Check<'_>,
    ) -> Result<(), CudaError> {
        let per = d.max(1);
        let (view, nq, staged) = match what {
            Check::Caller(v) => (v, v.len() / per, None),
            Check::Stage(v) => (
                v,
                v.len() / per,
                Some(slot.queries_at(d, 0, v.len() / per)?),
            ),
            Check::Staged(nq) => (slot.queries_at(d, 0, nq)?, nq, None),
        };
        let s = Queue::Stream(slot.stream.as_inner());
        kernels.check_queries(
            s,
            view,
            nq as u32,
            d as u32,
            staged,
            slot.check_words()?,
            slot.verdict_view()?,
        )?;
        slot.fetch_verdict()
    }

    /// The verdict of the last check queued on `slot` (whose stream the
    /// caller has synchronised since), of queries numbered from `first`.
    pub(crate) fn turn_verdict(slot: &Slot, first: usize) -> Result<(), CudaError> {
        match slot.check_host.as_slice()[0] {
            u32::MAX => Ok(()),
            bad => Err(CudaError::BadDeviceQuery {
                query: first + bad as usize,
            }),
        }
    }

    /// [`Self::search_batch_from`] the `queries.len() / D` queries in the
    /// caller's device memory, after the work queued on `wait_on` (a raw
    /// `CUstream`; 0 is the default stream), their values checked on the
    /// device first.
    pub(crate) fn search_batch_device(
        &self,
        queries: DevSlice<'_, f32>,
        wait_on: u64,
        k: usize,
    ) -> Result<Vec<Vec<Neighbor>>, CudaError> {
        let d = self.dim();
        if queries.len() % d != 0 {
            return Err(CudaError::DeviceBatchLength {
                got: queries.len(),
                expected: d,
            });
        }
        let k = validate::k(k, self.len())?;
        let nq = queries.len() / d;
        if nq == 0 {
            return Ok(Vec::new());
        }
        // Each turn's queries are checked as they are staged (one kernel) and
        // the verdict read with the turn's results: no wait of its own. A
        // turn of values at fault is searched (every kernel is bounded
        // whatever the values) and its answers are dropped for the error.
        let mut slot = self.slot()?;
        driver::wait_for_stream(&slot.stream, wait_on)?;
        let mut results = Vec::with_capacity(nq);
        let outcome = self.batch_turns(&mut slot, Source::Unchecked(queries), nq, k, &mut results);
        if outcome.is_err() {
            // As in search_batch_from: no chunk left running.
            if let Err(e) = slot.stream.synchronize() {
                tracing::debug!("batch stream after an error: {e}");
            }
        }
        outcome.map(|()| results)
    }
}
