//! Every kernel launch and raw asynchronous copy of the engine, in one place,
//! so the unsafe surface that hands device pointers to the driver is fenced
//! here and each call's status becomes a typed error.

use std::ffi::c_void;

use cust::module::Module;
use cust::sys as cu;
use topk_core::Metric;

use crate::error::CudaError;

/// A raw device address.
pub(crate) type DPtr = cu::CUdeviceptr;

/// Threads per block of the scoring kernels (8 warps).
const SCORE_THREADS: u32 = 256;
/// Rows a block of the single-query scoring kernel stages at once
/// (`SINGLE_WARPS × SINGLE_RT`).
const SINGLE_ROWS: u32 = 32;
/// Shared-memory bytes of its row tiles (`SINGLE_DEPTH` tiles of
/// `SINGLE_ROWS × STAGE_CW` floats).
const SINGLE_TILE_BYTES: usize = 3 * 32 * 128 * 4;
/// Threads of the one-launch search kernel (`TOPK_SEL_THREADS`).
const SEARCH_THREADS: u32 = 1024;
/// Rows a block of the one-launch search stages at once
/// (`SEARCH_WARPS × SEARCH_RT`).
const SEARCH_ROWS: u32 = 64;
/// Shared-memory bytes of its row tiles (`SEARCH_DEPTH` tiles).
const SEARCH_TILE_BYTES: usize = 4 * 64 * 128 * 4;
/// Block tile of `topk_approx_*` (`AX_BQ` queries × `AX_BR` rows, 256
/// threads) and its dynamic shared memory (`AX_STAGES` × (`AX_BQ` +
/// `AX_BR`) × `AX_LD` floats).
const APPROX_QUERIES: u32 = 64;
const APPROX_ROWS: u32 = 128;
const APPROX_SMEM: usize = 3 * (64 + 128) * 36 * 4;
/// Threads of `topk_filter_*` and `topk_rescore_*` (`FILTER_THREADS`).
const FILTER_THREADS: u32 = 256;
/// Blocks per multiprocessor of `topk_filter_*`, shared among the chunk's
/// queries: enough loads in flight to stream the lower bounds.
const FILTER_BLOCKS_PER_SM: u32 = 16;
/// Queries per tile of the batch kernel (`BATCH_QT`).
pub(crate) const BATCH_QT: u32 = 8;
/// Rows per warp of the batch kernel (`BATCH_RT`).
const BATCH_ROWS_PER_WARP: u32 = 4;
/// One shape of the resident-query batch kernels (`BQ32_*`, `BQ16_*` in
/// `kernels/score.cu`): a block keeps `queries` queries in shared memory and
/// walks blocks of `rows` rows through `depth` stages of `sub` chunks each.
#[derive(Clone, Copy, Debug)]
struct BatchShape {
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
/// 16 queries × 64 rows per block: smaller batches (in the H200 lab, faster
/// than the 32-query shape at 16, 33, 37 and 40 queries, slower on one tiny
/// 19-query case, level with it at 64).
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
    pub(crate) single_grid: u32,
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

/// Largest D whose query the single-query kernel stages in shared memory
/// beside its tiles; a larger D runs through the batch kernel.
pub(crate) const SINGLE_MAX_DIM: usize = 16 * 1024;
/// Rows whose ordered bits `topk_select_small` keeps in shared memory
/// (`TOPK_STASH_ROWS`).
const STASH_ROWS: u32 = 16384;
/// Dynamic shared memory of the ranking's scratch (TOPK_CAND_CAP keys) in
/// `topk_gather`.
const RANK_TMP_BYTES: usize = CAND_CAP * 8;

/// Dynamic shared memory of `topk_select_small` over `n` rows: the stash of
/// every row's ordered bits (n <= STASH_ROWS), which the ranking's scratch
/// reuses once the gather is done, so never less than that scratch.
fn small_smem(n: u32) -> usize {
    let stash = if n <= STASH_ROWS { n as usize * 4 } else { 0 };
    stash.max(RANK_TMP_BYTES)
}

/// Threads of the selection kernels (`TOPK_SEL_THREADS`).
const SEL_THREADS: u32 = 1024;
/// Rows per thread that size the grid of the grid-wide selection passes
/// (topk_hist, topk_gather): few enough that a single query's gather spreads
/// over most multiprocessors, since the pass is bound by load latency.
const SELECT_ROWS_PER_THREAD: u32 = 4;
/// Selection blocks per multiprocessor that a batch's queries share (see
/// `Kernels::select_blocks`).
const BATCH_SELECT_BLOCKS_PER_SM: u32 = 4;
/// Largest candidate set the device sorts (`TOPK_CAND_CAP`).
pub(crate) const CAND_CAP: usize = 4096;
/// Rows of the level-1 threshold bin kept per query for refinement
/// (`TOPK_MAYBE_CAP`).
pub(crate) const MAYBE_CAP: usize = 16384;
/// 32-bit words of each query's selection area (`TOPK_AREA_STRIDE`): the
/// 4,096-bin level-1 histogram, then eight counters.
pub(crate) const AREA_STRIDE: usize = 4096 + 8;
/// Header status of a result row: selection finished on the device.
pub(crate) const STATUS_OK: u32 = 0;
/// Header status: too many tied candidates; the host finishes the query.
pub(crate) const STATUS_OVERFLOW: u32 = 1;
/// Header status the host writes before a query whose results are mapped:
/// no kernel writes it, so the row is ready once the header differs.
pub(crate) const STATUS_PENDING: u32 = u32::MAX;

/// Slack the staged kernels need to start their tiles on a 128-byte
/// boundary (`TOPK_TILE_ALIGN` of score.cu).
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

/// Turns a raw driver status into a typed error naming the operation.
pub(crate) fn check(op: &'static str, status: cu::CUresult) -> Result<(), CudaError> {
    if status == cu::CUresult::CUDA_SUCCESS {
        Ok(())
    } else if status == cu::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        Err(CudaError::OutOfMemory {
            what: op,
            requested: 0,
            available: free_memory().unwrap_or(0),
        })
    } else {
        Err(CudaError::Driver {
            op,
            reason: format!("{status:?}"),
        })
    }
}

/// Free device memory of the current context, in bytes.
pub(crate) fn free_memory() -> Result<usize, CudaError> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: both pointers are valid for writes of one usize.
    let status = unsafe { cu::cuMemGetInfo_v2(&mut free, &mut total) };
    if status == cu::CUresult::CUDA_SUCCESS {
        Ok(free)
    } else {
        Err(CudaError::Driver {
            op: "cuMemGetInfo",
            reason: format!("{status:?}"),
        })
    }
}

/// Whether a block of `f` with `dynamic` bytes of dynamic shared memory fits
/// the current device's opt-in shared-memory limit per block.
fn fits_shared(f: cu::CUfunction, dynamic: usize) -> Result<bool, CudaError> {
    let mut dev: cu::CUdevice = 0;
    // SAFETY: `dev` is valid for one write; a context is current.
    check("cuCtxGetDevice", unsafe { cu::cuCtxGetDevice(&mut dev) })?;
    let (mut limit, mut fixed) = (0i32, 0i32);
    // SAFETY: `limit` is valid for one i32 write; `dev` is a live device.
    check("cuDeviceGetAttribute", unsafe {
        cu::cuDeviceGetAttribute(
            &mut limit,
            cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            dev,
        )
    })?;
    // SAFETY: `fixed` is valid for one i32 write; the function handle is live.
    check("cuFuncGetAttribute", unsafe {
        cu::cuFuncGetAttribute(
            &mut fixed,
            cu::CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
            f,
        )
    })?;
    Ok(fixed.max(0) as usize + dynamic <= limit.max(0) as usize)
}

/// Declares a mutable local for each argument, `name` (a copy of that value)
/// or `name = value`, and `$args`, the array of pointers to them that
/// `cuLaunchKernel` takes, in the order named (the kernel's parameter order).
macro_rules! kernel_args {
    ($args:ident = [$($v:ident $(= $e:expr)?),* $(,)?]) => {
        $(let mut $v = kernel_args!(@value $v $(, $e)?);)*
        let mut $args = [$(&mut $v as *mut _ as *mut c_void),*];
    };
    (@value $v:ident) => { $v };
    (@value $v:ident, $e:expr) => { $e };
}

/// Function handles of the loaded modules.
pub(crate) struct Kernels {
    /// Single query, D % 4 == 0 (16-byte copies).
    score1: [cu::CUfunction; 3],
    /// Single query, any D (4-byte copies).
    score1u: [cu::CUfunction; 3],
    /// One-launch search of a single query, D % 4 == 0.
    search1: [cu::CUfunction; 3],
    /// One-launch search of a single query, any D.
    search1u: [cu::CUfunction; 3],
    /// Batches, any D.
    scoreb: [cu::CUfunction; 3],
    /// Batches with the queries resident ([`BATCH_Q32`], [`BATCH_Q16`]).
    scoreq32: [cu::CUfunction; 3],
    scoreq16: [cu::CUfunction; 3],
    ids: [cu::CUfunction; 3],
    /// Filtered batches (`kernels/filter.cu`): tensor-core lower bounds,
    /// the listing of rows that may reach the top K, their canonical scores.
    approx: [cu::CUfunction; 3],
    filter: [cu::CUfunction; 3],
    rescore: [cu::CUfunction; 3],
    select_listed: cu::CUfunction,
    norms: cu::CUfunction,
    fetch_query: cu::CUfunction,
    select_small: cu::CUfunction,
    hist: cu::CUfunction,
    gather: cu::CUfunction,
    sm_count: u32,
}

// SAFETY: CUfunction handles are immutable once the module is loaded and the
// driver allows launching one function from several threads; the engine keeps
// the modules alive as long as these handles.
unsafe impl Send for Kernels {}
// SAFETY: as above, nothing is mutated through a shared handle.
unsafe impl Sync for Kernels {}

fn metric_slot(m: Metric) -> usize {
    match m {
        Metric::Dot => 0,
        Metric::Cosine => 1,
        Metric::L2 => 2,
    }
}

/// The kernels of one family for each metric, in `metric_slot` order.
macro_rules! family {
    ($module:expr, $prefix:literal) => {
        [
            function($module, concat!($prefix, "_dot"))?,
            function($module, concat!($prefix, "_cosine"))?,
            function($module, concat!($prefix, "_l2"))?,
        ]
    };
}

fn function(module: &Module, name: &'static str) -> Result<cu::CUfunction, CudaError> {
    module
        .get_function(name)
        .map(|f| f.to_raw())
        .map_err(|e| CudaError::ModuleLoad {
            module: name,
            reason: e.to_string(),
        })
}

/// A scratch slot's selection buffers for `nq` queries, as the selection
/// launches take them (sizes per query; the launches' contracts say which
/// each one reads and writes).
#[derive(Clone, Copy)]
pub(crate) struct SelectBufs {
    /// n scores.
    pub(crate) scores: DPtr,
    /// AREA_STRIDE words: the level-1 histogram and the counters.
    pub(crate) area: DPtr,
    /// One threshold (`TopkThreshold`).
    pub(crate) th: DPtr,
    /// CAND_CAP keys: the candidates above the threshold bin.
    pub(crate) cand: DPtr,
    /// MAYBE_CAP keys: the threshold bin's rows.
    pub(crate) maybe: DPtr,
    /// k + 1 result entries (header, then results), in device memory or in
    /// mapped host memory.
    pub(crate) out: DPtr,
}

/// The operands of a scoring launch: `nq` queries (`queries`, nq × d
/// floats, and their norms `qnorm`) against the corpus (`corpus`, n × d,
/// and its row norms `rnorm`), into `scores` (nq × n).
#[derive(Clone, Copy)]
pub(crate) struct Operands {
    pub(crate) corpus: DPtr,
    pub(crate) rnorm: DPtr,
    pub(crate) n: u32,
    pub(crate) d: u32,
    pub(crate) queries: DPtr,
    pub(crate) nq: u32,
    pub(crate) qnorm: DPtr,
    pub(crate) scores: DPtr,
}

impl Operands {
    /// Pointers to the fields in the order of the batch scoring kernels'
    /// parameter list (`topk_scoreq*_*`, `topk_scoreb_*`, `topk_approx_*`),
    /// for `cuLaunchKernel`; valid while `self` is.
    fn batch_args(&mut self) -> [*mut c_void; 8] {
        [
            &mut self.corpus as *mut DPtr as *mut c_void,
            &mut self.rnorm as *mut DPtr as *mut c_void,
            &mut self.n as *mut u32 as *mut c_void,
            &mut self.d as *mut u32 as *mut c_void,
            &mut self.queries as *mut DPtr as *mut c_void,
            &mut self.nq as *mut u32 as *mut c_void,
            &mut self.qnorm as *mut DPtr as *mut c_void,
            &mut self.scores as *mut DPtr as *mut c_void,
        ]
    }
}

/// A filtered chunk's lists: CAND_CAP listed rows per query (`list`), a
/// count per query (`count`) and the chunk's flag word (`flag`).
#[derive(Clone, Copy)]
pub(crate) struct Listed {
    pub(crate) list: DPtr,
    pub(crate) count: DPtr,
    pub(crate) flag: DPtr,
}

impl Kernels {
    /// Looks up every kernel of the three modules.
    pub(crate) fn load(
        score: &Module,
        select: &Module,
        filter: &Module,
        sm_count: u32,
    ) -> Result<Self, CudaError> {
        let select_small = function(select, "topk_select_small")?;
        let gather = function(select, "topk_gather")?;
        let approx = family!(filter, "topk_approx");
        let select_listed = function(filter, "topk_select_listed")?;
        for (f, dynamic) in [
            (select_small, small_smem(STASH_ROWS)),
            (gather, RANK_TMP_BYTES),
            (select_listed, RANK_TMP_BYTES),
            (approx[0], APPROX_SMEM),
            (approx[1], APPROX_SMEM),
            (approx[2], APPROX_SMEM),
        ] {
            // SAFETY: the function handle is live; the attribute takes a byte count.
            check("cuFuncSetAttribute", unsafe {
                cu::cuFuncSetAttribute(
                    f,
                    cu::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    dynamic as i32,
                )
            })?;
        }
        Ok(Kernels {
            score1: family!(score, "topk_score1"),
            score1u: family!(score, "topk_score1u"),
            search1: family!(score, "topk_search1"),
            search1u: family!(score, "topk_search1u"),
            scoreb: family!(score, "topk_scoreb"),
            scoreq32: family!(score, "topk_scoreq32"),
            scoreq16: family!(score, "topk_scoreq16"),
            ids: family!(score, "topk_score_ids"),
            approx,
            filter: family!(filter, "topk_filter"),
            rescore: family!(filter, "topk_rescore"),
            select_listed,
            norms: function(score, "topk_norms")?,
            fetch_query: function(score, "topk_fetch_query")?,
            select_small,
            hist: function(select, "topk_hist")?,
            gather,
            sm_count: sm_count.max(1),
        })
    }

    /// Launches `f` with `args` (pointers to each parameter value) on `q`,
    /// as a cooperative launch (every block resident at once) with
    /// `cooperative`: on a stream or as a graph node alike.
    ///
    /// # Safety
    /// 1. `args` matches the kernel's parameter list in number, order and size.
    /// 2. Every device address among them is valid for the accesses the kernel
    ///    makes with the sizes passed alongside, until the stream reaches it.
    /// 3. With `cooperative`, the grid fits the device at once.
    #[allow(clippy::too_many_arguments)]
    unsafe fn launch(
        op: &'static str,
        f: cu::CUfunction,
        grid: (u32, u32),
        block: u32,
        shared: u32,
        q: Queue<'_>,
        args: &mut [*mut c_void],
        cooperative: bool,
    ) -> Result<(), CudaError> {
        let stream = match q {
            Queue::Stream(stream) => stream,
            Queue::Graph(g) => {
                // SAFETY: forwarded from this function's contract.
                return unsafe { g.kernel(op, f, grid, block, shared, args, cooperative) };
            }
        };
        let (gx, gy, p) = (grid.0, grid.1, args.as_mut_ptr());
        // SAFETY: forwarded from this function's contract.
        let status = unsafe {
            if cooperative {
                cu::cuLaunchCooperativeKernel(f, gx, gy, 1, block, 1, 1, shared, stream, p)
            } else {
                cu::cuLaunchKernel(
                    f,
                    gx,
                    gy,
                    1,
                    block,
                    1,
                    1,
                    shared,
                    stream,
                    p,
                    std::ptr::null_mut(),
                )
            }
        };
        check(op, status)
    }

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

    /// Lets `f` use `smem` bytes of dynamic shared memory (above the default
    /// 48 KiB) and returns how many of its blocks of `threads` fit on the
    /// whole device at once.
    fn prepare_staged(
        &self,
        f: cu::CUfunction,
        threads: u32,
        smem: usize,
    ) -> Result<u32, CudaError> {
        // SAFETY: the function handle is live; the attribute takes a byte count.
        check("cuFuncSetAttribute", unsafe {
            cu::cuFuncSetAttribute(
                f,
                cu::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem as i32,
            )
        })?;
        let mut per_sm: i32 = 0;
        // SAFETY: `per_sm` is valid for one write; the function handle is live.
        check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
            cu::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut per_sm, f, threads as i32, smem)
        })?;
        Ok(per_sm.max(0) as u32 * self.sm_count)
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

    /// The whole search of one query in one cooperative launch: scores into
    /// `scores`, then its best `k` into `out` (header + k results), leaving
    /// the query area at zero (its two grid barriers add 2^32 to their word).
    ///
    /// # Safety
    /// `corpus` holds n × d floats, `rnorm` n floats (cosine), `query` d;
    /// `bufs` as [`SelectBufs`] says for one query, `area` at zero;
    /// 1 <= k <= min(n, CAND_CAP / 2); `grid` from
    /// [`Self::prepare_search`] for this metric and d.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn search1(
        &self,
        q: Queue<'_>,
        metric: Metric,
        corpus: DPtr,
        rnorm: DPtr,
        n: u32,
        d: u32,
        query: DPtr,
        bufs: &SelectBufs,
        k: u32,
        grid: u32,
    ) -> Result<(), CudaError> {
        let blocks = n.div_ceil(SEARCH_ROWS).clamp(1, grid.max(1));
        kernel_args!(
            args = [
                corpus,
                rnorm,
                n,
                d,
                query,
                scores = bufs.scores,
                area = bufs.area,
                k,
                cand = bufs.cand,
                maybe = bufs.maybe,
                out = bufs.out
            ]
        );
        // SAFETY: the parameter list of topk_search1*_*; buffers per the
        // contract; the grid fits the device at once (prepare_search), as the
        // kernel's barriers require, and the driver checks it again.
        unsafe {
            Self::launch(
                "topk_search1",
                self.search_kernel(metric, d as usize),
                (blocks, 1),
                SEARCH_THREADS,
                staged_smem(d as usize, SEARCH_TILE_BYTES) as u32,
                q,
                &mut args,
                true,
            )
        }
    }

    /// Canonical norms of `n` vectors of length `d` at `x` into `out`.
    ///
    /// # Safety
    /// `x` holds `n * d` floats and `out` room for `n`.
    pub(crate) unsafe fn norms(
        &self,
        q: Queue<'_>,
        x: DPtr,
        n: u32,
        d: u32,
        out: DPtr,
    ) -> Result<(), CudaError> {
        let warps_per_block = SCORE_THREADS / 32;
        let blocks = n.div_ceil(warps_per_block).clamp(1, self.sm_count * 16);
        kernel_args!(args = [x, n, d, out]);
        // SAFETY: the parameter list of topk_norms; sizes from the caller's contract.
        unsafe {
            Self::launch(
                "topk_norms",
                self.norms,
                (blocks, 1),
                SCORE_THREADS,
                0,
                q,
                &mut args,
                false,
            )
        }
    }

    /// Copies `n` floats of a host query from `src`, the device address of
    /// page-locked host memory, into `dst` with one block (a kernel, where
    /// a copy would wait for a copy engine).
    ///
    /// # Safety
    /// `src` is mapped host memory and `dst` device memory, each holding `n`
    /// floats; the host does not rewrite `src` until the kernel has run.
    pub(crate) unsafe fn fetch_query(
        &self,
        q: Queue<'_>,
        src: DPtr,
        dst: DPtr,
        n: u32,
    ) -> Result<(), CudaError> {
        kernel_args!(args = [src, dst, n]);
        // SAFETY: the parameter list of topk_fetch_query; sizes from the
        // caller's contract.
        unsafe {
            Self::launch(
                "topk_fetch_query",
                self.fetch_query,
                (1, 1),
                SCORE_THREADS,
                0,
                q,
                &mut args,
                false,
            )
        }
    }

    /// Scores `nq` queries against the corpus into `scores` (nq × n): the
    /// staged single-query kernel for one query with D <= SINGLE_MAX_DIM
    /// ([`single_path`]), the batch kernel otherwise.
    ///
    /// With `threshold` = (area, k, th) the single-query kernel also does the
    /// work of [`Self::hist`] (each block counts the rows it scored, the last
    /// finds the threshold into `th`); returns whether it did, that is whether
    /// [`Self::gather`] may follow without a histogram pass.
    ///
    /// # Safety
    /// `corpus` holds n × d floats, `rnorm` n floats (cosine), `queries`
    /// nq × d, `qnorm` nq norms (cosine, batch path), `scores` nq × n; with
    /// `threshold`, as [`Self::hist`] for one query: `area` AREA_STRIDE
    /// zeroed words, `th` room for one threshold, 1 <= k <= n.
    pub(crate) unsafe fn score(
        &self,
        q: Queue<'_>,
        metric: Metric,
        ops: &Operands,
        plan: &ScorePlan,
        threshold: Option<(DPtr, u32, DPtr)>,
    ) -> Result<bool, CudaError> {
        // The single-query kernel's own parameter list; the batch kernels
        // take Operands::batch_args.
        let Operands {
            corpus,
            rnorm,
            n,
            d,
            queries,
            nq,
            scores,
            ..
        } = *ops;
        let warps = SCORE_THREADS / 32;
        if single_path(nq as usize, d as usize) {
            let groups = n.div_ceil(SINGLE_ROWS);
            let blocks = groups.clamp(1, plan.single_grid.max(1));
            let fused = threshold.is_some();
            // A null area tells the kernel to stop after scoring.
            let (area, k, th) = threshold.unwrap_or((0, 0, 0));
            kernel_args!(args = [corpus, rnorm, n, d, queries, scores, area, k, th]);
            // SAFETY: the parameter list of topk_score1*_*; buffers per the
            // contract; the dynamic shared memory is the size the kernel
            // was prepared for (prepare_score) for this d.
            unsafe {
                Self::launch(
                    "topk_score1",
                    self.single_kernel(metric, d as usize),
                    (blocks, 1),
                    SCORE_THREADS,
                    staged_smem(d as usize, SINGLE_TILE_BYTES) as u32,
                    q,
                    &mut args,
                    false,
                )?;
            }
            Ok(fused)
        } else if let Some((kind, resident)) = plan.batch(nq) {
            let shape = kind.shape();
            let f = match kind {
                BatchKind::Q32 => self.scoreq32[metric_slot(metric)],
                BatchKind::Q16 => self.scoreq16[metric_slot(metric)],
            };
            let blocks = shape.grid(n, nq, resident);
            let mut o = *ops;
            let mut args = o.batch_args();
            // SAFETY: the parameter list of topk_scoreq*_*; buffers per the
            // contract; the dynamic shared memory is the size the kernel was
            // prepared for (prepare_score) for this d.
            unsafe {
                Self::launch(
                    "topk_scoreq",
                    f,
                    (blocks, 1),
                    shape.threads,
                    shape.smem(d as usize) as u32,
                    q,
                    &mut args,
                    false,
                )?;
            }
            Ok(false)
        } else {
            let tiles = nq.div_ceil(BATCH_QT);
            let row_blocks = n.div_ceil(warps * BATCH_ROWS_PER_WARP);
            let blocks = row_blocks
                .checked_mul(tiles)
                .ok_or(CudaError::InvalidOption {
                    name: "batch grid",
                    value: row_blocks as usize * tiles as usize,
                    reason: "the batch grid exceeds 2^32 blocks; use a smaller max_batch",
                })?;
            let mut o = *ops;
            let mut args = o.batch_args();
            // SAFETY: the parameter list of topk_scoreb_*; buffers per the contract.
            unsafe {
                Self::launch(
                    "topk_scoreb",
                    self.scoreb[metric_slot(metric)],
                    (blocks, 1),
                    SCORE_THREADS,
                    0,
                    q,
                    &mut args,
                    false,
                )?;
            }
            Ok(false)
        }
    }

    fn select_blocks(&self, n: u32, nq: u32) -> u32 {
        select_blocks(self.sm_count, n, nq)
    }

    /// The whole selection of each of `nq` queries in one block: its best
    /// `k` into `out` (one row of k + 1 entries per query: header, then
    /// results), leaving the query areas at zero.
    ///
    /// # Safety
    /// `bufs` as [`SelectBufs`] says, for nq queries (`th` unused), `area`
    /// zeroed; 1 <= k <= min(n, CAND_CAP / 2).
    pub(crate) unsafe fn select_small(
        &self,
        q: Queue<'_>,
        bufs: &SelectBufs,
        n: u32,
        nq: u32,
        k: u32,
    ) -> Result<(), CudaError> {
        let stride = k + 1;
        kernel_args!(
            args = [
                scores = bufs.scores,
                n,
                area = bufs.area,
                cand = bufs.cand,
                maybe = bufs.maybe,
                k,
                out = bufs.out,
                stride
            ]
        );
        let dynamic = small_smem(n) as u32;
        // SAFETY: the parameter list of topk_select_small; buffers per the
        // contract; the stash and scratch fit the shared memory allowed at
        // load (small_smem grows with n up to STASH_ROWS only).
        unsafe {
            Self::launch(
                "topk_select_small",
                self.select_small,
                (1, nq),
                SEL_THREADS,
                dynamic,
                q,
                &mut args,
                false,
            )
        }
    }

    /// Counts each query's scores in its level-1 histogram and finds its
    /// threshold for `k` into `th`, leaving the histogram at zero.
    ///
    /// # Safety
    /// `bufs.scores`, `bufs.area` (zeroed) and `bufs.th` as [`SelectBufs`]
    /// says, for nq queries; 1 <= k <= n.
    pub(crate) unsafe fn hist(
        &self,
        q: Queue<'_>,
        bufs: &SelectBufs,
        n: u32,
        nq: u32,
        k: u32,
    ) -> Result<(), CudaError> {
        kernel_args!(args = [scores = bufs.scores, n, area = bufs.area, k, th = bufs.th]);
        // SAFETY: the parameter list of topk_hist; buffers per the contract.
        unsafe {
            Self::launch(
                "topk_hist",
                self.hist,
                (self.select_blocks(n, nq), nq),
                SEL_THREADS,
                0,
                q,
                &mut args,
                false,
            )
        }
    }

    /// Gathers the candidates of each query and selects its best `k` into `out`
    /// (one row of `stride` = k + 1 entries per query: header, then results),
    /// leaving each query's level-2 histogram and counters at zero.
    ///
    /// # Safety
    /// `bufs` as [`SelectBufs`] says, for nq queries: `area`'s counters
    /// zero, `th` from [`Self::hist`] or the scoring kernel; k <= CAND_CAP / 2.
    pub(crate) unsafe fn gather(
        &self,
        q: Queue<'_>,
        bufs: &SelectBufs,
        n: u32,
        nq: u32,
        k: u32,
    ) -> Result<(), CudaError> {
        let stride = k + 1;
        kernel_args!(
            args = [
                scores = bufs.scores,
                n,
                area = bufs.area,
                th = bufs.th,
                cand = bufs.cand,
                maybe = bufs.maybe,
                k,
                out = bufs.out,
                stride
            ]
        );
        // SAFETY: the parameter list of topk_gather; buffers per the
        // contract; its scratch is the dynamic shared memory allowed at load.
        unsafe {
            Self::launch(
                "topk_gather",
                self.gather,
                (self.select_blocks(n, nq), nq),
                SEL_THREADS,
                RANK_TMP_BYTES as u32,
                q,
                &mut args,
                false,
            )
        }
    }

    /// Lower bounds of the canonical scores of the queries against the
    /// corpus, from TF32 tensor cores, into `ops.scores`.
    ///
    /// # Safety
    /// `ops` as [`Operands`] says, every norm included; d % 4 == 0 and
    /// `corpus` and `queries` 16-byte aligned.
    pub(crate) unsafe fn approx(
        &self,
        q: Queue<'_>,
        metric: Metric,
        ops: &Operands,
    ) -> Result<(), CudaError> {
        let mut o = *ops;
        let blocks = o.nq.div_ceil(APPROX_QUERIES) * o.n.div_ceil(APPROX_ROWS);
        let mut args = o.batch_args();
        // SAFETY: the parameter list of topk_approx_*; buffers per the
        // contract; the dynamic shared memory was allowed at load.
        unsafe {
            Self::launch(
                "topk_approx",
                self.approx[metric_slot(metric)],
                (blocks, 1),
                SCORE_THREADS,
                APPROX_SMEM as u32,
                q,
                &mut args,
                false,
            )
        }
    }

    /// Lists, per query, the rows whose upper bound reaches the K-th lower
    /// bound in `ops.scores` that the first selection wrote into `out`
    /// (rows of k + 1): into `lists` (see [`Listed`]); the flag becomes
    /// nonzero when a query lists more than CAND_CAP rows or its selection
    /// did not finish on the device.
    ///
    /// # Safety
    /// `ops` as [`Operands`] says with `scores` holding the lower bounds;
    /// `out` nq rows of k + 1 entries written by the selection; `lists` as
    /// [`Listed`] says for nq queries, counts and flag zeroed.
    pub(crate) unsafe fn filter(
        &self,
        q: Queue<'_>,
        metric: Metric,
        ops: &Operands,
        out: DPtr,
        k: u32,
        lists: &Listed,
    ) -> Result<(), CudaError> {
        let Operands {
            rnorm,
            n,
            d,
            nq,
            qnorm,
            scores,
            ..
        } = *ops;
        let Listed { list, count, flag } = *lists;
        let per_query = n
            .div_ceil(FILTER_THREADS * 4)
            .clamp(1, (FILTER_BLOCKS_PER_SM * self.sm_count / nq.max(1)).max(1));
        kernel_args!(args = [scores, rnorm, n, d, qnorm, out, k, list, count, flag]);
        // SAFETY: the parameter list of topk_filter_*; buffers per the contract.
        unsafe {
            Self::launch(
                "topk_filter",
                self.filter[metric_slot(metric)],
                (per_query, nq),
                FILTER_THREADS,
                0,
                q,
                &mut args,
                false,
            )
        }
    }

    /// Canonical scores of the rows [`Self::filter`] listed, into
    /// `ops.scores`.
    ///
    /// # Safety
    /// As [`Self::filter`], after it.
    pub(crate) unsafe fn rescore(
        &self,
        q: Queue<'_>,
        metric: Metric,
        ops: &Operands,
        lists: &Listed,
    ) -> Result<(), CudaError> {
        let Operands {
            corpus,
            rnorm,
            n,
            d,
            queries,
            nq,
            qnorm,
            scores,
        } = *ops;
        let Listed { list, count, flag } = *lists;
        let per_query = (4 * self.sm_count / nq.max(1)).clamp(1, 16);
        kernel_args!(args = [corpus, rnorm, n, d, queries, qnorm, list, count, flag, scores]);
        // SAFETY: the parameter list of topk_rescore_*; buffers per the contract.
        unsafe {
            Self::launch(
                "topk_rescore",
                self.rescore[metric_slot(metric)],
                (per_query, nq),
                FILTER_THREADS,
                0,
                q,
                &mut args,
                false,
            )
        }
    }

    /// The exact best `k` of each query's listed rows, by their canonical
    /// scores in `ops.scores`, into `out` (rows of k + 1).
    ///
    /// # Safety
    /// As [`Self::rescore`], after it; `out` nq rows of k + 1 entries;
    /// k <= CAND_CAP / 2.
    pub(crate) unsafe fn select_listed(
        &self,
        q: Queue<'_>,
        ops: &Operands,
        lists: &Listed,
        k: u32,
        out: DPtr,
    ) -> Result<(), CudaError> {
        let Operands { n, nq, scores, .. } = *ops;
        let Listed { list, count, flag } = *lists;
        kernel_args!(args = [scores, n, list, count, flag, k, out]);
        // SAFETY: the parameter list of topk_select_listed; buffers per the
        // contract; its ranking scratch is the dynamic shared memory allowed
        // at load.
        unsafe {
            Self::launch(
                "topk_select_listed",
                self.select_listed,
                (1, nq),
                SEL_THREADS,
                RANK_TMP_BYTES as u32,
                q,
                &mut args,
                false,
            )
        }
    }

    /// Scores `count` (query, row) pairs: pair `i` is row `ids[i]` against
    /// query `owner[i]`, into `out[i]`.
    ///
    /// # Safety
    /// `corpus` n × d, `rnorm` n (cosine), `queries` and `qnorm` cover every
    /// owner, `ids` values < n, `ids`/`owner`/`out` hold `count` entries.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn score_ids(
        &self,
        q: Queue<'_>,
        metric: Metric,
        corpus: DPtr,
        rnorm: DPtr,
        d: u32,
        queries: DPtr,
        qnorm: DPtr,
        ids: DPtr,
        owner: DPtr,
        count: u32,
        out: DPtr,
    ) -> Result<(), CudaError> {
        let warps = SCORE_THREADS / 32;
        let blocks = count.div_ceil(warps).clamp(1, self.sm_count * 16);
        kernel_args!(args = [corpus, rnorm, d, queries, qnorm, ids, owner, count, out]);
        // SAFETY: the parameter list of topk_score_ids_*; buffers per the contract.
        unsafe {
            Self::launch(
                "topk_score_ids",
                self.ids[metric_slot(metric)],
                (blocks, 1),
                SCORE_THREADS,
                0,
                q,
                &mut args,
                false,
            )
        }
    }
}

/// Blocks per query of the grid-wide selection passes over `n` scores:
/// about SELECT_ROWS_PER_THREAD rows per thread, at most the device's `sm`
/// multiprocessors for one query, and for a batch at most
/// [`BATCH_SELECT_BLOCKS_PER_SM`] blocks per multiprocessor shared among the
/// queries. (One block per multiprocessor shared among 64 queries left half
/// the device idle, each block reading 4 MB alone at 1M rows: 0.45 ms per
/// pass on an H200.)
fn select_blocks(sm: u32, n: u32, nq: u32) -> u32 {
    let per_query = n.div_ceil(SEL_THREADS * SELECT_ROWS_PER_THREAD);
    let cap = if nq <= 1 {
        sm
    } else {
        (BATCH_SELECT_BLOCKS_PER_SM * sm / nq).max(1)
    };
    per_query.clamp(1, cap)
}

/// Host → device copy of `bytes` on `q`.
///
/// # Safety
/// `src` is valid for `bytes` reads (pinned for a truly asynchronous copy;
/// pinned in a graph) and stays so until the copy runs; `dst` is valid for
/// `bytes` writes.
pub(crate) unsafe fn h2d(
    q: Queue<'_>,
    dst: DPtr,
    src: *const c_void,
    bytes: usize,
) -> Result<(), CudaError> {
    match q {
        // SAFETY: forwarded from this function's contract.
        Queue::Stream(stream) => check("cuMemcpyHtoDAsync", unsafe {
            cu::cuMemcpyHtoDAsync_v2(dst, src, bytes, stream)
        }),
        // SAFETY: forwarded from this function's contract.
        Queue::Graph(g) => unsafe {
            g.copy(Mem::Device(dst), Mem::Host(src as *mut c_void), bytes)
        },
    }
}

/// Where launches and copies go: queued on a stream (they run in order), or
/// appended to a graph under construction (they run, in the same order, each
/// time the graph is replayed).
#[derive(Clone, Copy)]
pub(crate) enum Queue<'a> {
    Stream(cu::CUstream),
    Graph(&'a GraphBuild),
}

/// One end of a graph copy.
enum Mem {
    Host(*mut c_void),
    Device(DPtr),
}

/// The parameters of a plain 1-D copy of `bytes` from `src` to `dst`
/// (every field set: the memory-type fields are enums with no zero value).
fn memcpy_params(dst: Mem, src: Mem, bytes: usize) -> cu::CUDA_MEMCPY3D {
    let side = |m: Mem| match m {
        Mem::Host(h) => (cu::CUmemorytype::CU_MEMORYTYPE_HOST, h, 0),
        Mem::Device(d) => (
            cu::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            std::ptr::null_mut(),
            d,
        ),
    };
    let (src_type, src_host, src_device) = side(src);
    let (dst_type, dst_host, dst_device) = side(dst);
    cu::CUDA_MEMCPY3D {
        srcXInBytes: 0,
        srcY: 0,
        srcZ: 0,
        srcLOD: 0,
        srcMemoryType: src_type,
        srcHost: src_host as *const c_void,
        srcDevice: src_device,
        srcArray: std::ptr::null_mut(),
        reserved0: std::ptr::null_mut(),
        srcPitch: 0,
        srcHeight: 0,
        dstXInBytes: 0,
        dstY: 0,
        dstZ: 0,
        dstLOD: 0,
        dstMemoryType: dst_type,
        dstHost: dst_host,
        dstDevice: dst_device,
        dstArray: std::ptr::null_mut(),
        reserved1: std::ptr::null_mut(),
        dstPitch: 0,
        dstHeight: 0,
        WidthInBytes: bytes,
        Height: 1,
        Depth: 1,
    }
}

/// A graph being built as a chain: each node depends on the one before.
/// Built node by node rather than captured from a stream, so that no other
/// thread's CUDA calls can interfere while it is made.
pub(crate) struct GraphBuild {
    graph: cu::CUgraph,
    ctx: cu::CUcontext,
    last: std::cell::Cell<cu::CUgraphNode>,
}

impl GraphBuild {
    /// An empty graph in the current context.
    pub(crate) fn new() -> Result<Self, CudaError> {
        let mut ctx: cu::CUcontext = std::ptr::null_mut();
        // SAFETY: `ctx` is valid for one write.
        check("cuCtxGetCurrent", unsafe { cu::cuCtxGetCurrent(&mut ctx) })?;
        let mut graph: cu::CUgraph = std::ptr::null_mut();
        // SAFETY: `graph` is valid for one write.
        check("cuGraphCreate", unsafe { cu::cuGraphCreate(&mut graph, 0) })?;
        Ok(GraphBuild {
            graph,
            ctx,
            last: std::cell::Cell::new(std::ptr::null_mut()),
        })
    }

    /// The dependency list of the next node: the last one, if any.
    fn deps(&self) -> (*const cu::CUgraphNode, usize) {
        let last = self.last.as_ptr() as *const cu::CUgraphNode;
        if self.last.get().is_null() {
            (std::ptr::null(), 0)
        } else {
            (last, 1)
        }
    }

    /// Appends a kernel node (a cooperative one with `cooperative`).
    ///
    /// # Safety
    /// As [`Kernels::launch`]; the buffers stay valid while the graph lives.
    #[allow(clippy::too_many_arguments)]
    unsafe fn kernel(
        &self,
        op: &'static str,
        f: cu::CUfunction,
        grid: (u32, u32),
        block: u32,
        shared: u32,
        args: &mut [*mut c_void],
        cooperative: bool,
    ) -> Result<(), CudaError> {
        let params = cu::CUDA_KERNEL_NODE_PARAMS {
            func: f,
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: 1,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: shared,
            kernelParams: args.as_mut_ptr(),
            extra: std::ptr::null_mut(),
        };
        let (deps, ndeps) = self.deps();
        let mut node: cu::CUgraphNode = std::ptr::null_mut();
        // SAFETY: the driver copies the parameters (and the argument values
        // they point at) into the node; `node` is valid for one write.
        check(op, unsafe {
            cu::cuGraphAddKernelNode(&mut node, self.graph, deps, ndeps, &params)
        })?;
        if cooperative {
            // The attribute value is a union the driver reads as its own
            // (larger, in newer headers) type: pass zeroed room for it with
            // `cooperative` (its first member) set.
            let mut value = [0u64; 8];
            // SAFETY: `value` is 64 bytes, aligned for an i32 at its start.
            unsafe { (value.as_mut_ptr() as *mut i32).write(1) };
            // SAFETY: `node` was just added; `value` outlives the call.
            check(op, unsafe {
                cu::cuGraphKernelNodeSetAttribute(
                    node,
                    cu::CUkernelNodeAttrID::CU_KERNEL_NODE_ATTRIBUTE_COOPERATIVE,
                    value.as_ptr() as *const cu::CUkernelNodeAttrValue,
                )
            })?;
        }
        self.last.set(node);
        Ok(())
    }

    /// Appends a copy node of `bytes` from `src` to `dst`.
    ///
    /// # Safety
    /// Both ranges are valid for `bytes` (host ones pinned) while the graph lives.
    unsafe fn copy(&self, dst: Mem, src: Mem, bytes: usize) -> Result<(), CudaError> {
        let p = memcpy_params(dst, src, bytes);
        let (deps, ndeps) = self.deps();
        let mut node: cu::CUgraphNode = std::ptr::null_mut();
        // SAFETY: `p` describes the two ranges of the contract; `node` is
        // valid for one write.
        check("cuGraphAddMemcpyNode", unsafe {
            cu::cuGraphAddMemcpyNode(&mut node, self.graph, deps, ndeps, &p, self.ctx)
        })?;
        self.last.set(node);
        Ok(())
    }

    /// Instantiates the graph for replay.
    pub(crate) fn finish(self) -> Result<Replay, CudaError> {
        let graph = self.graph;
        // The Replay (or the error path) owns the graph from here on.
        std::mem::forget(self);
        let mut exec: cu::CUgraphExec = std::ptr::null_mut();
        // SAFETY: `exec` is valid for one write; `graph` is complete.
        let status = unsafe { cu::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
        if let Err(e) = check("cuGraphInstantiate", status) {
            // SAFETY: the graph is ours and instantiated nowhere.
            unsafe { cu::cuGraphDestroy(graph) };
            return Err(e);
        }
        Ok(Replay { graph, exec })
    }
}

impl Drop for GraphBuild {
    fn drop(&mut self) {
        // SAFETY: the graph is ours (finish forgets self) and was never
        // instantiated.
        unsafe { cu::cuGraphDestroy(self.graph) };
    }
}

/// A built sequence of launches and copies, instantiated: one launch replays
/// it with the same parameters and buffers.
pub(crate) struct Replay {
    graph: cu::CUgraph,
    exec: cu::CUgraphExec,
}

// SAFETY: graph handles are not bound to a thread; the engine uses each one
// under its slot's mutex, with the context current.
unsafe impl Send for Replay {}

impl Replay {
    /// Queues the whole sequence on `stream`.
    pub(crate) fn launch(&self, stream: cu::CUstream) -> Result<(), CudaError> {
        // SAFETY: the executable graph is live; its buffers belong to the
        // slot that owns it and outlive it.
        check("cuGraphLaunch", unsafe {
            cu::cuGraphLaunch(self.exec, stream)
        })
    }
}

impl Drop for Replay {
    fn drop(&mut self) {
        // SAFETY: both handles are ours; the owner's context is current (the
        // engine makes it so before its slots drop) and the stream that
        // replayed them was synchronised.
        unsafe {
            cu::cuGraphExecDestroy(self.exec);
            cu::cuGraphDestroy(self.graph);
        }
    }
}

/// Device → host copy of `bytes` on `q`.
///
/// # Safety
/// `src` is valid for `bytes` reads; `dst` (pinned in a graph) valid for
/// `bytes` writes until the copy runs and nothing reads it before then.
pub(crate) unsafe fn d2h(
    q: Queue<'_>,
    dst: *mut c_void,
    src: DPtr,
    bytes: usize,
) -> Result<(), CudaError> {
    match q {
        // SAFETY: forwarded from this function's contract.
        Queue::Stream(stream) => check("cuMemcpyDtoHAsync", unsafe {
            cu::cuMemcpyDtoHAsync_v2(dst, src, bytes, stream)
        }),
        // SAFETY: forwarded from this function's contract.
        Queue::Graph(g) => unsafe { g.copy(Mem::Host(dst), Mem::Device(src), bytes) },
    }
}

/// Device → device copy of `bytes` on `stream`.
///
/// # Safety
/// Both ranges are valid device memory of `bytes` and do not overlap.
pub(crate) unsafe fn d2d(
    stream: cu::CUstream,
    dst: DPtr,
    src: DPtr,
    bytes: usize,
) -> Result<(), CudaError> {
    // SAFETY: forwarded from this function's contract.
    check("cuMemcpyDtoDAsync", unsafe {
        cu::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream)
    })
}

/// Sets `words` 32-bit words at `dst` to zero on `stream`.
///
/// # Safety
/// `dst` is valid device memory of `words * 4` bytes.
pub(crate) unsafe fn zero32(
    stream: cu::CUstream,
    dst: DPtr,
    words: usize,
) -> Result<(), CudaError> {
    // SAFETY: forwarded from this function's contract.
    check("cuMemsetD32Async", unsafe {
        cu::cuMemsetD32Async(dst, 0, words, stream)
    })
}

/// Sets `bytes` bytes at `dst` to zero, synchronously.
///
/// # Safety
/// `dst` is valid device memory of `bytes` bytes.
pub(crate) unsafe fn zero_sync(dst: DPtr, bytes: usize) -> Result<(), CudaError> {
    // SAFETY: forwarded from this function's contract.
    check("cuMemsetD8", unsafe { cu::cuMemsetD8_v2(dst, 0, bytes) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of `#define NAME <integer>` in a kernel header.
    fn define(src: &str, name: &str) -> usize {
        src.lines()
            .filter_map(|l| l.trim().strip_prefix("#define "))
            .find_map(|rest| {
                let mut parts = rest.split_whitespace();
                (parts.next() == Some(name)).then(|| parts.next()).flatten()
            })
            .and_then(|v| v.trim_end_matches('u').parse().ok())
            .unwrap_or_else(|| panic!("no integer #define {name} in kernels/common.cuh"))
    }

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
    fn every_kernel_the_host_loads_is_an_entry_of_the_ptx() {
        let families = [
            "topk_score1",
            "topk_score1u",
            "topk_search1",
            "topk_search1u",
            "topk_scoreb",
            "topk_scoreq32",
            "topk_scoreq16",
            "topk_score_ids",
        ];
        let mut names: Vec<String> = families
            .iter()
            .flat_map(|f| ["dot", "cosine", "l2"].map(|m| format!("{f}_{m}")))
            .collect();
        names.push("topk_norms".into());
        names.push("topk_fetch_query".into());
        for name in &names {
            assert!(
                crate::ptx::SCORE_PTX.contains(&format!(".entry {name}(")),
                "{name} missing from score.ptx"
            );
        }
        assert!(crate::ptx::FILTER_PTX.contains(".entry topk_select_listed("));
        for f in ["topk_approx", "topk_filter", "topk_rescore"] {
            for m in ["dot", "cosine", "l2"] {
                let name = format!("{f}_{m}");
                assert!(
                    crate::ptx::FILTER_PTX.contains(&format!(".entry {name}(")),
                    "{name} missing from filter.ptx"
                );
            }
        }
        for name in ["topk_select_small", "topk_hist", "topk_gather"] {
            assert!(
                crate::ptx::SELECT_PTX.contains(&format!(".entry {name}(")),
                "{name} missing from select.ptx"
            );
        }
    }

    #[test]
    fn the_one_block_select_always_has_room_for_the_ranking_scratch() {
        assert_eq!(small_smem(1), RANK_TMP_BYTES);
        assert_eq!(small_smem(STASH_ROWS), STASH_ROWS as usize * 4);
        assert_eq!(small_smem(STASH_ROWS + 1), RANK_TMP_BYTES);
        assert!((0..=2 * STASH_ROWS).all(|n| small_smem(n) <= small_smem(STASH_ROWS)));
    }

    #[test]
    fn host_constants_mirror_the_kernel_headers() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../kernels/common.cuh");
        let src = std::fs::read_to_string(path).expect("kernels/common.cuh");
        assert_eq!(define(&src, "TOPK_AREA_STRIDE"), AREA_STRIDE);
        assert_eq!(define(&src, "TOPK_CAND_CAP"), CAND_CAP);
        assert_eq!(define(&src, "TOPK_MAYBE_CAP"), MAYBE_CAP);
        assert_eq!(define(&src, "TOPK_STASH_ROWS"), STASH_ROWS as usize);
        assert_eq!(define(&src, "TOPK_SEL_THREADS"), SEL_THREADS as usize);
        assert_eq!(define(&src, "TOPK_SEL_THREADS"), SEARCH_THREADS as usize);
        assert_eq!(define(&src, "TOPK_STATUS_OK"), STATUS_OK as usize);
        assert_eq!(
            define(&src, "TOPK_STATUS_OVERFLOW"),
            STATUS_OVERFLOW as usize
        );
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../kernels/filter.cu");
        let filter = std::fs::read_to_string(path).expect("kernels/filter.cu");
        let (bq, br) = (define(&filter, "AX_BQ"), define(&filter, "AX_BR"));
        assert_eq!((bq as u32, br as u32), (APPROX_QUERIES, APPROX_ROWS));
        assert_eq!(define(&filter, "AX_THREADS"), SCORE_THREADS as usize);
        assert_eq!(define(&filter, "FILTER_THREADS"), FILTER_THREADS as usize);
        let ld = define(&filter, "AX_BK") + 4;
        assert_eq!(
            APPROX_SMEM,
            define(&filter, "AX_STAGES") * (bq + br) * ld * 4
        );
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../kernels/score.cu");
        let score = std::fs::read_to_string(path).expect("kernels/score.cu");
        assert_eq!(define(&score, "BCH_CH"), BATCH_CHUNK_COLS);
        assert_eq!(define(&score, "TOPK_TILE_ALIGN"), TILE_ALIGN);
        for (prefix, shape) in [("BQ32", BATCH_Q32), ("BQ16", BATCH_Q16)] {
            let get = |name: &str| define(&score, &format!("{prefix}_{name}")) as u32;
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
    fn graph_copy_parameters_describe_a_plain_copy() {
        let mut host = [0u8; 64];
        let h = host.as_mut_ptr() as *mut c_void;
        let up = memcpy_params(Mem::Device(0x1000), Mem::Host(h), 64);
        assert_eq!(up.srcMemoryType, cu::CUmemorytype::CU_MEMORYTYPE_HOST);
        assert_eq!(up.srcHost, h as *const c_void);
        assert_eq!(up.dstMemoryType, cu::CUmemorytype::CU_MEMORYTYPE_DEVICE);
        assert_eq!(up.dstDevice, 0x1000);
        assert_eq!((up.WidthInBytes, up.Height, up.Depth), (64, 1, 1));
        let down = memcpy_params(Mem::Host(h), Mem::Device(0x2000), 8);
        assert_eq!(down.srcMemoryType, cu::CUmemorytype::CU_MEMORYTYPE_DEVICE);
        assert_eq!(down.srcDevice, 0x2000);
        assert_eq!(down.dstMemoryType, cu::CUmemorytype::CU_MEMORYTYPE_HOST);
        assert_eq!(down.dstHost, h);
        assert_eq!((down.WidthInBytes, down.Height, down.Depth), (8, 1, 1));
    }
}
