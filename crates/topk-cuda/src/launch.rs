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
/// Rows a warp scores at once in the single-query kernel (`SINGLE_RT`).
const SINGLE_ROWS_PER_WARP: u32 = 4;
/// Queries per tile of the batch kernel (`BATCH_QT`).
pub(crate) const BATCH_QT: u32 = 8;
/// Rows per warp of the batch kernel (`BATCH_RT`).
const BATCH_ROWS_PER_WARP: u32 = 4;
/// Largest D whose query fits the single-query kernel's shared memory (48 KiB).
pub(crate) const SINGLE_MAX_DIM: usize = 12 * 1024;
/// One warp per query (`THRESH_THREADS`).
const THRESH_THREADS: u32 = 32;
const GATHER_THREADS: u32 = 1024;
/// Largest candidate set the device sorts (`TOPK_CAND_CAP`).
pub(crate) const CAND_CAP: usize = 4096;
/// 32-bit words of each query's histogram area (`TOPK_HIST_STRIDE`): 65,536
/// fine bins, 256 coarse bins, the fused kernel's ticket and padding.
pub(crate) const HIST_STRIDE: usize = (1 << 16) + 256 + 4;
/// Header status of a result row: selection finished on the device.
pub(crate) const STATUS_OK: u32 = 0;
/// Header status: too many tied candidates; the host finishes the query.
pub(crate) const STATUS_OVERFLOW: u32 = 1;

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

/// Function handles of the loaded modules.
pub(crate) struct Kernels {
    score1: [cu::CUfunction; 3],
    scoreb: [cu::CUfunction; 3],
    ids: [cu::CUfunction; 3],
    norms: cu::CUfunction,
    threshold: cu::CUfunction,
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

fn function(module: &Module, name: &'static str) -> Result<cu::CUfunction, CudaError> {
    module
        .get_function(name)
        .map(|f| f.to_raw())
        .map_err(|e| CudaError::ModuleLoad {
            module: name,
            reason: e.to_string(),
        })
}

impl Kernels {
    /// Looks up every kernel of the two modules.
    pub(crate) fn load(score: &Module, select: &Module, sm_count: u32) -> Result<Self, CudaError> {
        Ok(Kernels {
            score1: [
                function(score, "topk_score1_dot")?,
                function(score, "topk_score1_cosine")?,
                function(score, "topk_score1_l2")?,
            ],
            scoreb: [
                function(score, "topk_scoreb_dot")?,
                function(score, "topk_scoreb_cosine")?,
                function(score, "topk_scoreb_l2")?,
            ],
            ids: [
                function(score, "topk_score_ids_dot")?,
                function(score, "topk_score_ids_cosine")?,
                function(score, "topk_score_ids_l2")?,
            ],
            norms: function(score, "topk_norms")?,
            threshold: function(select, "topk_threshold")?,
            gather: function(select, "topk_gather")?,
            sm_count: sm_count.max(1),
        })
    }

    /// Launches `f` with `args` (pointers to each parameter value).
    ///
    /// # Safety
    /// 1. `args` matches the kernel's parameter list in number, order and size.
    /// 2. Every device address among them is valid for the accesses the kernel
    ///    makes with the sizes passed alongside, until the stream reaches it.
    unsafe fn launch(
        op: &'static str,
        f: cu::CUfunction,
        grid: (u32, u32),
        block: u32,
        shared: u32,
        stream: cu::CUstream,
        args: &mut [*mut c_void],
    ) -> Result<(), CudaError> {
        // SAFETY: forwarded from this function's contract.
        let status = unsafe {
            cu::cuLaunchKernel(
                f,
                grid.0,
                grid.1,
                1,
                block,
                1,
                1,
                shared,
                stream,
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        check(op, status)
    }

    /// Blocks of the single-query scoring kernel that fit on the whole device
    /// at once for dimension `d`: the grid that strides over the rows in one
    /// balanced wave (a second, partial wave would leave SMs idle at the end).
    pub(crate) fn single_query_grid(&self, metric: Metric, d: usize) -> Result<u32, CudaError> {
        let mut per_sm: i32 = 0;
        let smem = if d <= SINGLE_MAX_DIM { d * 4 } else { 0 };
        // SAFETY: `per_sm` is valid for one write; the function handle is live.
        check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
            cu::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut per_sm,
                self.score1[metric_slot(metric)],
                SCORE_THREADS as i32,
                smem,
            )
        })?;
        Ok((per_sm.max(1) as u32) * self.sm_count)
    }

    /// Canonical norms of `n` vectors of length `d` at `x` into `out`.
    ///
    /// # Safety
    /// `x` holds `n * d` floats and `out` room for `n`.
    pub(crate) unsafe fn norms(
        &self,
        stream: cu::CUstream,
        x: DPtr,
        n: u32,
        d: u32,
        out: DPtr,
    ) -> Result<(), CudaError> {
        let (mut x, mut n, mut d, mut out) = (x, n, d, out);
        let warps_per_block = SCORE_THREADS / 32;
        let blocks = n.div_ceil(warps_per_block).clamp(1, self.sm_count * 16);
        let mut args = [
            &mut x as *mut _ as *mut c_void,
            &mut n as *mut _ as *mut c_void,
            &mut d as *mut _ as *mut c_void,
            &mut out as *mut _ as *mut c_void,
        ];
        // SAFETY: the parameter list of topk_norms; sizes from the caller's contract.
        unsafe {
            Self::launch(
                "topk_norms",
                self.norms,
                (blocks, 1),
                SCORE_THREADS,
                0,
                stream,
                &mut args,
            )
        }
    }

    /// Scores `nq` queries against the corpus into `scores` (nq × n) and
    /// counts them in `hist` (nq × HIST_STRIDE, zero on entry). Returns true
    /// when the launch also found the threshold for `k` into `th` (a single
    /// query: its last block does it); otherwise [`Self::threshold`] must run.
    ///
    /// # Safety
    /// `corpus` holds n × d floats, `rnorm` n floats (cosine), `queries`
    /// nq × d, `qnorm` nq (cosine), `scores` nq × n, `hist` nq × HIST_STRIDE,
    /// `th` nq thresholds; 1 <= k <= n.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn score(
        &self,
        stream: cu::CUstream,
        metric: Metric,
        corpus: DPtr,
        rnorm: DPtr,
        n: u32,
        d: u32,
        queries: DPtr,
        nq: u32,
        qnorm: DPtr,
        scores: DPtr,
        hist: DPtr,
        k: u32,
        th: DPtr,
        single_grid: u32,
    ) -> Result<bool, CudaError> {
        let (mut corpus, mut rnorm, mut n, mut d) = (corpus, rnorm, n, d);
        let (mut queries, mut nq, mut qnorm, mut scores, mut hist) =
            (queries, nq, qnorm, scores, hist);
        let (mut k, mut th) = (k, th);
        let warps = SCORE_THREADS / 32;
        if nq == 1 && (d as usize) <= SINGLE_MAX_DIM {
            let groups = n.div_ceil(warps * SINGLE_ROWS_PER_WARP);
            let blocks = groups.clamp(1, single_grid.max(1));
            let mut args = [
                &mut corpus as *mut _ as *mut c_void,
                &mut rnorm as *mut _ as *mut c_void,
                &mut n as *mut _ as *mut c_void,
                &mut d as *mut _ as *mut c_void,
                &mut queries as *mut _ as *mut c_void,
                &mut qnorm as *mut _ as *mut c_void,
                &mut scores as *mut _ as *mut c_void,
                &mut hist as *mut _ as *mut c_void,
                &mut k as *mut _ as *mut c_void,
                &mut th as *mut _ as *mut c_void,
            ];
            // SAFETY: the parameter list of topk_score1_*; buffers per the contract;
            // the query (d floats) fits the dynamic shared memory asked for.
            unsafe {
                Self::launch(
                    "topk_score1",
                    self.score1[metric_slot(metric)],
                    (blocks, 1),
                    SCORE_THREADS,
                    d * 4,
                    stream,
                    &mut args,
                )?;
            }
            Ok(true)
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
            let mut args = [
                &mut corpus as *mut _ as *mut c_void,
                &mut rnorm as *mut _ as *mut c_void,
                &mut n as *mut _ as *mut c_void,
                &mut d as *mut _ as *mut c_void,
                &mut queries as *mut _ as *mut c_void,
                &mut nq as *mut _ as *mut c_void,
                &mut qnorm as *mut _ as *mut c_void,
                &mut scores as *mut _ as *mut c_void,
                &mut hist as *mut _ as *mut c_void,
            ];
            // SAFETY: the parameter list of topk_scoreb_*; buffers per the contract.
            unsafe {
                Self::launch(
                    "topk_scoreb",
                    self.scoreb[metric_slot(metric)],
                    (blocks, 1),
                    SCORE_THREADS,
                    0,
                    stream,
                    &mut args,
                )?;
            }
            Ok(false)
        }
    }

    /// Finds each query's threshold bin and zeroes its coarse histogram.
    ///
    /// # Safety
    /// `hist` holds nq × HIST_STRIDE counts summing to at least `k` per query;
    /// `th` has room for nq thresholds.
    pub(crate) unsafe fn threshold(
        &self,
        stream: cu::CUstream,
        hist: DPtr,
        nq: u32,
        k: u32,
        th: DPtr,
    ) -> Result<(), CudaError> {
        let (mut hist, mut k, mut th) = (hist, k, th);
        let mut args = [
            &mut hist as *mut _ as *mut c_void,
            &mut k as *mut _ as *mut c_void,
            &mut th as *mut _ as *mut c_void,
        ];
        // SAFETY: the parameter list of topk_threshold; buffers per the contract.
        unsafe {
            Self::launch(
                "topk_threshold",
                self.threshold,
                (nq, 1),
                THRESH_THREADS,
                0,
                stream,
                &mut args,
            )
        }
    }

    /// Gathers the candidates of each query and selects its best `k` into `out`
    /// (one row of `stride` = k + 1 entries per query: header, then results),
    /// clearing the fine bins of each query's histogram on the way.
    ///
    /// # Safety
    /// `scores` holds nq × n floats, `hist` nq × HIST_STRIDE words, `th` nq thresholds, `cand` nq × CAND_CAP
    /// keys, `cand_count` and `done` nq zeroed counters, `out` nq × stride entries.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn gather(
        &self,
        stream: cu::CUstream,
        scores: DPtr,
        n: u32,
        nq: u32,
        hist: DPtr,
        th: DPtr,
        cand: DPtr,
        cand_count: DPtr,
        done: DPtr,
        k: u32,
        out: DPtr,
    ) -> Result<(), CudaError> {
        let (mut scores, mut n, mut hist, mut th, mut cand) = (scores, n, hist, th, cand);
        let (mut cand_count, mut done, mut k, mut out) = (cand_count, done, k, out);
        let mut stride = k + 1;
        let per_query = n.div_ceil(GATHER_THREADS * 4);
        let cap = ((self.sm_count * 4) / nq.max(1)).max(1);
        let blocks = per_query.clamp(1, cap);
        let mut args = [
            &mut scores as *mut _ as *mut c_void,
            &mut n as *mut _ as *mut c_void,
            &mut hist as *mut _ as *mut c_void,
            &mut th as *mut _ as *mut c_void,
            &mut cand as *mut _ as *mut c_void,
            &mut cand_count as *mut _ as *mut c_void,
            &mut done as *mut _ as *mut c_void,
            &mut k as *mut _ as *mut c_void,
            &mut out as *mut _ as *mut c_void,
            &mut stride as *mut _ as *mut c_void,
        ];
        // SAFETY: the parameter list of topk_gather; buffers per the contract.
        unsafe {
            Self::launch(
                "topk_gather",
                self.gather,
                (blocks, nq),
                GATHER_THREADS,
                0,
                stream,
                &mut args,
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
        stream: cu::CUstream,
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
        let (mut corpus, mut rnorm, mut d, mut queries, mut qnorm) =
            (corpus, rnorm, d, queries, qnorm);
        let (mut ids, mut owner, mut count, mut out) = (ids, owner, count, out);
        let warps = SCORE_THREADS / 32;
        let blocks = count.div_ceil(warps).clamp(1, self.sm_count * 16);
        let mut args = [
            &mut corpus as *mut _ as *mut c_void,
            &mut rnorm as *mut _ as *mut c_void,
            &mut d as *mut _ as *mut c_void,
            &mut queries as *mut _ as *mut c_void,
            &mut qnorm as *mut _ as *mut c_void,
            &mut ids as *mut _ as *mut c_void,
            &mut owner as *mut _ as *mut c_void,
            &mut count as *mut _ as *mut c_void,
            &mut out as *mut _ as *mut c_void,
        ];
        // SAFETY: the parameter list of topk_score_ids_*; buffers per the contract.
        unsafe {
            Self::launch(
                "topk_score_ids",
                self.ids[metric_slot(metric)],
                (blocks, 1),
                SCORE_THREADS,
                0,
                stream,
                &mut args,
            )
        }
    }
}

/// Host → device copy of `bytes` on `stream`.
///
/// # Safety
/// `src` is valid for `bytes` reads (pinned for a truly asynchronous copy) and
/// stays so until the stream reaches the copy; `dst` is valid for `bytes` writes.
pub(crate) unsafe fn h2d(
    stream: cu::CUstream,
    dst: DPtr,
    src: *const c_void,
    bytes: usize,
) -> Result<(), CudaError> {
    // SAFETY: forwarded from this function's contract.
    check("cuMemcpyHtoDAsync", unsafe {
        cu::cuMemcpyHtoDAsync_v2(dst, src, bytes, stream)
    })
}

/// Device → host copy of `bytes` on `stream`.
///
/// # Safety
/// `src` is valid for `bytes` reads; `dst` valid for `bytes` writes until the
/// stream reaches the copy and nothing reads it before then.
pub(crate) unsafe fn d2h(
    stream: cu::CUstream,
    dst: *mut c_void,
    src: DPtr,
    bytes: usize,
) -> Result<(), CudaError> {
    // SAFETY: forwarded from this function's contract.
    check("cuMemcpyDtoHAsync", unsafe {
        cu::cuMemcpyDtoHAsync_v2(dst, src, bytes, stream)
    })
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
