//! Every kernel launch and asynchronous copy of the engine, in one place:
//! the wrappers take device views that carry their lengths
//! ([`crate::driver::DevSlice`]), check what their kernel reads and writes
//! against them, and turn each call's status into a typed error. With
//! `driver`, the only module of the crate with `unsafe`.
//!
//! | file | kernels |
//! | --- | --- |
//! | `score.rs` | single-query and batch scoring, the one-launch search, norms, the query fetch |
//! | `select.rs` | the one-block selection, the histogram and the gather |
//! | `filter.rs` | tensor-core bounds, listing, rescoring, listed selection, scores of listed ids |
//! | `graph.rs` | graphs built node by node and their replay |
//! | `copy.rs` | host/device copies and zeroing |
//! | `walk.rs` | the graph walk: every query's HNSW search in one launch |
//! | `prune.rs` | the batched build's neighbour selection and list writes |

mod copy;
mod filter;
mod filter90;
mod graph;
mod prune;
mod rows;
mod score;
mod select;
mod walk;

use std::ffi::c_void;

use cust::module::Module;
use cust::sys as cu;
use topk_core::{Dtype, Metric};

use crate::device::{DevNeighbor, DevThreshold};
use crate::driver::{check, DPtr, DevSlice, Rows};
use crate::error::CudaError;

pub(crate) use copy::{
    d2d, d2d_2d, d2d_sync, d2h, fill_neg_inf, h2d, h2d_staged, h2d_sync, h2d_upload, zero32,
    zero_async, zero_sync, STAGED_MIN_BYTES,
};
pub(crate) use filter::Sampled;
pub(crate) use filter90::{Emitted, HalfQueries, ShadowRows};
pub(crate) use graph::{GraphBuild, Replay};
pub(crate) use prune::{PruneArgs, SetListsArgs, PRUNE_MAX_CANDS, PRUNE_MAX_CAP};
pub(crate) use rows::FROM_B;
pub(crate) use score::{single_path, FusedThreshold, ScorePlan};
pub(crate) use walk::{WalkArgs, WalkGraph};

/// Threads per block of the scoring kernels (8 warps).
const SCORE_THREADS: u32 = 256;
/// Threads of the selection kernels (`TOPK_SEL_THREADS`).
const SEL_THREADS: u32 = 1024;
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
/// Dynamic shared memory of the ranking's scratch (TOPK_CAND_CAP keys) in
/// `topk_gather` and `topk_select_listed`.
const RANK_TMP_BYTES: usize = CAND_CAP * 8;

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

/// Blocks of `threads` threads and `smem` bytes of dynamic shared memory
/// (already allowed for `f`) that fit on one multiprocessor at once.
fn blocks_per_sm(f: cu::CUfunction, threads: u32, smem: usize) -> Result<u32, CudaError> {
    let mut per_sm: i32 = 0;
    // SAFETY: `per_sm` is valid for one write; the function handle is live.
    check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
        cu::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut per_sm, f, threads as i32, smem)
    })?;
    Ok(per_sm.max(0) as u32)
}

/// Lets `f` use `bytes` of dynamic shared memory (above the default 48 KiB).
fn allow_shared(f: cu::CUfunction, bytes: usize) -> Result<(), CudaError> {
    // SAFETY: the function handle is live; the attribute takes a byte count.
    check("cuFuncSetAttribute", unsafe {
        cu::cuFuncSetAttribute(
            f,
            cu::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            bytes as i32,
        )
    })
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
pub(crate) use kernel_args;

/// The f16 build of the Hopper bounds that an engine of f32 rows runs over
/// its f16 copy of them (`Tuning::shadow_bounds`, docs/CONTRACTS.md §5).
#[derive(Clone, Copy)]
pub(crate) struct Shadow90 {
    approx90: [cu::CUfunction; 3],
    emit90: [cu::CUfunction; 3],
    queries16: cu::CUfunction,
    rows16: cu::CUfunction,
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
    /// Batches with the queries resident (32- and 16-query shapes).
    scoreq32: [cu::CUfunction; 3],
    scoreq16: [cu::CUfunction; 3],
    ids: [cu::CUfunction; 3],
    /// Filtered batches (`kernels/filter.cu`): tensor-core lower bounds,
    /// the listing of rows that may reach the top K, their canonical scores.
    approx: [cu::CUfunction; 3],
    /// The same bounds from Hopper's warpgroup products
    /// (`kernels/filter90.cu`), where the device runs them.
    approx90: Option<[cu::CUfunction; 3]>,
    /// The Hopper bounds that list rows as they multiply (`topk_emit90_*`).
    emit90: Option<[cu::CUfunction; 3]>,
    /// The half operands of the queries of those bounds (`topk_queries16`),
    /// where the rows are a half type.
    queries16: Option<cu::CUfunction>,
    /// The f16 build's Hopper bounds, for the f16 copy of f32 rows
    /// (`Tuning::shadow_bounds`), where it is loaded.
    shadow90: Option<Shadow90>,
    filter: [cu::CUfunction; 3],
    /// The listing over the rows `topk_emit90_*` listed.
    filter_emitted: [cu::CUfunction; 3],
    rescore: [cu::CUfunction; 3],
    select_listed: cu::CUfunction,
    norms: cu::CUfunction,
    row_norms: cu::CUfunction,
    fetch_query: cu::CUfunction,
    select_small: cu::CUfunction,
    hist: cu::CUfunction,
    gather: cu::CUfunction,
    /// The mutable resident corpus (`kernels/rows.cu`).
    /// `topk_gather_rows` (f32 values) and `topk_gather_stored` (stored rows).
    gather_rows: [cu::CUfunction; 2],
    /// `topk_scatter_rows` and `topk_scatter_stored`.
    scatter_rows: [cu::CUfunction; 2],
    /// Bytes per stored value of the loaded row families.
    row_width: usize,
    mask_scores: cu::CUfunction,
    score_list: [cu::CUfunction; 3],
    check_queries: cu::CUfunction,
    resolve_ids: cu::CUfunction,
    /// The graph walk (`kernels/walk.cu`), per team size of
    /// [`crate::config::WALK_TEAMS`] and metric.
    walk: [[cu::CUfunction; 3]; 4],
    /// The batched build's neighbour selection (`kernels/prune.cuh`, in
    /// the walk's module) and its writes of layer-0 lists.
    prune: [cu::CUfunction; 3],
    set_lists: cu::CUfunction,
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
        family!($module, $prefix, "")
    };
    ($module:expr, $prefix:literal, $suffix:literal) => {
        [
            function($module, concat!($prefix, "_dot", $suffix))?,
            function($module, concat!($prefix, "_cosine", $suffix))?,
            function($module, concat!($prefix, "_l2", $suffix))?,
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
/// launches take them (per query: `n` scores, `AREA_STRIDE` words of
/// histogram and counters, one threshold, `CAND_CAP` candidate keys,
/// `MAYBE_CAP` threshold-bin keys, and a result row of k + 1 entries,
/// header first, in device memory or in mapped host memory).
#[derive(Clone, Copy)]
pub(crate) struct SelectBufs<'a> {
    pub(crate) scores: DevSlice<'a, f32>,
    pub(crate) area: DevSlice<'a, u32>,
    pub(crate) th: DevSlice<'a, DevThreshold>,
    pub(crate) cand: DevSlice<'a, u64>,
    pub(crate) maybe: DevSlice<'a, u64>,
    pub(crate) out: DevSlice<'a, DevNeighbor>,
}

impl SelectBufs<'_> {
    /// Checks every buffer for `nq` queries over `n` scores selecting
    /// `k`, and 1 <= k <= min(n, CAND_CAP / 2).
    fn check(&self, n: u32, nq: u32, k: u32) -> Result<(), CudaError> {
        let (n, nq, k) = (n as usize, nq as usize, k as usize);
        if k == 0 || k > n || k > CAND_CAP / 2 {
            return Err(CudaError::InvalidOption {
                name: "k of a device selection",
                value: k,
                reason: "must be in 1..=min(N, 2048)",
            });
        }
        self.scores.need("scores", nq * n)?;
        self.area.need("selection areas", nq * AREA_STRIDE)?;
        self.th.need("thresholds", nq)?;
        self.cand.need("candidate keys", nq * CAND_CAP)?;
        self.maybe.need("threshold-bin keys", nq * MAYBE_CAP)?;
        self.out.need("results", nq * (k + 1))
    }
}

/// The operands of a scoring launch: `nq` queries (`queries`, nq × d
/// floats, and their norms `qnorm`) against the corpus (`corpus`, n × d,
/// and its row norms `rnorm`), into `scores` (nq × n).
#[derive(Clone, Copy)]
pub(crate) struct Operands<'a> {
    pub(crate) corpus: Rows<'a>,
    pub(crate) rnorm: DevSlice<'a, f32>,
    pub(crate) n: u32,
    pub(crate) d: u32,
    pub(crate) queries: DevSlice<'a, f32>,
    pub(crate) nq: u32,
    pub(crate) qnorm: DevSlice<'a, f32>,
    pub(crate) scores: DevSlice<'a, f32>,
}

/// [`Operands`] as the batch scoring kernels' parameter list
/// (`topk_scoreq*_*`, `topk_scoreb_*`, `topk_approx_*`).
struct BatchArgs {
    corpus: DPtr,
    rnorm: DPtr,
    n: u32,
    d: u32,
    queries: DPtr,
    nq: u32,
    qnorm: DPtr,
    scores: DPtr,
}

impl BatchArgs {
    /// Pointers to the fields in parameter order, for `cuLaunchKernel`;
    /// valid while `self` is.
    fn pointers(&mut self) -> [*mut c_void; 8] {
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

impl Operands<'_> {
    /// Checks the corpus, queries and scores, and the norms where the
    /// kernel reads them: the row norms with `row_norms` (cosine, or any
    /// metric of the filtered path), the query norms with `query_norms`.
    fn check(&self, row_norms: bool, query_norms: bool) -> Result<(), CudaError> {
        let (n, d, nq) = (self.n as usize, self.d as usize, self.nq as usize);
        self.corpus.need("corpus", n * d)?;
        self.queries.need("queries", nq * d)?;
        self.scores.need("scores", nq * n)?;
        if row_norms {
            self.rnorm.need("row norms", n)?;
        }
        if query_norms {
            self.qnorm.need("query norms", nq)?;
        }
        Ok(())
    }

    fn batch_args(&self) -> BatchArgs {
        BatchArgs {
            corpus: self.corpus.ptr(),
            rnorm: self.rnorm.ptr(),
            n: self.n,
            d: self.d,
            queries: self.queries.ptr(),
            nq: self.nq,
            qnorm: self.qnorm.ptr(),
            scores: self.scores.ptr(),
        }
    }
}

/// A filtered chunk's lists: CAND_CAP listed rows per query (`list`), a
/// count per query (`count`) and the chunk's flag word (`flag`).
#[derive(Clone, Copy)]
pub(crate) struct Listed<'a> {
    pub(crate) list: DevSlice<'a, u32>,
    pub(crate) count: DevSlice<'a, u32>,
    pub(crate) flag: DevSlice<'a, u32>,
}

impl Listed<'_> {
    /// Checks the lists for `nq` queries.
    fn check(&self, nq: u32) -> Result<(), CudaError> {
        let nq = nq as usize;
        self.list.need("filtered rows", nq * CAND_CAP)?;
        self.count.need("filter counts", nq)?;
        self.flag.need("filter flag", 1)
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

/// One kernel launch: the function, its grid (x, y), threads per block and
/// dynamic shared memory, and whether it is cooperative (every block
/// resident at once).
struct Launch {
    op: &'static str,
    f: cu::CUfunction,
    grid: (u32, u32),
    block: u32,
    shared: u32,
    cooperative: bool,
}

impl Launch {
    fn new(op: &'static str, f: cu::CUfunction, grid: (u32, u32), block: u32) -> Self {
        Launch {
            op,
            f,
            grid,
            block,
            shared: 0,
            cooperative: false,
        }
    }

    fn shared(self, bytes: usize) -> Self {
        Launch {
            shared: bytes as u32,
            ..self
        }
    }

    fn cooperative(self) -> Self {
        Launch {
            cooperative: true,
            ..self
        }
    }

    /// Launches with `args` (pointers to each parameter value) on `q`: on a
    /// stream or as a graph node alike.
    ///
    /// # Safety
    /// 1. `args` matches the kernel's parameter list in number, order and size.
    /// 2. Every device address among them is valid for the accesses the kernel
    ///    makes with the sizes passed alongside, until the stream reaches it
    ///    (for a graph: while the graph lives).
    /// 3. A cooperative grid fits the device at once.
    unsafe fn run(&self, q: Queue<'_>, args: &mut [*mut c_void]) -> Result<(), CudaError> {
        let Launch {
            op,
            f,
            grid,
            block,
            shared,
            cooperative,
        } = *self;
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
}

/// The loaded kernel modules, one per family of `kernels/` (kept alive as
/// long as the function handles taken from them).
pub(crate) struct Modules {
    norms: Module,
    single: Module,
    batch: Module,
    ids: Module,
    select: Module,
    filter: Module,
    /// Loaded only on a device of compute capability 9.0 (its PTX is
    /// built for `sm_90a`).
    filter90: Option<Module>,
    /// The f16 build of `filter90`, for the f16 copy of f32 rows; loaded
    /// only beside an f32 `filter90` when the engine keeps that copy.
    shadow90: Option<Module>,
    rows: Module,
    walk: Module,
    /// The storage type of the row families loaded.
    dtype: Dtype,
}

fn load_module(module: &'static str, ptx: &str) -> Result<Module, CudaError> {
    Module::from_ptx(ptx, &[]).map_err(|e| CudaError::ModuleLoad {
        module,
        reason: e.to_string(),
    })
}

impl Modules {
    /// Loads the embedded PTX of every family into the current context of
    /// a device of `compute_capability`; the Hopper bound kernels only where
    /// it is (9, 0) and `wgmma` allows them (where they fail to load, the
    /// engine keeps the `mma.sync` bounds).
    pub(crate) fn load(
        compute_capability: (i32, i32),
        wgmma: bool,
        dtype: Dtype,
        shadow: bool,
    ) -> Result<Self, CudaError> {
        use crate::ptx;
        // The row families in the build for the corpus's storage type.
        let build_of = |family: &'static str, dtype: Dtype| -> Result<Module, CudaError> {
            let name = ptx::build_name(family, dtype.as_str());
            let text = ptx::ptx_of(&name).ok_or(CudaError::ModuleLoad {
                module: family,
                reason: format!("no embedded PTX build {name}"),
            })?;
            load_module(family, text)
        };
        let rows_of = |family: &'static str| build_of(family, dtype);
        // The Hopper bounds are an option: a driver that cannot compile
        // their PTX leaves the engine on mma.sync, with a warning. Their
        // build for the storage type multiplies f32 rows as TF32, half rows
        // as they are stored.
        let filter90 = if wgmma && compute_capability == (9, 0) {
            rows_of("filter90")
                .inspect_err(|e| {
                    tracing::warn!("topk-cuda: wgmma bounds not loaded, using mma.sync: {e}")
                })
                .ok()
        } else {
            None
        };
        // The f16 build beside the f32 one, for the rows' f16 copy; without
        // it the f32 rows keep their TF32 bounds.
        let shadow90 = if shadow && dtype == Dtype::F32 && filter90.is_some() {
            build_of("filter90", Dtype::F16)
                .inspect_err(|e| {
                    tracing::warn!("topk-cuda: f16 bounds of f32 rows not loaded: {e}")
                })
                .ok()
        } else {
            None
        };
        Ok(Modules {
            dtype,
            filter90,
            shadow90,
            norms: rows_of("norms")?,
            single: rows_of("score_single")?,
            batch: rows_of("score_batch")?,
            ids: rows_of("score_ids")?,
            select: load_module("select", ptx::SELECT_PTX)?,
            filter: rows_of("filter")?,
            rows: rows_of("rows")?,
            walk: load_module("walk", ptx::WALK_PTX)?,
        })
    }
}

/// The Hopper bound kernels of one build (`topk_approx90_*`,
/// `topk_emit90_*`), each allowed its dynamic shared memory.
type HopperBounds = ([cu::CUfunction; 3], [cu::CUfunction; 3]);
fn hopper_bounds(m: &Module) -> Result<HopperBounds, CudaError> {
    let approx = family!(m, "topk_approx90");
    let emit = family!(m, "topk_emit90");
    for &k in &approx {
        allow_shared(k, filter90::APPROX90_SMEM)?;
    }
    for &k in &emit {
        allow_shared(k, filter90::TURNS_SMEM)?;
    }
    Ok((approx, emit))
}

impl Kernels {
    /// Looks up every kernel of the modules.
    pub(crate) fn load(modules: &Modules, sm_count: u32) -> Result<Self, CudaError> {
        let Modules {
            norms,
            single,
            batch,
            ids,
            select,
            filter,
            filter90,
            shadow90,
            rows,
            walk,
            dtype,
        } = modules;
        let select_small = function(select, "topk_select_small")?;
        let gather = function(select, "topk_gather")?;
        let approx = family!(filter, "topk_approx");
        let select_listed = function(filter, "topk_select_listed")?;
        let (approx90, emit90, queries16) = match filter90 {
            Some(m) => {
                let (f, e) = hopper_bounds(m)?;
                let q16 = match dtype {
                    Dtype::F32 => None,
                    _ => Some(function(m, "topk_queries16")?),
                };
                (Some(f), Some(e), q16)
            }
            None => (None, None, None),
        };
        let shadow90 = match shadow90 {
            Some(m) => {
                let (approx90, emit90) = hopper_bounds(m)?;
                Some(Shadow90 {
                    approx90,
                    emit90,
                    queries16: function(m, "topk_queries16")?,
                    rows16: function(m, "topk_rows16")?,
                })
            }
            None => None,
        };
        for (f, dynamic) in [
            (select_small, select::small_smem(select::STASH_ROWS)),
            (gather, RANK_TMP_BYTES),
            (select_listed, RANK_TMP_BYTES),
            (approx[0], filter::APPROX_SMEM),
            (approx[1], filter::APPROX_SMEM),
            (approx[2], filter::APPROX_SMEM),
        ] {
            allow_shared(f, dynamic)?;
        }
        Ok(Kernels {
            score1: family!(single, "topk_score1"),
            score1u: family!(single, "topk_score1u"),
            search1: family!(single, "topk_search1"),
            search1u: family!(single, "topk_search1u"),
            scoreb: family!(batch, "topk_scoreb"),
            scoreq32: family!(batch, "topk_scoreq32"),
            scoreq16: family!(batch, "topk_scoreq16"),
            ids: family!(ids, "topk_score_ids"),
            approx,
            approx90,
            emit90,
            queries16,
            shadow90,
            filter: family!(filter, "topk_filter"),
            filter_emitted: family!(filter, "topk_filter_emitted"),
            rescore: family!(filter, "topk_rescore"),
            select_listed,
            norms: function(norms, "topk_norms")?,
            row_norms: function(norms, "topk_row_norms")?,
            fetch_query: function(norms, "topk_fetch_query")?,
            select_small,
            hist: function(select, "topk_hist")?,
            gather,
            gather_rows: [
                function(rows, "topk_gather_rows")?,
                function(rows, "topk_gather_stored")?,
            ],
            scatter_rows: [
                function(rows, "topk_scatter_rows")?,
                function(rows, "topk_scatter_stored")?,
            ],
            row_width: dtype.bytes(),
            mask_scores: function(rows, "topk_mask_scores")?,
            score_list: family!(rows, "topk_score_list"),
            check_queries: function(rows, "topk_check_queries")?,
            resolve_ids: function(rows, "topk_resolve_ids")?,
            walk: [
                family!(walk, "topk_walk", "_32"),
                family!(walk, "topk_walk", "_64"),
                family!(walk, "topk_walk", "_128"),
                family!(walk, "topk_walk", "_256"),
            ],
            prune: family!(walk, "topk_prune"),
            set_lists: function(walk, "topk_set_lists")?,
            sm_count: sm_count.max(1),
        })
    }

    /// Lets `f` use `smem` bytes of dynamic shared memory and returns how
    /// many of its blocks of `threads` fit on the whole device at once.
    fn prepare_staged(
        &self,
        f: cu::CUfunction,
        threads: u32,
        smem: usize,
    ) -> Result<u32, CudaError> {
        allow_shared(f, smem)?;
        Ok(blocks_per_sm(f, threads, smem)? * self.sm_count)
    }
}

#[cfg(test)]
mod tests;
