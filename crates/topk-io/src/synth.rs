//! Seeded Gaussian rows for the demo, the tests and the benchmark campaign.
//!
//! Row `i` is drawn from its own ChaCha8 stream keyed by `(seed, stream kind)`
//! with stream number `i`, so it depends on `(seed, i, d)` only: the first N
//! rows of a larger corpus are exactly the N-row corpus, rows can be made in
//! parallel in any order, and a benchmark can grow N without regenerating.

use ndarray::Array2;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;
use rayon::prelude::*;
use topk_core::canon_norm;

/// Which family of rows to draw: corpus and queries of one seed never share rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stream {
    /// Corpus rows.
    Corpus,
    /// Query rows.
    Queries,
}

impl Stream {
    fn tag(self) -> u64 {
        match self {
            Stream::Corpus => 0,
            Stream::Queries => 1,
        }
    }
}

/// Fills `out` with row `i` of the given stream: i.i.d. standard normal
/// values, divided by the row's canonical norm when `normalize` is set.
pub fn gaussian_row(stream: Stream, seed: u64, i: usize, normalize: bool, out: &mut [f32]) {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(&stream.tag().to_le_bytes());
    let mut rng = ChaCha8Rng::from_seed(key);
    rng.set_stream(i as u64);
    for v in out.iter_mut() {
        *v = rng.sample(StandardNormal);
    }
    if normalize {
        let norm = canon_norm(out);
        // A zero row cannot be normalised; the chance of drawing one is nil,
        // but dividing would fill it with NaN, which no backend accepts.
        if norm > 0.0 {
            for v in out.iter_mut() {
                *v /= norm;
            }
        }
    }
}

/// `n × d` Gaussian corpus rows (optionally L2-normalised), deterministic in `seed`.
pub fn gaussian_rows(n: usize, d: usize, seed: u64, normalize: bool) -> Array2<f32> {
    rows(Stream::Corpus, n, d, seed, normalize)
}

/// `q × d` Gaussian query rows of the same seed, independent of the corpus rows.
pub fn gaussian_queries(q: usize, d: usize, seed: u64, normalize: bool) -> Array2<f32> {
    rows(Stream::Queries, q, d, seed, normalize)
}

/// Fills `out` with consecutive rows of `d` values of `stream`, row `i`
/// being [`gaussian_row`]`(stream, seed, i, ..)`: the same values as [`rows`],
/// into a buffer the caller allocated (and could fail to allocate gracefully).
pub fn fill_rows(stream: Stream, d: usize, seed: u64, normalize: bool, out: &mut [f32]) {
    if d == 0 {
        return;
    }
    out.par_chunks_mut(d)
        .enumerate()
        .for_each(|(i, row)| gaussian_row(stream, seed, i, normalize, row));
}

/// `n × d` rows of `stream`.
pub fn rows(stream: Stream, n: usize, d: usize, seed: u64, normalize: bool) -> Array2<f32> {
    let mut out = Array2::<f32>::zeros((n, d));
    if d == 0 {
        return out;
    }
    if let Some(flat) = out.as_slice_mut() {
        flat.par_chunks_mut(d)
            .enumerate()
            .for_each(|(i, row)| gaussian_row(stream, seed, i, normalize, row));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_depend_on_seed_and_index_only() {
        let small = gaussian_rows(10, 7, 42, false);
        let large = gaussian_rows(50, 7, 42, false);
        for (a, b) in small.iter().zip(large.iter()) {
            assert_eq!(a.to_bits(), b.to_bits());
        }
        let mut row = vec![0.0; 7];
        gaussian_row(Stream::Corpus, 42, 33, false, &mut row);
        assert_eq!(row.as_slice(), large.row(33).as_slice().unwrap());
        assert_ne!(gaussian_rows(10, 7, 43, false), small);
        assert_ne!(gaussian_queries(10, 7, 42, false), small);
    }

    #[test]
    fn values_look_standard_normal() {
        let a = gaussian_rows(200, 64, 1, false);
        let n = a.len() as f64;
        let mean = a.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
        let var = a
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / n;
        // 12,800 draws: the sample mean's s.d. is ~0.009, the variance's ~0.0125.
        assert!(mean.abs() < 0.05, "mean {mean}");
        assert!((var - 1.0).abs() < 0.07, "variance {var}");
    }

    #[test]
    fn normalised_rows_have_unit_norm() {
        let a = gaussian_rows(20, 128, 9, true);
        for row in a.outer_iter() {
            let norm = canon_norm(row.as_slice().unwrap());
            assert!((norm - 1.0).abs() < 1e-5, "norm {norm}");
        }
    }

    #[test]
    fn empty_shapes_are_fine() {
        assert_eq!(gaussian_rows(0, 5, 1, true).dim(), (0, 5));
        assert_eq!(gaussian_rows(5, 0, 1, true).dim(), (5, 0));
    }
}
