//! Launches of `kernels/rows.cu`: the row moves, overwrites and masks of the
//! mutable resident corpus, and the scores of a list of rows.

use std::ffi::c_void;

use cust::sys as cu;
use topk_core::Metric;

use super::{kernel_args, metric_slot, Kernels, Launch, Operands, Queue, SCORE_THREADS};
use crate::driver::{DevSlice, Rows};
use crate::error::CudaError;

/// Flag of a `gather_rows` map entry taking the row from the second source
/// (`TOPK_FROM_B`).
pub(crate) const FROM_B: u32 = 0x8000_0000;

/// Blocks of an elementwise pass over `total` values: one value per thread
/// up to 16 blocks per multiprocessor, then a stride loop.
fn elementwise_blocks(sm_count: u32, total: usize) -> u32 {
    (total.div_ceil(SCORE_THREADS as usize) as u64).clamp(1, u64::from(sm_count) * 16) as u32
}

impl Kernels {
    /// The move kernel of views that all store values of one width: the
    /// f32 one (`f32`, the f32 pair of a move) for 4 bytes, the stored-row
    /// one of the modules' storage type for theirs; an error naming `what`
    /// for any other mix.
    fn moving(
        &self,
        what: &'static str,
        views: [Rows<'_>; 3],
        f32: [cu::CUfunction; 2],
    ) -> Result<cu::CUfunction, CudaError> {
        let width = views[0].width();
        if views.iter().any(|v| v.width() != width) || (width != 4 && width != self.row_width) {
            return Err(CudaError::CountMismatch {
                what,
                got: width,
                expected: self.row_width,
            });
        }
        Ok(if width == 4 { f32[0] } else { f32[1] })
    }

    /// Row `j` of `dst` (`j < map.len()`) becomes row `map[j]` of `a`, or
    /// row `map[j] & !FROM_B` of `b` where the flag is set. Every map entry
    /// must name a row of its source (checked by the caller).
    pub(crate) fn gather_rows(
        &self,
        q: Queue<'_>,
        a: Rows<'_>,
        b: Rows<'_>,
        map: DevSlice<'_, u32>,
        d: u32,
        dst: Rows<'_>,
    ) -> Result<(), CudaError> {
        let m = map.len() as u32;
        dst.need("gathered rows", m as usize * d as usize)?;
        let f = self.moving("gathered rows", [a, b, dst], self.gather_rows)?;
        kernel_args!(
            args = [
                src_a = a.ptr(),
                src_b = b.ptr(),
                map = map.ptr(),
                m,
                d,
                dst = dst.ptr()
            ]
        );
        let blocks = elementwise_blocks(self.sm_count, m as usize * d as usize);
        let launch = Launch::new("topk_gather_rows", f, (blocks, 1), SCORE_THREADS);
        // SAFETY: the parameter list of topk_gather_rows; `dst` holds m rows
        // and the caller guarantees every map entry names a row of its source.
        unsafe { launch.run(q, &mut args) }
    }

    /// Row `rows[j]` of `dst` becomes row `j` of `src`. Every entry of
    /// `rows` must be a row of `dst` (checked by the caller).
    pub(crate) fn scatter_rows(
        &self,
        q: Queue<'_>,
        src: Rows<'_>,
        rows: DevSlice<'_, u32>,
        d: u32,
        dst: Rows<'_>,
    ) -> Result<(), CudaError> {
        let m = rows.len() as u32;
        src.need("scattered rows", m as usize * d as usize)?;
        let f = self.moving("scattered rows", [src, src, dst], self.scatter_rows)?;
        kernel_args!(args = [src = src.ptr(), rows = rows.ptr(), m, d, dst = dst.ptr()]);
        let blocks = elementwise_blocks(self.sm_count, m as usize * d as usize);
        let launch = Launch::new("topk_scatter_rows", f, (blocks, 1), SCORE_THREADS);
        // SAFETY: the parameter list of topk_scatter_rows; `src` holds m rows
        // and the caller guarantees every target row lies in `dst`.
        unsafe { launch.run(q, &mut args) }
    }

    /// Sets score `i` of each of `nq` rows of `n` scores to NaN (below every
    /// score in the §3 order) where bit `i` of that query's allow set (`words`, `stride` words apart; 0: one
    /// set for all) is clear.
    pub(crate) fn mask_scores(
        &self,
        q: Queue<'_>,
        scores: DevSlice<'_, f32>,
        n: u32,
        nq: u32,
        words: DevSlice<'_, u64>,
        stride: u32,
    ) -> Result<(), CudaError> {
        scores.need("masked scores", n as usize * nq as usize)?;
        let per_query = (n as usize).div_ceil(64);
        let sets = if stride == 0 { 1 } else { nq as usize };
        words.need("allow sets", (sets - 1) * stride as usize + per_query)?;
        kernel_args!(args = [scores = scores.ptr(), n, nq, words = words.ptr(), stride]);
        let blocks = elementwise_blocks(self.sm_count, n as usize * nq as usize);
        let launch = Launch::new(
            "topk_mask_scores",
            self.mask_scores,
            (blocks, 1),
            SCORE_THREADS,
        );
        // SAFETY: the parameter list of topk_mask_scores; both buffers checked.
        unsafe { launch.run(q, &mut args) }
    }

    /// Canonical scores of the `ops.nq` queries against the rows of `list`
    /// into `out` (query `q`'s score of `list[j]` at `q * list.len() + j`).
    /// Every listed row must be below `ops.n` (checked by the caller).
    pub(crate) fn score_list(
        &self,
        q: Queue<'_>,
        metric: Metric,
        ops: &Operands<'_>,
        list: DevSlice<'_, u32>,
        out: DevSlice<'_, f32>,
    ) -> Result<(), CudaError> {
        let (n, d, nq) = (ops.n as usize, ops.d as usize, ops.nq as usize);
        let m = list.len();
        ops.corpus.need("corpus", n * d)?;
        ops.queries.need("queries", nq * d)?;
        if metric == Metric::Cosine {
            ops.rnorm.need("row norms", n)?;
            ops.qnorm.need("query norms", nq)?;
        }
        out.need("list scores", m * nq)?;
        let warps = SCORE_THREADS / 32;
        let blocks = ((m * nq).div_ceil(warps as usize) as u64)
            .clamp(1, u64::from(self.sm_count) * 16) as u32;
        let m = m as u32;
        kernel_args!(
            args = [
                corpus = ops.corpus.ptr(),
                rnorm = ops.rnorm.ptr(),
                d = ops.d,
                queries = ops.queries.ptr(),
                qnorm = ops.qnorm.ptr(),
                nq = ops.nq,
                list = list.ptr(),
                m,
                out = out.ptr()
            ]
        );
        let launch = Launch::new(
            "topk_score_list",
            self.score_list[metric_slot(metric)],
            (blocks, 1),
            SCORE_THREADS,
        );
        // SAFETY: the parameter list of topk_score_list_*; sizes checked
        // above and every listed row lies in the corpus (caller).
        unsafe { launch.run(q, &mut args) }
    }

    /// Writes to `verdict[0]` the first of `nq` device queries of `d` values
    /// breaking docs/CONTRACTS.md §4 (`u32::MAX`: none), copying them to
    /// `staged` as they are read where it is given. `words` (two, `u32::MAX`
    /// then 0 before the first launch) are the kernel's and left so again.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn check_queries(
        &self,
        q: Queue<'_>,
        queries: DevSlice<'_, f32>,
        nq: u32,
        d: u32,
        staged: Option<DevSlice<'_, f32>>,
        words: DevSlice<'_, u32>,
        verdict: DevSlice<'_, u32>,
    ) -> Result<(), CudaError> {
        let values = nq as usize * d as usize;
        queries.need("checked queries", values)?;
        if let Some(st) = staged {
            st.need("query staging", values)?;
        }
        words.need("query check words", 2)?;
        verdict.need("query check verdict", 1)?;
        kernel_args!(
            args = [
                queries = queries.ptr(),
                nq,
                d,
                staged = staged.map_or(0, |s| s.ptr()),
                words = words.ptr(),
                verdict = verdict.ptr()
            ]
        );
        let warps = SCORE_THREADS / 32;
        let blocks = nq.div_ceil(warps).clamp(1, self.sm_count * 16);
        let launch = Launch::new(
            "topk_check_queries",
            self.check_queries,
            (blocks, 1),
            SCORE_THREADS,
        );
        // SAFETY: the parameter list of topk_check_queries; sizes checked
        // (a null `staged` is not written).
        unsafe { launch.run(q, &mut args) }
    }

    /// Resolves the `want.len()` ascending ids of an allow-list against the
    /// `n` ascending stored ids (`live`: the live bitset, or `None` when every
    /// stored row is live): each id's row (or `u32::MAX`, `TOPK_NO_ROW`) into `rows`, the bits
    /// of the allowed rows set in `bits` (zero before), their number added to
    /// `count[0]`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn resolve_ids(
        &self,
        q: Queue<'_>,
        ids: DevSlice<'_, u64>,
        n: u32,
        live: Option<DevSlice<'_, u64>>,
        want: DevSlice<'_, u64>,
        rows: DevSlice<'_, u32>,
        bits: DevSlice<'_, u64>,
        count: DevSlice<'_, u32>,
    ) -> Result<(), CudaError> {
        let m = want.len() as u32;
        ids.need("stored ids", n as usize)?;
        rows.need("resolved rows", m as usize)?;
        bits.need("allow bits", (n as usize).div_ceil(64))?;
        count.need("allowed count", 1)?;
        let live_ptr = match live {
            Some(l) => {
                l.need("live rows", (n as usize).div_ceil(64))?;
                l.ptr()
            }
            None => 0,
        };
        kernel_args!(
            args = [
                ids = ids.ptr(),
                n,
                live = live_ptr,
                want = want.ptr(),
                m,
                rows = rows.ptr(),
                bits = bits.ptr(),
                count = count.ptr()
            ]
        );
        let blocks = elementwise_blocks(self.sm_count, m as usize);
        let launch = Launch::new(
            "topk_resolve_ids",
            self.resolve_ids,
            (blocks, 1),
            SCORE_THREADS,
        );
        // SAFETY: the parameter list of topk_resolve_ids; every buffer holds
        // what the kernel indexes (checked above); a null `live` is allowed.
        unsafe { launch.run(q, &mut args) }
    }
}
