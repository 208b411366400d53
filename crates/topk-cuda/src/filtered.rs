//! The filtered batch chunk (`kernels/filter.cu`): tensor-core lower
//! bounds of every score, the selection over them, the listing of the rows
//! whose upper bound reaches the K-th lower bound, their canonical scores
//! and the exact selection among them; and the canonical rerun of a chunk
//! whose bounds did not separate.

use std::sync::atomic::Ordering;

use crate::driver::DevSlice;
use crate::engine::{Engine, MIN_SAMPLE};
use crate::error::CudaError;
use crate::launch::{HalfQueries, Listed, Queue, Sampled, SelectBufs, CAND_CAP};
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
}
