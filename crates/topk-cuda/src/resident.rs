//! The mutable resident corpus (docs/CONTRACTS.md §10): rows with external
//! ids added, replaced and removed on the device, searched exactly with or
//! without an allow-list.
//!
//! **Layout.** Device rows are kept in ascending id order, so the engine's
//! tiebreak on the smaller row is the contract's tiebreak on the smaller id
//! and every selection kernel stays exact without change. Rows added above
//! the largest id are appended in place (the common case: ids that grow);
//! rows added below it, and compaction, merge the rows into a fresh buffer
//! with one device gather (`topk_gather_rows`), never re-uploading a stored
//! row. Past the reserved capacity the buffers double by a device copy.
//!
//! **Exclusion.** Removed rows stay stored with their live bit clear until
//! [`ResidentCorpus::compact`] (or a merge) drops them. A search that must
//! skip rows (removed ones, or rows outside its filter) either scores only
//! the allowed rows (a list, when they are at most [`GATHER_FRACTION`] of the
//! stored rows) or scores every row and sets the excluded ones to NaN before
//! the selection (a bitset; NaN ranks below every score, -inf included),
//! asking for at most as many results as rows are allowed; no excluded row
//! reaches a result either way. Batches large enough for the engine's
//! filtered path hide the excluded rows from its lower bounds the same way.

use cust::memory::DeviceBuffer;
use topk_core::{validate, Hit, Metric, Neighbor, MAX_ID};

use crate::device::{self};
use crate::driver::{self, alloc, DevSlice};
use crate::engine::Engine;
use crate::error::{CudaError, DriverResult};
use crate::launch::{self, Queue, FROM_B, STATUS_OK, STATUS_OVERFLOW};
use crate::plan::{PathCounts, Planner};
use crate::slot::Slot;
use crate::{CudaConfig, IdFilter, GATHER_FRACTION};

/// A GPU-resident corpus that changes: rows carry external ids (at most
/// [`MAX_ID`]), added, upserted and removed on the device, searched exactly
/// under the docs/CONTRACTS.md §3 order with the id as the tiebreak.
pub struct ResidentCorpus {
    /// `live` on the device (words for the capacity). Declared before the
    /// engine: fields drop in order, and the engine holds the context.
    live_dev: DeviceBuffer<u64>,
    /// `ids` on the device (room for the capacity): allow-lists are resolved
    /// against it there.
    ids_dev: DeviceBuffer<u64>,
    /// Id of each stored row, strictly ascending.
    ids: Vec<u64>,
    /// One bit per stored row: set while live.
    live: Vec<u64>,
    /// Stored rows whose bit is clear.
    dead: usize,
    engine: Engine,
}

impl Drop for ResidentCorpus {
    fn drop(&mut self) {
        // Frees need the context current on the dropping thread.
        if let Err(e) = self.engine.ctx().make_current() {
            tracing::warn!("topk-cuda: could not make the context current to free: {e}");
        }
    }
}

impl std::fmt::Debug for ResidentCorpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResidentCorpus")
            .field("live", &self.len())
            .field("stored", &self.ids.len())
            .field("capacity", &self.engine.capacity)
            .field("d", &self.engine.dim())
            .field("metric", &self.engine.metric())
            .finish()
    }
}

/// Where a search's queries are: host memory, or device memory of the
/// caller (a torch tensor, say), copied device to device into the slot.
#[derive(Clone, Copy)]
enum Source<'a> {
    Host(&'a [f32]),
    Device(DevSlice<'a, f32>),
}

impl<'a> Source<'a> {
    /// Queries `first..first + count` of rows of `d`.
    fn part(self, first: usize, count: usize, d: usize) -> Result<Source<'a>, CudaError> {
        Ok(match self {
            Source::Host(h) => Source::Host(&h[first * d..(first + count) * d]),
            Source::Device(v) => Source::Device(v.range("device queries", first * d, count * d)?),
        })
    }

    /// Copies these queries into the start of the slot's query buffer.
    fn stage(self, slot: &mut Slot) -> Result<(), CudaError> {
        match self {
            Source::Host(h) => Engine::stage_queries(slot, h),
            Source::Device(v) => {
                let dst = DevSlice::of(&slot.queries).range("query staging", 0, v.len())?;
                launch::d2d(slot.stream.as_inner(), dst, v)
            }
        }
    }
}

/// How a search's allowed rows reach the device.
enum Allowed<'a> {
    /// Every stored row (no row removed).
    Every,
    /// The live rows, under the corpus's live bitset.
    Live,
    /// These stored rows, ascending.
    Rows(&'a [u32]),
    /// The rows whose bits the device resolution set in the slot's allow set.
    DeviceBits,
}

/// A sparse filter's rows as the list path scores them.
#[derive(Clone, Copy)]
enum List<'a> {
    /// Stored rows, ascending, still to be copied to the device.
    Host(&'a [u32]),
    /// The slot's list of `ids.len()` entries resolved on the device (rows
    /// ascending, `NO_ROW` for ids not allowed): position `j` is `ids[j]`.
    Device(&'a [u64]),
}

impl ResidentCorpus {
    /// An empty corpus of `dim`-value rows with device room for `capacity`
    /// rows (at least one) before its first growth.
    ///
    /// Errors: `dim` out of range, limits out of range, no driver or device,
    /// not enough device memory, or [`CudaError::NotCompiled`].
    pub fn new(
        dim: usize,
        metric: Metric,
        config: CudaConfig,
        capacity: usize,
    ) -> Result<Self, CudaError> {
        let engine = Engine::with_capacity(dim, metric, config, capacity)?;
        engine.ctx().make_current()?;
        let live_dev = alloc::<u64>("live rows", engine.capacity.div_ceil(64))?;
        let ids_dev = alloc::<u64>("stored ids", engine.capacity)?;
        Ok(ResidentCorpus {
            ids_dev,
            engine,
            ids: Vec::new(),
            live: Vec::new(),
            live_dev,
            dead: 0,
        })
    }

    /// Live rows.
    pub fn len(&self) -> usize {
        self.ids.len() - self.dead
    }

    /// Whether no row is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stored rows, removed ones included until compaction.
    pub fn stored(&self) -> usize {
        self.ids.len()
    }

    /// Rows the device buffers hold before the next growth.
    pub fn capacity(&self) -> usize {
        self.engine.capacity
    }

    /// Removed rows still stored.
    pub fn tombstones(&self) -> usize {
        self.dead
    }

    /// Values per row.
    pub fn dim(&self) -> usize {
        self.engine.dim()
    }

    /// The metric searches score with.
    pub fn metric(&self) -> Metric {
        self.engine.metric()
    }

    /// The configuration the engine was built with.
    pub fn config(&self) -> &CudaConfig {
        self.engine.config()
    }

    /// Queries served per engine path since construction (unfiltered
    /// searches of a corpus without removed rows).
    pub fn path_counts(&self) -> PathCounts {
        self.engine.path_counts()
    }

    /// Whether `id` is live.
    pub fn contains(&self, id: u64) -> bool {
        self.live_row(id).is_some()
    }

    /// Adds rows (`ids.len()` rows of D values, row-major) under new ids,
    /// all or nothing: an id already live, given twice or above [`MAX_ID`],
    /// a count or width mismatch, or values breaking docs/CONTRACTS.md §4
    /// are errors that change nothing; so is running out of device memory.
    pub fn add(&mut self, ids: &[u64], rows: &[f32]) -> Result<(), CudaError> {
        self.engine.ctx().make_current()?;
        self.check_call(ids, rows)?;
        if let Some((position, &id)) = ids.iter().enumerate().find(|(_, &id)| self.contains(id)) {
            return Err(CudaError::IdPresent { id, position });
        }
        self.insert(ids, rows)
    }

    /// Replaces the rows of live ids and adds the others, all or nothing
    /// (the checks of [`Self::add`], except that a live id is expected).
    pub fn upsert(&mut self, ids: &[u64], rows: &[f32]) -> Result<(), CudaError> {
        self.engine.ctx().make_current()?;
        self.check_call(ids, rows)?;
        let d = self.dim();
        let (mut fresh_ids, mut fresh_rows) = (Vec::new(), Vec::new());
        let (mut old_ids, mut old_rows) = (Vec::new(), Vec::new());
        for (&id, row) in ids.iter().zip(rows.chunks_exact(d)) {
            if self.contains(id) {
                old_ids.push(id);
                old_rows.extend_from_slice(row);
            } else {
                fresh_ids.push(id);
                fresh_rows.extend_from_slice(row);
            }
        }
        // The add may fail on device memory; the overwrite only on a driver
        // fault. Adding first keeps a memory failure from changing anything.
        self.insert(&fresh_ids, &fresh_rows)?;
        if old_ids.is_empty() {
            return Ok(());
        }
        // Rows may have moved in the add: look them up after it.
        let targets: Vec<u32> = old_ids
            .iter()
            .filter_map(|&id| self.live_row(id))
            .map(|r| r as u32)
            .collect();
        let staged = device::upload("upserted rows", &old_rows)?;
        let rows_dev = device::upload("upserted row numbers", &targets)?;
        let e = &self.engine;
        {
            let slot = e.slot()?;
            let s = Queue::Stream(slot.stream.as_inner());
            e.kernels.scatter_rows(
                s,
                DevSlice::of(&staged),
                DevSlice::of(&rows_dev),
                d as u32,
                DevSlice::of(&e.corpus),
            )?;
            slot.stream
                .synchronize()
                .op("cuStreamSynchronize (upsert)")?;
        }
        self.refresh_norms(0, self.ids.len())?;
        self.engine.set_rows(self.ids.len());
        Ok(())
    }

    /// Removes the rows of `ids` from every later result and returns how many
    /// were live (absent ids and repeats are ignored).
    pub fn remove(&mut self, ids: &[u64]) -> Result<usize, CudaError> {
        self.engine.ctx().make_current()?;
        let mut removed = 0;
        for &id in ids {
            if let Some(r) = self.live_row(id) {
                self.live[r / 64] &= !(1 << (r % 64));
                removed += 1;
            }
        }
        if removed > 0 {
            self.dead += removed;
            self.upload_live()?;
        }
        Ok(removed)
    }

    /// Drops every removed row from the device now (one device gather of the
    /// live rows). Changes no result.
    pub fn compact(&mut self) -> Result<(), CudaError> {
        self.engine.ctx().make_current()?;
        if self.dead == 0 {
            return Ok(());
        }
        self.relayout(&[], &[])
    }

    /// The exact top-`k` live rows of each of the `queries` (row-major, D
    /// values each) among those `filter` allows: at most `min(k, allowed)`
    /// hits per query, by descending score, equal scores by ascending id.
    pub fn search(
        &self,
        queries: &[f32],
        k: usize,
        filter: IdFilter<'_>,
    ) -> Result<Vec<Vec<Hit>>, CudaError> {
        let d = self.dim();
        let nq = validate::queries_rowmajor(queries, d)?;
        self.search_source(Source::Host(queries), nq, k, filter)
    }

    /// [`Self::search`] of `nq` queries of D values already in device memory
    /// at `queries` (a raw address of this process's CUDA context, as torch's
    /// `data_ptr()` gives), read with no copy through the host, after the
    /// work queued so far on the caller's `stream` (a raw `CUstream`; 0 is
    /// the default stream). The queries are checked on the device by the
    /// rules of docs/CONTRACTS.md §4 before any is searched. Hits come back
    /// to the host.
    ///
    /// # Safety
    /// The memory at `queries` must stay allocated, and unchanged, until the
    /// call returns. The driver checks that the address lies in a device
    /// allocation long enough for the queries.
    pub unsafe fn search_device(
        &self,
        queries: u64,
        nq: usize,
        k: usize,
        filter: IdFilter<'_>,
        stream: u64,
    ) -> Result<Vec<Vec<Hit>>, CudaError> {
        let d = self.dim();
        self.engine.ctx().make_current()?;
        let values = nq.checked_mul(d).ok_or(CudaError::CountMismatch {
            what: "device query values",
            got: nq,
            expected: d,
        })?;
        if nq == 0 {
            return Ok(Vec::new());
        }
        let view = driver::external::<f32>(queries, values)?;
        {
            let mut slot = self.engine.slot()?;
            let slot = &mut *slot;
            driver::wait_for_stream(&slot.stream, stream)?;
            slot.check_host.as_mut_slice()[0] = u32::MAX;
            let s = Queue::Stream(slot.stream.as_inner());
            let check = DevSlice::of(&slot.check);
            launch::h2d(s, check, &slot.check_host, 0, 1)?;
            self.engine
                .kernels
                .check_queries(s, view, nq as u32, d as u32, check)?;
            launch::d2h(s, &mut slot.check_host, check)?;
            slot.stream
                .synchronize()
                .op("cuStreamSynchronize (query check)")?;
            let bad = slot.check_host.as_slice()[0];
            if bad != u32::MAX {
                return Err(CudaError::BadDeviceQuery {
                    query: bad as usize,
                });
            }
        }
        self.search_source(Source::Device(view), nq, k, filter)
    }

    /// A checked search of `nq` queries from `src`.
    fn search_source(
        &self,
        src: Source<'_>,
        nq: usize,
        k: usize,
        filter: IdFilter<'_>,
    ) -> Result<Vec<Vec<Hit>>, CudaError> {
        if k == 0 {
            return Err(topk_core::Error::ZeroK.into());
        }
        let d = self.dim();
        match filter {
            IdFilter::All => {
                let allowed = if self.dead == 0 {
                    Allowed::Every
                } else {
                    Allowed::Live
                };
                self.search_allowed(src, nq, k, allowed)
            }
            IdFilter::Shared(ids) => self.search_filtered(src, nq, k, ids),
            IdFilter::PerQuery(lists) => {
                if lists.len() != nq {
                    return Err(CudaError::CountMismatch {
                        what: "filters for queries",
                        got: lists.len(),
                        expected: nq,
                    });
                }
                let mut out = Vec::with_capacity(nq);
                for (i, ids) in lists.iter().enumerate() {
                    let q = src.part(i, 1, d)?;
                    out.extend(self.search_filtered(q, 1, k, ids)?);
                }
                Ok(out)
            }
        }
    }

    /// Searches `nq` checked queries over the allowed rows.
    fn search_allowed(
        &self,
        src: Source<'_>,
        nq: usize,
        k: usize,
        allowed: Allowed<'_>,
    ) -> Result<Vec<Vec<Hit>>, CudaError> {
        let n = self.ids.len();
        let count = match allowed {
            Allowed::Every => n,
            Allowed::Live => n - self.dead,
            Allowed::Rows(rows) => rows.len(),
            Allowed::DeviceBits => {
                return Err(CudaError::Driver {
                    op: "resident search",
                    reason: "a device allow set used outside the slot that built it".to_owned(),
                })
            }
        };
        if count == 0 {
            return Ok(vec![Vec::new(); nq]);
        }
        let allowed = match allowed {
            Allowed::Rows(_) if count == n => Allowed::Every,
            other => other,
        };
        if let (Allowed::Every, Source::Host(queries)) = (&allowed, src) {
            return self.search_every(queries, nq, k);
        }
        let mut slot = self.engine.slot()?;
        match allowed {
            Allowed::Rows(rows) if Self::gathers(rows.len(), n) => {
                self.search_list(&mut slot, src, nq, k, List::Host(rows))
            }
            other => self.search_masked(&mut slot, src, nq, k.min(count), other),
        }
    }

    /// Whether `allowed` of `n` stored rows are scored as a list (else
    /// every row under a bitset): a single query scores the list with a warp
    /// per row, a batch gathers it in pieces for the batch kernel.
    fn gathers(allowed: usize, n: usize) -> bool {
        allowed as f64 <= GATHER_FRACTION * n as f64
    }

    /// Searches under an allow-list of ids: resolved to rows on the device
    /// (one binary search per id against the stored ids there, which also
    /// builds the bitset and counts the allowed rows), then scored as a
    /// list or under the bitset by how many rows it allows.
    fn search_filtered(
        &self,
        src: Source<'_>,
        nq: usize,
        k: usize,
        ids: &[u64],
    ) -> Result<Vec<Vec<Hit>>, CudaError> {
        let n = self.ids.len();
        if ids.is_empty() || n == 0 {
            return Ok(vec![Vec::new(); nq]);
        }
        let sorted: std::borrow::Cow<'_, [u64]> = if ids.windows(2).all(|w| w[0] < w[1]) {
            std::borrow::Cow::Borrowed(ids)
        } else {
            let mut v = ids.to_vec();
            v.sort_unstable();
            v.dedup();
            std::borrow::Cow::Owned(v)
        };
        let m = sorted.len();
        let e = &self.engine;
        let mut guard = e.slot()?;
        let slot = &mut *guard;
        if m > slot.want.len() {
            // More ids than rows the slot can hold: resolved on the host.
            drop(guard);
            let rows = self.resolve(&sorted);
            return self.search_allowed(src, nq, k, Allowed::Rows(&rows));
        }
        let words = n.div_ceil(64);
        {
            let s = Queue::Stream(slot.stream.as_inner());
            slot.want_host.as_mut_slice()[..m].copy_from_slice(&sorted);
            let want = DevSlice::of(&slot.want).range("allow-list ids", 0, m)?;
            launch::h2d(s, want, &slot.want_host, 0, m)?;
            let bits = DevSlice::of(&slot.allow).range("allow sets", 0, words)?;
            let stream = slot.stream.as_inner();
            launch::zero_async(stream, bits)?;
            launch::zero_async(stream, DevSlice::of(&slot.count))?;
            let stored = DevSlice::of(&self.ids_dev).range("stored ids", 0, n)?;
            let live = (self.dead > 0).then(|| DevSlice::of(&self.live_dev));
            let rows = DevSlice::of(&slot.list).range("filter rows", 0, m)?;
            e.kernels.resolve_ids(
                s,
                stored,
                n as u32,
                live,
                want,
                rows,
                bits,
                DevSlice::of(&slot.count),
            )?;
            launch::d2h(s, &mut slot.count_host, DevSlice::of(&slot.count))?;
            slot.stream
                .synchronize()
                .op("cuStreamSynchronize (allow-list)")?;
        }
        let allowed = slot.count_host.as_slice()[0] as usize;
        if allowed == 0 {
            return Ok(vec![Vec::new(); nq]);
        }
        if allowed == n {
            if let Source::Host(queries) = src {
                drop(guard);
                return self.search_every(queries, nq, k);
            }
            return self.search_masked(slot, src, nq, k, Allowed::Every);
        }
        let k = k.min(allowed);
        if Self::gathers(allowed, n) {
            self.search_list(slot, src, nq, k, List::Device(&sorted))
        } else {
            self.search_masked(slot, src, nq, k, Allowed::DeviceBits)
        }
    }

    /// Every stored row allowed: the engine's own paths, whose row order is
    /// the id order.
    fn search_every(
        &self,
        queries: &[f32],
        nq: usize,
        k: usize,
    ) -> Result<Vec<Vec<Hit>>, CudaError> {
        let found = if nq == 1 {
            let mut v = Vec::with_capacity(k.min(self.ids.len()));
            self.engine.search_host(queries, k, &mut v)?;
            vec![v]
        } else {
            self.engine.search_batch(queries, k)?
        };
        Ok(found.into_iter().map(|v| self.hits(&v)).collect())
    }

    /// Scores every stored row, hides the excluded ones (none under
    /// `Allowed::Every`), selects `k` (at most the allowed count).
    fn search_masked(
        &self,
        slot: &mut Slot,
        src: Source<'_>,
        nq: usize,
        k: usize,
        allowed: Allowed<'_>,
    ) -> Result<Vec<Vec<Hit>>, CudaError> {
        let e = &self.engine;
        let (n, d) = (self.ids.len(), self.dim());
        let words = n.div_ceil(64);
        if let Allowed::Rows(rows) = allowed {
            let host = &mut slot.allow_host.as_mut_slice()[..words];
            host.fill(0);
            for &r in rows {
                host[r as usize / 64] |= 1 << (r % 64);
            }
            let dst = DevSlice::of(&slot.allow).range("allow sets", 0, words)?;
            launch::h2d(
                Queue::Stream(slot.stream.as_inner()),
                dst,
                &slot.allow_host,
                0,
                words,
            )?;
        }
        let mut out = Vec::with_capacity(nq);
        let chunk = e.sizes.chunk;
        for first in (0..nq).step_by(chunk) {
            let cq = chunk.min(nq - first);
            src.part(first, cq, d)?.stage(slot)?;
            if e.planner.filtered(k, cq) && self.bounded_chunk(slot, cq, k, &allowed, &mut out)? {
                continue;
            }
            let s = Queue::Stream(slot.stream.as_inner());
            let qv = slot.queries_at(d, 0, cq)?;
            let ops = e.operands(slot, qv, cq);
            e.enqueue_scores(s, &ops, None)?;
            if let Some(words_dev) = self.allow_words(slot, &allowed) {
                let scores = DevSlice::of(&slot.scores);
                e.kernels
                    .mask_scores(s, scores, n as u32, cq as u32, words_dev, 0)?;
            }
            self.select_chunk(slot, n, cq, k, &mut out, |row| self.ids[row as usize])?;
        }
        Ok(out)
    }

    /// The device bitset of the allowed rows: the slot's allow set for a
    /// filter, the live rows for removed ones, none when every row is.
    fn allow_words<'s>(
        &'s self,
        slot: &'s Slot,
        allowed: &Allowed<'_>,
    ) -> Option<DevSlice<'s, u64>> {
        match allowed {
            Allowed::Rows(_) | Allowed::DeviceBits => Some(DevSlice::of(&slot.allow)),
            Allowed::Live => Some(DevSlice::of(&self.live_dev)),
            Allowed::Every => None,
        }
    }

    /// The engine's filtered path (tensor-core lower bounds, listing,
    /// canonical rescoring) for a staged chunk of `cq` queries, the excluded
    /// rows hidden from the bounds. Appends the chunk's answers and says true,
    /// or says false (nothing appended) where the bounds did not separate
    /// the top K and the chunk must take the canonical path.
    fn bounded_chunk(
        &self,
        slot: &mut Slot,
        cq: usize,
        k: usize,
        allowed: &Allowed<'_>,
        out: &mut Vec<Vec<Hit>>,
    ) -> Result<bool, CudaError> {
        let e = &self.engine;
        let d = self.dim();
        {
            let stream = slot.stream.as_inner();
            launch::zero32(stream, DevSlice::of(&slot.fcount))?;
            let qv = slot.queries_at(d, 0, cq)?;
            let words = self.allow_words(slot, allowed);
            e.enqueue_filtered_masked(slot, qv, 0, cq, k, words)?;
            let counts = DevSlice::of(&slot.fcount);
            launch::d2h(Queue::Stream(stream), &mut slot.fcount_host, counts)?;
        }
        Engine::fetch_results(slot, cq, k)?;
        let finished = (0..cq).all(|qi| slot.out_host.as_slice()[qi * (k + 1)].index == STATUS_OK);
        if slot.fcount_host.as_slice()[0] != 0 || !finished {
            e.reruns.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Ok(false);
        }
        for qi in 0..cq {
            let row = &slot.out_host.as_slice()[qi * (k + 1)..(qi + 1) * (k + 1)];
            let found: Vec<Neighbor> = row[1..]
                .iter()
                .map(|r| Neighbor::new(r.index, r.score))
                .collect();
            out.push(self.hits(&found));
        }
        Ok(true)
    }

    /// Scores only the listed rows (ascending), selects `k` among them.
    fn search_list(
        &self,
        slot: &mut Slot,
        src: Source<'_>,
        nq: usize,
        k: usize,
        rows: List<'_>,
    ) -> Result<Vec<Vec<Hit>>, CudaError> {
        if nq > 1 {
            let rows: std::borrow::Cow<'_, [u32]> = match rows {
                List::Host(rows) => std::borrow::Cow::Borrowed(rows),
                List::Device(_) => std::borrow::Cow::Owned(self.rows_of_bits(slot)?),
            };
            return self.search_list_batch(slot, src, nq, k, &rows);
        }
        let e = &self.engine;
        let d = self.dim();
        let m = match rows {
            List::Host(rows) => {
                let m = rows.len();
                slot.list_host.as_mut_slice()[..m].copy_from_slice(rows);
                let list = DevSlice::of(&slot.list).range("filter rows", 0, m)?;
                launch::h2d(
                    Queue::Stream(slot.stream.as_inner()),
                    list,
                    &slot.list_host,
                    0,
                    m,
                )?;
                m
            }
            List::Device(ids) => ids.len(),
        };
        let k = k.min(m);
        let mut out = Vec::with_capacity(nq);
        // Chunks whose list scores fit the slot's score buffer.
        let fit = (slot.scores.len() / m).max(1);
        let chunk = e.sizes.chunk.min(fit);
        for first in (0..nq).step_by(chunk) {
            let cq = chunk.min(nq - first);
            src.part(first, cq, d)?.stage(slot)?;
            let s = Queue::Stream(slot.stream.as_inner());
            let qv = slot.queries_at(d, 0, cq)?;
            let ops = e.operands(slot, qv, cq);
            if self.metric() == Metric::Cosine {
                e.kernels
                    .norms(s, qv, cq as u32, d as u32, DevSlice::of(&slot.qnorm))?;
            }
            let list = DevSlice::of(&slot.list).range("filter rows", 0, m)?;
            let scores = DevSlice::of(&slot.scores);
            e.kernels.score_list(s, self.metric(), &ops, list, scores)?;
            match rows {
                List::Host(rows) => self.select_chunk(slot, m, cq, k, &mut out, |pos| {
                    self.ids[rows[pos as usize] as usize]
                })?,
                List::Device(ids) => {
                    self.select_chunk(slot, m, cq, k, &mut out, |pos| ids[pos as usize])?
                }
            }
        }
        Ok(out)
    }

    /// The allowed rows, ascending, of the allow set the device resolution
    /// left in the slot.
    fn rows_of_bits(&self, slot: &mut Slot) -> Result<Vec<u32>, CudaError> {
        let words = self.ids.len().div_ceil(64);
        let bits = DevSlice::of(&slot.allow).range("allow sets", 0, words)?;
        launch::d2h(
            Queue::Stream(slot.stream.as_inner()),
            &mut slot.allow_host,
            bits,
        )?;
        slot.stream
            .synchronize()
            .op("cuStreamSynchronize (allow set)")?;
        let mut rows = Vec::new();
        for (w, &word) in slot.allow_host.as_slice()[..words].iter().enumerate() {
            let mut b = word;
            while b != 0 {
                rows.push((w * 64) as u32 + b.trailing_zeros());
                b &= b - 1;
            }
        }
        Ok(rows)
    }

    /// A batch over a list of allowed rows (ascending): each piece of the
    /// list is gathered into contiguous device memory and scored there by
    /// the engine's batch kernel (the canonical score, §2), its scores copied
    /// into their columns; the selection then runs over the list.
    fn search_list_batch(
        &self,
        slot: &mut Slot,
        src: Source<'_>,
        nq: usize,
        k: usize,
        rows: &[u32],
    ) -> Result<Vec<Vec<Hit>>, CudaError> {
        let e = &self.engine;
        let (c, d) = (rows.len(), self.dim());
        let k = k.min(c);
        slot.list_host.as_mut_slice()[..c].copy_from_slice(rows);
        let list = DevSlice::of(&slot.list).range("filter rows", 0, c)?;
        launch::h2d(
            Queue::Stream(slot.stream.as_inner()),
            list,
            &slot.list_host,
            0,
            c,
        )?;
        let piece = slot.compact_norms.len().min(c);
        let chunk = e.sizes.chunk.min(slot.scores.len() / (c + piece)).max(1);
        let cosine = self.metric() == Metric::Cosine;
        let mut out = Vec::with_capacity(nq);
        for first in (0..nq).step_by(chunk) {
            let cq = chunk.min(nq - first);
            src.part(first, cq, d)?.stage(slot)?;
            let stream = slot.stream.as_inner();
            let s = Queue::Stream(stream);
            let qv = slot.queries_at(d, 0, cq)?;
            let scores = DevSlice::of(&slot.scores);
            for j0 in (0..c).step_by(piece) {
                let p = piece.min(c - j0);
                let map = DevSlice::of(&slot.list).range("filter rows", j0, p)?;
                let compact = DevSlice::of(&slot.compact);
                let corpus = DevSlice::of(&e.corpus);
                e.kernels
                    .gather_rows(s, corpus, corpus, map, d as u32, compact)?;
                let norms = DevSlice::of(&slot.compact_norms);
                if cosine {
                    let rnorm = DevSlice::of(&e.rnorm);
                    e.kernels.gather_rows(s, rnorm, rnorm, map, 1, norms)?;
                }
                let temp = scores.range("piece scores", cq * c, cq * p)?;
                let ops = crate::launch::Operands {
                    corpus: compact.range("gathered rows", 0, p * d)?,
                    rnorm: norms,
                    n: p as u32,
                    d: d as u32,
                    queries: qv,
                    nq: cq as u32,
                    qnorm: DevSlice::of(&slot.qnorm),
                    scores: temp,
                };
                e.enqueue_scores(s, &ops, None)?;
                let dst = scores.skip("list scores", j0)?;
                launch::d2d_2d(stream, dst, c, temp, p, p, cq)?;
            }
            self.select_chunk(slot, c, cq, k, &mut out, |pos| {
                self.ids[rows[pos as usize] as usize]
            })?;
        }
        Ok(out)
    }

    /// Selects `k` of each of the `cq` rows of `n` scores in the slot (rows of
    /// `n` apart), on the device where K allows, finishing on the host what
    /// the device could not; `id_of` maps a selected position to its id.
    fn select_chunk(
        &self,
        slot: &mut Slot,
        n: usize,
        cq: usize,
        k: usize,
        out: &mut Vec<Vec<Hit>>,
        id_of: impl Fn(u32) -> u64,
    ) -> Result<(), CudaError> {
        let e = &self.engine;
        let mut found = Vec::with_capacity(k);
        if !e.planner.device_k(k) {
            for qi in 0..cq {
                Engine::select_scores_on_host(slot, qi, n, k, &mut found)?;
                out.push(Self::hits_of(&found, &id_of));
            }
            return Ok(());
        }
        {
            let s = Queue::Stream(slot.stream.as_inner());
            let bufs = slot.select_bufs(0, k)?;
            let (n32, nq32, k32) = (n as u32, cq as u32, k as u32);
            if n <= e.config.tuning.fuse_rows {
                e.kernels.select_small(s, &bufs, n32, nq32, k32)?;
            } else {
                e.kernels.hist(s, &bufs, n32, nq32, k32)?;
                e.kernels.gather(s, &bufs, n32, nq32, k32)?;
            }
        }
        Engine::fetch_results(slot, cq, k)?;
        for qi in 0..cq {
            let row = &slot.out_host.as_slice()[qi * (k + 1)..(qi + 1) * (k + 1)];
            match row[0].index {
                STATUS_OK => {
                    found.clear();
                    found.extend(row[1..].iter().map(|r| Neighbor::new(r.index, r.score)));
                }
                STATUS_OVERFLOW => {
                    tracing::debug!(
                        k,
                        "tied candidates over the device cap; selecting on the host"
                    );
                    Engine::select_scores_on_host(slot, qi, n, k, &mut found)?;
                }
                other => {
                    return Err(CudaError::Driver {
                        op: "topk_gather",
                        reason: format!("unknown result status {other}"),
                    })
                }
            }
            out.push(Self::hits_of(&found, &id_of));
        }
        Ok(())
    }

    /// Hits of selected stored rows.
    fn hits(&self, found: &[Neighbor]) -> Vec<Hit> {
        Self::hits_of(found, |row| self.ids[row as usize])
    }

    /// Hits of selected positions, their ids by `id_of`.
    fn hits_of(found: &[Neighbor], id_of: impl Fn(u32) -> u64) -> Vec<Hit> {
        found
            .iter()
            .map(|nb| Hit::new(id_of(nb.index), nb.score))
            .collect()
    }

    /// The stored row of a live id.
    fn live_row(&self, id: u64) -> Option<usize> {
        let r = self.ids.binary_search(&id).ok()?;
        (self.live[r / 64] & (1 << (r % 64)) != 0).then_some(r)
    }

    /// The live stored rows of `ids`, ascending: a binary search per id for
    /// a short list, one merge with the stored ids for a long one.
    fn resolve(&self, ids: &[u64]) -> Vec<u32> {
        let mut sorted;
        let ids = if ids.windows(2).all(|w| w[0] < w[1]) {
            ids
        } else {
            sorted = ids.to_vec();
            sorted.sort_unstable();
            sorted.dedup();
            &sorted[..]
        };
        let n = self.ids.len();
        let is_live = |r: usize| self.live[r / 64] & (1 << (r % 64)) != 0;
        let mut rows = Vec::with_capacity(ids.len().min(n));
        if (ids.len() as f64) * (n.max(2) as f64).log2() < n as f64 {
            rows.extend(
                ids.iter()
                    .filter_map(|id| self.ids.binary_search(id).ok())
                    .filter(|&r| is_live(r))
                    .map(|r| r as u32),
            );
        } else {
            let (mut i, mut r) = (0, 0);
            while i < ids.len() && r < n {
                match ids[i].cmp(&self.ids[r]) {
                    std::cmp::Ordering::Less => i += 1,
                    std::cmp::Ordering::Greater => r += 1,
                    std::cmp::Ordering::Equal => {
                        if is_live(r) {
                            rows.push(r as u32);
                        }
                        i += 1;
                        r += 1;
                    }
                }
            }
        }
        rows
    }

    /// The checks every mutation makes before anything changes.
    fn check_call(&self, ids: &[u64], rows: &[f32]) -> Result<(), CudaError> {
        let d = self.dim();
        if rows.len() % d != 0 {
            return Err(topk_core::Error::RaggedCorpus {
                len: rows.len(),
                dim: d,
            }
            .into());
        }
        if ids.len() != rows.len() / d {
            return Err(CudaError::CountMismatch {
                what: "ids for rows",
                got: ids.len(),
                expected: rows.len() / d,
            });
        }
        let mut seen: std::collections::HashMap<u64, usize> =
            std::collections::HashMap::with_capacity(ids.len());
        for (position, &id) in ids.iter().enumerate() {
            if id > MAX_ID {
                return Err(CudaError::IdTooLarge {
                    id,
                    position,
                    max: MAX_ID,
                });
            }
            if let Some(first) = seen.insert(id, position) {
                return Err(CudaError::DuplicateId {
                    id,
                    first,
                    second: position,
                });
            }
        }
        if !rows.is_empty() {
            validate::corpus(rows, d)?;
        }
        let total = self.ids.len() + ids.len();
        if total > u32::MAX as usize / 2 {
            return Err(topk_core::Error::TooManyRows {
                n: total,
                max: u32::MAX as usize / 2,
            }
            .into());
        }
        Ok(())
    }

    /// Stores checked rows under ids that are not live.
    fn insert(&mut self, ids: &[u64], rows: &[f32]) -> Result<(), CudaError> {
        if ids.is_empty() {
            return Ok(());
        }
        let d = self.dim();
        let mut order: Vec<usize> = (0..ids.len()).collect();
        order.sort_unstable_by_key(|&i| ids[i]);
        let sorted_ids: Vec<u64> = order.iter().map(|&i| ids[i]).collect();
        let in_order = order.iter().enumerate().all(|(j, &i)| i == j);
        let permuted;
        let sorted_rows = if in_order {
            rows
        } else {
            permuted = order
                .iter()
                .flat_map(|&i| rows[i * d..(i + 1) * d].iter().copied())
                .collect::<Vec<f32>>();
            &permuted[..]
        };
        if self.ids.last().is_some_and(|&last| sorted_ids[0] <= last) {
            return self.relayout(&sorted_ids, sorted_rows);
        }
        let (n, a) = (self.ids.len(), ids.len());
        self.grow_to(n + a)?;
        let dst = DevSlice::of(&self.engine.corpus).range("corpus", n * d, a * d)?;
        launch::h2d_sync(dst, sorted_rows)?;
        let id_dst = DevSlice::of(&self.ids_dev).range("stored ids", n, a)?;
        launch::h2d_sync(id_dst, &sorted_ids)?;
        self.refresh_norms(n, a)?;
        self.ids.extend_from_slice(&sorted_ids);
        self.live.resize((n + a).div_ceil(64), 0);
        for r in n..n + a {
            self.live[r / 64] |= 1 << (r % 64);
        }
        if self.dead > 0 {
            self.upload_live()?;
        }
        self.engine.set_rows(n + a);
        Ok(())
    }

    /// Rewrites the device rows as the live stored rows merged by id with
    /// `fresh` rows (ascending ids, none live), dropping removed rows: one
    /// gather into a new buffer, the stored rows never leaving the device.
    fn relayout(&mut self, fresh_ids: &[u64], fresh_rows: &[f32]) -> Result<(), CudaError> {
        let d = self.dim();
        let n = self.ids.len();
        let is_live = |r: usize| self.live[r / 64] & (1 << (r % 64)) != 0;
        let mut map = Vec::with_capacity(n - self.dead + fresh_ids.len());
        let mut ids = Vec::with_capacity(map.capacity());
        let (mut r, mut f) = (0, 0);
        loop {
            while r < n && !is_live(r) {
                r += 1;
            }
            let take_old = match (r < n, f < fresh_ids.len()) {
                (true, true) => self.ids[r] < fresh_ids[f],
                (true, false) => true,
                (false, true) => false,
                (false, false) => break,
            };
            if take_old {
                map.push(r as u32);
                ids.push(self.ids[r]);
                r += 1;
            } else {
                map.push(f as u32 | FROM_B);
                ids.push(fresh_ids[f]);
                f += 1;
            }
        }
        let total = map.len();
        let capacity = if total > self.engine.capacity {
            total.max(2 * self.engine.capacity)
        } else {
            self.engine.capacity
        };
        let fresh = device::upload(
            "added rows",
            if fresh_rows.is_empty() {
                &[0.0]
            } else {
                fresh_rows
            },
        )?;
        let map_dev = device::upload("row map", if map.is_empty() { &[0] } else { &map[..] })?;
        let corpus = alloc::<f32>("corpus", capacity * d)?;
        let ids_dev = if capacity > self.engine.capacity {
            Some(alloc::<u64>("stored ids", capacity)?)
        } else {
            None
        };
        let staged = self.engine.staged_growth(capacity)?;
        if total > 0 {
            let e = &self.engine;
            let slot = e.slot()?;
            let s = Queue::Stream(slot.stream.as_inner());
            let map_view = DevSlice::of(&map_dev).range("row map", 0, total)?;
            e.kernels.gather_rows(
                s,
                DevSlice::of(&e.corpus),
                DevSlice::of(&fresh),
                map_view,
                d as u32,
                DevSlice::of(&corpus),
            )?;
            slot.stream
                .synchronize()
                .op("cuStreamSynchronize (relayout)")?;
        }
        self.engine.corpus = corpus;
        if let Some(staged) = staged {
            self.engine.install_growth(staged);
            self.live_dev = alloc::<u64>("live rows", capacity.div_ceil(64))?;
        }
        if let Some(ids_dev) = ids_dev {
            self.ids_dev = ids_dev;
        }
        launch::h2d_sync(DevSlice::of(&self.ids_dev), &ids)?;
        self.ids = ids;
        self.live = vec![0; total.div_ceil(64)];
        for r in 0..total {
            self.live[r / 64] |= 1 << (r % 64);
        }
        self.dead = 0;
        self.refresh_norms(0, total)?;
        self.engine.set_rows(total);
        tracing::debug!(rows = total, capacity, "resident corpus relaid");
        Ok(())
    }

    /// Grows the device buffers to hold `rows` rows (doubling), copying the
    /// stored rows device to device.
    fn grow_to(&mut self, rows: usize) -> Result<(), CudaError> {
        if rows <= self.engine.capacity {
            return Ok(());
        }
        let d = self.dim();
        let n = self.ids.len();
        let capacity = rows.max(2 * self.engine.capacity);
        let corpus = alloc::<f32>("corpus", capacity * d)?;
        let live_dev = alloc::<u64>("live rows", capacity.div_ceil(64))?;
        let ids_dev = alloc::<u64>("stored ids", capacity)?;
        let staged = self.engine.staged_growth(capacity)?;
        if n > 0 {
            let src = DevSlice::of(&self.engine.corpus).range("corpus", 0, n * d)?;
            launch::d2d_sync(DevSlice::of(&corpus), src)?;
            let src = DevSlice::of(&self.ids_dev).range("stored ids", 0, n)?;
            launch::d2d_sync(DevSlice::of(&ids_dev), src)?;
        }
        self.engine.corpus = corpus;
        self.ids_dev = ids_dev;
        if let Some(staged) = staged {
            self.engine.install_growth(staged);
        }
        self.live_dev = live_dev;
        // Norms are recomputed rather than copied: a growth can make
        // filtered batches (which need them) possible for the first time.
        self.refresh_norms(0, n)?;
        if self.dead > 0 {
            self.upload_live()?;
        }
        tracing::debug!(rows = n, capacity, "resident corpus grown on the device");
        Ok(())
    }

    /// Recomputes the norms of rows `first..first + count` where the engine
    /// keeps norms.
    fn refresh_norms(&self, first: usize, count: usize) -> Result<(), CudaError> {
        let e = &self.engine;
        if !e.norms || count == 0 {
            return Ok(());
        }
        let d = self.dim();
        let slot = e.slot()?;
        let s = Queue::Stream(slot.stream.as_inner());
        let rows = DevSlice::of(&e.corpus).range("corpus", first * d, count * d)?;
        let out = DevSlice::of(&e.rnorm).range("row norms", first, count)?;
        e.kernels.norms(s, rows, count as u32, d as u32, out)?;
        slot.stream
            .synchronize()
            .op("cuStreamSynchronize (row norms)")
    }

    /// Copies the live bitset to the device.
    fn upload_live(&self) -> Result<(), CudaError> {
        launch::h2d_sync(DevSlice::of(&self.live_dev), &self.live)
    }
}

/// The buffers of a grown engine, allocated before anything is replaced.
pub(crate) struct Growth {
    capacity: usize,
    rnorm: DeviceBuffer<f32>,
    norms: bool,
    slots: Vec<std::sync::Mutex<Slot>>,
    sizes: crate::slot::Sizes,
}

impl Engine {
    /// The rows in use become `n`: the plan is made again for them and the
    /// slots' query graphs (captured with the old rows and buffers) dropped.
    pub(crate) fn set_rows(&mut self, n: usize) {
        self.n = n;
        self.planner = Planner::new(n, self.dim(), &self.config, self.search_grid.is_some());
        for slot in &mut self.slots {
            let slot = slot.get_mut().unwrap_or_else(|p| p.into_inner());
            slot.graphs = crate::graph::GraphCache::default();
        }
    }

    /// The norm buffer and slots of `capacity` rows when that is more than
    /// the engine holds (`None` otherwise), allocated without touching the
    /// engine so that running out of memory changes nothing.
    pub(crate) fn staged_growth(&self, capacity: usize) -> Result<Option<Growth>, CudaError> {
        if capacity <= self.capacity {
            return Ok(None);
        }
        let shape = Engine::shape_for(capacity, self.dim(), &self.config, self.lists);
        let norms = self.metric() == Metric::Cosine || shape.filter_list > 0;
        let rnorm = alloc::<f32>("row norms", if norms { capacity } else { 1 })?;
        let slots = Engine::make_slots(
            &shape,
            self.config.streams,
            self.map_results,
            self.map_queries,
        )?;
        Ok(Some(Growth {
            capacity,
            rnorm,
            norms,
            slots,
            sizes: shape.sizes,
        }))
    }

    /// Replaces the norm buffer and slots by grown ones (the caller then
    /// recomputes the norms).
    pub(crate) fn install_growth(&mut self, g: Growth) {
        for s in &self.slots {
            let slot = s.lock().unwrap_or_else(|p| p.into_inner());
            if let Err(e) = slot.stream.synchronize() {
                tracing::warn!("topk-cuda: stream error before growth: {e}");
            }
        }
        self.capacity = g.capacity;
        self.rnorm = g.rnorm;
        self.norms = g.norms;
        self.slots = g.slots;
        self.sizes = g.sizes;
    }
}
