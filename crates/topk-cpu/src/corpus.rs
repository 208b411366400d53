//! The corpus as both backends hold it: one contiguous row-major store at
//! its storage type (docs/CONTRACTS.md §14), validated at ingest, with cosine
//! row norms computed once from the stored (widened) values.

use std::borrow::Cow;
use std::ops::Range;

use ndarray::ArrayView2;
use topk_core::{validate, Dtype, Metric, Result, RowStore};

use crate::kernels::Kernels;

/// Values widened per step when a pass over a half-width corpus needs it
/// as `f32` (norms at ingest, the certified path's bound norms).
const WIDEN_VALUES: usize = 1 << 20;

/// Values (whole rows, at least one) gathered per step from a strided view
/// into a half-width store: the buffer follows the corpus, not D alone.
const GATHER_VALUES: usize = 1 << 18;

/// An owned, validated `N × D` corpus under one metric.
#[derive(Debug, Clone)]
pub(crate) struct Corpus {
    store: RowStore,
    n: usize,
    dim: usize,
    metric: Metric,
    /// Canonical norm of every row for cosine; empty for the other metrics.
    norms: Vec<f32>,
}

impl Corpus {
    /// Copies a view of any layout into row-major order, stored as `dtype`.
    pub(crate) fn from_view(
        rows: ArrayView2<'_, f32>,
        metric: Metric,
        dtype: Dtype,
        norms: impl Fn(&[f32], usize) -> Vec<f32>,
    ) -> Result<Self> {
        let (n, dim) = rows.dim();
        let store = if dtype == Dtype::F32 {
            // `from_f32` checks the copy (§4), naming rows in logical order.
            // `iter` walks in logical (row-major) order whatever the strides.
            let data = match rows.as_slice() {
                Some(s) => s.to_vec(),
                None => rows.iter().copied().collect(),
            };
            RowStore::from_f32(data, dim, Dtype::F32)?
        } else {
            // The value rules run on the values as stored (push_rows).
            validate::corpus_shape(n.saturating_mul(dim), dim)?;
            let mut store = RowStore::empty(dim, dtype)?;
            store.reserve(n);
            match rows.as_slice() {
                Some(s) => store.push_rows(s)?,
                None => {
                    // About GATHER_VALUES values a step, at least one row and
                    // never more rows than there are.
                    let step = (GATHER_VALUES / dim.max(1)).clamp(1, n.max(1));
                    let mut buf = Vec::with_capacity(step * dim);
                    for r0 in (0..n).step_by(step) {
                        let r1 = (r0 + step).min(n);
                        buf.clear();
                        buf.extend(rows.slice(ndarray::s![r0..r1, ..]).iter().copied());
                        store.push_rows(&buf)?;
                    }
                }
            }
            store
        };
        Self::from_store(store, metric, norms)
    }

    /// Takes a row-major buffer of `len / dim` rows, stored as `dtype`
    /// (without a copy for `f32`).
    pub(crate) fn from_rowmajor(
        data: Vec<f32>,
        dim: usize,
        metric: Metric,
        dtype: Dtype,
        norms: impl Fn(&[f32], usize) -> Vec<f32>,
    ) -> Result<Self> {
        Self::from_store(RowStore::from_f32(data, dim, dtype)?, metric, norms)
    }

    /// Takes a store whose rows were checked on the way in.
    pub(crate) fn from_store(
        store: RowStore,
        metric: Metric,
        norms: impl Fn(&[f32], usize) -> Vec<f32>,
    ) -> Result<Self> {
        let (n, dim) = (store.len(), store.dim());
        validate::corpus_shape(store.values(), dim)?;
        let mut corpus = Corpus {
            store,
            n,
            dim,
            metric,
            norms: Vec::new(),
        };
        if metric == Metric::Cosine {
            let mut all = Vec::with_capacity(n);
            corpus.for_each_chunk(|_, rows| all.extend(norms(rows, dim)));
            corpus.norms = all;
        }
        debug_assert!(metric != Metric::Cosine || corpus.norms.len() == n);
        Ok(corpus)
    }

    pub(crate) fn len(&self) -> usize {
        self.n
    }

    pub(crate) fn dim(&self) -> usize {
        self.dim
    }

    pub(crate) fn metric(&self) -> Metric {
        self.metric
    }

    /// The stored rows.
    pub(crate) fn store(&self) -> &RowStore {
        &self.store
    }

    /// The corpus borrowed.
    #[inline]
    pub(crate) fn view(&self) -> CorpusRef<'_> {
        CorpusRef {
            store: &self.store,
            metric: self.metric,
            norms: &self.norms,
        }
    }

    /// See [`CorpusRef::for_each_chunk`].
    pub(crate) fn for_each_chunk(&self, f: impl FnMut(usize, &[f32])) {
        self.view().for_each_chunk(0..self.n, f);
    }

    /// Row `i` as `f32` (borrowed for `f32` storage).
    #[inline]
    pub(crate) fn row(&self, i: usize) -> Cow<'_, [f32]> {
        self.store.row(i)
    }

    /// See [`CorpusRef::rows`].
    #[inline]
    pub(crate) fn rows<'a>(&'a self, range: Range<usize>, scratch: &'a mut Vec<f32>) -> &'a [f32] {
        crate::kernels::rows_f32(&self.store, range, scratch)
    }

    /// See [`CorpusRef::norm`].
    #[inline]
    pub(crate) fn norm(&self, i: usize) -> f32 {
        self.view().norm(i)
    }

    /// See [`CorpusRef::norms`].
    #[inline]
    pub(crate) fn norms(&self, range: Range<usize>) -> &[f32] {
        self.view().norms(range)
    }
}

/// A corpus held elsewhere, borrowed: stored rows (docs/CONTRACTS.md §14)
/// and, for cosine, the canonical norm of every row (computed by
/// [`crate::Kernels::norm`] from the stored values, widened). What
/// [`crate::CertifiedRows`] and [`crate::select_certified`] read, so that a
/// corpus that changes (an index's rows) can use the certified path too.
#[derive(Debug, Clone, Copy)]
pub struct CorpusRef<'a> {
    store: &'a RowStore,
    metric: Metric,
    norms: &'a [f32],
}

impl<'a> CorpusRef<'a> {
    /// Borrows `store` under `metric`; `norms` holds one canonical norm per
    /// stored row for cosine and is empty (or ignored) otherwise.
    ///
    /// # Errors
    /// [`crate::CpuError::NormCount`] when cosine norms do not number the
    /// stored rows.
    pub fn new(store: &'a RowStore, metric: Metric, norms: &'a [f32]) -> Result<CorpusRef<'a>> {
        let norms = if metric == Metric::Cosine { norms } else { &[] };
        if metric == Metric::Cosine && norms.len() != store.len() {
            return Err(crate::CpuError::NormCount {
                norms: norms.len(),
                rows: store.len(),
            }
            .into());
        }
        Ok(CorpusRef {
            store,
            metric,
            norms,
        })
    }

    /// Stored rows.
    #[inline]
    pub fn len(&self) -> usize {
        self.store.len()
    }

    /// Whether no row is stored.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.store.len() == 0
    }

    /// Values per row.
    #[inline]
    pub fn dim(&self) -> usize {
        self.store.dim()
    }

    /// The metric.
    #[inline]
    pub fn metric(&self) -> Metric {
        self.metric
    }

    /// Calls `f(first_row, rows)` over rows `range` as `f32`, in order: one
    /// call for `f32` storage, widened chunks of about a million values
    /// otherwise.
    pub(crate) fn for_each_chunk(&self, range: Range<usize>, mut f: impl FnMut(usize, &[f32])) {
        let dim = self.dim();
        if let Some(all) = self.store.as_f32() {
            f(range.start, &all[range.start * dim..range.end * dim]);
            return;
        }
        let step = (WIDEN_VALUES / dim).max(1);
        let mut buf = Vec::new();
        for r0 in range.clone().step_by(step) {
            let r1 = (r0 + step).min(range.end);
            f(r0, crate::kernels::rows_f32(self.store, r0..r1, &mut buf));
        }
    }

    /// Rows `range` as one `f32` block: the stored values for `f32`,
    /// otherwise widened into `scratch`.
    #[inline]
    pub(crate) fn rows<'s>(&self, range: Range<usize>, scratch: &'s mut Vec<f32>) -> &'s [f32]
    where
        'a: 's,
    {
        crate::kernels::rows_f32(self.store, range, scratch)
    }

    /// Norm of row `i` (0 for metrics without norms; never read there).
    #[inline]
    pub(crate) fn norm(&self, i: usize) -> f32 {
        self.norms.get(i).copied().unwrap_or(0.0)
    }

    /// Norms of rows `range` for cosine, `&[]` otherwise.
    #[inline]
    pub(crate) fn norms(&self, range: Range<usize>) -> &'a [f32] {
        if self.norms.is_empty() {
            &[]
        } else {
            &self.norms[range]
        }
    }

    /// The canonical score of row `i` for a query and its cosine norm, by
    /// `kernels` (every path gives the same bits).
    #[inline]
    pub(crate) fn score(&self, kernels: Kernels, query: &[f32], query_norm: f32, i: u32) -> f32 {
        let i = i as usize;
        kernels.score_stored_row(self.metric, query, query_norm, self.store, i, self.norm(i))
    }
}
