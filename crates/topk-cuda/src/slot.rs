//! Scratch slots: each concurrent search holds one, with its own stream,
//! device buffers and pinned host staging, all sized at construction from
//! a [`SlotShape`].

use cust::memory::{DeviceBuffer, LockedBuffer};
use cust::stream::{Stream, StreamFlags};
use topk_core::Dtype;

use crate::device::{pinned, DevNeighbor, DevThreshold};
use crate::driver::{self, alloc, DevSlice, RowBuf};
use crate::error::{CudaError, DriverResult};
use crate::graph::GraphCache;
use crate::launch::{self, SelectBufs, AREA_STRIDE, CAND_CAP, MAYBE_CAP};

/// Fewest queries per batch chunk (see [`Sizes::new`]).
pub(crate) const BATCH_CHUNK: usize = 64;

/// Most queries a slot stages at once; a larger `max_batch` runs in turns.
const MAX_STAGED: usize = 1024;

/// Bytes of a slot's gathered-rows buffer (the mutable resident corpus).
const COMPACT_BYTES: usize = 64 << 20;

/// Rows of `d` values the gathered-rows buffer of a slot with `lists` rows
/// of list scratch holds (none without list scratch).
pub(crate) fn compact_rows(lists: usize, d: usize) -> usize {
    if lists == 0 {
        0
    } else {
        (COMPACT_BYTES / (4 * d.max(1))).clamp(1, lists)
    }
}

/// Scratch of one concurrent search: a stream, the query and result buffers
/// (device and pinned host) of a whole staged batch, and the scoring and
/// selection scratch of one chunk of it.
pub(crate) struct Slot {
    pub(crate) stream: Stream,
    pub(crate) queries: DeviceBuffer<f32>,
    pub(crate) qnorm: DeviceBuffer<f32>,
    pub(crate) scores: DeviceBuffer<f32>,
    pub(crate) area: DeviceBuffer<u32>,
    pub(crate) th: DeviceBuffer<DevThreshold>,
    pub(crate) cand: DeviceBuffer<u64>,
    pub(crate) maybe: DeviceBuffer<u64>,
    pub(crate) out: DeviceBuffer<DevNeighbor>,
    pub(crate) ids: DeviceBuffer<u32>,
    pub(crate) owner: DeviceBuffer<u32>,
    pub(crate) id_scores: DeviceBuffer<f32>,
    /// The filtered batch's listed rows, CAND_CAP per query of a chunk.
    pub(crate) flist: DeviceBuffer<u32>,
    /// Per chunk of a turn a flag asking the host to run the chunk again on
    /// the canonical path, then per query of the turn its listed rows.
    pub(crate) fcount: DeviceBuffer<u32>,
    /// `fcount` copied back after a filtered turn.
    pub(crate) fcount_host: LockedBuffer<u32>,
    /// A filtered chunk's sampled lower bounds (`Tuning::filter_sample`).
    pub(crate) fsample: DeviceBuffer<f32>,
    /// A filtered chunk's queries as the Hopper bounds of half-width rows
    /// multiply them, and their inverse scales (empty for f32 rows).
    pub(crate) q16: RowBuf,
    pub(crate) q16_inv: DeviceBuffer<f32>,
    pub(crate) q_host: LockedBuffer<f32>,
    pub(crate) out_host: LockedBuffer<DevNeighbor>,
    /// `out_host` as the device sees it, where results are mapped: the
    /// kernels write there and no copy follows.
    out_mapped: Option<DevSlice<'static, DevNeighbor>>,
    /// `q_host` as the device sees it, where host queries are read by
    /// `topk_fetch_query` rather than copied (`Tuning::mapped_queries`).
    pub(crate) q_mapped: Option<DevSlice<'static, f32>>,
    pub(crate) scores_host: LockedBuffer<f32>,
    pub(crate) ids_host: LockedBuffer<u32>,
    pub(crate) owner_host: LockedBuffer<u32>,
    pub(crate) id_scores_host: LockedBuffer<f32>,
    /// The slot's query graphs.
    pub(crate) graphs: GraphCache,
    /// A sparse filter's allowed rows (the mutable resident corpus).
    pub(crate) list: DeviceBuffer<u32>,
    pub(crate) list_host: LockedBuffer<u32>,
    /// The allow sets of a dense filter, a row's bit per query of a chunk
    /// (the mutable resident corpus).
    pub(crate) allow: DeviceBuffer<u64>,
    pub(crate) allow_host: LockedBuffer<u64>,
    /// An allow-list's ids, resolved on the device (the mutable resident
    /// corpus), and the count of allowed rows found.
    pub(crate) want: DeviceBuffer<u64>,
    pub(crate) want_host: LockedBuffer<u64>,
    pub(crate) count: DeviceBuffer<u32>,
    pub(crate) count_host: LockedBuffer<u32>,
    /// A piece of a batch's allowed rows gathered contiguous, with their
    /// norms, for the batch scoring kernel (the mutable resident corpus).
    pub(crate) compact: RowBuf,
    pub(crate) compact_norms: DeviceBuffer<f32>,
    /// The device query check's words (its running minimum and its count of
    /// blocks finished, left `u32::MAX` and 0 by every launch) and, third,
    /// its verdict where `check_host` is not mapped.
    pub(crate) check: DeviceBuffer<u32>,
    /// The check's verdict (the first query at fault, `u32::MAX`: none) in
    /// its first word; the other two set `check` up once.
    pub(crate) check_host: LockedBuffer<u32>,
    /// `check_host` as the device sees it, where results are mapped: the
    /// check writes its verdict there and no copy follows.
    check_mapped: Option<DevSlice<'static, u32>>,
}

/// What one slot's buffers are sized for: N rows of D columns, the slot's
/// [`Sizes`], `max_k` results per query, `gather` listed ids and
/// `filter_list` rows listed by a filtered chunk (0 where batches are never
/// filtered).
pub(crate) struct SlotShape {
    pub(crate) n: usize,
    pub(crate) d: usize,
    pub(crate) sizes: Sizes,
    pub(crate) max_k: usize,
    pub(crate) gather: usize,
    pub(crate) filter_list: usize,
    /// Rows of the list and allow-set scratch (0: none).
    pub(crate) lists: usize,
    /// How the corpus stores its values (the gathered rows are stored alike).
    pub(crate) dtype: Dtype,
    /// Sampled lower bounds a filtered chunk's query holds (0: none).
    pub(crate) sampled: usize,
    /// Whether f32 rows may have their Hopper bounds from an f16 copy
    /// (`Tuning::shadow_bounds`), whose queries are f16 too.
    pub(crate) shadow: bool,
}

impl SlotShape {
    /// Queries whose half operands a slot holds: a filtered chunk's where
    /// the rows are a half type or have an f16 copy, none otherwise.
    fn half_queries(&self) -> usize {
        if (self.dtype == Dtype::F32 && !self.shadow) || self.filter_list == 0 {
            0
        } else {
            self.sizes.chunk
        }
    }

    /// The type of those half operands: the rows', or f16 for the copy of
    /// f32 rows.
    fn half_dtype(&self) -> Dtype {
        match self.dtype {
            Dtype::F32 => Dtype::F16,
            half => half,
        }
    }

    /// Bytes of a half query value.
    fn half_bytes(&self) -> usize {
        self.half_dtype().bytes()
    }

    /// Device bytes one slot needs, for the up-front memory check.
    pub(crate) fn bytes(&self) -> usize {
        let Sizes { staged, chunk } = self.sizes;
        let (n, d) = (self.n, self.d);
        staged * d * 4
            + chunk * 4
            + chunk * n * 4
            + chunk * AREA_STRIDE * 4
            + chunk * 16
            + chunk * CAND_CAP * 8
            + chunk * MAYBE_CAP * 8
            + staged * (self.max_k + 1) * 8
            + self.gather * 12
            + self.filter_list * 4
            + (self.sizes.turn_chunks() + staged) * 4
            + self.lists * 12
            + compact_rows(self.lists, d) * (d * self.dtype.bytes() + 4)
            + self.half_queries() * (d * self.half_bytes() + 4)
            + chunk * self.sampled * 4
            + chunk * self.lists.div_ceil(64) * 8
    }
}

/// How many queries a slot holds: `staged` queries and their results at
/// once (a batch call's turn), scored and selected `chunk` at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sizes {
    pub(crate) staged: usize,
    pub(crate) chunk: usize,
}

impl Sizes {
    /// `max_batch` queries staged (at most [`MAX_STAGED`]); chunks as large
    /// as `batch_scratch` bytes of scores allow over `n` rows, in whole
    /// 32-query tiles of the batch kernel, at least [`BATCH_CHUNK`] (a
    /// smaller chunk would read the corpus more often than the scoring
    /// needs) and at most the staged queries.
    pub(crate) fn new(n: usize, max_batch: usize, batch_scratch: usize) -> Self {
        let staged = max_batch.min(MAX_STAGED);
        let fit = batch_scratch / (4 * n.max(1));
        let chunk = (fit - fit % 32).max(BATCH_CHUNK).min(staged);
        Sizes { staged, chunk }
    }

    /// Chunks of a full turn.
    pub(crate) fn turn_chunks(&self) -> usize {
        self.staged.div_ceil(self.chunk)
    }
}

impl Slot {
    pub(crate) fn new(
        shape: &SlotShape,
        map_results: bool,
        map_queries: bool,
    ) -> Result<Self, CudaError> {
        let SlotShape {
            n,
            d,
            sizes,
            max_k,
            gather,
            filter_list,
            lists,
            dtype,
            sampled,
            shadow: _,
        } = *shape;
        let Sizes { staged, chunk } = sizes;
        let allow_words = chunk * lists.div_ceil(64);
        let counts = sizes.turn_chunks() + staged;
        let stream = Stream::new(StreamFlags::NON_BLOCKING, None).op("cuStreamCreate")?;
        let mut slot = Slot {
            queries: alloc("query staging", staged * d)?,
            qnorm: alloc("query norms", chunk)?,
            scores: alloc("score buffer", chunk * n)?,
            area: alloc("selection areas", chunk * AREA_STRIDE)?,
            th: alloc("thresholds", chunk)?,
            cand: alloc("candidate keys", chunk * CAND_CAP)?,
            maybe: alloc("threshold-bin keys", chunk * MAYBE_CAP)?,
            out: alloc("results", staged * (max_k + 1))?,
            ids: alloc("gather ids", gather)?,
            owner: alloc("gather owners", gather)?,
            id_scores: alloc("gather scores", gather)?,
            flist: alloc("filtered rows", filter_list.max(1))?,
            fcount: alloc("filter counts", counts)?,
            fcount_host: pinned(counts)?,
            fsample: alloc("sampled lower bounds", chunk * sampled)?,
            q16: RowBuf::alloc("half queries", shape.half_dtype(), shape.half_queries() * d)?,
            q16_inv: alloc("half query scales", shape.half_queries())?,
            q_host: pinned(staged * d)?,
            out_host: pinned(staged * (max_k + 1))?,
            scores_host: pinned(n)?,
            ids_host: pinned(gather)?,
            owner_host: pinned(gather)?,
            id_scores_host: pinned(gather)?,
            graphs: GraphCache::default(),
            list: alloc("filter rows", lists)?,
            list_host: pinned(lists)?,
            allow: alloc("allow sets", allow_words)?,
            allow_host: pinned(allow_words)?,
            compact: RowBuf::alloc("gathered rows", dtype, compact_rows(lists, d) * d)?,
            compact_norms: alloc("gathered norms", compact_rows(lists, d))?,
            want: alloc("allow-list ids", lists)?,
            want_host: pinned(lists)?,
            count: alloc("allowed count", 1)?,
            count_host: pinned(1)?,
            check: alloc("query check", 3)?,
            check_host: pinned(3)?,
            check_mapped: None,
            out_mapped: None,
            q_mapped: None,
            stream,
        };
        if map_results {
            match driver::mapped(&mut slot.out_host) {
                Ok(view) => slot.out_mapped = Some(view),
                Err(e) => tracing::debug!("results copied back: host memory not mapped ({e})"),
            }
            match driver::mapped(&mut slot.check_host) {
                Ok(view) => slot.check_mapped = Some(view),
                Err(e) => tracing::debug!("query verdicts copied back: not mapped ({e})"),
            }
        }
        slot.check_host
            .as_mut_slice()
            .copy_from_slice(&[u32::MAX, 0, u32::MAX]);
        let s = launch::Queue::Stream(slot.stream.as_inner());
        launch::h2d(s, DevSlice::of(&slot.check), &slot.check_host, 0, 3)?;
        if map_queries {
            match driver::mapped(&mut slot.q_host) {
                Ok(view) => slot.q_mapped = Some(view),
                Err(e) => tracing::debug!("host queries copied: host memory not mapped ({e})"),
            }
        }
        launch::zero32(slot.stream.as_inner(), DevSlice::of(&slot.area))?;
        slot.stream.synchronize().op("cuStreamSynchronize")?;
        Ok(slot)
    }

    /// The check's two words ([`Kernels::check_queries`]'s `words`).
    ///
    /// [`Kernels::check_queries`]: crate::launch::Kernels::check_queries
    pub(crate) fn check_words(&self) -> Result<DevSlice<'_, u32>, CudaError> {
        DevSlice::of(&self.check).range("query check words", 0, 2)
    }

    /// Where the check writes its verdict: `check_host` as mapped, else the
    /// third word of `check` (copied back by [`Self::fetch_verdict`]).
    pub(crate) fn verdict_view(&self) -> Result<DevSlice<'_, u32>, CudaError> {
        match self.check_mapped {
            Some(v) => v.range("query verdict", 0, 1),
            None => DevSlice::of(&self.check).range("query verdict", 2, 1),
        }
    }

    /// Queues the verdict's copy to `check_host[0]` where it is not mapped.
    pub(crate) fn fetch_verdict(&mut self) -> Result<(), CudaError> {
        if self.check_mapped.is_some() {
            return Ok(());
        }
        let s = launch::Queue::Stream(self.stream.as_inner());
        let from = DevSlice::of(&self.check).range("query verdict", 2, 1)?;
        launch::d2h(s, &mut self.check_host, from)
    }

    /// Whether results land in `out_host` without a copy.
    pub(crate) fn mapped(&self) -> bool {
        self.out_mapped.is_some()
    }

    /// Where the kernels write results: `out_host` as mapped, else `out`.
    pub(crate) fn out_view(&self) -> DevSlice<'_, DevNeighbor> {
        self.out_mapped.unwrap_or_else(|| DevSlice::of(&self.out))
    }

    /// The slot's staged queries from query `first` on, for `nq` queries of
    /// `d` values.
    pub(crate) fn queries_at(
        &self,
        d: usize,
        first: usize,
        nq: usize,
    ) -> Result<DevSlice<'_, f32>, CudaError> {
        DevSlice::of(&self.queries).range("query staging", first * d, nq * d)
    }

    /// The buffers the selection kernels take, results from row `first` of
    /// rows of `k + 1` entries where [`Self::out_view`] says.
    pub(crate) fn select_bufs(&self, first: usize, k: usize) -> Result<SelectBufs<'_>, CudaError> {
        Ok(SelectBufs {
            scores: DevSlice::of(&self.scores),
            area: DevSlice::of(&self.area),
            th: DevSlice::of(&self.th),
            cand: DevSlice::of(&self.cand),
            maybe: DevSlice::of(&self.maybe),
            out: self.out_view().skip("results", first * (k + 1))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_chunks_grow_with_the_scratch_and_stay_in_bounds() {
        let scratch = crate::DEFAULT_BATCH_SCRATCH;
        // A whole default batch in one chunk up to 1M rows (2^20).
        assert_eq!(
            Sizes::new(1 << 20, 256, scratch),
            Sizes {
                staged: 256,
                chunk: 256
            }
        );
        assert_eq!(Sizes::new(1_000_000, 256, scratch).chunk, 256);
        assert_eq!(Sizes::new(10_000, 256, scratch).chunk, 256);
        // Whole 32-query tiles beyond: 170 fit at 1.5M rows, 89 at 3M.
        assert_eq!(Sizes::new(1_500_000, 256, scratch).chunk, 160);
        assert_eq!(Sizes::new(3_000_000, 256, scratch).chunk, 64);
        assert_eq!(Sizes::new(300_000, 256, 256 << 20).chunk, 192);
        // Never fewer than 64 (nor more than staged), whatever the scratch.
        assert_eq!(Sizes::new(10_000_000, 256, scratch).chunk, 64);
        assert_eq!(Sizes::new(10_000, 256, 0).chunk, 64);
        assert_eq!(
            Sizes::new(10_000, 5, scratch),
            Sizes {
                staged: 5,
                chunk: 5
            }
        );
        // Staging stops at MAX_STAGED queries; a larger max_batch runs in turns.
        assert_eq!(
            Sizes::new(10, 1 << 20, scratch),
            Sizes {
                staged: 1024,
                chunk: 1024
            }
        );
        assert_eq!(
            Sizes::new(0, 3, 0),
            Sizes {
                staged: 3,
                chunk: 3
            }
        );
    }
}
