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
//! the allowed rows (a list, when they are at most [`crate::GATHER_FRACTION`] of the
//! stored rows) or scores every row and sets the excluded ones to NaN before
//! the selection (a bitset; NaN ranks below every score, -inf included),
//! asking for at most as many results as rows are allowed; no excluded row
//! reaches a result either way. Batches large enough for the engine's
//! filtered path hide the excluded rows from its lower bounds the same way.

#[cfg(test)]
mod fault_tests;

mod growth;
mod search;

use std::borrow::Cow;

use cust::memory::DeviceBuffer;
use topk_core::{validate, Dtype, IdProblem, Metric, RowStore, MAX_ID};

use crate::device::{self};
use crate::driver::{alloc, DevSlice, RowBuf, Rows};
use crate::engine::Engine;
use crate::error::{CudaError, DriverResult};
use crate::launch::{self, Queue, FROM_B};
use crate::plan::PathCounts;
use crate::CudaConfig;

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
        Self::with_dtype(dim, Dtype::F32, metric, config, capacity)
    }

    /// [`Self::new`] for rows stored as `dtype` on the device
    /// (docs/CONTRACTS.md §14): added rows are rounded once to it, and an
    /// `f16` value beyond its range is an error that changes nothing.
    pub fn with_dtype(
        dim: usize,
        dtype: Dtype,
        metric: Metric,
        config: CudaConfig,
        capacity: usize,
    ) -> Result<Self, CudaError> {
        let engine = Engine::with_capacity(dim, dtype, metric, config, capacity)?;
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

    /// How the device stores the rows.
    pub fn dtype(&self) -> Dtype {
        self.engine.dtype()
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
        let rows = self.check_call(ids, rows)?;
        if let Some((position, &id)) = ids.iter().enumerate().find(|(_, &id)| self.contains(id)) {
            return Err(CudaError::IdPresent { id, position });
        }
        self.insert(ids, &rows)
    }

    /// Replaces the rows of live ids and adds the others, all or nothing
    /// (the checks of [`Self::add`], except that a live id is expected).
    pub fn upsert(&mut self, ids: &[u64], rows: &[f32]) -> Result<(), CudaError> {
        self.engine.ctx().make_current()?;
        let rows = self.check_call(ids, rows)?;
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
        // Everything the overwrite needs is allocated before the add changes
        // anything, so running out of device memory anywhere in the call
        // leaves the corpus as it was; after the add, only a driver fault
        // can fail.
        let overwrite = if old_ids.is_empty() {
            None
        } else {
            Some((
                self.device_rows("upserted rows", &old_rows)?,
                alloc::<u32>("upserted row numbers", old_ids.len())?,
                alloc::<f32>("upserted norms", old_ids.len())?,
            ))
        };
        self.insert(&fresh_ids, &fresh_rows)?;
        let Some((staged, rows_dev, staged_norms)) = overwrite else {
            return Ok(());
        };
        // Rows may have moved in the add: look them up after it.
        let targets: Vec<u32> = old_ids
            .iter()
            .filter_map(|&id| self.live_row(id))
            .map(|r| r as u32)
            .collect();
        let overwritten = self.overwrite(&staged, &rows_dev, &staged_norms, &targets);
        // The add is done: a failure now, whatever its kind, leaves the call
        // half made, which a caller must not take for a refusal.
        overwritten.map_err(|e| CudaError::Driver {
            op: "upsert (the overwrite after its add)",
            reason: e.to_string(),
        })?;
        self.engine.set_rows(self.ids.len());
        Ok(())
    }

    /// Writes staged rows (and their norms, where kept) over stored rows
    /// `targets`.
    fn overwrite(
        &self,
        staged: &RowBuf,
        rows_dev: &DeviceBuffer<u32>,
        staged_norms: &DeviceBuffer<f32>,
        targets: &[u32],
    ) -> Result<(), CudaError> {
        let d = self.dim();
        launch::h2d_sync(DevSlice::of(rows_dev), targets)?;
        let e = &self.engine;
        let slot = e.slot()?;
        let s = Queue::Stream(slot.stream.as_inner());
        let (staged, rows_dev) = (staged.view(), DevSlice::of(rows_dev));
        e.kernels
            .scatter_rows(s, staged, rows_dev, d as u32, e.corpus.view())?;
        if e.norms {
            // Only the replaced rows' norms change: computed on the staged
            // rows and scattered like them.
            let norms = DevSlice::of(staged_norms);
            e.kernels
                .row_norms(s, staged, targets.len() as u32, d as u32, norms)?;
            e.kernels.scatter_rows(
                s,
                Rows::of_f32(norms),
                rows_dev,
                1,
                Rows::of_f32(DevSlice::of(&e.rnorm)),
            )?;
        }
        slot.stream.synchronize().op("cuStreamSynchronize (upsert)")
    }

    /// Removes the rows of `ids` from every later result and returns how many
    /// were live (absent ids and repeats are ignored).
    pub fn remove(&mut self, ids: &[u64]) -> Result<usize, CudaError> {
        self.engine.ctx().make_current()?;
        let mut live = self.live.clone();
        let mut removed = 0;
        for &id in ids {
            if let Some(r) = self.live_row(id) {
                let bit = 1 << (r % 64);
                if live[r / 64] & bit != 0 {
                    live[r / 64] &= !bit;
                    removed += 1;
                }
            }
        }
        if removed > 0 {
            // The device's bits first: a refused copy changes nothing.
            launch::h2d_sync(DevSlice::of(&self.live_dev), &live)?;
            self.live = live;
            self.dead += removed;
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

    /// The stored row of a live id.
    fn live_row(&self, id: u64) -> Option<usize> {
        let r = self.ids.binary_search(&id).ok()?;
        self.is_live(r).then_some(r)
    }

    /// The live ids among `ids` (ascending, distinct), ascending: one merge
    /// with the stored ids.
    fn live_ids_among(&self, ids: &[u64]) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.len());
        let (mut i, mut r) = (0, 0);
        while i < ids.len() && r < self.ids.len() {
            match ids[i].cmp(&self.ids[r]) {
                std::cmp::Ordering::Less => i += 1,
                std::cmp::Ordering::Greater => r += 1,
                std::cmp::Ordering::Equal => {
                    if self.is_live(r) {
                        out.push(ids[i]);
                    }
                    i += 1;
                    r += 1;
                }
            }
        }
        out
    }

    /// Whether stored row `r` is live.
    fn is_live(&self, r: usize) -> bool {
        self.live[r / 64] & (1 << (r % 64)) != 0
    }

    /// The checks every mutation makes before anything changes.
    /// Checks a call's ids and rows, the rows by the rules of the storage
    /// type (for a half type: finite once rounded, and the overflow rule on
    /// the rounded rows), before anything changes. Returns the rows as they
    /// will be stored, widened (the rows themselves for f32), so that the
    /// later conversions cannot fail.
    fn check_call<'r>(&self, ids: &[u64], rows: &'r [f32]) -> Result<Cow<'r, [f32]>, CudaError> {
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
        topk_core::check_ids(ids).map_err(|problem| match problem {
            IdProblem::TooLarge { id, position } => CudaError::IdTooLarge {
                id,
                position,
                max: MAX_ID,
            },
            IdProblem::Repeated { id, first, second } => {
                CudaError::DuplicateId { id, first, second }
            }
        })?;
        let stored = match self.dtype() {
            _ if rows.is_empty() => Cow::Borrowed(rows),
            Dtype::F32 => {
                validate::corpus(rows, d)?;
                Cow::Borrowed(rows)
            }
            dtype => Cow::Owned(RowStore::from_f32(rows.to_vec(), d, dtype)?.to_f32()),
        };
        let total = self.ids.len() + ids.len();
        if total > u32::MAX as usize / 2 {
            return Err(topk_core::Error::TooManyRows {
                n: total,
                max: u32::MAX as usize / 2,
            }
            .into());
        }
        Ok(stored)
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
        let dst = self.engine.corpus.view().range("corpus", n * d, a * d)?;
        self.upload_stored("corpus", dst, sorted_rows)?;
        let id_dst = DevSlice::of(&self.ids_dev).range("stored ids", n, a)?;
        launch::h2d_sync(id_dst, &sorted_ids)?;
        self.refresh_norms(n, a)?;
        // The rows past `n` are unused until the host state below says
        // otherwise, so every device step before it may fail harmlessly.
        let mut live = self.live.clone();
        live.resize((n + a).div_ceil(64), 0);
        for r in n..n + a {
            live[r / 64] |= 1 << (r % 64);
        }
        if self.dead > 0 {
            launch::h2d_sync(DevSlice::of(&self.live_dev), &live)?;
        }
        self.live = live;
        self.ids.extend_from_slice(&sorted_ids);
        self.engine.set_rows(n + a);
        Ok(())
    }

    /// Rewrites the device rows as the live stored rows merged by id with
    /// `fresh` rows (ascending ids, none live), dropping removed rows: one
    /// gather into a new buffer, the stored rows never leaving the device.
    fn relayout(&mut self, fresh_ids: &[u64], fresh_rows: &[f32]) -> Result<(), CudaError> {
        let d = self.dim();
        let n = self.ids.len();
        let mut map = Vec::with_capacity(n - self.dead + fresh_ids.len());
        let mut ids = Vec::with_capacity(map.capacity());
        let (mut r, mut f) = (0, 0);
        loop {
            while r < n && !self.is_live(r) {
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
        // Every buffer the new layout needs is allocated, and every device
        // step made into them, before anything is replaced: running out of
        // memory, or a refused copy or launch, leaves the corpus as it was.
        // The ids and norms get fresh buffers too (12 bytes a row beside the
        // corpus's D values), so that none is overwritten in place.
        let fresh = self.device_rows("added rows", fresh_rows)?;
        let map_dev = device::upload("row map", if map.is_empty() { &[0] } else { &map[..] })?;
        let corpus = RowBuf::alloc("corpus", self.dtype(), capacity * d)?;
        let ids_dev = alloc::<u64>("stored ids", capacity)?;
        let staged = self.engine.staged_growth(capacity)?;
        let live_dev = match staged {
            Some(_) => Some(alloc::<u64>("live rows", capacity.div_ceil(64))?),
            None => None,
        };
        let rnorm = match &staged {
            None if self.engine.norms => Some(alloc::<f32>("row norms", capacity)?),
            _ => None,
        };
        launch::h2d_sync(DevSlice::of(&ids_dev), &ids)?;
        if total > 0 {
            let e = &self.engine;
            let slot = e.slot()?;
            let s = Queue::Stream(slot.stream.as_inner());
            let map_view = DevSlice::of(&map_dev).range("row map", 0, total)?;
            e.kernels.gather_rows(
                s,
                e.corpus.view(),
                fresh.view(),
                map_view,
                d as u32,
                corpus.view(),
            )?;
            let norms = match (&staged, &rnorm) {
                (Some(g), _) if g.norms => Some(DevSlice::of(&g.rnorm)),
                (None, Some(r)) => Some(DevSlice::of(r)),
                _ => None,
            };
            if let Some(out) = norms {
                let rows = corpus.view().range("corpus", 0, total * d)?;
                let out = out.range("row norms", 0, total)?;
                e.kernels.row_norms(s, rows, total as u32, d as u32, out)?;
            }
            slot.stream
                .synchronize()
                .op("cuStreamSynchronize (relayout)")?;
        }
        // Nothing below fails.
        self.engine.corpus = corpus;
        self.ids_dev = ids_dev;
        if let Some(staged) = staged {
            self.engine.install_growth(staged);
        }
        if let Some(live_dev) = live_dev {
            self.live_dev = live_dev;
        }
        if let Some(rnorm) = rnorm {
            self.engine.rnorm = rnorm;
        }
        self.ids = ids;
        self.live = vec![0; total.div_ceil(64)];
        for r in 0..total {
            self.live[r / 64] |= 1 << (r % 64);
        }
        // No row is removed now, so no search reads the device's live bits
        // until a removal uploads them whole.
        self.dead = 0;
        self.engine.set_rows(total);
        tracing::debug!(rows = total, capacity, "resident corpus relaid");
        Ok(())
    }

    /// Grows the device buffers to hold `rows` rows (doubling), copying the
    /// stored rows device to device. As in [`Self::relayout`], the grown
    /// buffers are filled before they replace the old ones.
    fn grow_to(&mut self, rows: usize) -> Result<(), CudaError> {
        if rows <= self.engine.capacity {
            return Ok(());
        }
        let d = self.dim();
        let n = self.ids.len();
        let capacity = rows.max(2 * self.engine.capacity);
        let corpus = RowBuf::alloc("corpus", self.dtype(), capacity * d)?;
        let live_dev = alloc::<u64>("live rows", capacity.div_ceil(64))?;
        let ids_dev = alloc::<u64>("stored ids", capacity)?;
        let staged = self.engine.staged_growth(capacity)?;
        if n > 0 {
            let src = self.engine.corpus.view().range("corpus", 0, n * d)?;
            launch::d2d_sync(corpus.view().as_words(), src.as_words())?;
            let src = DevSlice::of(&self.ids_dev).range("stored ids", 0, n)?;
            launch::d2d_sync(DevSlice::of(&ids_dev), src)?;
            if self.dead > 0 {
                launch::h2d_sync(DevSlice::of(&live_dev), &self.live)?;
            }
        }
        if let Some(g) = staged.as_ref().filter(|g| g.norms && n > 0) {
            // Norms are recomputed rather than copied: a growth can make
            // filtered batches (which need them) possible for the first
            // time.
            let e = &self.engine;
            let slot = e.slot()?;
            let s = Queue::Stream(slot.stream.as_inner());
            let src = corpus.view().range("corpus", 0, n * d)?;
            let out = DevSlice::of(&g.rnorm).range("row norms", 0, n)?;
            e.kernels.row_norms(s, src, n as u32, d as u32, out)?;
            slot.stream
                .synchronize()
                .op("cuStreamSynchronize (row norms)")?;
        }
        // Nothing below fails.
        self.engine.corpus = corpus;
        self.ids_dev = ids_dev;
        if let Some(staged) = staged {
            self.engine.install_growth(staged);
        }
        self.live_dev = live_dev;
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
        let rows = e.corpus.view().range("corpus", first * d, count * d)?;
        let out = DevSlice::of(&e.rnorm).range("row norms", first, count)?;
        e.kernels.row_norms(s, rows, count as u32, d as u32, out)?;
        slot.stream
            .synchronize()
            .op("cuStreamSynchronize (row norms)")
    }

    /// `rows` (checked f32 rows) on the device as the corpus stores them
    /// (room for one row when there are none, so the buffer is never empty;
    /// nothing reads it then).
    fn device_rows(&self, what: &'static str, rows: &[f32]) -> Result<RowBuf, CudaError> {
        let d = self.dim();
        let buf = RowBuf::alloc(what, self.dtype(), rows.len().max(d))?;
        if rows.is_empty() {
            return Ok(buf);
        }
        self.upload_stored(what, buf.view(), rows)?;
        Ok(buf)
    }

    /// Copies `rows` (checked rows of stored values, widened: see
    /// [`Self::check_call`]) into the start of `dst` as the corpus stores
    /// them; narrowing them again is exact.
    fn upload_stored(
        &self,
        what: &'static str,
        dst: Rows<'_>,
        rows: &[f32],
    ) -> Result<(), CudaError> {
        let dst = dst.range(what, 0, rows.len())?;
        match self.dtype() {
            Dtype::F32 => launch::h2d_upload(dst.as_f32(what)?, rows),
            dtype => {
                let mut store = RowStore::empty(self.dim(), dtype)?;
                store.push_checked(rows);
                let bits = store.as_bits16().unwrap_or_default();
                launch::h2d_upload(dst.as_bits16(what)?, bits)
            }
        }
    }
}
