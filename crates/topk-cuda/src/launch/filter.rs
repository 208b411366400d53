//! Launches of the filtered batch (`kernels/filter.cu`): tensor-core lower
//! bounds, the listing of rows that may reach the top K, their canonical
//! scores and the selection among them; and the scores of listed ids
//! (`kernels/score_ids.cu`), the HNSW crate's batched distances. The
//! Hopper bound kernels' launches are in `filter90.rs`.

use std::ffi::c_void;

use topk_core::Metric;

use super::filter90::{approx90_run, Emitted, HalfQueries};
use super::{
    kernel_args, metric_slot, Kernels, Launch, Listed, Operands, Queue, CAND_CAP, RANK_TMP_BYTES,
    SCORE_THREADS, SEL_THREADS,
};
use crate::device::DevNeighbor;
use crate::driver::DevSlice;
use crate::error::CudaError;

/// Block tile of `topk_approx_*` (`AX_BQ` queries × `AX_BR` rows, 256
/// threads) and its dynamic shared memory (`AX_STAGES` × (`AX_BQ` +
/// `AX_BR`) × `AX_LD` floats).
const APPROX_QUERIES: u32 = 64;
const APPROX_ROWS: u32 = 128;
pub(super) const APPROX_SMEM: usize = 3 * (64 + 128) * 36 * 4;
/// Threads of `topk_filter_*` and `topk_rescore_*` (`FILTER_THREADS`).
const FILTER_THREADS: u32 = 256;
/// Runs of 32 rows a warp of `topk_filter_*` reads a step (`FILTER_UNROLL`).
const FILTER_UNROLL: u32 = 4;
/// Blocks per multiprocessor of `topk_filter_*`, shared among the chunk's
/// queries: enough loads in flight to stream the lower bounds.
const FILTER_BLOCKS_PER_SM: u32 = 16;
/// Blocks per multiprocessor of `topk_rescore_*`, shared among a chunk's
/// queries.
const RESCORE_BLOCKS_PER_SM: u32 = 16;

/// Checks the alignment the tensor-core kernel's 16-byte copies need.
pub(super) fn check_aligned(ops: &Operands<'_>) -> Result<(), CudaError> {
    if ops.d % 4 != 0 || ops.corpus.ptr() % 16 != 0 || ops.queries.ptr() % 16 != 0 {
        return Err(CudaError::InvalidOption {
            name: "D of a filtered batch",
            value: ops.d as usize,
            reason: "the filtered path needs D % 4 == 0 and 16-byte aligned rows",
        });
    }
    Ok(())
}

/// Where a filtered chunk's bound kernel also writes the lower bounds of
/// every 2^`shift`-th row (`shift` 0: nowhere), `ceil(n / 2^shift)` a query.
#[derive(Clone, Copy)]
pub(crate) struct Sampled<'a> {
    pub(crate) bounds: DevSlice<'a, f32>,
    pub(crate) shift: u32,
}

impl Kernels {
    /// Lower bounds of the canonical scores of the queries against the
    /// corpus, from tensor cores, into `ops.scores` (every norm read).
    /// `half` is the room the Hopper bounds of half-width rows need (with
    /// D % 8 != 0 such rows take the `mma.sync` bounds).
    /// `sampled` also gets the bounds of every 2^shift-th row.
    pub(crate) fn approx(
        &self,
        q: Queue<'_>,
        metric: Metric,
        ops: &Operands<'_>,
        half: HalfQueries<'_>,
        sampled: Sampled<'_>,
    ) -> Result<(), CudaError> {
        ops.check(true, true)?;
        check_aligned(ops)?;
        if sampled.shift > 0 {
            let per_query = (ops.n as usize).div_ceil(1 << sampled.shift);
            sampled
                .bounds
                .need("sampled lower bounds", ops.nq as usize * per_query)?;
        }
        if let Some((f, bq)) = self.bound_queries90(q, ops, half)? {
            return approx90_run(q, f, metric, ops, bq, ops.scores, sampled, 0);
        }
        kernel_args!(
            args = [
                corpus = ops.corpus.ptr(),
                rnorm = ops.rnorm.ptr(),
                n = ops.n,
                d = ops.d,
                queries = ops.queries.ptr(),
                nq = ops.nq,
                qnorm = ops.qnorm.ptr(),
                scores = ops.scores.ptr(),
                sub = sampled.bounds.ptr(),
                shift = sampled.shift
            ]
        );
        let blocks = ops.nq.div_ceil(APPROX_QUERIES) * ops.n.div_ceil(APPROX_ROWS);
        let launch = Launch::new(
            "topk_approx",
            self.approx[metric_slot(metric)],
            (blocks, 1),
            SCORE_THREADS,
        )
        .shared(APPROX_SMEM);
        // SAFETY: the parameter list of topk_approx_*; buffers and
        // alignment checked above; the dynamic shared memory was allowed at
        // load.
        unsafe { launch.run(q, &mut args) }
    }

    /// Lists, per query, the rows whose upper bound reaches the K-th lower
    /// bound in `ops.scores` that the first selection wrote into `out`
    /// (rows of k + 1): into `lists` (counts and flag zero before); the flag
    /// becomes nonzero when a query lists more than CAND_CAP rows or its
    /// selection did not finish on the device.
    pub(crate) fn filter(
        &self,
        q: Queue<'_>,
        metric: Metric,
        ops: &Operands<'_>,
        out: DevSlice<'_, DevNeighbor>,
        k: u32,
        lists: &Listed<'_>,
    ) -> Result<(), CudaError> {
        ops.check(true, true)?;
        lists.check(ops.nq)?;
        out.need("results", ops.nq as usize * (k as usize + 1))?;
        let (n, d, nq) = (ops.n, ops.d, ops.nq);
        let per_query = n
            .div_ceil(FILTER_THREADS * FILTER_UNROLL)
            .clamp(1, (FILTER_BLOCKS_PER_SM * self.sm_count / nq.max(1)).max(1));
        kernel_args!(
            args = [
                scores = ops.scores.ptr(),
                rnorm = ops.rnorm.ptr(),
                n,
                d,
                qnorm = ops.qnorm.ptr(),
                out = out.ptr(),
                k,
                list = lists.list.ptr(),
                count = lists.count.ptr(),
                flag = lists.flag.ptr()
            ]
        );
        let launch = Launch::new(
            "topk_filter",
            self.filter[metric_slot(metric)],
            (per_query, nq),
            FILTER_THREADS,
        );
        // SAFETY: the parameter list of topk_filter_*; buffers checked above.
        unsafe { launch.run(q, &mut args) }
    }

    /// [`Self::filter`] over the rows the Hopper listing put into `e`
    /// (their lower bounds against the K-th of them that the selection over
    /// `e.lo` wrote into `out`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn filter_emitted(
        &self,
        q: Queue<'_>,
        metric: Metric,
        ops: &Operands<'_>,
        out: DevSlice<'_, DevNeighbor>,
        k: u32,
        e: &Emitted<'_>,
        lists: &Listed<'_>,
    ) -> Result<(), CudaError> {
        ops.rnorm.need("row norms", ops.n as usize)?;
        ops.qnorm.need("query norms", ops.nq as usize)?;
        e.check(ops.nq)?;
        lists.check(ops.nq)?;
        out.need("results", ops.nq as usize * (k as usize + 1))?;
        let (cap, d, nq) = (e.cap, ops.d, ops.nq);
        let per_query = cap
            .div_ceil(FILTER_THREADS * FILTER_UNROLL)
            .clamp(1, (FILTER_BLOCKS_PER_SM * self.sm_count / nq.max(1)).max(1));
        kernel_args!(
            args = [
                lo = e.lo.ptr(),
                rnorm = ops.rnorm.ptr(),
                cap,
                d,
                qnorm = ops.qnorm.ptr(),
                out = out.ptr(),
                k,
                rows = e.rows.ptr(),
                count = e.count.ptr(),
                list = lists.list.ptr(),
                listed = lists.count.ptr(),
                flag = lists.flag.ptr()
            ]
        );
        let launch = Launch::new(
            "topk_filter_emitted",
            self.filter_emitted[metric_slot(metric)],
            (per_query, nq),
            FILTER_THREADS,
        );
        // SAFETY: the parameter list of topk_filter_emitted_*; buffers
        // checked above; the listed rows the kernel reads norms of are rows
        // the listing kernel wrote, all below n.
        unsafe { launch.run(q, &mut args) }
    }

    /// Canonical scores of the rows [`Self::filter`] listed, into
    /// `ops.scores`.
    pub(crate) fn rescore(
        &self,
        q: Queue<'_>,
        metric: Metric,
        ops: &Operands<'_>,
        lists: &Listed<'_>,
    ) -> Result<(), CudaError> {
        ops.check(true, true)?;
        lists.check(ops.nq)?;
        let (n, d, nq) = (ops.n, ops.d, ops.nq);
        // 16 blocks per SM among the chunk's queries (at most 32 a query):
        // 1-2 % faster than 4 at 1M rows, Q = 256 (measured on an H200,
        // bench/gpu/NOTES.md); a block's 32 teams score a query's rows.
        let per_query = (RESCORE_BLOCKS_PER_SM * self.sm_count / nq.max(1)).clamp(1, 32);
        kernel_args!(
            args = [
                corpus = ops.corpus.ptr(),
                rnorm = ops.rnorm.ptr(),
                n,
                d,
                queries = ops.queries.ptr(),
                qnorm = ops.qnorm.ptr(),
                list = lists.list.ptr(),
                count = lists.count.ptr(),
                flag = lists.flag.ptr(),
                scores = ops.scores.ptr()
            ]
        );
        let launch = Launch::new(
            "topk_rescore",
            self.rescore[metric_slot(metric)],
            (per_query, nq),
            FILTER_THREADS,
        );
        // SAFETY: the parameter list of topk_rescore_*; buffers checked
        // above; listed rows are < n (the listing writes only row indices).
        unsafe { launch.run(q, &mut args) }
    }

    /// The exact best `k` of each query's listed rows, by their canonical
    /// scores in `ops.scores`, into `out` (rows of k + 1).
    pub(crate) fn select_listed(
        &self,
        q: Queue<'_>,
        ops: &Operands<'_>,
        lists: &Listed<'_>,
        k: u32,
        out: DevSlice<'_, DevNeighbor>,
    ) -> Result<(), CudaError> {
        let (n, nq) = (ops.n, ops.nq);
        ops.scores.need("scores", nq as usize * n as usize)?;
        lists.check(nq)?;
        out.need("results", nq as usize * (k as usize + 1))?;
        if k == 0 || k as usize > CAND_CAP / 2 {
            return Err(CudaError::InvalidOption {
                name: "k of a listed selection",
                value: k as usize,
                reason: "must be in 1..=2048",
            });
        }
        kernel_args!(
            args = [
                scores = ops.scores.ptr(),
                n,
                list = lists.list.ptr(),
                count = lists.count.ptr(),
                flag = lists.flag.ptr(),
                k,
                out = out.ptr()
            ]
        );
        let launch = Launch::new(
            "topk_select_listed",
            self.select_listed,
            (1, nq),
            SEL_THREADS,
        )
        .shared(RANK_TMP_BYTES);
        // SAFETY: the parameter list of topk_select_listed; buffers checked
        // above; its ranking scratch is the dynamic shared memory allowed at
        // load.
        unsafe { launch.run(q, &mut args) }
    }

    /// Scores one (query, row) pair per element of `ids`: pair `i` is row
    /// `ids[i]` against query `owner[i]`, into `out[i]`. Every id must be below `ops.n` and
    /// every owner below `ops.nq` (checked by the caller on the host before
    /// the copy).
    pub(crate) fn score_ids(
        &self,
        q: Queue<'_>,
        metric: Metric,
        ops: &Operands<'_>,
        ids: DevSlice<'_, u32>,
        owner: DevSlice<'_, u32>,
        out: DevSlice<'_, f32>,
    ) -> Result<(), CudaError> {
        let cosine = metric == Metric::Cosine;
        let (n, d, nq) = (ops.n as usize, ops.d as usize, ops.nq as usize);
        ops.corpus.need("corpus", n * d)?;
        ops.queries.need("queries", nq * d)?;
        if cosine {
            ops.rnorm.need("row norms", n)?;
            ops.qnorm.need("query norms", nq)?;
        }
        let count = ids.len() as u32;
        owner.need("gather owners", count as usize)?;
        out.need("gather scores", count as usize)?;
        let warps = SCORE_THREADS / 32;
        let blocks = count.div_ceil(warps).clamp(1, self.sm_count * 16);
        kernel_args!(
            args = [
                corpus = ops.corpus.ptr(),
                rnorm = ops.rnorm.ptr(),
                d = ops.d,
                queries = ops.queries.ptr(),
                qnorm = ops.qnorm.ptr(),
                ids = ids.ptr(),
                owner = owner.ptr(),
                count,
                out = out.ptr()
            ]
        );
        let launch = Launch::new(
            "topk_score_ids",
            self.ids[metric_slot(metric)],
            (blocks, 1),
            SCORE_THREADS,
        );
        // SAFETY: the parameter list of topk_score_ids_*; buffers checked
        // above, ids and owners in range by the caller's host check.
        unsafe { launch.run(q, &mut args) }
    }
}

#[cfg(test)]
mod tests {
    use super::super::filter90::QUERIES16_THREADS;
    use super::super::tests::{define, FILTER90_CU, FILTER_CU};
    use super::*;

    #[test]
    fn host_constants_mirror_the_filter_kernels() {
        let (bq, br) = (define(FILTER_CU, "AX_BQ"), define(FILTER_CU, "AX_BR"));
        assert_eq!((bq as u32, br as u32), (APPROX_QUERIES, APPROX_ROWS));
        assert_eq!(define(FILTER_CU, "AX_THREADS"), SCORE_THREADS as usize);
        assert_eq!(define(FILTER_CU, "FILTER_THREADS"), FILTER_THREADS as usize);
        assert_eq!(define(FILTER_CU, "FILTER_UNROLL"), FILTER_UNROLL as usize);
        assert_eq!(
            define(FILTER90_CU, "W9_QUERY_THREADS"),
            QUERIES16_THREADS as usize
        );
        let ld = define(FILTER_CU, "AX_BK") + 4;
        assert_eq!(
            APPROX_SMEM,
            define(FILTER_CU, "AX_STAGES") * (bq + br) * ld * 4
        );
    }
}
