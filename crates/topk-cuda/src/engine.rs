//! The GPU engine behind [`crate::CudaRetriever`]: context, modules, the
//! resident corpus and per-stream scratch slots, all allocated at
//! construction (DESIGN.md §5).
//!
//! A search takes one slot (its own stream, device scratch and pinned host
//! staging) under that slot's mutex, so concurrent searches from several
//! threads run on separate streams without sharing scratch; with more threads
//! than slots the extra ones wait for a slot.

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cust::context::{Context, CurrentContext};
use cust::device::{Device, DeviceAttribute};
use cust::event::{Event, EventFlags};
use cust::memory::{DeviceBuffer, DeviceSlice, LockedBuffer};
use cust::module::Module;
use cust::stream::{Stream, StreamFlags, StreamWaitEventFlags};
use ndarray::ArrayView2;
use topk_core::order::rank_key;
use topk_core::{validate, Metric, Neighbor};

use crate::error::{CudaError, DriverResult};
use crate::launch::{
    self, DPtr, Kernels, Queue, ScorePlan, AREA_STRIDE, CAND_CAP, MAYBE_CAP, STATUS_OK,
    STATUS_OVERFLOW, STATUS_PENDING,
};
use crate::ptx;
use crate::{CudaOptions, DeviceInfo};

/// One result as the kernels write it; the layout of [`Neighbor`].
#[derive(Clone, Copy, Debug, Default, rustacuda_derive::DeviceCopy)]
#[repr(C)]
pub(crate) struct DevNeighbor {
    index: u32,
    score: f32,
}

impl DevNeighbor {
    pub(crate) fn new(index: u32, score: f32) -> Self {
        DevNeighbor { index, score }
    }
}

/// A query's level-1 threshold bin and the rows above and in it
/// (`TopkThreshold`).
#[derive(Clone, Copy, Debug, Default, rustacuda_derive::DeviceCopy)]
#[repr(C)]
pub(crate) struct DevThreshold {
    bucket: u32,
    above: u32,
    in_bucket: u32,
    pad: u32,
}

/// The primary context, shared by the engine and every object holding
/// device memory of it, so that frees run with the context current.
pub(crate) struct Ctx {
    ctx: Context,
}

impl Ctx {
    pub(crate) fn make_current(&self) -> Result<(), CudaError> {
        CurrentContext::set_current(&self.ctx).op("cuCtxSetCurrent")
    }
}

/// Initialises the driver and retains the primary context of `device`.
pub(crate) fn open(device: usize) -> Result<(Arc<Ctx>, Device), CudaError> {
    cust::init(cust::CudaFlags::empty()).map_err(|e| CudaError::NoDriver {
        reason: format!("{e} ({e:?})"),
    })?;
    let available = Device::num_devices().op("cuDeviceGetCount")? as usize;
    if device >= available {
        return Err(CudaError::NoDevice {
            requested: device,
            available,
        });
    }
    let dev = Device::get_device(device as u32).op("cuDeviceGet")?;
    let ctx = Context::new(dev).op("cuDevicePrimaryCtxRetain")?;
    Ok((Arc::new(Ctx { ctx }), dev))
}

/// Name, driver and memory of `dev`.
pub(crate) fn info_of(dev: Device) -> Result<DeviceInfo, CudaError> {
    let mut driver = 0i32;
    // SAFETY: `driver` is valid for one i32 write.
    launch::check("cuDriverGetVersion", unsafe {
        cust::sys::cuDriverGetVersion(&mut driver)
    })?;
    let major = dev
        .get_attribute(DeviceAttribute::ComputeCapabilityMajor)
        .op("cuDeviceGetAttribute")?;
    let minor = dev
        .get_attribute(DeviceAttribute::ComputeCapabilityMinor)
        .op("cuDeviceGetAttribute")?;
    Ok(DeviceInfo {
        name: dev.name().op("cuDeviceGetName")?,
        driver_version: format!("{}.{}", driver / 1000, (driver % 1000) / 10),
        total_memory: dev.total_memory().op("cuDeviceTotalMem")?,
        compute_capability: (major, minor),
        multiprocessors: dev
            .get_attribute(DeviceAttribute::MultiprocessorCount)
            .op("cuDeviceGetAttribute")? as u32,
    })
}

/// Allocates `len` elements, naming the buffer in an out-of-memory error.
fn alloc<T: cust::memory::DeviceCopy>(
    what: &'static str,
    len: usize,
) -> Result<DeviceBuffer<T>, CudaError> {
    let len = len.max(1);
    // SAFETY: every buffer is written by a copy or a kernel before it is read
    // (the counters and histograms are zeroed explicitly after allocation).
    unsafe { DeviceBuffer::uninitialized(len) }.map_err(|e| match e {
        cust::error::CudaError::OutOfMemory => CudaError::OutOfMemory {
            what,
            requested: len * std::mem::size_of::<T>(),
            available: launch::free_memory().unwrap_or(0),
        },
        other => CudaError::driver("cuMemAlloc", other),
    })
}

fn pinned<T: cust::memory::DeviceCopy + Default>(len: usize) -> Result<LockedBuffer<T>, CudaError> {
    LockedBuffer::new(&T::default(), len.max(1)).op("cuMemAllocHost")
}

type DeviceAttr = cust::sys::CUdevice_attribute;

/// Whether a yes/no attribute of `dev` is set.
fn device_flag(dev: Device, attr: DeviceAttr) -> Result<bool, CudaError> {
    let mut v = 0i32;
    // SAFETY: `v` is valid for one i32 write; `dev` is a live device.
    launch::check("cuDeviceGetAttribute", unsafe {
        cust::sys::cuDeviceGetAttribute(&mut v, attr, dev.as_raw())
    })?;
    Ok(v != 0)
}

fn ptr<T: cust::memory::DeviceCopy>(b: &DeviceSlice<T>) -> DPtr {
    b.as_device_ptr().as_raw()
}

/// Scratch of one concurrent search: a stream, the query and result buffers
/// (device and pinned host) of a whole staged batch, and the scoring and
/// selection scratch of one chunk of it.
struct Slot {
    stream: Stream,
    queries: DeviceBuffer<f32>,
    qnorm: DeviceBuffer<f32>,
    scores: DeviceBuffer<f32>,
    area: DeviceBuffer<u32>,
    th: DeviceBuffer<DevThreshold>,
    cand: DeviceBuffer<u64>,
    maybe: DeviceBuffer<u64>,
    out: DeviceBuffer<DevNeighbor>,
    ids: DeviceBuffer<u32>,
    owner: DeviceBuffer<u32>,
    id_scores: DeviceBuffer<f32>,
    /// The filtered batch's listed rows, CAND_CAP per query of a chunk.
    flist: DeviceBuffer<u32>,
    /// Per chunk of a turn a flag asking the host to run the chunk again on
    /// the canonical path, then per query of the turn its listed rows.
    fcount: DeviceBuffer<u32>,
    /// `fcount` copied back after a filtered turn.
    fcount_host: LockedBuffer<u32>,
    q_host: LockedBuffer<f32>,
    out_host: LockedBuffer<DevNeighbor>,
    /// Where the kernels write results: `out_host`'s device address when
    /// results are mapped (no copy back), else `out`.
    out_dev: DPtr,
    /// Results land in `out_host` without a copy.
    mapped: bool,
    /// The device address of `q_host`, where host queries are read by
    /// `topk_fetch_query` rather than copied (`CudaOptions::mapped_queries`).
    q_mapped: Option<DPtr>,
    scores_host: LockedBuffer<f32>,
    ids_host: LockedBuffer<u32>,
    owner_host: LockedBuffer<u32>,
    id_scores_host: LockedBuffer<f32>,
    /// Built query graphs by K and query source (`None`: the driver could
    /// not build one), at most `MAX_REPLAYS`, oldest first.
    replays: Vec<(GraphKey, Option<launch::Replay>)>,
    /// Device queries (K, address) seen once and not yet given a graph, at
    /// most `MAX_DEVICE_SEEN`, oldest first.
    device_seen: Vec<GraphKey>,
}

/// Where the query of a graph comes from: the slot's pinned staging buffer
/// (copied in by the graph), or a device buffer of the caller's, read in
/// place at the address the graph was built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum QuerySource {
    Host,
    Device(DPtr),
}

/// A graph is built for one K and one query source.
type GraphKey = (usize, QuerySource);

/// Query graphs kept per slot (one per K and query source in use).
const MAX_REPLAYS: usize = 8;
/// Device queries remembered until their second use, when they get a graph:
/// a caller that reuses a few query buffers gets graphs, one that cycles
/// through many never pays for building graphs it would not reuse.
const MAX_DEVICE_SEEN: usize = 4;

/// The rule of [`Engine::device_graph_wanted`] on the remembered keys
/// `seen` (at most `MAX_DEVICE_SEEN`, oldest first): true for a key with a
/// graph (`built`) or seen once before (then forgotten); otherwise the key
/// is remembered, dropping the oldest, and the answer is false.
fn second_use(seen: &mut Vec<GraphKey>, built: bool, key: GraphKey) -> bool {
    if built {
        return true;
    }
    if let Some(i) = seen.iter().position(|kk| *kk == key) {
        seen.remove(i);
        return true;
    }
    if seen.len() >= MAX_DEVICE_SEEN {
        seen.remove(0);
    }
    seen.push(key);
    false
}

/// What one slot's buffers are sized for: N rows of D columns, the slot's
/// [`Sizes`], `max_k` results per query, `gather` listed ids and
/// `filter_list` rows listed by a filtered chunk (0 where batches are never
/// filtered).
struct SlotShape {
    n: usize,
    d: usize,
    sizes: Sizes,
    max_k: usize,
    gather: usize,
    filter_list: usize,
}

impl SlotShape {
    /// Device bytes one slot needs, for the up-front memory check.
    fn bytes(&self) -> usize {
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
    }
}

/// How many queries a slot holds: `staged` queries and their results at
/// once (a batch call's turn), scored and selected `chunk` at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sizes {
    staged: usize,
    chunk: usize,
}

impl Sizes {
    /// `max_batch` queries staged (at most [`MAX_STAGED`]); chunks as large
    /// as `batch_scratch` bytes of scores allow over `n` rows, in whole
    /// 32-query tiles of the batch kernel, at least [`BATCH_CHUNK`] (a
    /// smaller chunk would read the corpus more often than the scoring
    /// needs) and at most the staged queries.
    fn new(n: usize, max_batch: usize, batch_scratch: usize) -> Self {
        let staged = max_batch.min(MAX_STAGED);
        let fit = batch_scratch / (4 * n.max(1));
        let chunk = (fit - fit % 32).max(BATCH_CHUNK).min(staged);
        Sizes { staged, chunk }
    }

    /// Chunks of a full turn.
    fn turn_chunks(&self) -> usize {
        self.staged.div_ceil(self.chunk)
    }
}

/// The device's address for page-locked host memory at `host` from
/// cuMemAllocHost, which is mapped into the device's address space where
/// the device can map host memory with unified addressing (checked by the
/// caller before asking).
fn device_address(host: *mut c_void) -> Result<DPtr, CudaError> {
    let mut dev: DPtr = 0;
    // SAFETY: `dev` is valid for one write; the driver checks that `host`
    // is page-locked memory it allocated and reports an error otherwise.
    let status = unsafe { cust::sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0) };
    launch::check("cuMemHostGetDevicePointer", status)?;
    Ok(dev)
}

impl Slot {
    /// The buffers the selection kernels take, results from row `first` of
    /// rows of `k + 1` entries where `out_dev` says.
    fn select_bufs(&self, first: usize, k: usize) -> launch::SelectBufs {
        let row = (first * (k + 1) * std::mem::size_of::<DevNeighbor>()) as DPtr;
        launch::SelectBufs {
            scores: ptr(&self.scores),
            area: ptr(&self.area),
            th: ptr(&self.th),
            cand: ptr(&self.cand),
            maybe: ptr(&self.maybe),
            out: self.out_dev + row,
        }
    }

    fn new(shape: &SlotShape, map_results: bool, map_queries: bool) -> Result<Self, CudaError> {
        let SlotShape {
            n,
            d,
            sizes,
            max_k,
            gather,
            filter_list,
        } = *shape;
        let Sizes { staged, chunk } = sizes;
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
            q_host: pinned(staged * d)?,
            out_host: pinned(staged * (max_k + 1))?,
            scores_host: pinned(n)?,
            ids_host: pinned(gather)?,
            owner_host: pinned(gather)?,
            id_scores_host: pinned(gather)?,
            replays: Vec::new(),
            device_seen: Vec::new(),
            out_dev: 0,
            mapped: false,
            q_mapped: None,
            stream,
        };
        slot.out_dev = ptr(&slot.out);
        if map_results {
            match device_address(slot.out_host.as_mut_ptr() as *mut c_void) {
                Ok(dev) => {
                    slot.out_dev = dev;
                    slot.mapped = true;
                }
                Err(e) => tracing::debug!("results copied back: host memory not mapped ({e})"),
            }
        }
        if map_queries {
            match device_address(slot.q_host.as_mut_ptr() as *mut c_void) {
                Ok(dev) => slot.q_mapped = Some(dev),
                Err(e) => tracing::debug!("host queries copied: host memory not mapped ({e})"),
            }
        }
        let s = slot.stream.as_inner();
        // SAFETY: each range is exactly the buffer it names.
        unsafe {
            launch::zero32(s, ptr(&slot.area), slot.area.len())?;
        }
        slot.stream.synchronize().op("cuStreamSynchronize")?;
        Ok(slot)
    }
}

/// The engine: everything [`crate::CudaRetriever`] owns on the device.
pub(crate) struct Engine {
    n: usize,
    d: usize,
    metric: Metric,
    opts: CudaOptions,
    sizes: Sizes,
    info: DeviceInfo,
    kernels: Kernels,
    /// Grids of the scoring kernels for this D.
    plan: ScorePlan,
    /// Resident blocks of the one-launch search kernel for this D, where the
    /// device can run it.
    search_grid: Option<u32>,
    corpus: DeviceBuffer<f32>,
    rnorm: DeviceBuffer<f32>,
    slots: Vec<Mutex<Slot>>,
    next: AtomicUsize,
    /// Filtered batch chunks the host ran again on the canonical path.
    reruns: AtomicUsize,
    // Declared after the buffers that live in them: fields drop in order.
    _score_module: Module,
    _select_module: Module,
    _filter_module: Module,
    ctx: Arc<Ctx>,
}

/// Largest K of the filtered batch path ([`Engine::filtered`]).
const FILTER_MAX_K: usize = 1024;

/// Fewest queries per batch chunk (see [`Sizes::new`]).
const BATCH_CHUNK: usize = 64;

/// Most queries a slot stages at once; a larger `max_batch` runs in turns.
const MAX_STAGED: usize = 1024;

/// Bytes of the pinned staging buffer copied before each piece is queued
/// for the device (see [`Engine::stage_queries`]).
const STAGE_PIECE_BYTES: usize = 256 * 1024;

impl Engine {
    pub(crate) fn new(
        corpus: ArrayView2<'_, f32>,
        metric: Metric,
        opts: CudaOptions,
    ) -> Result<Self, CudaError> {
        let (n, d) = validate::corpus_view(corpus)?;
        match corpus.as_slice() {
            Some(flat) => Self::build(flat, n, d, metric, opts),
            None => {
                let flat: Vec<f32> = corpus.iter().copied().collect();
                Self::build(&flat, n, d, metric, opts)
            }
        }
    }

    pub(crate) fn from_rowmajor(
        data: &[f32],
        dim: usize,
        metric: Metric,
        opts: CudaOptions,
    ) -> Result<Self, CudaError> {
        let n = validate::corpus(data, dim)?;
        Self::build(data, n, dim, metric, opts)
    }

    fn build(
        flat: &[f32],
        n: usize,
        d: usize,
        metric: Metric,
        opts: CudaOptions,
    ) -> Result<Self, CudaError> {
        opts.check()?;
        let (ctx, dev) = open(opts.device)?;
        let info = info_of(dev)?;
        let sizes = Sizes::new(n, opts.max_batch, opts.batch_scratch);
        let filter_list = if Self::filter_fits(n, d, &opts) {
            sizes.chunk * CAND_CAP
        } else {
            0
        };
        let shape = SlotShape {
            n,
            d,
            sizes,
            max_k: opts.max_k,
            gather: opts.max_gather,
            filter_list,
        };
        let requested = n * d * 4 + n * 4 + shape.bytes() * opts.streams;
        let available = launch::free_memory()?;
        if requested > available {
            return Err(CudaError::OutOfMemory {
                what: "the engine (corpus, norms and per-stream scratch)",
                requested,
                available,
            });
        }
        let score_module =
            Module::from_ptx(ptx::SCORE_PTX, &[]).map_err(|e| CudaError::ModuleLoad {
                module: "score",
                reason: e.to_string(),
            })?;
        let select_module =
            Module::from_ptx(ptx::SELECT_PTX, &[]).map_err(|e| CudaError::ModuleLoad {
                module: "select",
                reason: e.to_string(),
            })?;
        let filter_module =
            Module::from_ptx(ptx::FILTER_PTX, &[]).map_err(|e| CudaError::ModuleLoad {
                module: "filter",
                reason: e.to_string(),
            })?;
        let kernels = Kernels::load(
            &score_module,
            &select_module,
            &filter_module,
            info.multiprocessors,
        )?;
        let plan = kernels.prepare_score(metric, d)?;
        let search_grid = if device_flag(dev, DeviceAttr::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH)? {
            kernels.prepare_search(metric, d)?
        } else {
            None
        };
        let corpus = DeviceBuffer::from_slice(flat).map_err(|e| match e {
            cust::error::CudaError::OutOfMemory => CudaError::OutOfMemory {
                what: "corpus",
                requested: flat.len() * 4,
                available: launch::free_memory().unwrap_or(0),
            },
            other => CudaError::driver("cuMemcpyHtoD (corpus)", other),
        })?;
        // Row norms: cosine scores divide by them, filtered batches bound
        // every metric's scores with them.
        let norms = metric == Metric::Cosine || filter_list > 0;
        let rnorm = alloc::<f32>("row norms", if norms { n } else { 1 })?;
        let mut slots = Vec::with_capacity(opts.streams);
        let can_map = device_flag(dev, DeviceAttr::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY)?
            && device_flag(dev, DeviceAttr::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)?;
        let map_results = opts.mapped_results && can_map;
        let map_queries = opts.mapped_queries && can_map;
        for _ in 0..opts.streams {
            slots.push(Mutex::new(Slot::new(&shape, map_results, map_queries)?));
        }
        if norms {
            let slot = slots[0].lock().unwrap_or_else(|p| p.into_inner());
            // SAFETY: corpus holds n × d floats and rnorm n.
            unsafe {
                kernels.norms(
                    Queue::Stream(slot.stream.as_inner()),
                    ptr(&corpus),
                    n as u32,
                    d as u32,
                    ptr(&rnorm),
                )?;
            }
            slot.stream
                .synchronize()
                .op("cuStreamSynchronize (row norms)")?;
        }
        tracing::debug!(n, d, %metric, streams = opts.streams, ?sizes, "topk-cuda engine ready");
        Ok(Engine {
            n,
            d,
            metric,
            opts,
            sizes,
            info,
            kernels,
            plan,
            search_grid,
            corpus,
            rnorm,
            slots,
            next: AtomicUsize::new(0),
            reruns: AtomicUsize::new(0),
            _score_module: score_module,
            _select_module: select_module,
            _filter_module: filter_module,
            ctx,
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.n
    }
    pub(crate) fn dim(&self) -> usize {
        self.d
    }
    pub(crate) fn metric(&self) -> Metric {
        self.metric
    }
    pub(crate) fn filter_reruns(&self) -> usize {
        self.reruns.load(Ordering::Relaxed)
    }

    pub(crate) fn options(&self) -> &CudaOptions {
        &self.opts
    }
    pub(crate) fn info(&self) -> &DeviceInfo {
        &self.info
    }
    pub(crate) fn ctx(&self) -> &Arc<Ctx> {
        &self.ctx
    }

    /// Takes a free slot if there is one, else waits for the next in turn.
    fn slot(&self) -> Result<MutexGuard<'_, Slot>, CudaError> {
        self.ctx.make_current()?;
        for s in &self.slots {
            if let Ok(g) = s.try_lock() {
                return Ok(g);
            }
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        // A panic in another search cannot leave a slot half-written in a way
        // that matters: every search rewrites what it reads.
        Ok(self.slots[i].lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Queues scoring and selection of `nq` queries already in `queries` (on
    /// the slot's stream), their results going to rows `first..first + nq`
    /// of the result buffer. Selection runs on the device when `k` fits the
    /// result buffers; otherwise only the scores are produced.
    fn enqueue(
        &self,
        slot: &Slot,
        queries: DPtr,
        first: usize,
        nq: usize,
        k: usize,
    ) -> Result<(), CudaError> {
        let s = Queue::Stream(slot.stream.as_inner());
        self.enqueue_marked(slot, s, queries, first, nq, k, &mut |_| Ok(()))
    }

    /// [`Self::enqueue`] on `s` (the slot's stream, or a graph being built
    /// for it), calling `mark` with a stage name after the launch that ends
    /// each stage (for [`Self::stage_times`]).
    #[allow(clippy::too_many_arguments)]
    fn enqueue_marked(
        &self,
        slot: &Slot,
        s: Queue<'_>,
        queries: DPtr,
        first: usize,
        nq: usize,
        k: usize,
        mark: &mut dyn FnMut(&'static str) -> Result<(), CudaError>,
    ) -> Result<(), CudaError> {
        let (n, d) = (self.n as u32, self.d as u32);
        // SAFETY: the scoring and selection scratch was sized at construction
        // for `chunk` queries (nq <= chunk) and the result rows for `staged`
        // (first + nq <= staged), N rows, D columns and max_k results (k <=
        // max_k on the device path); `queries` holds nq × d floats (checked
        // by callers).
        unsafe {
            let one_launch = self.n > self.opts.fuse_rows && self.n <= self.opts.single_launch_rows;
            if let (1, true, true, Some(grid)) =
                (nq, k <= self.opts.max_k, one_launch, self.search_grid)
            {
                self.kernels.search1(
                    s,
                    self.metric,
                    ptr(&self.corpus),
                    ptr(&self.rnorm),
                    n,
                    d,
                    queries,
                    &slot.select_bufs(first, k),
                    k as u32,
                    grid,
                )?;
                return mark("search");
            }
            if self.metric == Metric::Cosine && !launch::single_path(nq, self.d) {
                self.kernels
                    .norms(s, queries, nq as u32, d, ptr(&slot.qnorm))?;
            }
            let grid_select = k <= self.opts.max_k && self.n > self.opts.fuse_rows;
            // A single query's scoring kernel also finds its threshold.
            let threshold =
                (grid_select && nq == 1).then(|| (ptr(&slot.area), k as u32, ptr(&slot.th)));
            let ops = self.operands(slot, queries, nq);
            let fused = self
                .kernels
                .score(s, self.metric, &ops, &self.plan, threshold)?;
            mark("score")?;
            if k > self.opts.max_k {
                // The host selects from the scores.
                return Ok(());
            }
            let bufs = slot.select_bufs(first, k);
            let (nq, k) = (nq as u32, k as u32);
            if !grid_select {
                self.kernels.select_small(s, &bufs, n, nq, k)?;
            } else {
                if !fused {
                    self.kernels.hist(s, &bufs, n, nq, k)?;
                    mark("threshold")?;
                }
                self.kernels.gather(s, &bufs, n, nq, k)?;
            }
            mark("select")?;
        }
        Ok(())
    }

    /// The scoring operands of `nq` queries at `queries` against the corpus,
    /// into the slot's scores.
    fn operands(&self, slot: &Slot, queries: DPtr, nq: usize) -> launch::Operands {
        launch::Operands {
            corpus: ptr(&self.corpus),
            rnorm: ptr(&self.rnorm),
            n: self.n as u32,
            d: self.d as u32,
            queries,
            nq: nq as u32,
            qnorm: ptr(&slot.qnorm),
            scores: ptr(&slot.scores),
        }
    }

    /// Whether batches over `n` rows of `d` columns can take the filtered
    /// path under `opts` (the tensor-core kernel stages whole 16-byte pieces).
    fn filter_fits(n: usize, d: usize, opts: &CudaOptions) -> bool {
        n >= opts.filter_rows && d % 4 == 0 && n <= u32::MAX as usize
    }

    /// Whether a batch chunk of `cq` queries with this K takes the filtered
    /// path: at least `filter_queries` queries, K at most [`FILTER_MAX_K`]
    /// (and `max_k`), so that the rows listed besides the best K usually
    /// fit the CAND_CAP a query may list.
    fn filtered(&self, k: usize, cq: usize) -> bool {
        Self::filter_fits(self.n, self.d, &self.opts)
            && k <= self.opts.max_k.min(FILTER_MAX_K)
            && cq >= self.opts.filter_queries
    }

    /// Queues the filtered path (kernels/filter.cu) for `nq` queries of a
    /// batch chunk, results to rows `first..first + nq` of the turn (`first`
    /// a multiple of the chunk size): lower bounds, the selection over them,
    /// the listing of rows that may reach the top K, their canonical scores
    /// and the selection among them. `fcount` (zeroed by the caller) gets
    /// the chunk's flag (run it again on the canonical path) and each
    /// query's count of listed rows.
    fn enqueue_filtered(
        &self,
        slot: &Slot,
        queries: DPtr,
        first: usize,
        nq: usize,
        k: usize,
    ) -> Result<(), CudaError> {
        let s = Queue::Stream(slot.stream.as_inner());
        let ci = first / self.sizes.chunk;
        let lists = launch::Listed {
            list: ptr(&slot.flist),
            count: ptr(&slot.fcount) + ((self.sizes.turn_chunks() + first) * 4) as DPtr,
            flag: ptr(&slot.fcount) + (ci * 4) as DPtr,
        };
        let bufs = slot.select_bufs(first, k);
        let ops = self.operands(slot, queries, nq);
        let (k32, metric, ks) = (k as u32, self.metric, &self.kernels);
        // SAFETY: as in enqueue_marked: the scratch holds `chunk` queries' N
        // scores (nq <= chunk) and their selection buffers, the result rows
        // `staged` (first + nq <= staged); rnorm holds N norms and qnorm
        // `chunk`; `queries` holds nq × d floats at a 16-byte aligned address
        // (d % 4 == 0, checked by filtered()); flist holds CAND_CAP words per
        // query of a chunk, fcount a word per chunk of a turn (ci <
        // turn_chunks) then a word per query of the turn; k <= FILTER_MAX_K
        // <= CAND_CAP / 2.
        unsafe {
            ks.norms(s, queries, ops.nq, ops.d, ops.qnorm)?;
            ks.approx(s, metric, &ops)?;
            ks.hist(s, &bufs, ops.n, ops.nq, k32)?;
            ks.gather(s, &bufs, ops.n, ops.nq, k32)?;
            ks.filter(s, metric, &ops, bufs.out, k32, &lists)?;
            ks.rescore(s, metric, &ops, &lists)?;
            ks.select_listed(s, &ops, &lists, k32, bufs.out)?;
        }
        Ok(())
    }

    /// Copies the `nq × (k + 1)` result rows back and waits for the stream.
    fn fetch_results(&self, slot: &mut Slot, nq: usize, k: usize) -> Result<(), CudaError> {
        let s = Queue::Stream(slot.stream.as_inner());
        Self::copy_results(slot, s, nq, k)?;
        slot.stream.synchronize().op("cuStreamSynchronize")
    }

    /// Queues on `s` the copy of the `nq × (k + 1)` result rows to the
    /// pinned host buffer; the host reads them after synchronising the stream.
    fn copy_results(slot: &mut Slot, s: Queue<'_>, nq: usize, k: usize) -> Result<(), CudaError> {
        if slot.mapped {
            // The kernels wrote the rows into out_host already.
            return Ok(());
        }
        let entries = nq * (k + 1);
        // SAFETY: out_host holds staged × (max_k + 1) >= entries elements
        // (nq <= staged, k <= max_k); callers synchronise before reading them.
        unsafe {
            launch::d2h(
                s,
                slot.out_host.as_mut_ptr() as *mut c_void,
                ptr(&slot.out),
                entries * std::mem::size_of::<DevNeighbor>(),
            )
        }
    }

    /// Copies `queries` (at most `staged` rows of D) through the pinned
    /// staging buffer to the slot's device query buffer, on its stream, and
    /// returns that buffer's address. A large batch goes in pieces of about
    /// [`STAGE_PIECE_BYTES`], each queued for the device as soon as it is in
    /// the staging buffer, so the device copies one piece while the host
    /// writes the next.
    fn stage_queries(slot: &mut Slot, queries: &[f32]) -> Result<DPtr, CudaError> {
        let piece = STAGE_PIECE_BYTES / 4;
        let base = ptr(&slot.queries);
        let staging = &mut slot.q_host.as_mut_slice()[..queries.len()];
        for (i, (dst, src)) in staging
            .chunks_mut(piece)
            .zip(queries.chunks(piece))
            .enumerate()
        {
            dst.copy_from_slice(src);
            let offset = (i * piece * 4) as DPtr;
            // SAFETY: dst lies in q_host (pinned) and the device buffer holds
            // staged × d >= queries.len() floats, so [offset, offset + 4 ×
            // dst.len()) is inside both; the previous search on this slot
            // was waited for, so no queued copy still reads this piece.
            unsafe {
                launch::h2d(
                    Queue::Stream(slot.stream.as_inner()),
                    base + offset,
                    dst.as_ptr() as *const c_void,
                    dst.len() * 4,
                )?;
            }
        }
        Ok(base)
    }

    /// Reads query `qi`'s results into `out`, finishing it on the host from its
    /// scores when the device path did not (k > max_k or too many ties). A
    /// query of a batch names its device copy in `rescore`: its scores may
    /// have been overwritten by a later chunk's, so it is scored again alone
    /// (the same canonical scores) before the host selects; a single query's
    /// scores are still in row `qi`.
    fn collect(
        &self,
        slot: &mut Slot,
        qi: usize,
        k: usize,
        rescore: Option<DPtr>,
        out: &mut Vec<Neighbor>,
    ) -> Result<(), CudaError> {
        out.clear();
        if k <= self.opts.max_k {
            let row = &slot.out_host.as_slice()[qi * (k + 1)..(qi + 1) * (k + 1)];
            match row[0].index {
                STATUS_OK => {
                    out.extend(row[1..].iter().map(|r| Neighbor::new(r.index, r.score)));
                    return Ok(());
                }
                STATUS_OVERFLOW => {
                    tracing::debug!(
                        k,
                        "tied candidates over the device cap; selecting on the host"
                    );
                }
                other => {
                    return Err(CudaError::Driver {
                        op: "topk_gather",
                        reason: format!("unknown result status {other}"),
                    })
                }
            }
        }
        match rescore {
            Some(query) => {
                // K past max_k queues the scoring alone, into row 0.
                self.enqueue(slot, query, 0, 1, self.opts.max_k + 1)?;
                self.select_on_host(slot, 0, k, out)
            }
            None => self.select_on_host(slot, qi, k, out),
        }
    }

    /// The slower exact path: brings query `qi`'s N scores to the host and
    /// selects there with the §3 key.
    fn select_on_host(
        &self,
        slot: &mut Slot,
        qi: usize,
        k: usize,
        out: &mut Vec<Neighbor>,
    ) -> Result<(), CudaError> {
        let n = self.n;
        // SAFETY: scores holds chunk × n floats (qi < chunk); scores_host holds
        // n; the stream is synchronised before reading.
        unsafe {
            launch::d2h(
                Queue::Stream(slot.stream.as_inner()),
                slot.scores_host.as_mut_ptr() as *mut c_void,
                ptr(&slot.scores) + (qi * n * 4) as u64,
                n * 4,
            )?;
        }
        slot.stream.synchronize().op("cuStreamSynchronize")?;
        let scores = &slot.scores_host.as_slice()[..n];
        let mut keys: Vec<u64> = scores
            .iter()
            .enumerate()
            .map(|(i, &s)| rank_key(s, i as u32))
            .collect();
        if k < n {
            keys.select_nth_unstable_by(k - 1, |a, b| b.cmp(a));
            keys.truncate(k);
        }
        keys.sort_unstable_by(|a, b| b.cmp(a));
        out.clear();
        out.extend(keys.iter().map(|&key| {
            let i = u32::MAX - key as u32;
            Neighbor::new(i, scores[i as usize])
        }));
        Ok(())
    }

    /// One host query, end to end.
    pub(crate) fn search_host(
        &self,
        query: &[f32],
        k: usize,
        out: &mut Vec<Neighbor>,
    ) -> Result<(), CudaError> {
        validate::query(query, self.d)?;
        let k = validate::k(k, self.n)?;
        let mut slot = self.slot()?;
        if self.opts.graphs && k <= self.opts.max_k {
            slot.q_host.as_mut_slice()[..query.len()].copy_from_slice(query);
            if self.run_graph(&mut slot, (k, QuerySource::Host))? {
                return self.collect(&mut slot, 0, k, None, out);
            }
        }
        let qptr = Self::stage_queries(&mut slot, query)?;
        self.finish_one(&mut slot, qptr, k, out)
    }

    /// One query with `key` as the slot's graph ([`Self::replay`]), waited
    /// for until its results are in `out_host`; false (nothing queued) where
    /// no graph could be built.
    ///
    /// With results mapped into host memory the first row's header is
    /// marked pending before the launch and then polled: the selection
    /// writes it last, after a system-scope fence, so the rows are complete
    /// as soon as it changes, without waiting for the kernel to exit and the
    /// stream to report it. (The previous query on the slot wrote its
    /// header last too, so nothing overwrites the mark but this query's
    /// selection.) The stream is queried every 64 polls, so a failed launch
    /// still ends the wait with its error. Otherwise the stream is
    /// synchronised. Work the kernel does after the header (its blocks
    /// exiting) finishes before anything queued next on the slot's stream.
    fn run_graph(&self, slot: &mut Slot, key: GraphKey) -> Result<bool, CudaError> {
        if slot.mapped {
            slot.out_host.as_mut_slice()[0] = DevNeighbor::new(STATUS_PENDING, 0.0);
        }
        if !self.replay(slot, key)? {
            return Ok(false);
        }
        if !slot.mapped {
            slot.stream.synchronize().op("cuStreamSynchronize")?;
            return Ok(true);
        }
        let header = slot.out_host.as_ptr() as *const u32;
        let mut polls: u32 = 0;
        loop {
            polls = polls.wrapping_add(1);
            // Whether the stream has finished, asked every 64 polls; the
            // header is read after the answer, so a finished stream with no
            // header is a real absence.
            let finished = polls % 64 == 0 && {
                // SAFETY: the stream handle is live while the slot is.
                let status = unsafe { cust::sys::cuStreamQuery(slot.stream.as_inner()) };
                if status != cust::sys::CUresult::CUDA_ERROR_NOT_READY {
                    launch::check("cuStreamQuery", status)?;
                }
                status == cust::sys::CUresult::CUDA_SUCCESS
            };
            // SAFETY: `header` is the first word of out_host (DevNeighbor is
            // repr(C), index first), page-locked memory the slot owns and the
            // device writes; a volatile read sees each new value.
            if unsafe { std::ptr::read_volatile(header) } != STATUS_PENDING {
                // The rows were written before the header.
                std::sync::atomic::fence(Ordering::Acquire);
                return Ok(true);
            }
            if finished {
                return Err(CudaError::Driver {
                    op: "topk_select",
                    reason: "the query's kernels finished without writing its results".to_owned(),
                });
            }
            std::hint::spin_loop();
        }
    }

    /// Queues the slot's query graph for `key`, built on first use, and
    /// returns true; false where the driver could not build it (remembered,
    /// and logged at debug level): the caller then queues the steps itself.
    fn replay(&self, slot: &mut Slot, key: GraphKey) -> Result<bool, CudaError> {
        let i = match slot.replays.iter().position(|(kk, _)| *kk == key) {
            Some(i) => i,
            None => {
                if slot.replays.len() >= MAX_REPLAYS {
                    // The last launch may still be finishing after its
                    // results (`run_graph`): let it end before a graph
                    // is destroyed (rare: only past MAX_REPLAYS keys).
                    slot.stream.synchronize().op("cuStreamSynchronize")?;
                    slot.replays.remove(0);
                }
                let replay = self
                    .build_graph(slot, key)
                    .map_err(|e| {
                        tracing::debug!(?key, "query graph not built ({e}); queueing its steps")
                    })
                    .ok();
                slot.replays.push((key, replay));
                slot.replays.len() - 1
            }
        };
        match &slot.replays[i].1 {
            Some(r) => r.launch(slot.stream.as_inner()).map(|()| true),
            None => Ok(false),
        }
    }

    /// Whether a device query with `key` should replay a graph: it has one,
    /// or this is the second use of its buffer since it was last seen (see
    /// `MAX_DEVICE_SEEN`); a first use is remembered.
    fn device_graph_wanted(slot: &mut Slot, key: GraphKey) -> bool {
        let built = slot.replays.iter().any(|(kk, _)| *kk == key);
        second_use(&mut slot.device_seen, built, key)
    }

    /// One query with `k` on `slot`'s buffers as a graph: for a host query
    /// the copy from the pinned staging buffer, then every kernel (reading a
    /// device query where it lies), then the result copy.
    fn build_graph(&self, slot: &mut Slot, key: GraphKey) -> Result<launch::Replay, CudaError> {
        let (k, source) = key;
        let graph = launch::GraphBuild::new()?;
        let s = Queue::Graph(&graph);
        let query = match source {
            QuerySource::Host => {
                // SAFETY: as in `stage_queries`: q_host (pinned, at its host
                // or mapped device address) and the device query buffer hold
                // staged × d >= d floats; both live as long as the slot that
                // keeps the graph, and the host rewrites q_host only after
                // the previous replay's results are in.
                unsafe {
                    match slot.q_mapped {
                        Some(src) => {
                            self.kernels
                                .fetch_query(s, src, ptr(&slot.queries), self.d as u32)?
                        }
                        None => launch::h2d(
                            s,
                            ptr(&slot.queries),
                            slot.q_host.as_ptr() as *const c_void,
                            self.d * 4,
                        )?,
                    }
                }
                ptr(&slot.queries)
            }
            // The caller's buffer of d floats: replayed only for a query of
            // that length at this very address (`search_device`).
            QuerySource::Device(p) => p,
        };
        self.enqueue_marked(slot, s, query, 0, 1, k, &mut |_| Ok(()))?;
        Self::copy_results(slot, s, 1, k)?;
        graph.finish()
    }

    fn finish_one(
        &self,
        slot: &mut Slot,
        qptr: DPtr,
        k: usize,
        out: &mut Vec<Neighbor>,
    ) -> Result<(), CudaError> {
        self.enqueue(slot, qptr, 0, 1, k)?;
        if k <= self.opts.max_k {
            self.fetch_results(slot, 1, k)?;
        }
        self.collect(slot, 0, k, None, out)
    }

    /// One query already on the device. With `wait_on`, the search first waits
    /// (on the device, not the host) for the work queued on that stream.
    pub(crate) fn search_device(
        &self,
        query: &DeviceSlice<f32>,
        wait_on: Option<&Stream>,
        k: usize,
        out: &mut Vec<Neighbor>,
    ) -> Result<(), CudaError> {
        if query.len() != self.d {
            return Err(CudaError::DeviceQueryLength {
                got: query.len(),
                expected: self.d,
            });
        }
        let k = validate::k(k, self.n)?;
        let mut slot = self.slot()?;
        if let Some(caller) = wait_on {
            let ev = Event::new(EventFlags::DISABLE_TIMING).op("cuEventCreate")?;
            ev.record(caller).op("cuEventRecord")?;
            slot.stream
                .wait_event(ev, StreamWaitEventFlags::DEFAULT)
                .op("cuStreamWaitEvent")?;
        }
        if self.opts.graphs && k <= self.opts.max_k {
            let key = (k, QuerySource::Device(ptr(query)));
            if Self::device_graph_wanted(&mut slot, key) && self.run_graph(&mut slot, key)? {
                return self.collect(&mut slot, 0, k, None, out);
            }
        }
        self.finish_one(&mut slot, ptr(query), k, out)
    }

    /// Device time of each stage of one host query, from events recorded
    /// between the stages (a diagnostic for tuning; the search itself records
    /// none). A one-launch search has the single stage `search`; otherwise
    /// `score` then `select`, with a `threshold` stage only where the
    /// scoring kernel cannot find the threshold itself (D past
    /// the single-query kernel's limit).
    pub(crate) fn stage_times(
        &self,
        query: &[f32],
        k: usize,
    ) -> Result<Vec<(&'static str, f32)>, CudaError> {
        validate::query(query, self.d)?;
        let k = validate::k(k, self.n)?.min(self.opts.max_k);
        let mut slot = self.slot()?;
        let slot = &mut *slot;
        let start = Event::new(EventFlags::DEFAULT).op("cuEventCreate")?;
        let mut marks: Vec<(&'static str, Event)> = Vec::with_capacity(4);
        let mut record = |name: &'static str, stream: &Stream| -> Result<(), CudaError> {
            let ev = Event::new(EventFlags::DEFAULT).op("cuEventCreate")?;
            ev.record(stream).op("cuEventRecord")?;
            marks.push((name, ev));
            Ok(())
        };
        start.record(&slot.stream).op("cuEventRecord")?;
        let qptr = Self::stage_queries(slot, query)?;
        record("h2d", &slot.stream)?;
        let s = Queue::Stream(slot.stream.as_inner());
        self.enqueue_marked(slot, s, qptr, 0, 1, k, &mut |name| {
            record(name, &slot.stream)
        })?;
        let s = Queue::Stream(slot.stream.as_inner());
        Self::copy_results(slot, s, 1, k)?;
        record("d2h", &slot.stream)?;
        slot.stream.synchronize().op("cuStreamSynchronize")?;
        let mut out = Vec::with_capacity(marks.len());
        let mut prev = &start;
        for (name, ev) in &marks {
            let ms = ev.elapsed_time_f32(prev).op("cuEventElapsedTime")?;
            out.push((*name, ms));
            prev = ev;
        }
        Ok(out)
    }

    /// A batch of `nq` row-major queries: staged a turn of up to the slot's
    /// `staged` queries at a time, whose chunks are all queued before the
    /// host waits once for the turn's results (with K past `max_k`, each
    /// chunk's scores are read back before the next chunk overwrites them).
    pub(crate) fn search_batch(
        &self,
        queries: &[f32],
        k: usize,
    ) -> Result<Vec<Vec<Neighbor>>, CudaError> {
        let d = self.d;
        let k = validate::k(k, self.n)?;
        let nq = queries.len() / d;
        let mut results = Vec::with_capacity(nq);
        let mut slot = self.slot()?;
        let outcome = self.batch_turns(&mut slot, queries, k, &mut results);
        if outcome.is_err() {
            // A failure part way through a turn can leave its earlier chunks
            // running; let them finish, so that none of them writes a result
            // header after the slot's next search has marked it pending.
            if let Err(e) = slot.stream.synchronize() {
                tracing::debug!("batch stream after an error: {e}");
            }
        }
        outcome.map(|()| results)
    }

    /// The turns of [`Self::search_batch`] on `slot`, appending each query's
    /// answer to `results`.
    fn batch_turns(
        &self,
        slot: &mut Slot,
        queries: &[f32],
        k: usize,
        results: &mut Vec<Vec<Neighbor>>,
    ) -> Result<(), CudaError> {
        let d = self.d;
        let Sizes { staged, chunk } = self.sizes;
        for (t, turn) in queries.chunks(staged * d).enumerate() {
            let tq = turn.len() / d;
            // The first chunk is the largest: a turn filters any chunk only
            // if it filters that one.
            let filtered = self.filtered(k, chunk.min(tq));
            if filtered {
                // SAFETY: fcount holds exactly its own length in words.
                unsafe {
                    launch::zero32(slot.stream.as_inner(), ptr(&slot.fcount), slot.fcount.len())?;
                }
            }
            let qptr = Self::stage_queries(slot, turn)?;
            let query_at = |i: usize| qptr + (i * d * 4) as DPtr;
            for first in (0..tq).step_by(chunk) {
                let cq = chunk.min(tq - first);
                if self.filtered(k, cq) {
                    self.enqueue_filtered(slot, query_at(first), first, cq, k)?;
                } else {
                    self.enqueue(slot, query_at(first), first, cq, k)?;
                }
                if k > self.opts.max_k {
                    for qi in 0..cq {
                        let mut v = Vec::with_capacity(k);
                        self.select_on_host(slot, qi, k, &mut v)?;
                        results.push(v);
                    }
                }
            }
            if k <= self.opts.max_k {
                if filtered {
                    // SAFETY: fcount_host (pinned) and fcount have the same
                    // length; the host reads it after fetch_results waits.
                    unsafe {
                        launch::d2h(
                            Queue::Stream(slot.stream.as_inner()),
                            slot.fcount_host.as_mut_ptr() as *mut c_void,
                            ptr(&slot.fcount),
                            slot.fcount.len() * 4,
                        )?;
                    }
                }
                self.fetch_results(slot, tq, k)?;
                if filtered && self.refilter(slot, tq, k, &query_at)? {
                    self.fetch_results(slot, tq, k)?;
                }
                for qi in 0..tq {
                    let mut v = Vec::with_capacity(k);
                    self.collect(slot, qi, k, Some(query_at(qi)), &mut v)?;
                    results.push(v);
                }
            }
            tracing::trace!(turn = t, queries = tq, chunk, "batch turn done");
        }
        Ok(())
    }

    /// After a filtered turn of `tq` queries has finished and its counts
    /// are in `fcount_host`: queues the
    /// canonical path for every chunk the device flagged (its bounds did
    /// not separate the top K within the list's capacity, or its first
    /// selection did not finish on the device) and says whether there were
    /// any.
    fn refilter(
        &self,
        slot: &mut Slot,
        tq: usize,
        k: usize,
        query_at: &dyn Fn(usize) -> DPtr,
    ) -> Result<bool, CudaError> {
        let chunk = self.sizes.chunk;
        let counts = slot.fcount_host.as_slice();
        let chunks = self.sizes.turn_chunks();
        let mut again = false;
        for (ci, first) in (0..tq).step_by(chunk).enumerate() {
            let cq = chunk.min(tq - first);
            let listed = &counts[chunks + first..chunks + first + cq];
            let most = listed.iter().copied().max().unwrap_or(0);
            tracing::trace!(
                chunk = ci,
                most,
                "filtered chunk: most rows listed by a query"
            );
            if counts[ci] != 0 {
                tracing::debug!(
                    chunk = ci,
                    most,
                    "bounds did not separate the top K; canonical path"
                );
                self.enqueue(slot, query_at(first), first, cq, k)?;
                self.reruns.fetch_add(1, Ordering::Relaxed);
                again = true;
            }
        }
        Ok(again)
    }

    /// Canonical scores of listed rows per query (the graph index's batched
    /// distance step).
    pub(crate) fn score_ids(
        &self,
        queries: &[f32],
        ids: &[u32],
        offsets: &[usize],
        out: &mut [f32],
    ) -> Result<(), CudaError> {
        let d = self.d;
        if queries.len() % d != 0 {
            return Err(CudaError::Input(topk_core::Error::DimensionMismatch {
                what: format!("score_ids queries ({} values)", queries.len()),
                expected: d,
                got: queries.len() % d,
            }));
        }
        let nq = queries.len() / d;
        for (i, q) in queries.chunks(d).enumerate() {
            validate::query_at(q, d, i)?;
        }
        let max_queries = self.opts.max_batch.min(BATCH_CHUNK);
        if nq > max_queries {
            return Err(CudaError::OverCapacity {
                what: "queries",
                got: nq,
                max: max_queries,
            });
        }
        if ids.len() > self.opts.max_gather {
            return Err(CudaError::OverCapacity {
                what: "ids",
                got: ids.len(),
                max: self.opts.max_gather,
            });
        }
        if offsets.len() != nq + 1
            || offsets.first() != Some(&0)
            || offsets.last() != Some(&ids.len())
            || offsets.windows(2).any(|w| w[0] > w[1])
        {
            return Err(CudaError::BadOffsets {
                reason: format!(
                    "offsets must have {} non-decreasing entries from 0 to {} (got {:?})",
                    nq + 1,
                    ids.len(),
                    offsets
                ),
            });
        }
        if out.len() != ids.len() {
            return Err(CudaError::BadOffsets {
                reason: format!("out has {} slots for {} ids", out.len(), ids.len()),
            });
        }
        if let Some((position, &id)) = ids
            .iter()
            .enumerate()
            .find(|(_, &id)| id as usize >= self.n)
        {
            return Err(CudaError::RowIdOutOfRange {
                id,
                position,
                n: self.n,
            });
        }
        if ids.is_empty() {
            return Ok(());
        }
        let mut slot = self.slot()?;
        let slot = &mut *slot;
        let qptr = Self::stage_queries(slot, queries)?;
        slot.ids_host.as_mut_slice()[..ids.len()].copy_from_slice(ids);
        let owner = &mut slot.owner_host.as_mut_slice()[..ids.len()];
        for (q, w) in offsets.windows(2).enumerate() {
            owner[w[0]..w[1]].fill(q as u32);
        }
        let s = Queue::Stream(slot.stream.as_inner());
        let count = ids.len();
        // SAFETY: every staging buffer holds at least the copied lengths
        // (checked against the capacities above); ids are < n; the stream is
        // synchronised before `id_scores_host` is read.
        unsafe {
            launch::h2d(
                s,
                ptr(&slot.ids),
                slot.ids_host.as_ptr() as *const c_void,
                count * 4,
            )?;
            launch::h2d(
                s,
                ptr(&slot.owner),
                slot.owner_host.as_ptr() as *const c_void,
                count * 4,
            )?;
            if self.metric == Metric::Cosine {
                self.kernels
                    .norms(s, qptr, nq as u32, d as u32, ptr(&slot.qnorm))?;
            }
            self.kernels.score_ids(
                s,
                self.metric,
                ptr(&self.corpus),
                ptr(&self.rnorm),
                d as u32,
                qptr,
                ptr(&slot.qnorm),
                ptr(&slot.ids),
                ptr(&slot.owner),
                count as u32,
                ptr(&slot.id_scores),
            )?;
            launch::d2h(
                s,
                slot.id_scores_host.as_mut_ptr() as *mut c_void,
                ptr(&slot.id_scores),
                count * 4,
            )?;
        }
        slot.stream.synchronize().op("cuStreamSynchronize")?;
        out.copy_from_slice(&slot.id_scores_host.as_slice()[..count]);
        Ok(())
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Frees need the context current on the dropping thread.
        if let Err(e) = self.ctx.make_current() {
            tracing::warn!("topk-cuda: could not make the context current to free: {e}");
        }
        for s in &self.slots {
            let slot = s.lock().unwrap_or_else(|p| p.into_inner());
            if let Err(e) = slot.stream.synchronize() {
                tracing::warn!("topk-cuda: stream error at drop: {e}");
            }
        }
    }
}

/// A device buffer that frees itself with its context current.
pub(crate) struct OwnedDevice<T: cust::memory::DeviceCopy> {
    pub(crate) buf: DeviceBuffer<T>,
    ctx: Arc<Ctx>,
}

impl<T: cust::memory::DeviceCopy> OwnedDevice<T> {
    pub(crate) fn from_slice(ctx: &Arc<Ctx>, data: &[T]) -> Result<Self, CudaError> {
        ctx.make_current()?;
        Ok(OwnedDevice {
            buf: DeviceBuffer::from_slice(data).op("cuMemcpyHtoD")?,
            ctx: Arc::clone(ctx),
        })
    }
    /// Makes the buffer's context current on this thread.
    pub(crate) fn make_current(&self) -> Result<(), CudaError> {
        self.ctx.make_current()
    }
    pub(crate) fn zeroed(
        ctx: &Arc<Ctx>,
        what: &'static str,
        len: usize,
    ) -> Result<Self, CudaError> {
        ctx.make_current()?;
        let buf = alloc::<T>(what, len)?;
        // SAFETY: the range is exactly the new buffer.
        unsafe { launch::zero_sync(ptr(&buf), buf.len() * std::mem::size_of::<T>())? };
        Ok(OwnedDevice {
            buf,
            ctx: Arc::clone(ctx),
        })
    }
}

impl<T: cust::memory::DeviceCopy> Drop for OwnedDevice<T> {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.make_current() {
            tracing::warn!("topk-cuda: could not make the context current to free: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(k: usize, p: DPtr) -> GraphKey {
        (k, QuerySource::Device(p))
    }

    #[test]
    fn batch_chunks_grow_with_the_scratch_and_stay_in_bounds() {
        let scratch = crate::DEFAULT_BATCH_SCRATCH;
        // 64-query chunks at 1M rows, as before the scratch was an option.
        assert_eq!(
            Sizes::new(1 << 20, 256, scratch),
            Sizes {
                staged: 256,
                chunk: 64
            }
        );
        // Smaller corpora take a whole default batch in one chunk.
        assert_eq!(Sizes::new(262_144, 256, scratch).chunk, 256);
        // Whole 32-query tiles: 223 fit at 300k rows, 67 at 1M.
        assert_eq!(Sizes::new(300_000, 256, scratch).chunk, 192);
        assert_eq!(Sizes::new(1_000_000, 256, scratch).chunk, 64);
        assert_eq!(Sizes::new(10_000, 256, scratch).chunk, 256);
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

    #[test]
    fn a_device_buffer_gets_a_graph_on_its_second_use() {
        let mut seen = Vec::new();
        assert!(!second_use(&mut seen, false, dev(10, 0x1000)));
        assert!(second_use(&mut seen, false, dev(10, 0x1000)));
        assert!(seen.is_empty());
        // Another K is another graph.
        assert!(!second_use(&mut seen, false, dev(11, 0x1000)));
        // A built graph is always replayed and nothing is remembered.
        assert!(second_use(&mut seen, true, dev(10, 0x1000)));
        assert_eq!(seen, vec![dev(11, 0x1000)]);
    }

    #[test]
    fn a_caller_cycling_through_many_buffers_never_builds_graphs() {
        let mut seen = Vec::new();
        for round in 0..3 {
            for b in 0..(MAX_DEVICE_SEEN as u64 + 1) {
                let key = dev(10, 0x1000 * (b + 1));
                assert!(
                    !second_use(&mut seen, false, key),
                    "round {round} buffer {b}"
                );
                assert!(seen.len() <= MAX_DEVICE_SEEN);
            }
        }
        // Up to MAX_DEVICE_SEEN buffers in turn do get graphs.
        let mut seen = Vec::new();
        let keys: Vec<GraphKey> = (0..MAX_DEVICE_SEEN as u64)
            .map(|b| dev(10, 0x1000 * (b + 1)))
            .collect();
        assert!(keys.iter().all(|&k| !second_use(&mut seen, false, k)));
        assert!(keys.iter().all(|&k| second_use(&mut seen, false, k)));
    }
}
