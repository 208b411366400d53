//! The filtered batch chunk (`kernels/filter.cu`): tensor-core lower
//! bounds of every score, the selection over them, the listing of the rows
//! whose upper bound reaches the K-th lower bound, their canonical scores
//! and the exact selection among them; and the canonical rerun of a chunk
//! whose bounds did not separate.

use std::sync::atomic::Ordering;

use crate::driver::DevSlice;
use crate::engine::{Engine, MIN_SAMPLE};
use crate::error::CudaError;
use crate::launch::{self, Emitted, HalfQueries, Listed, Queue, Sampled, SelectBufs, CAND_CAP};
use crate::slot::Slot;

/// Values a query's rescoring may read for a sampled threshold: s · K rows
/// of D values at most. About s · K rows are listed and scored
/// canonically; past this the extra rescoring costs what the smaller
/// selection saves (measured on an H200 at 1M rows, K = 100: s = 8 pays at
/// D <= 512, s = 4 at D = 768 and 1024, `bench/gpu/NOTES.md`).
const SAMPLE_VALUES: usize = 1 << 19;

/// log2 of the stride of the rows whose lower bounds give a filtered
/// chunk's threshold (`Tuning::filter_sample`): the largest power of two
/// s <= `max` with s · k · 4 <= CAND_CAP, s · k · d <= SAMPLE_VALUES and
/// s · k · d <= n, at least MIN_SAMPLE, whose sample of `n` rows fits
/// `room` bounds a query and holds 4 k of them; 0 (every row) where there
/// is none. The selection then reads n / s bounds a query instead of n,
/// and the rescoring about s · k rows of d values instead of k: below
/// n = s · k · d the rescoring costs more than the selection saves
/// (measured on an H200 at K = 100: sampling loses at 200k rows for D = 768
/// and 1024 and at 50k-100k for D = 384, and wins from 500k rows,
/// `bench/gpu/NOTES.md`).
pub(crate) fn sample_shift(max: usize, k: usize, n: usize, d: usize, room: usize) -> u32 {
    let mut s = if max >= MIN_SAMPLE {
        1usize << max.ilog2()
    } else {
        return 0;
    };
    while s >= MIN_SAMPLE {
        let rows = n.div_ceil(s);
        let listed = s * k;
        let values = listed * d;
        if listed * 4 <= CAND_CAP
            && values <= SAMPLE_VALUES
            && values <= n
            && rows <= room
            && rows >= 4 * k
        {
            return s.ilog2();
        }
        s /= 2;
    }
    0
}

/// Most rows a query of the Hopper listing keeps (`Tuning::filter_emit`).
pub(crate) const EMIT_CAP: usize = 32_768;
/// Smallest stride of the Hopper listing's sample: its bounds cost at most
/// 1/16 of the chunk's.
pub(crate) const EMIT_MIN_STRIDE: usize = 16;

/// The Hopper listing's plan (`Tuning::filter_emit`): log2 of the stride s
/// of its sample and the rows a query keeps, `cap` = min(EMIT_CAP, n / 4):
/// the largest power of two s <= `max`, at least EMIT_MIN_STRIDE, with
/// 4 · s · k <= cap (about s · k rows are listed) and a sample of at least
/// 4 k rows, where the sample's bounds, the listed bounds and rows and the
/// counts of `nq` queries fit `room` floats (the chunk's score buffer,
/// which the rescoring reuses after them). `None` where there is none.
pub(crate) fn emit_plan(
    max: usize,
    k: usize,
    n: usize,
    nq: usize,
    room: usize,
) -> Option<(u32, usize)> {
    if max < EMIT_MIN_STRIDE || k == 0 {
        return None;
    }
    let cap = EMIT_CAP.min(n / 4);
    let mut s = 1usize << max.ilog2();
    while s >= EMIT_MIN_STRIDE {
        let rows = n.div_ceil(s);
        let need = nq.checked_mul(rows + 2 * cap + 1)?;
        if 4 * s * k <= cap && rows >= 4 * k && need <= room {
            return Some((s.ilog2(), cap));
        }
        s /= 2;
    }
    None
}

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
            shadow: self.shadow_rows(slot)?,
        };
        if half.shadow.is_some() {
            self.shadowed.fetch_add(1, Ordering::Relaxed);
        }
        let plan = match allow {
            Some(_) => None,
            None if self.n < self.config.tuning.filter_emit_rows => None,
            None => emit_plan(
                self.config.tuning.filter_emit,
                k,
                self.n,
                nq,
                ops.scores.len(),
            ),
        };
        if let Some((shift, cap)) = plan.filter(|_| ks.lists90(ops.corpus.width(), ops.d)) {
            // The Hopper listing (docs/CONTRACTS.md §5): the score buffer
            // holds the sample's bounds, then the listed bounds, rows and
            // counts, all dead before the rescoring writes its scores.
            let rows = self.n.div_ceil(1 << shift);
            let room = ops.scores;
            let sample = room.range("sampled lower bounds", 0, nq * rows)?;
            let lo = room.range("listed lower bounds", nq * rows, nq * cap)?;
            let words = room.words();
            let emitted = Emitted {
                lo,
                rows: words.range("listed rows", nq * (rows + cap), nq * cap)?,
                count: words.range("listed counts", nq * (rows + 2 * cap), nq)?,
                cap: cap as u32,
            };
            let bq = ks.approx_sample90(s, metric, &ops, half, sample, shift)?;
            let first_sel = SelectBufs {
                scores: sample,
                ..bufs
            };
            ks.hist(s, &first_sel, rows as u32, ops.nq, k32)?;
            ks.gather(s, &first_sel, rows as u32, ops.nq, k32)?;
            let stream = slot.stream.as_inner();
            launch::fill_neg_inf(stream, emitted.lo)?;
            launch::zero32(stream, emitted.count)?;
            ks.emit90(s, metric, &ops, bq, bufs.out, k32, &emitted, lists.flag)?;
            let listed_sel = SelectBufs { scores: lo, ..bufs };
            ks.hist(s, &listed_sel, cap as u32, ops.nq, k32)?;
            ks.gather(s, &listed_sel, cap as u32, ops.nq, k32)?;
            ks.filter_emitted(s, metric, &ops, bufs.out, k32, &emitted, &lists)?;
            ks.rescore(s, metric, &ops, &lists)?;
            self.listed.fetch_add(1, Ordering::Relaxed);
            return ks.select_listed(s, &ops, &lists, k32, bufs.out);
        }
        // The threshold from every 2^shift-th row's bound (none hidden by
        // an allow set, whose mask comes after the bounds).
        let shift = match allow {
            Some(_) => 0,
            None => sample_shift(
                self.config.tuning.filter_sample,
                k,
                self.n,
                self.dim(),
                slot.fsample.len() / nq.max(1),
            ),
        };
        let sampled = Sampled {
            bounds: DevSlice::of(&slot.fsample),
            shift,
        };
        ks.approx(s, metric, &ops, half, sampled)?;
        if let Some(words) = allow {
            ks.mask_scores(s, ops.scores, ops.n, ops.nq, words, 0)?;
        }
        let (sel, sel_n) = match shift {
            0 => (bufs, ops.n),
            _ => (
                SelectBufs {
                    scores: sampled.bounds,
                    ..bufs
                },
                ops.n.div_ceil(1 << shift),
            ),
        };
        ks.hist(s, &sel, sel_n, ops.nq, k32)?;
        ks.gather(s, &sel, sel_n, ops.nq, k32)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_stride_keeps_the_list_and_the_sample_large_enough() {
        let room = 1_000_000usize.div_ceil(MIN_SAMPLE);
        let m = 1_000_000;
        // (max, k, n, d, room, shift)
        let cases = [
            // K = 100 over 1M rows: every 8th row up to D = 512, every 4th
            // at D = 768 and 1024 (s · K · D <= 2^19), none at 4096.
            (8, 100, m, 384, room, 3),
            (8, 100, m, 512, room, 3),
            (8, 100, m, 768, room, 2),
            (8, 100, m, 1024, room, 2),
            (8, 100, m, 4096, room, 0),
            // A larger maximum is cut to what the list holds (8 · 128 · 4).
            (64, 128, m, 128, room, 3),
            (8, 200, m, 128, room, 2),
            (8, 256, m, 128, room, 2),
            // Past that, or below MIN_SAMPLE, every row.
            (8, 257, m, 128, room, 0),
            (2, 10, m, 128, room, 0),
            (1, 10, m, 128, room, 0),
            (0, 10, m, 128, room, 0),
            // Not a power of two: the largest power below it.
            (7, 10, m, 128, room, 2),
            // Not where the rescoring would read more values than there
            // are rows: s = 4 from 409,600 rows at D = 1024, s = 8 from
            // 307,200 at D = 384 (s = 4 below), none at 50k.
            (8, 100, 200_000, 1024, room, 0),
            (8, 100, 409_600, 1024, room, 2),
            (8, 100, 307_199, 384, room, 2),
            (8, 100, 307_200, 384, room, 3),
            (8, 100, 50_000, 384, room, 0),
            (8, 10, 50_000, 384, room, 3),
            // The sample must fit the slot's room.
            (8, 100, m, 128, 100_000, 0),
            (8, 10, m, 128, 0, 0),
        ];
        for (max, k, n, d, room, shift) in cases {
            assert_eq!(
                sample_shift(max, k, n, d, room),
                shift,
                "max {max} k {k} n {n} d {d} room {room}"
            );
        }
    }

    #[test]
    fn the_listing_plan_keeps_the_sample_small_and_the_room_four_times_the_rows() {
        let m = 1_000_000;
        let full = |nq: usize, n: usize| nq * n;
        // (max, k, n, nq, room, plan)
        let cases = [
            // K = 100 over 1M rows: every 64th row, room for 32,768 rows.
            (64, 100, m, 256, full(256, m), Some((6, EMIT_CAP))),
            (64, 10, m, 256, full(256, m), Some((6, EMIT_CAP))),
            (128, 10, m, 256, full(256, m), Some((7, EMIT_CAP))),
            // Not a power of two: the largest power below it.
            (100, 10, m, 256, full(256, m), Some((6, EMIT_CAP))),
            // Larger K: a denser sample, down to every 16th row at 512.
            (64, 200, m, 256, full(256, m), Some((5, EMIT_CAP))),
            (64, 512, m, 256, full(256, m), Some((4, EMIT_CAP))),
            (64, 513, m, 256, full(256, m), None),
            // Small corpora: room N / 4, and a sample of at least 4 K rows.
            (64, 100, 30_000, 64, full(64, 30_000), Some((4, 7_500))),
            (64, 100, 20_000, 64, full(64, 20_000), None),
            (64, 10, 20_000, 64, full(64, 20_000), Some((6, 5_000))),
            (64, 1, 1_000, 64, full(64, 1_000), Some((5, 250))),
            // Off below a stride of 16, for K = 0, or without the room.
            (8, 10, m, 256, full(256, m), None),
            (0, 10, m, 256, full(256, m), None),
            (64, 0, m, 256, full(256, m), None),
            (64, 10, m, 256, 256 * 2 * EMIT_CAP, None),
        ];
        for (max, k, n, nq, room, plan) in cases {
            assert_eq!(
                emit_plan(max, k, n, nq, room),
                plan,
                "max {max} k {k} n {n} nq {nq} room {room}"
            );
        }
    }
}
