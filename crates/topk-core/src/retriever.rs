//! The trait generic code is written against.
//!
//! A retriever owns a corpus of `len()` rows of `dim()` values under one
//! [`Metric`] and answers "the `k` best rows for this query" with
//! `min(k, len())` neighbours ordered by [`crate::cmp_rank`]. Backends differ in
//! where the corpus lives (host memory, GPU memory, a graph index) and
//! exact backends must return identical bytes.
//!
//! One method is required, [`Retriever::search_into`], which fills a
//! caller-owned buffer so that a serving loop allocates nothing per query;
//! everything else has a default a backend may override with something faster
//! (a GPU batches queries, the CPU reuses cached row blocks across them).

use ndarray::ArrayView2;

use crate::error::Result;
use crate::metric::Metric;
use crate::order::Neighbor;
use crate::validate;

/// An index over a fixed corpus that returns the best `k` rows for a query.
///
/// Object safe: hold it as `&dyn Retriever` or `Box<dyn Retriever>`, or
/// generically as `R: Retriever`.
pub trait Retriever: Send + Sync {
    /// A short name of the backend ("cpu", "oracle", "cuda", "hnsw").
    fn backend(&self) -> &'static str;

    /// Number of corpus rows, N.
    fn len(&self) -> usize;

    /// Values per row, D.
    fn dim(&self) -> usize;

    /// The metric scores are computed with.
    fn metric(&self) -> Metric;

    /// Always false: an empty corpus is rejected at construction.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes the `min(k, N)` best neighbours of `query` into `out`, best first,
    /// replacing its contents (its capacity is reused).
    ///
    /// Errors: `k = 0`, a query of the wrong length, a non-finite query value,
    /// or a backend failure.
    fn search_into(&self, query: &[f32], k: usize, out: &mut Vec<Neighbor>) -> Result<()>;

    /// The `min(k, N)` best neighbours of `query`, best first.
    fn search(&self, query: &[f32], k: usize) -> Result<Vec<Neighbor>> {
        let mut out = Vec::with_capacity(k.min(self.len()));
        self.search_into(query, k, &mut out)?;
        Ok(out)
    }

    /// Searches every row of a `Q × D` batch (any memory layout); result `i`
    /// answers query `i`. The whole batch is validated before any search runs.
    fn search_batch(&self, queries: ArrayView2<'_, f32>, k: usize) -> Result<Vec<Vec<Neighbor>>> {
        validate::queries(queries, self.dim())?;
        validate::k(k, self.len())?;
        let mut scratch = Vec::new();
        queries
            .outer_iter()
            .map(|q| {
                let q = q
                    .as_slice()
                    .map(std::borrow::Cow::Borrowed)
                    .unwrap_or_else(|| {
                        std::borrow::Cow::Owned(q.iter().copied().collect::<Vec<f32>>())
                    });
                self.search_into(&q, k, &mut scratch)?;
                Ok(scratch.clone())
            })
            .collect()
    }
}

impl<R: Retriever + ?Sized> Retriever for &R {
    fn backend(&self) -> &'static str {
        (**self).backend()
    }
    fn len(&self) -> usize {
        (**self).len()
    }
    fn dim(&self) -> usize {
        (**self).dim()
    }
    fn metric(&self) -> Metric {
        (**self).metric()
    }
    fn search_into(&self, query: &[f32], k: usize, out: &mut Vec<Neighbor>) -> Result<()> {
        (**self).search_into(query, k, out)
    }
    fn search(&self, query: &[f32], k: usize) -> Result<Vec<Neighbor>> {
        (**self).search(query, k)
    }
    fn search_batch(&self, queries: ArrayView2<'_, f32>, k: usize) -> Result<Vec<Vec<Neighbor>>> {
        (**self).search_batch(queries, k)
    }
}

impl<R: Retriever + ?Sized> Retriever for Box<R> {
    fn backend(&self) -> &'static str {
        (**self).backend()
    }
    fn len(&self) -> usize {
        (**self).len()
    }
    fn dim(&self) -> usize {
        (**self).dim()
    }
    fn metric(&self) -> Metric {
        (**self).metric()
    }
    fn search_into(&self, query: &[f32], k: usize, out: &mut Vec<Neighbor>) -> Result<()> {
        (**self).search_into(query, k, out)
    }
    fn search(&self, query: &[f32], k: usize) -> Result<Vec<Neighbor>> {
        (**self).search(query, k)
    }
    fn search_batch(&self, queries: ArrayView2<'_, f32>, k: usize) -> Result<Vec<Vec<Neighbor>>> {
        (**self).search_batch(queries, k)
    }
}
