//! Launches of the selection kernels (`kernels/select.cu`): the one-block
//! selection of small corpora, and the grid-wide histogram and gather.

use std::ffi::c_void;

use super::{kernel_args, Kernels, Launch, Queue, SelectBufs, RANK_TMP_BYTES, SEL_THREADS};
use crate::error::CudaError;

/// Rows whose ordered bits `topk_select_small` keeps in shared memory
/// (`TOPK_STASH_ROWS`).
pub(super) const STASH_ROWS: u32 = 16384;
/// Rows per thread that size the grid of the grid-wide selection passes
/// (topk_hist, topk_gather): few enough that a single query's gather spreads
/// over most multiprocessors, since the pass is bound by load latency.
const SELECT_ROWS_PER_THREAD: u32 = 4;
/// Selection blocks per multiprocessor that a batch's queries share (see
/// [`select_blocks`]).
const BATCH_SELECT_BLOCKS_PER_SM: u32 = 4;

/// Dynamic shared memory of `topk_select_small` over `n` rows: the stash of
/// every row's ordered bits (n <= STASH_ROWS), which the ranking's scratch
/// reuses once the gather is done, so never less than that scratch.
pub(super) fn small_smem(n: u32) -> usize {
    let stash = if n <= STASH_ROWS { n as usize * 4 } else { 0 };
    stash.max(RANK_TMP_BYTES)
}

/// Blocks per query of the grid-wide selection passes over `n` scores:
/// about SELECT_ROWS_PER_THREAD rows per thread, at most the device's `sm`
/// multiprocessors for one query, and for a batch at most
/// [`BATCH_SELECT_BLOCKS_PER_SM`] blocks per multiprocessor shared among the
/// queries (one block per multiprocessor shared among 64 queries left half
/// the device idle on an H200).
fn select_blocks(sm: u32, n: u32, nq: u32) -> u32 {
    let per_query = n.div_ceil(SEL_THREADS * SELECT_ROWS_PER_THREAD);
    let cap = if nq <= 1 {
        sm
    } else {
        (BATCH_SELECT_BLOCKS_PER_SM * sm / nq).max(1)
    };
    per_query.clamp(1, cap)
}

impl Kernels {
    /// The whole selection of each of `nq` queries in one block: its best
    /// `k` into `bufs.out` (one row of k + 1 entries per query: header, then
    /// results), leaving the query areas (zero before) at zero.
    pub(crate) fn select_small(
        &self,
        q: Queue<'_>,
        bufs: &SelectBufs<'_>,
        n: u32,
        nq: u32,
        k: u32,
    ) -> Result<(), CudaError> {
        bufs.check(n, nq, k)?;
        let stride = k + 1;
        kernel_args!(
            args = [
                scores = bufs.scores.ptr(),
                n,
                area = bufs.area.ptr(),
                cand = bufs.cand.ptr(),
                maybe = bufs.maybe.ptr(),
                k,
                out = bufs.out.ptr(),
                stride
            ]
        );
        let launch = Launch::new("topk_select_small", self.select_small, (1, nq), SEL_THREADS)
            .shared(small_smem(n));
        // SAFETY: the parameter list of topk_select_small; buffers checked
        // above; the stash and scratch fit the shared memory allowed at load
        // (small_smem grows with n up to STASH_ROWS only).
        unsafe { launch.run(q, &mut args) }
    }

    /// Counts each query's scores in its level-1 histogram (zero before)
    /// and finds its threshold for `k` into `bufs.th`, leaving the
    /// histogram at zero.
    pub(crate) fn hist(
        &self,
        q: Queue<'_>,
        bufs: &SelectBufs<'_>,
        n: u32,
        nq: u32,
        k: u32,
    ) -> Result<(), CudaError> {
        bufs.check(n, nq, k)?;
        kernel_args!(
            args = [
                scores = bufs.scores.ptr(),
                n,
                area = bufs.area.ptr(),
                k,
                th = bufs.th.ptr()
            ]
        );
        let grid = (select_blocks(self.sm_count, n, nq), nq);
        let launch = Launch::new("topk_hist", self.hist, grid, SEL_THREADS);
        // SAFETY: the parameter list of topk_hist; buffers checked above.
        unsafe { launch.run(q, &mut args) }
    }

    /// Gathers the candidates of each query and selects its best `k` into
    /// `bufs.out` (one row of k + 1 entries per query: header, then
    /// results), leaving each query's level-2 histogram and counters at
    /// zero; `bufs.th` from [`Self::hist`] or the scoring kernel.
    pub(crate) fn gather(
        &self,
        q: Queue<'_>,
        bufs: &SelectBufs<'_>,
        n: u32,
        nq: u32,
        k: u32,
    ) -> Result<(), CudaError> {
        bufs.check(n, nq, k)?;
        let stride = k + 1;
        kernel_args!(
            args = [
                scores = bufs.scores.ptr(),
                n,
                area = bufs.area.ptr(),
                th = bufs.th.ptr(),
                cand = bufs.cand.ptr(),
                maybe = bufs.maybe.ptr(),
                k,
                out = bufs.out.ptr(),
                stride
            ]
        );
        let grid = (select_blocks(self.sm_count, n, nq), nq);
        let launch =
            Launch::new("topk_gather", self.gather, grid, SEL_THREADS).shared(RANK_TMP_BYTES);
        // SAFETY: the parameter list of topk_gather; buffers checked above;
        // its scratch is the dynamic shared memory allowed at load.
        unsafe { launch.run(q, &mut args) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_grids_fill_the_device_for_batches() {
        // One query: a block per 4,096 rows, at most one per multiprocessor.
        assert_eq!(select_blocks(132, 1_000_000, 1), 132);
        assert_eq!(select_blocks(132, 100_000, 1), 25);
        assert_eq!(select_blocks(132, 100, 1), 1);
        // A batch shares four blocks per multiprocessor, at least one each.
        assert_eq!(select_blocks(132, 1_000_000, 64), 8);
        assert_eq!(select_blocks(132, 1_000_000, 256), 2);
        assert_eq!(select_blocks(132, 1_000_000, 1024), 1);
        assert_eq!(select_blocks(132, 20_000, 64), 5);
    }

    #[test]
    fn the_one_block_select_always_has_room_for_the_ranking_scratch() {
        assert_eq!(small_smem(1), RANK_TMP_BYTES);
        assert_eq!(small_smem(STASH_ROWS), STASH_ROWS as usize * 4);
        assert_eq!(small_smem(STASH_ROWS + 1), RANK_TMP_BYTES);
        assert!((0..=2 * STASH_ROWS).all(|n| small_smem(n) <= small_smem(STASH_ROWS)));
    }
}
