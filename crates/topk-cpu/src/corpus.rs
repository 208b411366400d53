//! The corpus as both backends hold it: one contiguous row-major buffer,
//! validated at ingest, with cosine row norms computed once.

use ndarray::ArrayView2;
use topk_core::{validate, Metric, Result};

/// An owned, validated `N × D` corpus under one metric.
#[derive(Debug, Clone)]
pub(crate) struct Corpus {
    data: Vec<f32>,
    n: usize,
    dim: usize,
    metric: Metric,
    /// Canonical norm of every row for cosine; empty for the other metrics.
    norms: Vec<f32>,
}

impl Corpus {
    /// Copies a view of any layout into row-major order.
    pub(crate) fn from_view(
        rows: ArrayView2<'_, f32>,
        metric: Metric,
        norms: impl FnOnce(&[f32], usize) -> Vec<f32>,
    ) -> Result<Self> {
        let (n, dim) = validate::corpus_view(rows)?;
        // `iter` walks in logical (row-major) order whatever the strides.
        let data = match rows.as_slice() {
            Some(s) => s.to_vec(),
            None => rows.iter().copied().collect(),
        };
        Ok(Self::assemble(data, n, dim, metric, norms))
    }

    /// Takes a row-major buffer of `len / dim` rows.
    pub(crate) fn from_rowmajor(
        data: Vec<f32>,
        dim: usize,
        metric: Metric,
        norms: impl FnOnce(&[f32], usize) -> Vec<f32>,
    ) -> Result<Self> {
        let n = validate::corpus(&data, dim)?;
        Ok(Self::assemble(data, n, dim, metric, norms))
    }

    fn assemble(
        data: Vec<f32>,
        n: usize,
        dim: usize,
        metric: Metric,
        norms: impl FnOnce(&[f32], usize) -> Vec<f32>,
    ) -> Self {
        let norms = if metric == Metric::Cosine {
            norms(&data, dim)
        } else {
            Vec::new()
        };
        debug_assert!(metric != Metric::Cosine || norms.len() == n);
        Corpus {
            data,
            n,
            dim,
            metric,
            norms,
        }
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

    /// The whole row-major buffer.
    pub(crate) fn data(&self) -> &[f32] {
        &self.data
    }

    /// Row `i`.
    #[inline]
    pub(crate) fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.dim..(i + 1) * self.dim]
    }

    /// Rows `range` as one block.
    #[inline]
    pub(crate) fn rows(&self, range: std::ops::Range<usize>) -> &[f32] {
        &self.data[range.start * self.dim..range.end * self.dim]
    }

    /// Norm of row `i` (0 for metrics without norms; never read there).
    #[inline]
    pub(crate) fn norm(&self, i: usize) -> f32 {
        self.norms.get(i).copied().unwrap_or(0.0)
    }

    /// Norms of rows `range` for cosine, `&[]` otherwise.
    #[inline]
    pub(crate) fn norms(&self, range: std::ops::Range<usize>) -> &[f32] {
        if self.norms.is_empty() {
            &[]
        } else {
            &self.norms[range]
        }
    }
}
