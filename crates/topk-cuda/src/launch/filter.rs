//! Launches of the filtered batch (`kernels/filter.cu`): tensor-core lower
//! bounds, the listing of rows that may reach the top K, their canonical
//! scores and the selection among them; and the scores of listed ids
//! (`kernels/score_ids.cu`), the HNSW crate's batched distances.

use std::ffi::c_void;

use cust::sys as cu;
use topk_core::Metric;

use super::{
    kernel_args, metric_slot, Kernels, Launch, Listed, Operands, Queue, CAND_CAP, RANK_TMP_BYTES,
    SCORE_THREADS, SEL_THREADS,
};
use crate::device::DevNeighbor;
use crate::driver::{DPtr, DevSlice, Rows, TensorMap};
use crate::error::CudaError;

/// Block tile of `topk_approx_*` (`AX_BQ` queries × `AX_BR` rows, 256
/// threads) and its dynamic shared memory (`AX_STAGES` × (`AX_BQ` +
/// `AX_BR`) × `AX_LD` floats).
const APPROX_QUERIES: u32 = 64;
const APPROX_ROWS: u32 = 128;
pub(super) const APPROX_SMEM: usize = 3 * (64 + 128) * 36 * 4;
/// Block tile of `topk_approx90_*` (`W9Shape<W9_WGQ, W9_WGR, W9_STAGES>`:
/// 64 `W9_WGQ` queries × 128 `W9_WGR` rows, 128 threads a warpgroup, and
/// the copy engine's producer warp) and its dynamic shared memory
/// (`W9_STAGES` stages of (queries + rows) × 128 bytes, 1,024 bytes to
/// align them, two 8-byte barriers a stage).
const APPROX90_QUERIES: u32 = 64 * 2;
const APPROX90_ROWS: u32 = 128 * 2;
const APPROX90_THREADS: u32 = 128 * 2 * 2 + 32;
pub(super) const APPROX90_SMEM: usize = 4 * (128 + 256) * 128 + 1024 + 16 * 4;
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

/// Threads of `topk_queries16` (`W9_QUERY_THREADS`, a warp per query).
const QUERIES16_THREADS: u32 = 256;

/// Checks the alignment the tensor-core kernel's 16-byte copies need.
fn check_aligned(ops: &Operands<'_>) -> Result<(), CudaError> {
    if ops.d % 4 != 0 || ops.corpus.ptr() % 16 != 0 || ops.queries.ptr() % 16 != 0 {
        return Err(CudaError::InvalidOption {
            name: "D of a filtered batch",
            value: ops.d as usize,
            reason: "the filtered path needs D % 4 == 0 and 16-byte aligned rows",
        });
    }
    Ok(())
}

/// The tensor maps of a Hopper bound kernel: the `nq` queries and every
/// 2^`rshift`-th row that `bq` multiplies (the operands' corpus, or its
/// f16 copy), with the count of those rows.
fn maps90(
    ops: &Operands<'_>,
    bq: BoundQueries,
    rshift: u32,
) -> Result<(TensorMap, TensorMap, u32), CudaError> {
    let (n, d, nq) = (ops.n as usize, ops.d as usize, ops.nq as usize);
    let (queries, width) = (bq.ptr, bq.width);
    let rows = n.div_ceil(1 << rshift);
    let qmap = TensorMap::tiled(
        "queries of the Hopper bounds",
        queries,
        nq,
        d,
        width,
        APPROX90_QUERIES,
    )?;
    let cmap = TensorMap::tiled_every(
        "rows of the Hopper bounds",
        bq.rows,
        rows,
        d,
        width,
        APPROX90_ROWS,
        1 << rshift,
    )?;
    Ok((qmap, cmap, rows as u32))
}

/// The Hopper bound kernels' launch over `rows` rows of the operands.
fn launch90(op: &'static str, f: cu::CUfunction, nq: u32, rows: u32) -> Launch {
    let blocks = nq.div_ceil(APPROX90_QUERIES) * rows.div_ceil(APPROX90_ROWS);
    Launch::new(op, f, (blocks.max(1), 1), APPROX90_THREADS).shared(APPROX90_SMEM)
}

/// Runs `topk_approx90_*` (`f`, any storage type's build) over every
/// 2^`rshift`-th row of the operands (`ceil(n / 2^rshift)` bounds a query
/// into `scores`) and `bq`'s queries, each read through a tensor map of the
/// copy engine.
#[allow(clippy::too_many_arguments)]
fn approx90_run(
    q: Queue<'_>,
    f: [cu::CUfunction; 3],
    metric: Metric,
    ops: &Operands<'_>,
    bq: BoundQueries,
    scores: DevSlice<'_, f32>,
    sampled: Sampled<'_>,
    rshift: u32,
) -> Result<(), CudaError> {
    let (d, nq) = (ops.d, ops.nq);
    let (qmap, cmap, n) = maps90(ops, bq, rshift)?;
    scores.need("lower bounds", nq as usize * n as usize)?;
    kernel_args!(
        args = [
            qmap,
            cmap,
            rnorm = ops.rnorm.ptr(),
            n,
            d,
            nq,
            qnorm = ops.qnorm.ptr(),
            qinv = bq.inv,
            rinv = bq.rinv,
            scores = scores.ptr(),
            sub = sampled.bounds.ptr(),
            shift = sampled.shift,
            rshift
        ]
    );
    let launch = launch90("topk_approx90", f[metric_slot(metric)], nq, n);
    // SAFETY: the parameter list of topk_approx90_* (two tensor maps by
    // value, then the norms, sizes, the queries' and rows' inverse scales,
    // bounds, the norms' stride); the maps cover exactly the queries and
    // rows the caller checked (every 2^rshift-th row below n, whose norms
    // rnorm holds, and whose scales rinv holds where it is not null), the
    // bound buffers were checked above and by the caller; the dynamic shared
    // memory was allowed at load.
    unsafe { launch.run(q, &mut args) }
}

/// The operands a Hopper bound kernel multiplies: the f32 queries (`inv`
/// 0), or their half operands and inverse scales; and the rows (`width`
/// bytes a value): the stored rows (`rinv` 0), or the f16 copy of f32 rows
/// with each row's inverse scale (`shadow`).
#[derive(Clone, Copy)]
pub(crate) struct BoundQueries {
    ptr: DPtr,
    inv: DPtr,
    rows: DPtr,
    width: usize,
    rinv: DPtr,
    shadow: bool,
}

/// The f16 copy of an engine's f32 rows (`Tuning::shadow_bounds`): `rows`,
/// each row scaled by a power of two and rounded (`topk_rows16`), and each
/// row's inverse scale (`rinv`, NaN for a row always listed).
#[derive(Clone, Copy)]
pub(crate) struct ShadowRows<'a> {
    pub(crate) rows: Rows<'a>,
    pub(crate) rinv: DevSlice<'a, f32>,
}

/// Where the Hopper listing puts a chunk's rows: room for `cap` of them a
/// query, each one's lower bound (`lo`, -inf past the listed ones: the
/// caller fills it) and row (`rows`), and each query's count (`count`,
/// zeroed by the caller).
#[derive(Clone, Copy)]
pub(crate) struct Emitted<'a> {
    pub(crate) lo: DevSlice<'a, f32>,
    pub(crate) rows: DevSlice<'a, u32>,
    pub(crate) count: DevSlice<'a, u32>,
    pub(crate) cap: u32,
}

impl Emitted<'_> {
    fn check(&self, nq: u32) -> Result<(), CudaError> {
        let room = nq as usize * self.cap as usize;
        self.lo.need("listed lower bounds", room)?;
        self.rows.need("listed rows", room)?;
        self.count.need("listed counts", nq as usize)
    }
}

/// Room for the half operands of a chunk's queries that the Hopper bounds
/// of half-width rows multiply (`topk_queries16`): the queries scaled and
/// rounded to the rows' type, and each query's inverse scale.
#[derive(Clone, Copy)]
pub(crate) struct HalfQueries<'a> {
    pub(crate) values: Rows<'a>,
    pub(crate) inv: DevSlice<'a, f32>,
    /// The f16 copy of f32 rows that the bounds multiply instead of them,
    /// where the engine keeps one (and it is up to date).
    pub(crate) shadow: Option<ShadowRows<'a>>,
}

/// Where a filtered chunk's bound kernel also writes the lower bounds of
/// every 2^`shift`-th row (`shift` 0: nowhere), `ceil(n / 2^shift)` a query.
#[derive(Clone, Copy)]
pub(crate) struct Sampled<'a> {
    pub(crate) bounds: DevSlice<'a, f32>,
    pub(crate) shift: u32,
}

/// Queues `f`, a `w9_halves` kernel (`topk_queries16`, `topk_rows16`; a
/// warp a vector), over `count` f32 vectors of `d` values at `src`: each
/// vector scaled by a power of two and rounded into `out` (2-byte values,
/// 16-byte aligned for the copy engine that reads them), its inverse scale
/// into `inv`. `names` is the kernel's name and what `out` holds.
fn halves(
    q: Queue<'_>,
    names: (&'static str, &'static str),
    f: cu::CUfunction,
    src: DevSlice<'_, f32>,
    (count, d): (u32, u32),
    out: Rows<'_>,
    inv: DevSlice<'_, f32>,
) -> Result<(), CudaError> {
    let (op, what) = names;
    let values = count as usize * d as usize;
    src.need(what, values)?;
    out.need(what, values)?;
    inv.need("inverse scales of half values", count as usize)?;
    if out.width() != 2 {
        return Err(CudaError::CountMismatch {
            what: "bytes per half value",
            got: out.width(),
            expected: 2,
        });
    }
    if out.ptr() % 16 != 0 {
        return Err(CudaError::InvalidOption {
            name: what,
            value: out.ptr() as usize,
            reason: "the copy engine needs a 16-byte aligned buffer",
        });
    }
    kernel_args!(
        args = [
            vectors = src.ptr(),
            count,
            d,
            values = out.ptr(),
            scales = inv.ptr()
        ]
    );
    let warps = QUERIES16_THREADS / 32;
    let convert = Launch::new(
        op,
        f,
        (count.div_ceil(warps).clamp(1, 65_535), 1),
        QUERIES16_THREADS,
    );
    // SAFETY: the parameter list of topk_queries16 / topk_rows16 (vectors,
    // count, d, values, scales); count × d f32 values at src, room for as
    // many 2-byte values and count scales (checked above); the kernel's
    // warps stride over the vectors past its grid.
    unsafe { convert.run(q, &mut args) }
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

    /// Whether the Hopper listing (`topk_emit90_*`) runs for rows of
    /// `width` bytes a value and `d` values: the Hopper bounds are loaded
    /// and take those rows.
    pub(crate) fn lists90(&self, width: usize, d: u32) -> bool {
        self.emit90.is_some()
            && match width {
                4 => true,
                _ => self.queries16.is_some() && d % 8 == 0,
            }
    }

    /// The Hopper bounds of the operands' rows, where they run: their
    /// kernels and queries (for half-width rows, the queries' half operands
    /// queued into `h` first); `None` where the `mma.sync` bounds serve.
    fn bound_queries90(
        &self,
        q: Queue<'_>,
        ops: &Operands<'_>,
        h: HalfQueries<'_>,
    ) -> Result<Option<([cu::CUfunction; 3], BoundQueries)>, CudaError> {
        let Some(f) = self.approx90 else {
            return Ok(None);
        };
        let stored = |ptr: DPtr, inv: DPtr| BoundQueries {
            ptr,
            inv,
            rows: ops.corpus.ptr(),
            width: ops.corpus.width(),
            rinv: 0,
            shadow: false,
        };
        match (ops.corpus.width(), self.queries16, self.shadow90, h.shadow) {
            (4, _, Some(sh), Some(copy)) if ops.d % 8 == 0 => {
                let values = ops.n as usize * ops.d as usize;
                copy.rows.need("f16 copy of the rows", values)?;
                copy.rinv
                    .need("row scales of the f16 copy", ops.n as usize)?;
                if copy.rows.width() != 2 || copy.rows.ptr() % 16 != 0 {
                    return Err(CudaError::InvalidOption {
                        name: "f16 copy of the rows",
                        value: copy.rows.width(),
                        reason: "must be 2-byte values, 16-byte aligned",
                    });
                }
                self.queries_half(q, ops, sh.queries16, h)?;
                Ok(Some((
                    sh.approx90,
                    BoundQueries {
                        ptr: h.values.ptr(),
                        inv: h.inv.ptr(),
                        rows: copy.rows.ptr(),
                        width: 2,
                        rinv: copy.rinv.ptr(),
                        shadow: true,
                    },
                )))
            }
            (4, ..) => Ok(Some((f, stored(ops.queries.ptr(), 0)))),
            (2, Some(prep), ..) if ops.d % 8 == 0 => {
                self.queries_half(q, ops, prep, h)?;
                Ok(Some((f, stored(h.values.ptr(), h.inv.ptr()))))
            }
            _ => Ok(None),
        }
    }

    /// The first step of the Hopper listing: lower bounds of every
    /// 2^`shift`-th row (`ceil(n / 2^shift)` a query) into `sample`, for the
    /// selection whose K-th is T0. Returns the queries the listing
    /// multiplies next ([`Self::emit90`]).
    pub(crate) fn approx_sample90(
        &self,
        q: Queue<'_>,
        metric: Metric,
        ops: &Operands<'_>,
        half: HalfQueries<'_>,
        sample: DevSlice<'_, f32>,
        shift: u32,
    ) -> Result<BoundQueries, CudaError> {
        ops.check(true, true)?;
        check_aligned(ops)?;
        let Some((f, bq)) = self
            .bound_queries90(q, ops, half)?
            .filter(|_| self.lists90(ops.corpus.width(), ops.d))
        else {
            return Err(CudaError::InvalidOption {
                name: "Hopper listing",
                value: ops.corpus.width(),
                reason: "needs the Hopper bounds of these rows (compute capability 9.0)",
            });
        };
        let none = Sampled {
            bounds: sample,
            shift: 0,
        };
        approx90_run(q, f, metric, ops, bq, sample, none, shift)?;
        Ok(bq)
    }

    /// The listing bound kernel: every row whose upper bound reaches the
    /// K-th lower bound of the sample's selection in `sel` (rows of k + 1),
    /// into `e`; `flag` becomes nonzero when a query lists more than
    /// `e.cap` rows or its sample's selection did not finish.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn emit90(
        &self,
        q: Queue<'_>,
        metric: Metric,
        ops: &Operands<'_>,
        bq: BoundQueries,
        sel: DevSlice<'_, DevNeighbor>,
        k: u32,
        e: &Emitted<'_>,
        flag: DevSlice<'_, u32>,
    ) -> Result<(), CudaError> {
        ops.check(true, true)?;
        e.check(ops.nq)?;
        sel.need("sample results", ops.nq as usize * (k as usize + 1))?;
        flag.need("filter flag", 1)?;
        let f = match (bq.shadow, self.shadow90) {
            (true, Some(sh)) => Some(sh.emit90),
            (true, None) => None,
            (false, _) => self.emit90,
        };
        let Some(f) = f else {
            return Err(CudaError::InvalidOption {
                name: "Hopper listing",
                value: ops.corpus.width(),
                reason: "needs the Hopper bounds (compute capability 9.0)",
            });
        };
        let (d, nq) = (ops.d, ops.nq);
        let (qmap, cmap, n) = maps90(ops, bq, 0)?;
        kernel_args!(
            args = [
                qmap,
                cmap,
                rnorm = ops.rnorm.ptr(),
                n,
                d,
                nq,
                qnorm = ops.qnorm.ptr(),
                qinv = bq.inv,
                rinv = bq.rinv,
                sel = sel.ptr(),
                k,
                lo = e.lo.ptr(),
                rows = e.rows.ptr(),
                count = e.count.ptr(),
                cap = e.cap,
                flag = flag.ptr()
            ]
        );
        let launch = launch90("topk_emit90", f[metric_slot(metric)], nq, n);
        // SAFETY: the parameter list of topk_emit90_* (two tensor maps by
        // value, the norms, sizes, the queries' and rows' inverse scales
        // (rinv null, or checked for n rows with the copy), the sample's results, k,
        // the listing's room and counts, the flag); the maps cover the
        // checked queries and rows, every buffer was checked above (the
        // kernel writes at most cap entries a query); the dynamic shared
        // memory was allowed at load.
        unsafe { launch.run(q, &mut args) }
    }

    /// Queues the half operands of the operands' queries into `h`
    /// (`topk_queries16`).
    fn queries_half(
        &self,
        q: Queue<'_>,
        ops: &Operands<'_>,
        prep: cu::CUfunction,
        h: HalfQueries<'_>,
    ) -> Result<(), CudaError> {
        halves(
            q,
            ("topk_queries16", "half queries"),
            prep,
            ops.queries,
            (ops.nq, ops.d),
            h.values,
            h.inv,
        )
    }

    /// Whether f32 rows can have their Hopper bounds from an f16 copy (the
    /// f16 build of the bounds is loaded).
    pub(crate) fn shadows(&self) -> bool {
        self.shadow90.is_some()
    }

    /// Queues the f16 copy of `n` f32 rows of `d` values (`topk_rows16`)
    /// into `out`: each row scaled by a power of two and rounded, and its
    /// inverse scale.
    pub(crate) fn rows16(
        &self,
        q: Queue<'_>,
        rows: Rows<'_>,
        n: u32,
        d: u32,
        out: ShadowRows<'_>,
    ) -> Result<(), CudaError> {
        let Some(sh) = self.shadow90 else {
            return Err(CudaError::InvalidOption {
                name: "f16 copy of the rows",
                value: rows.width(),
                reason: "needs the f16 Hopper bounds (compute capability 9.0)",
            });
        };
        let rows = rows.as_f32("rows of the f16 copy")?;
        halves(
            q,
            ("topk_rows16", "f16 copy of the rows"),
            sh.rows16,
            rows,
            (n, d),
            out.rows,
            out.rinv,
        )
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

    #[test]
    fn host_constants_mirror_the_hopper_bound_kernel() {
        let (wgq, wgr) = (define(FILTER90_CU, "W9_WGQ"), define(FILTER90_CU, "W9_WGR"));
        assert_eq!(64 * wgq as u32, APPROX90_QUERIES);
        assert_eq!(128 * wgr as u32, APPROX90_ROWS);
        assert_eq!(128 * (wgq * wgr) as u32 + 32, APPROX90_THREADS);
        let (bk, align) = (
            define(FILTER90_CU, "W9_BK"),
            define(FILTER90_CU, "W9_ALIGN"),
        );
        let stage = (64 * wgq + 128 * wgr) * bk * 4;
        let stages = define(FILTER90_CU, "W9_STAGES");
        assert_eq!(APPROX90_SMEM, stages * stage + align + 16 * stages);
    }
}
