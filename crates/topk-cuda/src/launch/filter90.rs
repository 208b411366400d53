//! Launches of the Hopper bound kernels (`kernels/filter90.cu`): the
//! filtered batch's lower bounds from `wgmma` over tensor maps of the copy
//! engine, the Hopper listing (`topk_emit90_*`), and the half operands they
//! multiply (`topk_queries16`, `topk_rows16`: queries and the f16 copy of
//! f32 rows, scaled by powers of two).

use std::ffi::c_void;

use cust::sys as cu;
use topk_core::Metric;

use super::filter::{check_aligned, Sampled};
use super::{kernel_args, metric_slot, Kernels, Launch, Operands, Queue};
use crate::device::DevNeighbor;
use crate::driver::{DPtr, DevSlice, Rows, TensorMap};
use crate::error::CudaError;

/// Block tile of `topk_approx90_*` (`W9Shape<W9_WGQ, W9_WGR, W9_STAGES>`:
/// 64 `W9_WGQ` queries × 128 `W9_WGR` rows, 128 threads a warpgroup, and
/// the copy engine's producer warp) and its dynamic shared memory
/// (`W9_STAGES` stages of (queries + rows) × 128 bytes, 1,024 bytes to
/// align them, two 8-byte barriers a stage).
pub(super) const APPROX90_QUERIES: u32 = 64 * 2;
pub(super) const APPROX90_ROWS: u32 = 128 * 2;
pub(super) const APPROX90_THREADS: u32 = 128 * 2 * 2 + 32;
pub(super) const APPROX90_SMEM: usize = 4 * (128 + 256) * 128 + 1024 + 16 * 4;
/// Threads of `topk_queries16` (`W9_QUERY_THREADS`, a warp per query).
pub(super) const QUERIES16_THREADS: u32 = 256;
/// The Hopper listing (`topk_emit90_*`, `w9_list` over `W9Turns`): one
/// block an SM whose two groups of 2 × 1 warpgroups take turns, each on
/// 128 queries × 128 rows; `W9_TURN_STAGES` stages of (128 + 128) × 128
/// bytes, two barriers a stage and two more.
pub(super) const TURNS_QUERIES: u32 = 128;
pub(super) const TURNS_ROWS: u32 = 128;
pub(super) const TURNS_THREADS: u32 = 2 * 128 * 2 + 32;
pub(super) const TURNS_STAGES: usize = 6;
pub(super) const TURNS_SMEM: usize =
    TURNS_STAGES * (128 + 128) * 128 + 1024 + 16 * TURNS_STAGES + 16;

/// The tensor maps of a Hopper bound kernel: the `nq` queries and every
/// 2^`rshift`-th row that `bq` multiplies (the operands' corpus, or its
/// f16 copy), with the count of those rows.
fn maps90(
    ops: &Operands<'_>,
    bq: BoundQueries,
    rshift: u32,
    row_box: u32,
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
        row_box,
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
pub(super) fn approx90_run(
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
    let (qmap, cmap, n) = maps90(ops, bq, rshift, APPROX90_ROWS)?;
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
    pub(super) fn check(&self, nq: u32) -> Result<(), CudaError> {
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
    pub(super) fn bound_queries90(
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
        let (qmap, cmap, n) = maps90(ops, bq, 0, TURNS_ROWS)?;
        // Persistent blocks: one an SM, never more than the tiles.
        let tiles = nq.div_ceil(TURNS_QUERIES) * n.div_ceil(TURNS_ROWS);
        let blocks = tiles.clamp(1, self.sm_count);
        let f = f[metric_slot(metric)];
        let launch = Launch::new("topk_emit90", f, (blocks, 1), TURNS_THREADS).shared(TURNS_SMEM);
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
        // SAFETY: the parameter list of topk_emit90_* (two tensor maps by
        // value, the norms, sizes, the queries' and rows' inverse scales
        // (rinv null, or checked for n rows with the copy), the sample's results, k,
        // the listing's room and counts, the flag); the maps cover the
        // checked queries and rows in the kernel's boxes (128 of each), every
        // buffer was checked above (the kernel writes at most cap entries a
        // query); the dynamic shared memory was allowed at load.
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
}

#[cfg(test)]
mod tests {
    use super::super::tests::{define, FILTER90_CU};
    use super::*;

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
        // W9Turns = W9Shape<2, 1, W9_TURN_STAGES>, two groups and the turn
        // barriers.
        let turns = define(FILTER90_CU, "W9_TURN_STAGES");
        assert_eq!(turns, TURNS_STAGES);
        assert!(FILTER90_CU.contains("using W9Turns = W9Shape<2, 1, W9_TURN_STAGES>;"));
        assert_eq!((TURNS_QUERIES, TURNS_ROWS), (64 * 2, 128));
        assert_eq!(TURNS_THREADS, 2 * 128 * 2 + 32);
        let turn_stage = (64 * 2 + 128) * bk * 4;
        assert_eq!(TURNS_SMEM, turns * turn_stage + align + 16 * turns + 16);
        const {
            assert!(
                TURNS_SMEM <= 227 * 1024,
                "one block an SM fits Hopper's shared memory"
            )
        };
    }
}
