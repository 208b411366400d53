//! The corpus as the index holds it, and the canonical scores on it.
//!
//! Rows are stored row-major in one allocation (the layout the GPU path
//! uploads unchanged). Scores follow docs/CONTRACTS.md §2 exactly, so a neighbour's
//! score here has the same bits as the exact backends give for that row:
//! that is what makes recall measurable against the oracle and lets the GPU
//! distance path reproduce the CPU graph.

use rayon::prelude::*;
use topk_core::{validate, Metric};
use topk_cpu::Kernels;

/// Rows per part of [`check_corpus`].
const CHECK_PART_ROWS: usize = 4096;

/// `validate::corpus` on the rayon pool, in parts of whole rows: the same
/// verdict and the same error. As the sequential check does, a non-finite
/// value anywhere is reported first (the first one); otherwise the first
/// row that breaks the overflow rule. Returns N.
pub(crate) fn check_corpus(data: &[f32], dim: usize) -> topk_core::Result<usize> {
    let n = validate::corpus_shape(data.len(), dim)?;
    let mut errors: Vec<topk_core::Error> = data
        .par_chunks(CHECK_PART_ROWS * dim)
        .enumerate()
        .filter_map(|(i, part)| validate::corpus_values_from(part, dim, i * CHECK_PART_ROWS).err())
        .collect();
    if errors.is_empty() {
        return Ok(n);
    }
    let first = errors
        .iter()
        .position(|e| matches!(e, topk_core::Error::NonFinite { .. }))
        .unwrap_or(0);
    Err(errors.swap_remove(first))
}

/// The corpus rows, their norms where the metric needs them, and the metric.
#[derive(Debug, Clone)]
pub(crate) struct Vectors {
    dim: usize,
    metric: Metric,
    data: Vec<f32>,
    /// Row norms, computed once at ingest; empty unless the metric is cosine.
    norms: Vec<f32>,
    kern: Kernels,
}

/// A query prepared for scoring: the values and, for cosine, its norm.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Query<'q> {
    pub(crate) values: &'q [f32],
    pub(crate) norm: f32,
}

impl Vectors {
    /// Takes ownership of validated row-major data.
    pub(crate) fn new(data: Vec<f32>, dim: usize, metric: Metric) -> Self {
        // The fastest path this CPU runs; every path gives the canonical bits,
        // so the choice changes speed only.
        let kern = Kernels::best();
        let norms = if metric == Metric::Cosine {
            data.par_chunks_exact(dim).map(|r| kern.norm(r)).collect()
        } else {
            Vec::new()
        };
        Vectors {
            dim,
            metric,
            data,
            norms,
            kern,
        }
    }

    pub(crate) fn dim(&self) -> usize {
        self.dim
    }

    pub(crate) fn len(&self) -> usize {
        self.data.len() / self.dim
    }

    pub(crate) fn metric(&self) -> Metric {
        self.metric
    }

    /// All rows, row-major.
    pub(crate) fn data(&self) -> &[f32] {
        &self.data
    }

    /// Appends a validated row.
    pub(crate) fn push(&mut self, row: &[f32]) {
        self.data.extend_from_slice(row);
        if self.metric == Metric::Cosine {
            self.norms.push(self.kern.norm(row));
        }
    }

    /// Overwrites row `i` with a validated row.
    pub(crate) fn replace(&mut self, i: u32, row: &[f32]) {
        let start = i as usize * self.dim;
        self.data[start..start + self.dim].copy_from_slice(row);
        if self.metric == Metric::Cosine {
            self.norms[i as usize] = self.kern.norm(row);
        }
    }

    /// Row `i`.
    #[inline]
    pub(crate) fn row(&self, i: u32) -> &[f32] {
        let start = i as usize * self.dim;
        &self.data[start..start + self.dim]
    }

    /// Prepares a query (its norm is needed only for cosine).
    pub(crate) fn query<'q>(&self, values: &'q [f32]) -> Query<'q> {
        let norm = if self.metric == Metric::Cosine {
            self.kern.norm(values)
        } else {
            0.0
        };
        Query { values, norm }
    }

    /// Row `i` as a query (used while inserting it).
    pub(crate) fn row_query(&self, i: u32) -> Query<'_> {
        let norm = if self.metric == Metric::Cosine {
            self.norms[i as usize]
        } else {
            0.0
        };
        Query {
            values: self.row(i),
            norm,
        }
    }

    /// The canonical score of row `i` for a query.
    #[inline]
    pub(crate) fn score(&self, q: Query<'_>, i: u32) -> f32 {
        let row_norm = if self.metric == Metric::Cosine {
            self.norms[i as usize]
        } else {
            0.0
        };
        self.kern
            .score_row(self.metric, q.values, q.norm, self.row(i), row_norm)
    }

    /// The score between two rows (symmetric for every metric: IEEE negation
    /// is exact and both multiply-add operands commute).
    #[inline]
    pub(crate) fn pair(&self, a: u32, b: u32) -> f32 {
        self.score(self.row_query(a), b)
    }

    /// Scores `ids` for a query into `out[..ids.len()]`, prefetching the next
    /// row while scoring the current one.
    #[inline]
    pub(crate) fn score_ids(&self, q: Query<'_>, ids: &[u32], out: &mut [f32]) {
        for (j, (&id, o)) in ids.iter().zip(out.iter_mut()).enumerate() {
            if let Some(&next) = ids.get(j + 1) {
                self.prefetch(next);
            }
            *o = self.score(q, id);
        }
    }

    /// Hints the cache to load the start of row `i`.
    #[inline]
    pub(crate) fn prefetch(&self, i: u32) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let start = i as usize * self.dim;
            let row = self.data[start..start + self.dim].as_ptr();
            // Two lines cover the first 32 values; the hardware prefetcher
            // follows the sequential reads of the rest of the row.
            let lines = self.dim.min(32).div_ceil(16);
            for l in 0..lines {
                // SAFETY: a prefetch is a hint and never faults; the address is
                // inside row `i` (l * 16 < dim values from its start).
                unsafe { _mm_prefetch::<_MM_HINT_T0>(row.add(l * 16).cast::<i8>()) };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = i;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The verdict of both checks as comparable text.
    fn both(data: &[f32], dim: usize) -> (String, String) {
        let show = |r: topk_core::Result<usize>| match r {
            Ok(n) => format!("ok {n}"),
            Err(e) => e.to_string(),
        };
        (
            show(check_corpus(data, dim)),
            show(validate::corpus(data, dim)),
        )
    }

    proptest! {
        /// Bad values planted anywhere across several parts (NaN, ±Inf,
        /// rows past the overflow rule), in any order: the parallel check
        /// gives the sequential check's error, word for word.
        #[test]
        fn parallel_check_is_the_sequential_check(
            dim in 1_usize..6,
            parts in 1_usize..4,
            planted in proptest::collection::vec((0_usize..4 * CHECK_PART_ROWS, 0_u8..4), 0..4),
        ) {
            let n = parts * CHECK_PART_ROWS - 3;
            let mut data: Vec<f32> = (0..n * dim).map(|i| (i % 7) as f32 - 3.0).collect();
            for &(at, kind) in &planted {
                let row = at % n;
                let value = match kind {
                    0 => f32::NAN,
                    1 => f32::INFINITY,
                    2 => f32::NEG_INFINITY,
                    _ => 3.0e38,
                };
                data[row * dim + at % dim] = value;
            }
            let (par, seq) = both(&data, dim);
            prop_assert_eq!(par, seq);
        }
    }

    #[test]
    fn shape_errors_are_the_sequential_ones() {
        for (len, dim) in [(0, 4), (7, 4), (4, 0)] {
            let data = vec![1.0_f32; len];
            let (par, seq) = both(&data, dim);
            assert_eq!(par, seq);
            assert!(!par.starts_with("ok"), "{len} values of D = {dim}: {par}");
        }
    }
}
