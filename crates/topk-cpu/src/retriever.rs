//! `CpuRetriever`, the fast exact backend: rayon over row blocks, SIMD
//! canonical scores, per-block bounded selection merged with the one
//! comparator. The batch path lives in [`crate::batch`]; a single query over
//! [`crate::certified::MIN_INT8_VALUES`] corpus values or more takes the
//! certified int8 path of [`crate::certified`] where the CPU runs it and
//! its row state exists (a quarter of the bytes read, and canonical scores
//! for the rows its bounds keep; see [`CpuRetriever::prepare_certified`]).

use std::sync::{Arc, OnceLock};

use ndarray::{aview1, ArrayView2, Axis};
use rayon::prelude::*;
use topk_core::{validate, Dtype, Metric, Neighbor, Result, Retriever, RowStore};

use crate::certified::{self, BatchGemm, CertifiedRows};
use crate::corpus::Corpus;
use crate::error::CpuError;
use crate::kernels::Kernels;
use crate::select::Selector;

/// Rows scored per kernel call: their scores sit in a stack buffer, so a scan
/// allocates nothing per row.
pub(crate) const SCORE_BLOCK: usize = 64;
/// Values (about 1 MiB) per parallel task of a single-query scan: large enough
/// that scheduling costs vanish, small enough to balance two to many cores.
const TASK_VALUES: usize = 1 << 18;

/// Exact top-K on the CPU, bit-identical to [`crate::Oracle`].
#[derive(Debug, Clone)]
pub struct CpuRetriever {
    pub(crate) corpus: Corpus,
    pub(crate) kernels: Kernels,
    /// The approximate product of certified batches; `None` picks one per
    /// batch ([`BatchGemm::for_dim`]).
    pub(crate) batch_gemm: Option<BatchGemm>,
    pool: Option<Arc<rayon::ThreadPool>>,
    /// The certified path's row state for [`CpuRetriever::batch_gemm`]
    /// (upward norms, int8 codes), built by the first batch that takes the
    /// path or by [`CpuRetriever::prepare_certified`].
    certified: OnceLock<CertifiedRows>,
}

fn norms_with(kernels: Kernels) -> impl Fn(&[f32], usize) -> Vec<f32> {
    move |data, dim| {
        data.par_chunks(dim * SCORE_BLOCK)
            .flat_map_iter(|block| block.chunks_exact(dim).map(move |r| kernels.norm(r)))
            .collect()
    }
}

impl CpuRetriever {
    /// Copies an `N × D` corpus (any layout) and validates it (docs/CONTRACTS.md §4).
    pub fn new(corpus: ArrayView2<'_, f32>, metric: Metric) -> Result<CpuRetriever> {
        CpuRetriever::with_dtype(corpus, metric, Dtype::F32)
    }

    /// Copies an `N × D` corpus (any layout), stored as `dtype`
    /// (docs/CONTRACTS.md §14: each value rounded once to the nearest of the
    /// type; searches are exact over the stored values).
    pub fn with_dtype(
        corpus: ArrayView2<'_, f32>,
        metric: Metric,
        dtype: Dtype,
    ) -> Result<CpuRetriever> {
        let kernels = Kernels::best();
        Ok(CpuRetriever::assemble(
            Corpus::from_view(corpus, metric, dtype, norms_with(kernels))?,
            kernels,
        ))
    }

    /// Takes a row-major buffer of `data.len() / dim` rows without copying it.
    pub fn from_rowmajor(data: Vec<f32>, dim: usize, metric: Metric) -> Result<CpuRetriever> {
        let kernels = Kernels::best();
        Ok(CpuRetriever::assemble(
            Corpus::from_rowmajor(data, dim, metric, Dtype::F32, norms_with(kernels))?,
            kernels,
        ))
    }

    /// Takes stored rows of any type. They are checked by the input rules
    /// (docs/CONTRACTS.md §4) here, in one pass: `RowStore`'s unchecked
    /// mutators (`push_checked`, `extend_le_bytes`) can hold any value.
    pub fn from_store(store: RowStore, metric: Metric) -> Result<CpuRetriever> {
        store.check()?;
        let kernels = Kernels::best();
        Ok(CpuRetriever::assemble(
            Corpus::from_store(store, metric, norms_with(kernels))?,
            kernels,
        ))
    }

    fn assemble(corpus: Corpus, kernels: Kernels) -> CpuRetriever {
        CpuRetriever {
            corpus,
            kernels,
            batch_gemm: None,
            pool: None,
            certified: OnceLock::new(),
        }
    }

    /// Uses the given kernels instead of the fastest ones (to test or compare
    /// a path). Results are the same bytes on every path.
    pub fn with_kernels(mut self, kernels: Kernels) -> CpuRetriever {
        self.kernels = kernels;
        self
    }

    /// Uses the given approximate product for every certified batch instead
    /// of the one [`BatchGemm::for_dim`] picks, or
    /// [`CpuError::BatchGemmUnavailable`] when this CPU cannot run it.
    /// Results are the same bytes with every product.
    pub fn with_batch_gemm(mut self, gemm: BatchGemm) -> Result<CpuRetriever> {
        self.batch_gemm = Some(gemm.check()?);
        // A state built for the other product no longer fits.
        self.certified = OnceLock::new();
        Ok(self)
    }

    /// The approximate product of this retriever's certified batches: the
    /// forced one, or the one picked for its dimension.
    pub fn batch_gemm(&self) -> BatchGemm {
        self.batch_gemm
            .unwrap_or_else(|| BatchGemm::for_dim(self.dim()))
    }

    /// Runs searches on a dedicated pool of `threads` threads instead of
    /// rayon's global pool.
    pub fn with_threads(mut self, threads: usize) -> Result<CpuRetriever> {
        if threads == 0 {
            return Err(CpuError::ZeroThreads { threads }.into());
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("topk-cpu-{i}"))
            .build()
            .map_err(|source| CpuError::ThreadPool { threads, source })?;
        self.pool = Some(Arc::new(pool));
        Ok(self)
    }

    /// The kernels searches run on.
    pub fn kernels(&self) -> Kernels {
        self.kernels
    }

    /// Threads a search may use.
    pub fn threads(&self) -> usize {
        self.pool
            .as_ref()
            .map_or_else(rayon::current_num_threads, |p| p.current_num_threads())
    }

    /// The stored rows (their type, their values).
    pub fn store(&self) -> &RowStore {
        self.corpus.store()
    }

    /// How the corpus stores its values.
    pub fn dtype(&self) -> Dtype {
        self.corpus.store().dtype()
    }

    /// The certified path's row state (built on first use).
    pub(crate) fn certified_rows(&self) -> &CertifiedRows {
        self.certified.get_or_init(|| {
            self.install(|| CertifiedRows::of(self.corpus.view(), self.batch_gemm()))
        })
    }

    /// Builds the certified path's row state now: the rows' upward norms
    /// and, where the batch product is int8, the int8 codes (`N × ⌈D/4⌉·4`
    /// bytes beside the rows, a quarter of an f32 corpus). The first batch
    /// of [`certified::MIN_QUERIES`] or more queries builds it anyway;
    /// single queries and smaller batches use it once it exists (over
    /// [`certified::MIN_INT8_VALUES`] values) but never build it, so that
    /// memory grows only where asked for or where batches run
    /// (docs/CONTRACTS.md §2.1). The answers are the same bytes either way.
    pub fn prepare_certified(&self) {
        self.certified_rows();
    }

    /// Whether `queries` queries for the top `k` take the certified path:
    /// where it pays, and for fewer than [`certified::MIN_QUERIES`] queries
    /// only once the row state exists.
    pub(crate) fn takes_certified(&self, queries: usize, k: usize) -> bool {
        certified::applies(queries, self.len(), self.dim(), k, self.batch_gemm())
            && (queries >= certified::MIN_QUERIES || self.certified.get().is_some())
    }

    /// Runs `f` on this retriever's pool.
    pub(crate) fn install<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        match &self.pool {
            Some(pool) => pool.install(f),
            None => f(),
        }
    }

    /// The query's canonical norm for cosine (unused, so not computed, otherwise).
    pub(crate) fn query_norm(&self, query: &[f32]) -> f32 {
        if self.corpus.metric() == Metric::Cosine {
            self.kernels.norm(query)
        } else {
            0.0
        }
    }

    /// The score of row `i`, for the exact bits of the selected results.
    pub(crate) fn score_one(&self, query: &[f32], query_norm: f32, i: u32) -> f32 {
        self.corpus.view().score(self.kernels, query, query_norm, i)
    }

    /// Offers rows `range` to `sel`.
    fn scan(
        &self,
        query: &[f32],
        query_norm: f32,
        range: std::ops::Range<usize>,
        sel: &mut Selector,
    ) {
        let mut scores = [0.0_f32; SCORE_BLOCK];
        let mut wide = Vec::new();
        let mut start = range.start;
        while start < range.end {
            let end = (start + SCORE_BLOCK).min(range.end);
            let scores = &mut scores[..end - start];
            self.kernels.score_stored(
                self.corpus.metric(),
                query,
                query_norm,
                self.corpus.store(),
                start..end,
                self.corpus.norms(start..end),
                scores,
                &mut wide,
            );
            for (i, &s) in (start..end).zip(scores.iter()) {
                sel.offer(i as u32, s);
            }
            start = end;
        }
    }

    /// Selects the best `k` rows for one validated query.
    pub(crate) fn select(&self, query: &[f32], query_norm: f32, k: usize) -> Selector {
        let n = self.len();
        let task_rows = (TASK_VALUES / self.dim()).max(SCORE_BLOCK);
        if n <= task_rows {
            let mut sel = Selector::new(k);
            self.scan(query, query_norm, 0..n, &mut sel);
            return sel;
        }
        self.install(|| {
            let tasks = n.div_ceil(task_rows);
            // Few, long runs of tasks per thread: every fold piece starts with
            // an empty selector that must fill up again.
            let min_len = (tasks / (4 * rayon::current_num_threads())).max(1);
            (0..tasks)
                .into_par_iter()
                .with_min_len(min_len)
                .fold(
                    || Selector::new(k),
                    |mut sel, t| {
                        let range = t * task_rows..((t + 1) * task_rows).min(n);
                        self.scan(query, query_norm, range, &mut sel);
                        sel
                    },
                )
                .reduce(|| Selector::new(k), Selector::merge)
        })
    }
}

impl Retriever for CpuRetriever {
    fn backend(&self) -> &'static str {
        "cpu"
    }

    fn len(&self) -> usize {
        self.corpus.len()
    }

    fn dim(&self) -> usize {
        self.corpus.dim()
    }

    fn metric(&self) -> Metric {
        self.corpus.metric()
    }

    fn search_into(&self, query: &[f32], k: usize, out: &mut Vec<Neighbor>) -> Result<()> {
        validate::query(query, self.dim())?;
        let k = validate::k(k, self.len())?;
        let query_norm = self.query_norm(query);
        let sel = if self.takes_certified(1, k) {
            let batch = self.prepare_batch(aview1(query).insert_axis(Axis(0)));
            self.select_certified(&batch, k).0.pop()
        } else {
            None
        };
        sel.unwrap_or_else(|| self.select(query, query_norm, k))
            .finish(out, |i| self.score_one(query, query_norm, i));
        Ok(())
    }

    fn search_batch(&self, queries: ArrayView2<'_, f32>, k: usize) -> Result<Vec<Vec<Neighbor>>> {
        let mut out = Vec::new();
        self.search_batch_into(queries, k, &mut out)?;
        Ok(out)
    }
}
