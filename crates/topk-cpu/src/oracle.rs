//! The obviously-correct exact backend, the reference every other backend is
//! tested against: score every row with topk-core's scalar canonical score,
//! then select with the one comparator.

use ndarray::ArrayView2;
use topk_core::{
    canon_dot, canon_norm, canon_sqdist, cmp_rank, cosine_from_parts, validate, Dtype, Metric,
    Neighbor, Result, Retriever, RowStore,
};

use crate::corpus::Corpus;

/// Scalar exact search: no SIMD, no threads, no cleverness.
#[derive(Debug, Clone)]
pub struct Oracle {
    corpus: Corpus,
}

fn scalar_norms(data: &[f32], dim: usize) -> Vec<f32> {
    data.chunks_exact(dim).map(canon_norm).collect()
}

impl Oracle {
    /// Copies an `N × D` corpus (any layout) and validates it (docs/CONTRACTS.md §4).
    pub fn new(corpus: ArrayView2<'_, f32>, metric: Metric) -> Result<Oracle> {
        Oracle::with_dtype(corpus, metric, Dtype::F32)
    }

    /// Copies an `N × D` corpus (any layout), stored as `dtype`
    /// (docs/CONTRACTS.md §14).
    pub fn with_dtype(corpus: ArrayView2<'_, f32>, metric: Metric, dtype: Dtype) -> Result<Oracle> {
        Ok(Oracle {
            corpus: Corpus::from_view(corpus, metric, dtype, scalar_norms)?,
        })
    }

    /// Takes a row-major buffer of `data.len() / dim` rows.
    pub fn from_rowmajor(data: Vec<f32>, dim: usize, metric: Metric) -> Result<Oracle> {
        Ok(Oracle {
            corpus: Corpus::from_rowmajor(data, dim, metric, Dtype::F32, scalar_norms)?,
        })
    }

    /// Takes stored rows of any type. They are checked by the input rules
    /// (docs/CONTRACTS.md §4) here, in one pass: `RowStore`'s unchecked
    /// mutators (`push_checked`, `extend_le_bytes`) can hold any value.
    pub fn from_store(store: RowStore, metric: Metric) -> Result<Oracle> {
        store.check()?;
        Ok(Oracle {
            corpus: Corpus::from_store(store, metric, scalar_norms)?,
        })
    }

    /// How the corpus stores its values.
    pub fn dtype(&self) -> Dtype {
        self.corpus.store().dtype()
    }

    /// The score of row `i`, exactly [`Metric::score_scalar`] with the row's
    /// norm computed at ingest.
    fn score(&self, query: &[f32], query_norm: f32, i: usize) -> f32 {
        let row = self.corpus.row(i);
        match self.corpus.metric() {
            Metric::Dot => canon_dot(query, &row),
            Metric::Cosine => {
                cosine_from_parts(canon_dot(query, &row), query_norm, self.corpus.norm(i))
            }
            Metric::L2 => -canon_sqdist(query, &row),
        }
    }
}

impl Retriever for Oracle {
    fn backend(&self) -> &'static str {
        "oracle"
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
        let query_norm = canon_norm(query);
        out.clear();
        out.extend(
            (0..self.len()).map(|i| Neighbor::new(i as u32, self.score(query, query_norm, i))),
        );
        if k < out.len() {
            out.select_nth_unstable_by(k - 1, cmp_rank);
            out.truncate(k);
        }
        out.sort_unstable_by(cmp_rank);
        Ok(())
    }
}
