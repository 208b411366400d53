//! The GPU engine behind [`crate::CudaRetriever`]: context, modules, the
//! resident corpus and per-stream scratch slots, all allocated at
//! construction (docs/CONTRACTS.md §5), and the execution of a [`Plan`]
//! on a slot. The paths themselves live beside it: `single.rs` (one query),
//! `batch.rs` (batches in turns), `filtered.rs` (the filtered chunk),
//! `ids.rs` (scores of listed ids), `graph.rs` (the query graph cache);
//! and its parts: `shadow.rs` (the f16 copy of f32 rows), `results.rs`
//! (results back to the host, and the host's selection where the device
//! did not finish).
//!
//! A search takes one slot (its own stream, device scratch and pinned host
//! staging) under that slot's mutex, so concurrent searches from several
//! threads run on separate streams without sharing scratch; with more threads
//! than slots the extra ones wait for a slot.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cust::memory::DeviceBuffer;
use ndarray::ArrayView2;
use topk_core::{validate, Dtype, Metric, RowStore};

use crate::device::{self, open, Ctx};
use crate::driver::{self, alloc, device_flag, DevSlice, DeviceAttr, RowBuf};
use crate::error::{CudaError, DriverResult};
use crate::launch::{self, FusedThreshold, Kernels, Modules, Operands, Queue, ScorePlan, CAND_CAP};
use crate::plan::{PathCounters, PathCounts, Plan, Planner, Select, Steps};
use crate::shadow::Shadow;
use crate::slot::{Sizes, Slot, SlotShape};
use crate::stored::Source;
use crate::{CudaConfig, DeviceInfo};

/// Batch scratch sizes an engine falls back to, largest first, when the
/// configured one does not fit beside the corpus: the earlier default
/// (256 MiB: 64-query chunks at 1M rows) and the smallest chunks (64
/// queries, whatever the rows). Answers are the same bytes at every size.
const SCRATCH_FALLBACKS: [usize; 2] = [256 << 20, 0];

/// The smallest stride of a filtered chunk's sampled lower bounds
/// (`Tuning::filter_sample`): the slots hold a quarter of the rows' bounds.
pub(crate) const MIN_SAMPLE: usize = 4;

/// The engine: everything [`crate::CudaRetriever`] owns on the device.
pub(crate) struct Engine {
    /// Rows in use (the resident corpus's stored rows, removed ones included).
    pub(crate) n: usize,
    /// Rows the corpus, norm and scratch buffers hold.
    pub(crate) capacity: usize,
    d: usize,
    metric: Metric,
    pub(crate) config: CudaConfig,
    /// Which launches serve each query and chunk.
    pub(crate) planner: Planner,
    /// Queries served per path.
    pub(crate) paths: PathCounters,
    pub(crate) sizes: Sizes,
    info: DeviceInfo,
    pub(crate) kernels: Kernels,
    /// Grids of the scoring kernels for this D.
    score_plan: ScorePlan,
    /// Resident blocks of the one-launch search kernel for this D, where the
    /// device can run it.
    pub(crate) search_grid: Option<u32>,
    /// The rows as they are stored (docs/CONTRACTS.md §14).
    pub(crate) corpus: RowBuf,
    pub(crate) rnorm: DeviceBuffer<f32>,
    /// Whether `rnorm` holds the rows' norms (cosine, or filtered batches).
    pub(crate) norms: bool,
    /// The f16 copy of f32 rows for the Hopper bounds, where the engine
    /// keeps one (`Tuning::shadow_bounds`).
    pub(crate) shadow: Option<Shadow>,
    pub(crate) slots: Vec<Mutex<Slot>>,
    /// Rows of the resident corpus's list and allow-set scratch per slot
    /// (0 for a fixed corpus).
    pub(crate) lists: bool,
    pub(crate) map_results: bool,
    pub(crate) map_queries: bool,
    next: AtomicUsize,
    /// Filtered batch chunks the host ran again on the canonical path.
    pub(crate) reruns: AtomicUsize,
    /// Filtered batch chunks whose rows the Hopper bound kernel listed.
    pub(crate) listed: AtomicUsize,
    /// Filtered batch chunks bounded from the f16 copy of f32 rows.
    pub(crate) shadowed: AtomicUsize,
    // Declared after the buffers that live in them: fields drop in order.
    _modules: Modules,
    ctx: Arc<Ctx>,
}

impl Engine {
    pub(crate) fn new(
        corpus: ArrayView2<'_, f32>,
        metric: Metric,
        config: CudaConfig,
    ) -> Result<Self, CudaError> {
        let (n, d) = corpus.dim();
        match corpus.as_slice() {
            Some(flat) => Self::from_rowmajor(flat, d, metric, config),
            None if n == 0 || d == 0 => Self::from_rowmajor(&[], d, metric, config),
            None => {
                // Checked before the copy so that a bad view costs no copy.
                validate::corpus_view(corpus)?;
                let flat: Vec<f32> = corpus.iter().copied().collect();
                Self::build(Source::F32(&flat), n, d, metric, config, n, false)
            }
        }
    }

    /// An engine over `data`, row-major rows of `dim` values. The values are
    /// checked (docs/CONTRACTS.md §4) as they are uploaded: a large corpus
    /// streams through pinned buffers, each part checked by the host
    /// threads just before it is copied (`launch::h2d_staged`).
    pub(crate) fn from_rowmajor(
        data: &[f32],
        dim: usize,
        metric: Metric,
        config: CudaConfig,
    ) -> Result<Self, CudaError> {
        let n = validate::corpus_shape(data.len(), dim)?;
        if std::mem::size_of_val(data) < launch::STAGED_MIN_BYTES {
            validate::corpus_values(data, dim)?;
        }
        Self::build(Source::F32(data), n, dim, metric, config, n, false)
    }

    /// An engine over the rows of `store`, held on the device as they are
    /// stored (half the bytes for `f16` / `bf16`). The store's rows were
    /// checked as they were stored.
    pub(crate) fn from_store(
        store: &RowStore,
        metric: Metric,
        config: CudaConfig,
    ) -> Result<Self, CudaError> {
        let (n, d) = (store.len(), store.dim());
        if let Some(flat) = store.as_f32() {
            return Self::from_rowmajor(flat, d, metric, config);
        }
        // Every other storage type is 16 bits a value.
        let bits = store.as_bits16().unwrap_or_default();
        if bits.len() != n * d {
            return Err(CudaError::CountMismatch {
                what: "16-bit stored values for rows",
                got: bits.len(),
                expected: n * d,
            });
        }
        Self::build(
            Source::Bits16(bits, store.dtype()),
            n,
            d,
            metric,
            config,
            n,
            false,
        )
    }

    /// An engine of no rows yet with room for `capacity` rows of `dim`
    /// values, and the list scratch of the mutable resident corpus.
    pub(crate) fn with_capacity(
        dim: usize,
        dtype: Dtype,
        metric: Metric,
        config: CudaConfig,
        capacity: usize,
    ) -> Result<Self, CudaError> {
        validate::dim(dim)?;
        // Before the device is touched: the rows a resident corpus may hold
        // (its ids' limit), and a size in bytes that arithmetic can hold.
        let max_rows = u32::MAX as usize / 2;
        if capacity > max_rows {
            return Err(topk_core::Error::TooManyRows {
                n: capacity,
                max: max_rows,
            }
            .into());
        }
        if capacity
            .checked_mul(dim)
            .and_then(|v| v.checked_mul(dtype.bytes()))
            .is_none()
        {
            return Err(topk_core::Error::InvalidParameter {
                name: "capacity",
                value: capacity.to_string(),
                reason: format!("{capacity} rows of D = {dim} do not fit in memory"),
            }
            .into());
        }
        let empty = match dtype {
            Dtype::F32 => Source::F32(&[]),
            half => Source::Bits16(&[], half),
        };
        Self::build(empty, 0, dim, metric, config, capacity.max(1), true)
    }

    /// The batch scratch an engine of `capacity` rows uses, and its slot
    /// shape: the configured `batch_scratch` where every stream's slot fits
    /// in `available` bytes beside `fixed` (the corpus and its norms);
    /// otherwise the largest of [`SCRATCH_FALLBACKS`] below it that fits.
    /// `None` when not even the smallest chunks (64 queries) fit.
    pub(crate) fn fitting_scratch(
        capacity: usize,
        d: usize,
        dtype: Dtype,
        config: &CudaConfig,
        lists: bool,
        fixed: usize,
        available: usize,
    ) -> Option<(usize, SlotShape)> {
        let configured = config.tuning.batch_scratch;
        let tries = std::iter::once(configured)
            .chain(SCRATCH_FALLBACKS.into_iter().filter(|&s| s < configured));
        for scratch in tries {
            let mut c = config.clone();
            c.tuning.batch_scratch = scratch;
            let shape = Self::shape_for(capacity, d, dtype, &c, lists);
            let need = shape
                .bytes()
                .checked_mul(config.streams)?
                .checked_add(fixed)?;
            if need <= available {
                return Some((scratch, shape));
            }
        }
        None
    }

    /// The slot shape of `capacity` rows.
    pub(crate) fn shape_for(
        capacity: usize,
        d: usize,
        dtype: Dtype,
        config: &CudaConfig,
        lists: bool,
    ) -> SlotShape {
        let tuning = &config.tuning;
        let sizes = Sizes::new(capacity, config.max_batch, tuning.batch_scratch);
        let shadow = Self::shadow_wanted(d, dtype, config);
        let filter_list = if Planner::filter_fits(capacity, d, config) {
            sizes.chunk * CAND_CAP
        } else {
            0
        };
        SlotShape {
            n: capacity,
            d,
            sizes,
            max_k: config.max_k,
            gather: tuning.max_gather,
            filter_list,
            lists: if lists { capacity } else { 0 },
            dtype,
            sampled: if filter_list > 0 && tuning.filter_sample >= MIN_SAMPLE {
                capacity.div_ceil(MIN_SAMPLE)
            } else {
                0
            },
            shadow,
        }
    }

    /// The slots of `shape`, one per stream.
    pub(crate) fn make_slots(
        shape: &SlotShape,
        streams: usize,
        map_results: bool,
        map_queries: bool,
    ) -> Result<Vec<Mutex<Slot>>, CudaError> {
        let mut slots = Vec::with_capacity(streams);
        for _ in 0..streams {
            slots.push(Mutex::new(Slot::new(shape, map_results, map_queries)?));
        }
        Ok(slots)
    }

    fn build(
        rows: Source<'_>,
        n: usize,
        d: usize,
        metric: Metric,
        mut config: CudaConfig,
        capacity: usize,
        lists: bool,
    ) -> Result<Self, CudaError> {
        config.check()?;
        let started = std::time::Instant::now();
        let (ctx, dev) = open(config.device)?;
        let info = device::info_of(dev)?;
        let dtype = rows.dtype();
        let fixed = capacity * d * dtype.bytes() + capacity * 4;
        let available = driver::free_memory()?;
        // The f16 copy of the rows only where it fits beside the configured
        // scratch: a full chunk reads the rows once for more queries than
        // the copy saves.
        if Self::shadow_wanted(d, dtype, &config) && info.compute_capability == (9, 0) {
            let with_copy = fixed + Shadow::bytes(capacity, d);
            let fits =
                Self::fitting_scratch(capacity, d, dtype, &config, lists, with_copy, available)
                    .is_some_and(|(scratch, _)| scratch == config.tuning.batch_scratch);
            if !fits {
                tracing::info!(
                    available,
                    "topk-cuda: no room for the f16 copy of the rows; TF32 bounds"
                );
                config.tuning.shadow_bounds = false;
            }
        }
        let Some((scratch, shape)) =
            Self::fitting_scratch(capacity, d, dtype, &config, lists, fixed, available)
        else {
            let shape = Self::shape_for(capacity, d, dtype, &config, lists);
            return Err(CudaError::OutOfMemory {
                what: "the engine (corpus, norms and per-stream scratch)",
                requested: fixed + shape.bytes() * config.streams,
                available,
            });
        };
        if scratch != config.tuning.batch_scratch {
            tracing::info!(
                configured = config.tuning.batch_scratch,
                used = scratch,
                available,
                "topk-cuda: batch scratch reduced to fit beside the corpus"
            );
            config.tuning.batch_scratch = scratch;
        }
        let tuning = &config.tuning;
        let (sizes, filter_list) = (shape.sizes, shape.filter_list);
        let modules = Modules::load(
            info.compute_capability,
            tuning.wgmma_bounds,
            dtype,
            Self::shadow_wanted(d, dtype, &config),
        )?;
        let kernels = Kernels::load(&modules, info.multiprocessors)?;
        let modules_s = started.elapsed().as_secs_f64();
        let score_plan = kernels.prepare_score(metric, d)?;
        let search_grid = if device_flag(dev, DeviceAttr::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH)? {
            kernels.prepare_search(metric, d)?
        } else {
            None
        };
        let corpus = rows.upload(capacity, d)?;
        let upload_s = started.elapsed().as_secs_f64() - modules_s;
        // Row norms: cosine scores divide by them, filtered batches bound
        // every metric's scores with them.
        let norms = metric == Metric::Cosine || filter_list > 0;
        let rnorm = alloc::<f32>("row norms", if norms { capacity } else { 1 })?;
        let can_map = device_flag(dev, DeviceAttr::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY)?
            && device_flag(dev, DeviceAttr::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)?;
        let map_results = tuning.mapped_results && can_map;
        let map_queries = tuning.mapped_queries && can_map;
        let slots = Self::make_slots(&shape, config.streams, map_results, map_queries)?;
        if norms && n > 0 {
            let slot = slots[0].lock().unwrap_or_else(|p| p.into_inner());
            kernels.row_norms(
                Queue::Stream(slot.stream.as_inner()),
                corpus.view(),
                n as u32,
                d as u32,
                DevSlice::of(&rnorm),
            )?;
            slot.stream
                .synchronize()
                .op("cuStreamSynchronize (row norms)")?;
        }
        let planner = Planner::new(n, d, &config, search_grid.is_some());
        let mut engine = Engine {
            n,
            capacity,
            d,
            metric,
            config,
            planner,
            paths: PathCounters::default(),
            sizes,
            info,
            kernels,
            score_plan,
            search_grid,
            corpus,
            rnorm,
            norms,
            shadow: None,
            slots,
            lists,
            map_results,
            map_queries,
            next: AtomicUsize::new(0),
            reruns: AtomicUsize::new(0),
            listed: AtomicUsize::new(0),
            shadowed: AtomicUsize::new(0),
            _modules: modules,
            ctx,
        };
        engine.shadow = engine.shadow_for(capacity)?;
        if engine.shadow.is_some() && n > 0 {
            let slot = engine.slot()?;
            engine.shadow_rows(&slot)?;
        }
        tracing::info!(
            n,
            d,
            %metric,
            shadow = engine.shadow.is_some(),
            streams = engine.config.streams,
            ?sizes,
            modules_s,
            upload_s,
            secs = started.elapsed().as_secs_f64(),
            "topk-cuda engine ready"
        );
        Ok(engine)
    }

    /// How the corpus stores its values.
    pub(crate) fn dtype(&self) -> Dtype {
        self.corpus.dtype()
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
    pub(crate) fn filter_listed(&self) -> usize {
        self.listed.load(Ordering::Relaxed)
    }
    pub(crate) fn filter_shadowed(&self) -> usize {
        self.shadowed.load(Ordering::Relaxed)
    }
    pub(crate) fn shadow_bounds(&self) -> bool {
        self.shadow.is_some()
    }
    pub(crate) fn config(&self) -> &CudaConfig {
        &self.config
    }
    pub(crate) fn path_counts(&self) -> PathCounts {
        self.paths.snapshot()
    }
    pub(crate) fn info(&self) -> &DeviceInfo {
        &self.info
    }
    pub(crate) fn ctx(&self) -> &Arc<Ctx> {
        &self.ctx
    }

    /// Takes a free slot if there is one, else waits for the next in turn.
    pub(crate) fn slot(&self) -> Result<MutexGuard<'_, Slot>, CudaError> {
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

    /// Queues the launches of `plan` for `nq` queries in `queries` (on the
    /// slot's stream), their results going to rows `first..first + nq` of
    /// the result buffer (none where the plan leaves selection to the host:
    /// only the scores are produced).
    pub(crate) fn enqueue(
        &self,
        slot: &Slot,
        plan: Plan,
        queries: DevSlice<'_, f32>,
        first: usize,
        nq: usize,
        k: usize,
    ) -> Result<(), CudaError> {
        let s = Queue::Stream(slot.stream.as_inner());
        self.enqueue_marked(slot, s, plan, queries, first, nq, k, &mut |_| Ok(()))
    }

    /// [`Self::enqueue`] on `s` (the slot's stream, or a graph being built
    /// for it), calling `mark` with a stage name after the launch that ends
    /// each stage (for [`Self::stage_times`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn enqueue_marked(
        &self,
        slot: &Slot,
        s: Queue<'_>,
        plan: Plan,
        queries: DevSlice<'_, f32>,
        first: usize,
        nq: usize,
        k: usize,
        mark: &mut dyn FnMut(&'static str) -> Result<(), CudaError>,
    ) -> Result<(), CudaError> {
        let n = self.n as u32;
        let ops = self.operands(slot, queries, nq);
        let select = match plan.steps {
            Steps::Filtered => return self.enqueue_filtered(slot, queries, first, nq, k),
            Steps::OneLaunch => {
                let grid = self.search_grid.ok_or(CudaError::Driver {
                    op: "topk_search1",
                    reason: "the one-launch kernel does not run on this device".to_owned(),
                })?;
                let bufs = slot.select_bufs(first, k)?;
                self.kernels
                    .search1(s, self.metric, &ops, &bufs, k as u32, grid)?;
                return mark("search");
            }
            Steps::Score(select) => select,
        };
        // A single query's scoring kernel also finds its threshold.
        let threshold =
            (nq == 1 && matches!(select, Select::Fused | Select::Hist)).then(|| FusedThreshold {
                area: DevSlice::of(&slot.area),
                k: k as u32,
                th: DevSlice::of(&slot.th),
            });
        let fused = self.enqueue_scores(s, &ops, threshold)?;
        mark("score")?;
        let (nq, k32) = (nq as u32, k as u32);
        match select {
            Select::ScoresOnly => return Ok(()),
            Select::Small => {
                let bufs = slot.select_bufs(first, k)?;
                self.kernels.select_small(s, &bufs, n, nq, k32)?;
            }
            Select::Fused | Select::Hist => {
                let bufs = slot.select_bufs(first, k)?;
                if !fused {
                    self.kernels.hist(s, &bufs, n, nq, k32)?;
                    mark("threshold")?;
                }
                self.kernels.gather(s, &bufs, n, nq, k32)?;
            }
        }
        mark("select")
    }

    /// Queues the canonical scores of `ops.nq` queries against the corpus
    /// into the slot's scores (and the query norms a cosine batch needs
    /// first); `threshold` asks a single query's kernel to find its
    /// threshold too, and the answer says whether it did.
    pub(crate) fn enqueue_scores(
        &self,
        s: Queue<'_>,
        ops: &Operands<'_>,
        threshold: Option<FusedThreshold<'_>>,
    ) -> Result<bool, CudaError> {
        let nq = ops.nq as usize;
        if self.metric == Metric::Cosine && !launch::single_path(nq, self.d) {
            self.kernels
                .norms(s, ops.queries, ops.nq, ops.d, ops.qnorm)?;
        }
        self.kernels
            .score(s, self.metric, ops, &self.score_plan, threshold)
    }

    /// The scoring operands of `nq` queries at `queries` against the corpus,
    /// into the slot's scores.
    pub(crate) fn operands<'a>(
        &'a self,
        slot: &'a Slot,
        queries: DevSlice<'a, f32>,
        nq: usize,
    ) -> Operands<'a> {
        Operands {
            corpus: self.corpus.view(),
            rnorm: DevSlice::of(&self.rnorm),
            n: self.n as u32,
            d: self.d as u32,
            queries,
            nq: nq as u32,
            qnorm: DevSlice::of(&slot.qnorm),
            scores: DevSlice::of(&slot.scores),
        }
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

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
