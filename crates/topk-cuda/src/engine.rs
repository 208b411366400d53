//! The GPU engine behind [`crate::CudaRetriever`]: context, modules, the
//! resident corpus and per-stream scratch slots, all allocated at
//! construction (docs/CONTRACTS.md §5), and the execution of a [`Plan`]
//! on a slot. The paths themselves live beside it: `single.rs` (one query),
//! `batch.rs` (batches in turns), `filtered.rs` (the filtered chunk),
//! `ids.rs` (scores of listed ids), `graph.rs` (the query graph cache).
//!
//! A search takes one slot (its own stream, device scratch and pinned host
//! staging) under that slot's mutex, so concurrent searches from several
//! threads run on separate streams without sharing scratch; with more threads
//! than slots the extra ones wait for a slot.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cust::memory::DeviceBuffer;
use ndarray::ArrayView2;
use topk_core::order::rank_key;
use topk_core::{validate, Dtype, Metric, Neighbor, RowStore};

use crate::device::{self, open, Ctx};
use crate::driver::{self, alloc, device_flag, DevSlice, DeviceAttr, RowBuf};
use crate::error::{CudaError, DriverResult};
use crate::launch::{
    self, FusedThreshold, Kernels, Modules, Operands, Queue, ScorePlan, CAND_CAP, STATUS_OK,
    STATUS_OVERFLOW,
};
use crate::plan::{PathCounters, PathCounts, Plan, Planner, Select, Steps};
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

/// The f16 copy of an engine's f32 rows that its Hopper bounds multiply
/// (`Tuning::shadow_bounds`, docs/CONTRACTS.md §5): each row scaled by a
/// power of two and rounded, and each row's inverse scale.
pub(crate) struct Shadow {
    rows: RowBuf,
    rinv: DeviceBuffer<f32>,
    /// Whether the copy matches the rows in use. Rows that change mark it
    /// stale (they take `&mut` of the engine, so no search is in flight);
    /// the next filtered chunk makes it again under this lock and waits
    /// for it, so no search reads a copy being written.
    fresh: Mutex<bool>,
}

impl Shadow {
    /// Device bytes of the copy of `capacity` rows of `d` values.
    pub(crate) fn bytes(capacity: usize, d: usize) -> usize {
        capacity * (2 * d + 4)
    }

    /// Room for the copy of `capacity` rows of `d` values, stale.
    pub(crate) fn alloc(capacity: usize, d: usize) -> Result<Self, CudaError> {
        Ok(Shadow {
            rows: RowBuf::alloc("f16 copy of the rows", Dtype::F16, capacity * d)?,
            rinv: alloc::<f32>("row scales of the f16 copy", capacity)?,
            fresh: Mutex::new(false),
        })
    }

    /// Marks the copy stale: rows changed.
    pub(crate) fn stale(&mut self) {
        *self.fresh.get_mut().unwrap_or_else(|p| p.into_inner()) = false;
    }
}

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
        if dim == 0 {
            return Err(topk_core::Error::ZeroDimension.into());
        }
        if dim > validate::MAX_DIM {
            return Err(topk_core::Error::DimensionTooLarge {
                dim,
                max: validate::MAX_DIM,
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

    /// Whether an engine of `d` values a row stored as `dtype` asks for the
    /// f16 copy of its rows: f32 rows, D % 8 == 0 (the f16 products' step),
    /// D at least `shadow_min_dim`, `shadow_bounds` and `wgmma_bounds` on.
    /// It keeps one where, besides, the device runs the f16 Hopper bounds,
    /// filtered batches can run, and the copy fits.
    pub(crate) fn shadow_wanted(d: usize, dtype: Dtype, config: &CudaConfig) -> bool {
        let t = &config.tuning;
        dtype == Dtype::F32
            && d % 8 == 0
            && d >= t.shadow_min_dim
            && t.shadow_bounds
            && t.wgmma_bounds
    }

    /// Room for the f16 copy of `capacity` rows where this engine keeps
    /// one: `None` where it does not, or where the copy's memory is not
    /// there (the TF32 bounds serve; nothing else changes).
    pub(crate) fn shadow_for(&self, capacity: usize) -> Result<Option<Shadow>, CudaError> {
        if !(Self::shadow_wanted(self.d, self.dtype(), &self.config)
            && self.kernels.shadows()
            && Planner::filter_fits(capacity, self.d, &self.config))
        {
            return Ok(None);
        }
        match Shadow::alloc(capacity, self.d) {
            Ok(s) => Ok(Some(s)),
            Err(e @ CudaError::OutOfMemory { .. }) => {
                tracing::warn!("topk-cuda: no f16 copy of the rows, TF32 bounds: {e}");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The f16 copy of the rows in use for a filtered chunk on `slot`,
    /// made first (and waited for) where rows changed since it was last
    /// made; `None` where the engine keeps none.
    pub(crate) fn shadow_rows(
        &self,
        slot: &Slot,
    ) -> Result<Option<launch::ShadowRows<'_>>, CudaError> {
        let Some(sh) = &self.shadow else {
            return Ok(None);
        };
        let d = self.d;
        let copy = launch::ShadowRows {
            rows: sh
                .rows
                .view()
                .range("f16 copy of the rows", 0, self.n * d)?,
            rinv: DevSlice::of(&sh.rinv).range("row scales of the f16 copy", 0, self.n)?,
        };
        let mut fresh = sh.fresh.lock().unwrap_or_else(|p| p.into_inner());
        if !*fresh {
            if self.n > 0 {
                let rows = self.corpus.view().range("corpus", 0, self.n * d)?;
                self.kernels.rows16(
                    Queue::Stream(slot.stream.as_inner()),
                    rows,
                    self.n as u32,
                    d as u32,
                    copy,
                )?;
                slot.stream
                    .synchronize()
                    .op("cuStreamSynchronize (f16 copy of the rows)")?;
            }
            *fresh = true;
        }
        Ok(Some(copy))
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

    /// Copies the `nq × (k + 1)` result rows back and waits for the stream.
    pub(crate) fn fetch_results(slot: &mut Slot, nq: usize, k: usize) -> Result<(), CudaError> {
        let s = Queue::Stream(slot.stream.as_inner());
        Self::copy_results(slot, s, nq, k)?;
        slot.stream.synchronize().op("cuStreamSynchronize")
    }

    /// Queues on `s` the copy of the `nq × (k + 1)` result rows to the
    /// pinned host buffer; the host reads them after synchronising the stream.
    pub(crate) fn copy_results(
        slot: &mut Slot,
        s: Queue<'_>,
        nq: usize,
        k: usize,
    ) -> Result<(), CudaError> {
        if slot.mapped() {
            // The kernels wrote the rows into out_host already.
            return Ok(());
        }
        let rows = DevSlice::of(&slot.out).range("results", 0, nq * (k + 1))?;
        launch::d2h(s, &mut slot.out_host, rows)
    }

    /// Reads query `qi`'s results into `out`, finishing it on the host from its
    /// scores when the device path did not (k > max_k or too many ties). A
    /// query of a batch is named by its position in the slot's staged
    /// queries (`rescore`): its scores may have been overwritten by a later
    /// chunk's, so it is scored again alone (the same canonical scores)
    /// before the host selects; a single query's scores are still in row `qi`.
    pub(crate) fn collect(
        &self,
        slot: &mut Slot,
        qi: usize,
        k: usize,
        rescore: Option<usize>,
        out: &mut Vec<Neighbor>,
    ) -> Result<(), CudaError> {
        out.clear();
        if self.planner.device_k(k) {
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
            Some(staged) => {
                // The scoring alone, into row 0.
                let query = slot.queries_at(self.d, staged, 1)?;
                self.enqueue(slot, Plan::SCORES_ONLY, query, 0, 1, k)?;
                self.select_on_host(slot, 0, k, out)
            }
            None => self.select_on_host(slot, qi, k, out),
        }
    }

    /// The slower exact path: brings query `qi`'s N scores to the host and
    /// selects there with the docs/CONTRACTS.md §3 key.
    pub(crate) fn select_on_host(
        &self,
        slot: &mut Slot,
        qi: usize,
        k: usize,
        out: &mut Vec<Neighbor>,
    ) -> Result<(), CudaError> {
        Self::select_scores_on_host(slot, qi, self.n, k, out)
    }

    /// [`Self::select_on_host`] over query `qi`'s row of `n` scores (rows of
    /// `n` apart in the slot's scores).
    pub(crate) fn select_scores_on_host(
        slot: &mut Slot,
        qi: usize,
        n: usize,
        k: usize,
        out: &mut Vec<Neighbor>,
    ) -> Result<(), CudaError> {
        let row = DevSlice::of(&slot.scores).range("score buffer", qi * n, n)?;
        launch::d2h(
            Queue::Stream(slot.stream.as_inner()),
            &mut slot.scores_host,
            row,
        )?;
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
