//! Single queries: a host query (replayed as the slot's graph where it
//! can be, else staged and queued step by step), a query already on the
//! device, and the per-stage timing diagnostic.

use cust::event::{Event, EventFlags};
use cust::memory::DeviceSlice;
use cust::stream::{Stream, StreamWaitEventFlags};
use topk_core::{validate, Neighbor};

use crate::driver::{self, DevSlice};
use crate::engine::Engine;
use crate::error::{CudaError, DriverResult};
use crate::graph::QuerySource;
use crate::launch::{self, Queue};
use crate::plan::Plan;
use crate::slot::Slot;

/// Bytes of the pinned staging buffer copied before each piece is queued
/// for the device (see [`Engine::stage_queries`]).
const STAGE_PIECE_BYTES: usize = 256 * 1024;

impl Engine {
    /// Copies `queries` (at most `staged` rows of D) through the pinned
    /// staging buffer to the slot's device query buffer, on its stream. A
    /// large batch goes in pieces of about [`STAGE_PIECE_BYTES`], each
    /// queued for the device as soon as it is in the staging buffer, so the
    /// device copies one piece while the host writes the next. The previous
    /// search on the slot was waited for, so no queued copy still reads the
    /// staging buffer.
    pub(crate) fn stage_queries(slot: &mut Slot, queries: &[f32]) -> Result<(), CudaError> {
        let piece = STAGE_PIECE_BYTES / 4;
        let total = queries.len();
        if total > slot.q_host.len() {
            return Err(CudaError::OverCapacity {
                what: "staged query values",
                got: total,
                max: slot.q_host.len(),
            });
        }
        for start in (0..total).step_by(piece.max(1)) {
            let len = piece.min(total - start);
            slot.q_host.as_mut_slice()[start..start + len]
                .copy_from_slice(&queries[start..start + len]);
            let dst = DevSlice::of(&slot.queries).range("query staging", start, len)?;
            let s = Queue::Stream(slot.stream.as_inner());
            launch::h2d(s, dst, &slot.q_host, start, len)?;
        }
        Ok(())
    }

    /// One host query, end to end.
    pub(crate) fn search_host(
        &self,
        query: &[f32],
        k: usize,
        out: &mut Vec<Neighbor>,
    ) -> Result<(), CudaError> {
        validate::query(query, self.dim())?;
        let k = validate::k(k, self.len())?;
        let plan = self.planner.canonical(k, 1);
        self.paths.add(plan.path, 1);
        let mut slot = self.slot()?;
        if self.planner.graph(k) {
            slot.q_host.as_mut_slice()[..query.len()].copy_from_slice(query);
            if self.run_graph(&mut slot, (k, QuerySource::Host), None)? {
                return self.collect(&mut slot, 0, k, None, out);
            }
        }
        Self::stage_queries(&mut slot, query)?;
        self.finish_one(&mut slot, plan, None, k, out)
    }

    /// Queues `plan` for one query (the caller's device buffer, or else the
    /// slot's first staged query), waits for its results and reads them.
    fn finish_one(
        &self,
        slot: &mut Slot,
        plan: Plan,
        device: Option<DevSlice<'_, f32>>,
        k: usize,
        out: &mut Vec<Neighbor>,
    ) -> Result<(), CudaError> {
        let query = match device {
            Some(q) => q,
            None => slot.queries_at(self.dim(), 0, 1)?,
        };
        self.enqueue(slot, plan, query, 0, 1, k)?;
        if plan.device_selects() {
            Self::fetch_results(slot, 1, k)?;
        }
        self.collect(slot, 0, k, None, out)
    }

    /// One query already on the device. With `wait_on`, the search first waits
    /// (on the device, not the host) for the work queued on that stream.
    pub(crate) fn search_device(
        &self,
        query: &DeviceSlice<f32>,
        wait_on: Option<&Stream>,
        k: usize,
        out: &mut Vec<Neighbor>,
    ) -> Result<(), CudaError> {
        if query.len() != self.dim() {
            return Err(CudaError::DeviceQueryLength {
                got: query.len(),
                expected: self.dim(),
            });
        }
        let k = validate::k(k, self.len())?;
        let plan = self.planner.canonical(k, 1);
        self.paths.add(plan.path, 1);
        let mut slot = self.slot()?;
        if let Some(caller) = wait_on {
            let ev = Event::new(EventFlags::DISABLE_TIMING).op("cuEventCreate")?;
            ev.record(caller).op("cuEventRecord")?;
            slot.stream
                .wait_event(ev, StreamWaitEventFlags::DEFAULT)
                .op("cuStreamWaitEvent")?;
        }
        let view = driver::detached(query);
        if self.planner.graph(k) {
            let key = (k, QuerySource::Device(view.ptr()));
            if slot.graphs.device_graph_wanted(key) && self.run_graph(&mut slot, key, Some(view))? {
                return self.collect(&mut slot, 0, k, None, out);
            }
        }
        self.finish_one(&mut slot, plan, Some(view), k, out)
    }

    /// Device time of each stage of one host query, from events recorded
    /// between the stages (a diagnostic for tuning; the search itself records
    /// none). A one-launch search has the single stage `search`; otherwise
    /// `score` then `select`, with a `threshold` stage only where the
    /// scoring kernel cannot find the threshold itself (D past
    /// the single-query kernel's limit).
    pub(crate) fn stage_times(
        &self,
        query: &[f32],
        k: usize,
    ) -> Result<Vec<(&'static str, f32)>, CudaError> {
        validate::query(query, self.dim())?;
        let k = validate::k(k, self.len())?.min(self.config.max_k);
        let plan = self.planner.canonical(k, 1);
        let mut slot = self.slot()?;
        let slot = &mut *slot;
        let start = Event::new(EventFlags::DEFAULT).op("cuEventCreate")?;
        let mut marks: Vec<(&'static str, Event)> = Vec::with_capacity(4);
        let mut record = |name: &'static str, stream: &Stream| -> Result<(), CudaError> {
            let ev = Event::new(EventFlags::DEFAULT).op("cuEventCreate")?;
            ev.record(stream).op("cuEventRecord")?;
            marks.push((name, ev));
            Ok(())
        };
        start.record(&slot.stream).op("cuEventRecord")?;
        Self::stage_queries(slot, query)?;
        record("h2d", &slot.stream)?;
        let s = Queue::Stream(slot.stream.as_inner());
        let qview = slot.queries_at(self.dim(), 0, 1)?;
        self.enqueue_marked(slot, s, plan, qview, 0, 1, k, &mut |name| {
            record(name, &slot.stream)
        })?;
        let s = Queue::Stream(slot.stream.as_inner());
        Self::copy_results(slot, s, 1, k)?;
        record("d2h", &slot.stream)?;
        slot.stream.synchronize().op("cuStreamSynchronize")?;
        let mut out = Vec::with_capacity(marks.len());
        let mut prev = &start;
        for (name, ev) in &marks {
            let ms = ev.elapsed_time_f32(prev).op("cuEventElapsedTime")?;
            out.push((*name, ms));
            prev = ev;
        }
        Ok(out)
    }
}
