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

/// Forwards every method through a pointer type, so `&R`, `Box<R>` and
/// `Arc<R>` are retrievers too and keep any overrides of the pointee.
macro_rules! forward_retriever {
    ($($ptr:ty),*) => {$(
        impl<R: Retriever + ?Sized> Retriever for $ptr {
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
            fn search_batch(
                &self,
                queries: ArrayView2<'_, f32>,
                k: usize,
            ) -> Result<Vec<Vec<Neighbor>>> {
                (**self).search_batch(queries, k)
            }
        }
    )*};
}

forward_retriever!(&R, Box<R>, std::sync::Arc<R>);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::select::TopK;
    use crate::Error;
    use ndarray::{array, Array2};

    /// The smallest possible backend, to exercise the trait's defaults.
    struct Brute {
        rows: Array2<f32>,
    }

    impl Retriever for Brute {
        fn backend(&self) -> &'static str {
            "brute"
        }
        fn len(&self) -> usize {
            self.rows.nrows()
        }
        fn dim(&self) -> usize {
            self.rows.ncols()
        }
        fn metric(&self) -> Metric {
            Metric::Dot
        }
        fn search_into(&self, query: &[f32], k: usize, out: &mut Vec<Neighbor>) -> Result<()> {
            validate::query(query, self.dim())?;
            let k = validate::k(k, self.len())?;
            let mut sel = TopK::new(k);
            let scores: Vec<f32> = self
                .rows
                .outer_iter()
                .map(|r| Metric::Dot.score_scalar(query, r.as_slice().unwrap_or(&[])))
                .collect();
            for (i, &s) in scores.iter().enumerate() {
                sel.push(i as u32, s);
            }
            sel.drain_into(out, |i| scores[i as usize]);
            Ok(())
        }
    }

    fn generic_best<R: Retriever>(r: &R, q: &[f32]) -> u32 {
        r.search(q, 1).unwrap()[0].index
    }

    #[test]
    fn generic_and_dyn_callers_see_the_same_answers() {
        let b = Brute {
            rows: array![[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]],
        };
        let d: &dyn Retriever = &b;
        let boxed: Box<dyn Retriever> = Box::new(Brute {
            rows: b.rows.clone(),
        });
        assert_eq!(generic_best(&b, &[0.0, 2.0]), 1);
        assert_eq!(generic_best(&d, &[0.0, 2.0]), 1);
        assert_eq!(generic_best(&boxed, &[0.0, 2.0]), 1);
        assert_eq!(d.search(&[0.0, 1.0], 10).unwrap().len(), 3);
    }

    #[test]
    fn batch_default_validates_before_searching() {
        let b = Brute {
            rows: array![[1.0, 0.0], [0.0, 1.0]],
        };
        let qs = array![[1.0, 0.0], [0.0, 1.0]];
        let res = b.search_batch(qs.view(), 1).unwrap();
        assert_eq!((res[0][0].index, res[1][0].index), (0, 1));
        // A transposed (non-contiguous) batch answers by logical rows.
        let t = array![[1.0, 0.0], [0.0, 1.0]];
        assert_eq!(b.search_batch(t.t(), 1).unwrap()[1][0].index, 1);
        assert!(matches!(b.search_batch(qs.view(), 0), Err(Error::ZeroK)));
        let wide = Array2::<f32>::zeros((2, 3));
        assert!(matches!(
            b.search_batch(wide.view(), 1),
            Err(Error::DimensionMismatch {
                expected: 2,
                got: 3,
                ..
            })
        ));
        let mut bad = qs.clone();
        bad[[1, 1]] = f32::NAN;
        assert!(matches!(
            b.search_batch(bad.view(), 1),
            Err(Error::NonFinite { .. })
        ));
    }
}
