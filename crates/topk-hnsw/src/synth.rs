//! Seeded synthetic corpora for tests and the benchmark binaries: Gaussian
//! clusters, the usual stand-in for embedding data with local structure.
//!
//! Built on the crate's own [`SplitMix64`], so the same seed yields the same
//! rows on every platform and every dependency version.

use crate::params::SplitMix64;

/// A standard-normal generator (Box–Muller on [`SplitMix64`]).
#[derive(Debug, Clone)]
pub struct Normal {
    rng: SplitMix64,
    spare: Option<f64>,
}

impl Normal {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Normal {
            rng: SplitMix64::new(seed),
            spare: None,
        }
    }

    /// The next standard-normal value.
    pub fn sample(&mut self) -> f32 {
        if let Some(s) = self.spare.take() {
            return s as f32;
        }
        let u1 = self.rng.next_open01();
        let u2 = self.rng.next_open01();
        let r = (-2.0 * u1.ln()).sqrt();
        let t = std::f64::consts::TAU * u2;
        self.spare = Some(r * t.sin());
        (r * t.cos()) as f32
    }

    /// A uniform index below `n` (`n ≥ 1`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.rng.next_u64() % n as u64) as usize
    }
}

/// `n` rows of `dim` values around `clusters` centres: each centre is drawn
/// from N(0, 1) per coordinate, each row is a uniformly chosen centre plus
/// N(0, `spread`²) noise. Row-major.
pub fn gaussian_clusters(
    n: usize,
    dim: usize,
    clusters: usize,
    spread: f32,
    seed: u64,
) -> Vec<f32> {
    let mut g = Normal::new(seed);
    let clusters = clusters.max(1);
    let centres: Vec<f32> = (0..clusters * dim).map(|_| g.sample()).collect();
    let mut out = Vec::with_capacity(n * dim);
    for _ in 0..n {
        let c = g.below(clusters);
        let centre = &centres[c * dim..(c + 1) * dim];
        out.extend(centre.iter().map(|&v| v + spread * g.sample()));
    }
    out
}

/// Queries drawn like [`gaussian_clusters`] rows (same centres for the same
/// `seed`), from an independent noise stream, so they are not corpus rows.
pub fn cluster_queries(q: usize, dim: usize, clusters: usize, spread: f32, seed: u64) -> Vec<f32> {
    let mut g = Normal::new(seed);
    let clusters = clusters.max(1);
    let centres: Vec<f32> = (0..clusters * dim).map(|_| g.sample()).collect();
    let mut noise = Normal::new(seed ^ 0x9E37_79B9_7F4A_7C15);
    let mut out = Vec::with_capacity(q * dim);
    for _ in 0..q {
        let c = noise.below(clusters);
        let centre = &centres[c * dim..(c + 1) * dim];
        out.extend(centre.iter().map(|&v| v + spread * noise.sample()));
    }
    out
}

/// A corpus built to force ties: `n` rows drawn (seeded by `seed`) from
/// `distinct` rows of small integers in −3..=3, so that rows repeat and
/// many scores are exactly equal, and `q` queries of integers in −2..=2.
/// Row-major `(corpus, queries)`.
pub fn tied_rows(
    distinct: usize,
    n: usize,
    dim: usize,
    q: usize,
    seed: u64,
) -> (Vec<f32>, Vec<f32>) {
    let mut rng = SplitMix64::new(seed);
    let distinct = distinct.max(1);
    let pool: Vec<f32> = (0..distinct * dim)
        .map(|_| (rng.next_u64() % 7) as f32 - 3.0)
        .collect();
    let corpus: Vec<f32> = (0..n)
        .flat_map(|_| {
            let r = (rng.next_u64() % distinct as u64) as usize;
            pool[r * dim..(r + 1) * dim].to_vec()
        })
        .collect();
    let queries: Vec<f32> = (0..q * dim)
        .map(|_| (rng.next_u64() % 5) as f32 - 2.0)
        .collect();
    (corpus, queries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_and_roughly_normal() {
        let a = gaussian_clusters(100, 8, 4, 0.5, 7);
        assert_eq!(a, gaussian_clusters(100, 8, 4, 0.5, 7));
        assert_ne!(a, gaussian_clusters(100, 8, 4, 0.5, 8));
        let mut g = Normal::new(1);
        let xs: Vec<f64> = (0..100_000).map(|_| f64::from(g.sample())).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / xs.len() as f64;
        assert!(
            mean.abs() < 0.02 && (var - 1.0).abs() < 0.02,
            "{mean} {var}"
        );
    }
}
