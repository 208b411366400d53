//! The searches of the mutable resident corpus: where the queries come
//! from, how a filter's ids are resolved on the device, and the three ways
//! of scoring the allowed rows (the engine's own paths, a row list, or every
//! row under a bitset) before the selection.

use topk_core::{validate, Hit, Metric, Neighbor};

use super::ResidentCorpus;
use crate::batch::Source;
use crate::driver::{self, DevSlice, Rows};
use crate::engine::Engine;
use crate::error::{CudaError, DriverResult};
use crate::launch::{self, Queue, STATUS_OK, STATUS_OVERFLOW};
use crate::slot::Slot;
use crate::{IdFilter, GATHER_FRACTION};

/// Which rows a scan of every stored row may return.
#[derive(Clone, Copy)]
enum Allowed {
    /// The live rows, under the corpus's live bitset.
    Live,
    /// The rows of the slot's allow set, built by the device resolution of
    /// a filter.
    Filter,
}

impl ResidentCorpus {
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
        let nq = queries.len() / d;
        if queries.len() % d == 0 && nq > 1 && self.engine_batch(k, filter) {
            // Every row live: the engine's batch, which checks the values on
            // the device as it stages them (the host check only for a batch
            // at fault, to name it).
            let found = self.engine.search_batch(queries, k)?;
            return Ok(found.into_iter().map(|v| self.hits(&v)).collect());
        }
        validate::queries_rowmajor(queries, d)?;
        self.search_source(Source::Host(queries), nq, k, filter)
    }

    /// [`Self::search`] of `nq` queries of D values already in device memory
    /// at `queries` (a raw address of this process's CUDA context, as torch's
    /// `data_ptr()` gives), read with no copy through the host, after the
    /// work queued so far on the caller's `stream` (a raw `CUstream`; 0 is
    /// the default stream). The queries are checked on the device by the
    /// rules of docs/CONTRACTS.md §4 (as they are staged where no row is
    /// removed and no filter given, else before any is searched); no hit of
    /// a call with a query at fault is returned. Hits come back
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
        if self.engine_batch(k, filter) {
            // Every row live: the engine's batch, whose check is read with
            // its results (no wait of its own).
            let found = self.engine.search_batch_device(view, stream, k)?;
            return Ok(found.into_iter().map(|v| self.hits(&v)).collect());
        }
        self.engine
            .check_device_queries(&mut *self.engine.slot()?, view, nq, stream)?;
        self.search_source(Source::Device(view), nq, k, filter)
    }

    /// Whether a batch goes to the engine's own batch path, which checks
    /// its values on the device as it stages them: every stored row live,
    /// no filter, K ≥ 1.
    fn engine_batch(&self, k: usize, filter: IdFilter<'_>) -> bool {
        matches!(filter, IdFilter::All) && self.dead == 0 && !self.ids.is_empty() && k > 0
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
            IdFilter::All => self.search_all(src, nq, k),
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

    /// Searches `nq` checked queries over every live row.
    fn search_all(&self, src: Source<'_>, nq: usize, k: usize) -> Result<Vec<Vec<Hit>>, CudaError> {
        let live = self.len();
        if live == 0 {
            return Ok(vec![Vec::new(); nq]);
        }
        if self.dead == 0 {
            return self.search_every(src, nq, k);
        }
        let mut slot = self.engine.slot()?;
        self.search_masked(&mut slot, src, nq, k.min(live), Allowed::Live)
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
            // More ids than the corpus has rows: the live ones among them,
            // found on the host, are few enough for the device.
            drop(guard);
            let present = self.live_ids_among(&sorted);
            return self.search_filtered(src, nq, k, &present);
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
            drop(guard);
            return self.search_every(src, nq, k);
        }
        let k = k.min(allowed);
        if Self::gathers(allowed, n) {
            self.search_list(slot, src, nq, k, &sorted)
        } else {
            self.search_masked(slot, src, nq, k, Allowed::Filter)
        }
    }

    /// Every stored row allowed: the engine's own paths, whose row order is
    /// the id order.
    fn search_every(
        &self,
        src: Source<'_>,
        nq: usize,
        k: usize,
    ) -> Result<Vec<Vec<Hit>>, CudaError> {
        let found = match src {
            Source::Host(query) if nq == 1 => {
                let mut v = Vec::with_capacity(k.min(self.ids.len()));
                self.engine.search_host(query, k, &mut v)?;
                vec![v]
            }
            _ => self.engine.search_batch_from(src, k)?,
        };
        Ok(found.into_iter().map(|v| self.hits(&v)).collect())
    }

    /// Scores every stored row, hides the excluded ones, selects `k` (at
    /// most the allowed count).
    fn search_masked(
        &self,
        slot: &mut Slot,
        src: Source<'_>,
        nq: usize,
        k: usize,
        allowed: Allowed,
    ) -> Result<Vec<Vec<Hit>>, CudaError> {
        let e = &self.engine;
        let (n, d) = (self.ids.len(), self.dim());
        let mut out = Vec::with_capacity(nq);
        let chunk = e.sizes.chunk;
        for first in (0..nq).step_by(chunk) {
            let cq = chunk.min(nq - first);
            src.part(first, cq, d)?.stage(slot, &e.kernels, d)?;
            if e.planner.filtered(k, cq) && self.bounded_chunk(slot, cq, k, allowed, &mut out)? {
                continue;
            }
            let s = Queue::Stream(slot.stream.as_inner());
            let qv = slot.queries_at(d, 0, cq)?;
            let ops = e.operands(slot, qv, cq);
            e.enqueue_scores(s, &ops, None)?;
            let words = self.allow_words(slot, allowed);
            let scores = DevSlice::of(&slot.scores);
            e.kernels
                .mask_scores(s, scores, n as u32, cq as u32, words, 0)?;
            self.select_chunk(slot, n, cq, k, &mut out, |row| self.ids[row as usize])?;
        }
        Ok(out)
    }

    /// The device bitset of the allowed rows: the slot's allow set for a
    /// filter, the live rows for removed ones. (With every row allowed, the
    /// search takes the engine's own batch path instead.)
    fn allow_words<'s>(&'s self, slot: &'s Slot, allowed: Allowed) -> DevSlice<'s, u64> {
        match allowed {
            Allowed::Filter => DevSlice::of(&slot.allow),
            Allowed::Live => DevSlice::of(&self.live_dev),
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
        allowed: Allowed,
        out: &mut Vec<Vec<Hit>>,
    ) -> Result<bool, CudaError> {
        let e = &self.engine;
        let d = self.dim();
        {
            let stream = slot.stream.as_inner();
            launch::zero32(stream, DevSlice::of(&slot.fcount))?;
            let qv = slot.queries_at(d, 0, cq)?;
            let words = Some(self.allow_words(slot, allowed));
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
        ids: &[u64],
    ) -> Result<Vec<Vec<Hit>>, CudaError> {
        if nq > 1 {
            let rows = self.rows_of_bits(slot)?;
            return self.search_list_batch(slot, src, nq, k, &rows);
        }
        let e = &self.engine;
        let d = self.dim();
        let m = ids.len();
        let k = k.min(m);
        let mut out = Vec::with_capacity(nq);
        // Chunks whose list scores fit the slot's score buffer.
        let fit = (slot.scores.len() / m).max(1);
        let chunk = e.sizes.chunk.min(fit);
        for first in (0..nq).step_by(chunk) {
            let cq = chunk.min(nq - first);
            src.part(first, cq, d)?.stage(slot, &e.kernels, d)?;
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
            self.select_chunk(slot, m, cq, k, &mut out, |pos| ids[pos as usize])?;
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
            src.part(first, cq, d)?.stage(slot, &e.kernels, d)?;
            let stream = slot.stream.as_inner();
            let s = Queue::Stream(stream);
            let qv = slot.queries_at(d, 0, cq)?;
            let scores = DevSlice::of(&slot.scores);
            for j0 in (0..c).step_by(piece) {
                let p = piece.min(c - j0);
                let map = DevSlice::of(&slot.list).range("filter rows", j0, p)?;
                let compact = slot.compact.view();
                let corpus = e.corpus.view();
                e.kernels
                    .gather_rows(s, corpus, corpus, map, d as u32, compact)?;
                let norms = DevSlice::of(&slot.compact_norms);
                if cosine {
                    let rnorm = Rows::of_f32(DevSlice::of(&e.rnorm));
                    e.kernels
                        .gather_rows(s, rnorm, rnorm, map, 1, Rows::of_f32(norms))?;
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
}
