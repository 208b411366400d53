//! Launches of the scoring kernels: the staged single-query kernel and the
//! one-launch search (`kernels/score_single.cu`), the resident-query and
//! general batch kernels (`kernels/score_batch.cu`), norms and the mapped
//! query fetch (`kernels/norms.cu`).

use std::ffi::c_void;

use cust::sys as cu;
use topk_core::Metric;

use super::{
    fits_shared, kernel_args, metric_slot, Kernels, Launch, Operands, Queue, SelectBufs,
    SCORE_THREADS, SEL_THREADS,
};
use crate::device::DevThreshold;
use crate::driver::{DPtr, DevSlice, Rows};
use crate::error::CudaError;
use crate::plan::SINGLE_MAX_DIM;

/// Rows a block of the single-query scoring kernel stages at once
/// (`SINGLE_WARPS × SINGLE_RT`).
const SINGLE_ROWS: u32 = 32;
/// Shared-memory bytes of its row tiles (`SINGLE_DEPTH` tiles of
/// `SINGLE_ROWS × STAGE_CW` floats).
const SINGLE_TILE_BYTES: usize = 3 * 32 * 128 * 4;
/// Threads of the one-launch search kernel (`TOPK_SEL_THREADS`).
const SEARCH_THREADS: u32 = SEL_THREADS;
/// Rows a block of the one-launch search stages at once
/// (`SEARCH_WARPS × SEARCH_RT`).
const SEARCH_ROWS: u32 = 64;
/// Shared-memory bytes of its row tiles (`SEARCH_DEPTH` tiles).
const SEARCH_TILE_BYTES: usize = 4 * 64 * 128 * 4;
/// Queries per tile of the general batch kernel (`BATCH_QT`).
const BATCH_QT: u32 = 8;
/// Rows per warp of the general batch kernel (`BATCH_RT`).
const BATCH_ROWS_PER_WARP: u32 = 4;

/// One shape of the resident-query batch kernels (`BQ32_*`, `BQ16_*` in
/// `kernels/shapes.cuh`): a block keeps `queries` queries in shared memory and
/// walks blocks of `rows` rows through `depth` stages of `sub` chunks each.
#[derive(Clone, Copy, Debug)]
pub(super) struct BatchShape {
    queries: u32,
    rows: u32,
    threads: u32,
    depth: u32,
    sub: u32,
}

/// Columns per staged chunk of the batch kernels (`BCH_CH`).
const BATCH_CHUNK_COLS: usize = 128;
/// 32 queries × 32 rows per block: batches of more than
/// [`BATCH_SMALL_MAX`] queries.
const BATCH_Q32: BatchShape = BatchShape {
    queries: 32,
    rows: 32,
    threads: 256,
    depth: 2,
    sub: 2,
};
/// 16 queries × 64 rows per block: smaller batches (measured faster than the
/// 32-query shape from 16 to 40 queries on an H200, level at 64).
const BATCH_Q16: BatchShape = BatchShape {
    queries: 16,
    rows: 64,
    threads: 256,
    depth: 2,
    sub: 2,
};
/// Largest batch that takes [`BATCH_Q16`] when both shapes fit.
const BATCH_SMALL_MAX: u32 = 48;

impl BatchShape {
    /// Dynamic shared memory for dimension `d`: the row stages, then the
    /// queries padded to whole chunks.
    fn smem(&self, d: usize) -> usize {
        let stages = (self.depth * self.sub * self.rows) as usize * BATCH_CHUNK_COLS;
        (stages + self.queries as usize * d.next_multiple_of(BATCH_CHUNK_COLS)) * 4
    }

    /// The grid for `nq` queries over `n` rows with `resident` blocks on the
    /// device at once: every query tile gets the same number of blocks
    /// (at least one, at most one per row block), which stride over the row
    /// blocks together (the kernel derives the stride from the grid), so the
    /// tiles of one row block share its reads.
    fn grid(&self, n: u32, nq: u32, resident: u32) -> u32 {
        let tiles = nq.div_ceil(self.queries).max(1);
        let row_blocks = n.div_ceil(self.rows).max(1);
        let per_tile = (resident / tiles).clamp(1, row_blocks);
        per_tile.saturating_mul(tiles)
    }
}

/// The two resident-query batch kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BatchKind {
    Q32,
    Q16,
}

impl BatchKind {
    fn shape(self) -> BatchShape {
        match self {
            BatchKind::Q32 => BATCH_Q32,
            BatchKind::Q16 => BATCH_Q16,
        }
    }
}

/// What construction learned about the scoring kernels for the corpus's D:
/// resident blocks of the single-query kernel, and of each resident-query
/// batch kernel whose shared memory fits the device (`None` otherwise; the
/// general batch kernel then runs).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ScorePlan {
    single_grid: u32,
    q32: Option<u32>,
    q16: Option<u32>,
}

impl ScorePlan {
    /// The resident-query kernel for `nq` queries and its resident blocks,
    /// where one fits: the 16-query shape for small batches, the 32-query
    /// shape for larger ones, either where only one fits.
    fn batch(&self, nq: u32) -> Option<(BatchKind, u32)> {
        let q32 = self.q32.map(|b| (BatchKind::Q32, b));
        let q16 = self.q16.map(|b| (BatchKind::Q16, b));
        if nq > BATCH_SMALL_MAX {
            q32.or(q16)
        } else {
            q16.or(q32)
        }
    }
}

/// Slack the staged kernels need to start their tiles on a 128-byte
/// boundary (`TOPK_TILE_ALIGN` of `kernels/stage.cuh`).
const TILE_ALIGN: usize = 128;

/// Dynamic shared memory of a staged kernel for dimension `d`: the query
/// (padded to 16 bytes), up to [`TILE_ALIGN`] bytes of padding, then `tiles`
/// bytes of row tiles.
fn staged_smem(d: usize, tiles: usize) -> usize {
    d.next_multiple_of(4) * 4 + TILE_ALIGN + tiles
}

/// Whether `nq` queries of dimension `d` take the single-query kernels
/// (which compute a cosine query's norm themselves).
pub(crate) fn single_path(nq: usize, d: usize) -> bool {
    nq == 1 && d <= SINGLE_MAX_DIM
}

/// The threshold pass a single query's scoring kernel does besides scoring:
/// its selection area (zeroed), K and where the threshold goes.
#[derive(Clone, Copy)]
pub(crate) struct FusedThreshold<'a> {
    pub(crate) area: DevSlice<'a, u32>,
    pub(crate) k: u32,
    pub(crate) th: DevSlice<'a, DevThreshold>,
}

impl Kernels {
    /// The single-query scoring kernel of `metric` for dimension `d`.
    fn single_kernel(&self, metric: Metric, d: usize) -> cu::CUfunction {
        if d % 4 == 0 {
            self.score1[metric_slot(metric)]
        } else {
            self.score1u[metric_slot(metric)]
        }
    }

    /// The one-launch search kernel of `metric` for dimension `d`.
    fn search_kernel(&self, metric: Metric, d: usize) -> cu::CUfunction {
        if d % 4 == 0 {
            self.search1[metric_slot(metric)]
        } else {
            self.search1u[metric_slot(metric)]
        }
    }

    /// Prepares the scoring kernels for `d`: the single-query kernel's grid
    /// (the blocks that fit on the device at once, which stride over the row
    /// groups in one balanced wave) and the resident-query batch kernels
    /// whose shared memory fits.
    pub(crate) fn prepare_score(&self, metric: Metric, d: usize) -> Result<ScorePlan, CudaError> {
        let single_grid = if d > SINGLE_MAX_DIM {
            1
        } else {
            self.prepare_staged(
                self.single_kernel(metric, d),
                SCORE_THREADS,
                staged_smem(d, SINGLE_TILE_BYTES),
            )?
            .max(1)
        };
        let resident = |f: cu::CUfunction, shape: BatchShape| -> Result<Option<u32>, CudaError> {
            let smem = shape.smem(d);
            if !fits_shared(f, smem)? {
                return Ok(None);
            }
            let blocks = self.prepare_staged(f, shape.threads, smem)?;
            Ok((blocks > 0).then_some(blocks))
        };
        let m = metric_slot(metric);
        Ok(ScorePlan {
            single_grid,
            q32: resident(self.scoreq32[m], BATCH_Q32)?,
            q16: resident(self.scoreq16[m], BATCH_Q16)?,
        })
    }

    /// Prepares the one-launch search kernel for `d` and returns its largest
    /// grid (every block resident, as a cooperative launch requires), or
    /// `None` where it cannot run: D past the shared-memory limit, or no
    /// block fits.
    pub(crate) fn prepare_search(
        &self,
        metric: Metric,
        d: usize,
    ) -> Result<Option<u32>, CudaError> {
        let f = self.search_kernel(metric, d);
        let smem = staged_smem(d, SEARCH_TILE_BYTES);
        if d > SINGLE_MAX_DIM || !fits_shared(f, smem)? {
            return Ok(None);
        }
        let grid = self.prepare_staged(f, SEARCH_THREADS, smem)?;
        Ok((grid > 0).then_some(grid))
    }

    /// The whole search of one query (`ops.nq == 1`) in one cooperative
    /// launch: scores into `ops.scores`, then its best `k` into `bufs.out`
    /// (header + k results), leaving the query area at zero (its two grid
    /// barriers add 2^32 to their word). `bufs.area` must be zero and `grid`
    /// from [`Self::prepare_search`] for this metric and D.
    pub(crate) fn search1(
        &self,
        q: Queue<'_>,
        metric: Metric,
        ops: &Operands<'_>,
        bufs: &SelectBufs<'_>,
        k: u32,
        grid: u32,
    ) -> Result<(), CudaError> {
        ops.check(metric == Metric::Cosine, false)?;
        bufs.check(ops.n, 1, k)?;
        let (n, d) = (ops.n, ops.d);
        if d as usize > SINGLE_MAX_DIM {
            return Err(CudaError::InvalidOption {
                name: "D of the one-launch search",
                value: d as usize,
                reason: "must be at most 16,384",
            });
        }
        let blocks = n.div_ceil(SEARCH_ROWS).clamp(1, grid.max(1));
        kernel_args!(
            args = [
                corpus = ops.corpus.ptr(),
                rnorm = ops.rnorm.ptr(),
                n,
                d,
                query = ops.queries.ptr(),
                scores = ops.scores.ptr(),
                area = bufs.area.ptr(),
                k,
                cand = bufs.cand.ptr(),
                maybe = bufs.maybe.ptr(),
                out = bufs.out.ptr()
            ]
        );
        let launch = Launch::new(
            "topk_search1",
            self.search_kernel(metric, d as usize),
            (blocks, 1),
            SEARCH_THREADS,
        )
        .shared(staged_smem(d as usize, SEARCH_TILE_BYTES))
        .cooperative();
        // SAFETY: the parameter list of topk_search1*_*; every buffer was
        // checked above for one query of N rows, D columns and K; the grid
        // fits the device at once (prepare_search), as the kernel's barriers
        // require, and the driver checks it again.
        unsafe { launch.run(q, &mut args) }
    }

    /// Queues the canonical norms of `n` f32 vectors of `d` values at `x`
    /// (queries) into `out`.
    pub(crate) fn norms(
        &self,
        q: Queue<'_>,
        x: DevSlice<'_, f32>,
        n: u32,
        d: u32,
        out: DevSlice<'_, f32>,
    ) -> Result<(), CudaError> {
        x.need("norm inputs", n as usize * d as usize)?;
        self.norms_of(q, ("topk_norms", self.norms), x.ptr(), n, d, out)
    }

    /// Queues the canonical norms of `n` stored rows of `d` values at `x`
    /// (the modules' storage type, the width of `x`) into `out`.
    pub(crate) fn row_norms(
        &self,
        q: Queue<'_>,
        x: Rows<'_>,
        n: u32,
        d: u32,
        out: DevSlice<'_, f32>,
    ) -> Result<(), CudaError> {
        x.need("rows", n as usize * d as usize)?;
        if x.width() != self.row_width {
            return Err(CudaError::CountMismatch {
                what: "bytes per stored value for the row norms",
                got: x.width(),
                expected: self.row_width,
            });
        }
        self.norms_of(q, ("topk_row_norms", self.row_norms), x.ptr(), n, d, out)
    }

    /// Launches a norm kernel (`topk_norms` or `topk_row_norms`, the same
    /// parameter list) over `n` vectors at `x`, already checked.
    fn norms_of(
        &self,
        q: Queue<'_>,
        (name, f): (&'static str, cu::CUfunction),
        x: DPtr,
        n: u32,
        d: u32,
        out: DevSlice<'_, f32>,
    ) -> Result<(), CudaError> {
        out.need("norms", n as usize)?;
        let warps_per_block = SCORE_THREADS / 32;
        let blocks = n.div_ceil(warps_per_block).clamp(1, self.sm_count * 16);
        kernel_args!(args = [x, n, d, out = out.ptr()]);
        let launch = Launch::new(name, f, (blocks, 1), SCORE_THREADS);
        // SAFETY: the parameter list of both norm kernels; `x` holds n × d
        // values of the kernel's type (checked by the callers) and `out` n.
        unsafe { launch.run(q, &mut args) }
    }

    /// Copies `n` floats of a host query from `src`, page-locked host memory
    /// mapped into the device's address space, into `dst` with one block (a
    /// kernel, where a copy would wait for a copy engine). The host must not
    /// rewrite `src` until the kernel has run.
    pub(crate) fn fetch_query(
        &self,
        q: Queue<'_>,
        src: DevSlice<'_, f32>,
        dst: DevSlice<'_, f32>,
        n: u32,
    ) -> Result<(), CudaError> {
        src.need("mapped query", n as usize)?;
        dst.need("query", n as usize)?;
        kernel_args!(args = [src = src.ptr(), dst = dst.ptr(), n]);
        let launch = Launch::new("topk_fetch_query", self.fetch_query, (1, 1), SCORE_THREADS);
        // SAFETY: the parameter list of topk_fetch_query; sizes checked above.
        unsafe { launch.run(q, &mut args) }
    }

    /// Scores `ops.nq` queries against the corpus into `ops.scores` (nq × n):
    /// the staged single-query kernel for one query with D <= 16,384
    /// ([`single_path`]), the batch kernels otherwise (which read the query
    /// norms of a cosine batch).
    ///
    /// With `threshold` the single-query kernel also does the work of
    /// [`Self::hist`] (each block counts the rows it scored, the last finds
    /// the threshold); returns whether it did, that is whether
    /// [`Self::gather`] may follow without a histogram pass.
    pub(crate) fn score(
        &self,
        q: Queue<'_>,
        metric: Metric,
        ops: &Operands<'_>,
        plan: &ScorePlan,
        threshold: Option<FusedThreshold<'_>>,
    ) -> Result<bool, CudaError> {
        let (n, d, nq) = (ops.n, ops.d, ops.nq);
        let cosine = metric == Metric::Cosine;
        if single_path(nq as usize, d as usize) {
            ops.check(cosine, false)?;
            let groups = n.div_ceil(SINGLE_ROWS);
            let blocks = groups.clamp(1, plan.single_grid.max(1));
            let fused = threshold.is_some();
            // A null area tells the kernel to stop after scoring.
            let (area, k, th) = match threshold {
                Some(t) => {
                    if t.k == 0 || t.k > n {
                        return Err(CudaError::InvalidOption {
                            name: "k of a device selection",
                            value: t.k as usize,
                            reason: "must be in 1..=N",
                        });
                    }
                    t.area.need("selection areas", super::AREA_STRIDE)?;
                    t.th.need("thresholds", 1)?;
                    (t.area.ptr(), t.k, t.th.ptr())
                }
                None => (0, 0, 0),
            };
            kernel_args!(
                args = [
                    corpus = ops.corpus.ptr(),
                    rnorm = ops.rnorm.ptr(),
                    n,
                    d,
                    queries = ops.queries.ptr(),
                    scores = ops.scores.ptr(),
                    area,
                    k,
                    th
                ]
            );
            let launch = Launch::new(
                "topk_score1",
                self.single_kernel(metric, d as usize),
                (blocks, 1),
                SCORE_THREADS,
            )
            .shared(staged_smem(d as usize, SINGLE_TILE_BYTES));
            // SAFETY: the parameter list of topk_score1*_*; buffers checked
            // above; the dynamic shared memory is the size the kernel was
            // prepared for (prepare_score) for this d.
            unsafe { launch.run(q, &mut args)? };
            return Ok(fused);
        }
        ops.check(cosine, cosine)?;
        let mut raw = ops.batch_args();
        let mut args = raw.pointers();
        let launch = if let Some((kind, resident)) = plan.batch(nq) {
            let shape = kind.shape();
            let f = match kind {
                BatchKind::Q32 => self.scoreq32[metric_slot(metric)],
                BatchKind::Q16 => self.scoreq16[metric_slot(metric)],
            };
            let blocks = shape.grid(n, nq, resident);
            Launch::new("topk_scoreq", f, (blocks, 1), shape.threads).shared(shape.smem(d as usize))
        } else {
            let warps = SCORE_THREADS / 32;
            let tiles = nq.div_ceil(BATCH_QT);
            let row_blocks = n.div_ceil(warps * BATCH_ROWS_PER_WARP);
            let blocks = row_blocks
                .checked_mul(tiles)
                .ok_or(CudaError::InvalidOption {
                    name: "batch grid",
                    value: row_blocks as usize * tiles as usize,
                    reason: "the batch grid exceeds 2^32 blocks; use a smaller max_batch",
                })?;
            Launch::new(
                "topk_scoreb",
                self.scoreb[metric_slot(metric)],
                (blocks, 1),
                SCORE_THREADS,
            )
        };
        // SAFETY: the parameter list of topk_scoreq*_* and topk_scoreb_*
        // (BatchArgs); buffers checked above; a resident-query kernel's
        // dynamic shared memory is the size it was prepared for
        // (prepare_score) for this d.
        unsafe { launch.run(q, &mut args)? };
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{define, SCORE_BATCH_CU, SHAPES_CUH, STAGE_CUH};
    use super::*;

    #[test]
    fn host_shapes_mirror_the_scoring_kernels() {
        assert_eq!(define(SCORE_BATCH_CU, "BCH_CH"), BATCH_CHUNK_COLS);
        assert_eq!(define(STAGE_CUH, "TOPK_TILE_ALIGN"), TILE_ALIGN);
        assert_eq!(define(SHAPES_CUH, "BATCH_QT") as u32, BATCH_QT);
        assert_eq!(define(SHAPES_CUH, "BATCH_RT") as u32, BATCH_ROWS_PER_WARP);
        for (prefix, shape) in [("BQ32", BATCH_Q32), ("BQ16", BATCH_Q16)] {
            let get = |name: &str| define(SHAPES_CUH, &format!("{prefix}_{name}")) as u32;
            assert_eq!(get("WQ") * get("QT"), shape.queries, "{prefix} queries");
            assert_eq!(get("WR") * get("RT"), shape.rows, "{prefix} rows");
            assert_eq!(
                get("WR") * get("WQ") * 32,
                shape.threads,
                "{prefix} threads"
            );
            assert_eq!(get("DEPTH"), shape.depth, "{prefix} depth");
        }
    }

    #[test]
    fn small_batches_take_the_16_query_shape_and_either_shape_stands_in() {
        let both = ScorePlan {
            single_grid: 1,
            q32: Some(132),
            q16: Some(132),
        };
        assert_eq!(both.batch(1), Some((BatchKind::Q16, 132)));
        assert_eq!(both.batch(BATCH_SMALL_MAX), Some((BatchKind::Q16, 132)));
        assert_eq!(both.batch(BATCH_SMALL_MAX + 1), Some((BatchKind::Q32, 132)));
        let only16 = ScorePlan { q32: None, ..both };
        assert_eq!(only16.batch(64), Some((BatchKind::Q16, 132)));
        let only32 = ScorePlan { q16: None, ..both };
        assert_eq!(only32.batch(2), Some((BatchKind::Q32, 132)));
        let neither = ScorePlan {
            q32: None,
            q16: None,
            ..both
        };
        assert_eq!(neither.batch(2), None);
    }

    #[test]
    fn batch_grids_give_every_query_tile_the_same_blocks() {
        // 64 queries of the 32-query shape: 2 tiles of 66 blocks on 132.
        assert_eq!(BATCH_Q32.grid(1_000_000, 64, 132), 132);
        // 33 queries: 2 tiles, the odd block left idle.
        assert_eq!(BATCH_Q32.grid(1_000_000, 33, 133), 132);
        // Fewer row blocks than blocks: one block per row block and tile.
        assert_eq!(BATCH_Q16.grid(100, 16, 132), 2);
        assert_eq!(BATCH_Q16.grid(1, 1, 132), 1);
        // 64 tiles share 132 blocks: 2 each.
        assert_eq!(BATCH_Q16.grid(1_000_000, 1024, 132), 128);
        // More tiles than resident blocks: still one block per tile.
        assert_eq!(BATCH_Q16.grid(1_000_000, 3200, 132), 200);
    }

    #[test]
    fn batch_shapes_fit_the_common_dimensions_in_shared_memory() {
        // 227 KiB is the opt-in limit of a Hopper block; both shapes must
        // fit every D of the benchmark campaign there.
        for d in [384, 768, 1024] {
            for shape in [BATCH_Q32, BATCH_Q16] {
                assert!(shape.smem(d) <= 227 * 1024, "{shape:?} at d = {d}");
            }
        }
        assert_eq!(BATCH_Q32.smem(1), (2 * 2 * 32 * 128 + 32 * 128) * 4);
        assert_eq!(BATCH_Q16.smem(129), (2 * 2 * 64 * 128 + 16 * 256) * 4);
    }

    #[test]
    fn the_single_query_kernels_stop_at_their_shared_memory_limit() {
        assert!(single_path(1, SINGLE_MAX_DIM));
        assert!(!single_path(1, SINGLE_MAX_DIM + 1));
        assert!(!single_path(2, 8));
    }
}
